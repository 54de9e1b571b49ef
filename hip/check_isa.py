"""Checks a CDNA compile of hip/probe_attention_block.hip from its ISA and resource report.

    python hip/check_isa.py --target gfx90a --isa probe-...-gfx90a.s --remarks remarks.txt [--markdown]

--isa is the `.s` that `--save-temps` leaves, --remarks the compiler's stderr with
`-Rpass-analysis=kernel-resource-usage`. For every kernel it asserts: the MFMA instruction of its
element type and atom, in the target's spelling, and no other MFMA; 8-byte LDS reads for the
operands; no flat memory instructions (an LDS pointer the compiler lost track of); no scratch and no
spills; LDS <= 64 KiB. Prints one table row per kernel (SGPR, VGPR, AGPR, scratch, spills,
occupancy, LDS) and exits 1 if a check fails.
"""

import argparse
import re
import sys

LDS_LIMIT = 65536

# Mnemonic stems per (element type, atom); gfx90a spells bf16 `_1k`, gfx940/942 put `_` before the type.
_MFMA_STEMS = {("fp16", "32x32x8"): ("32x32x8", "f16"), ("bf16", "32x32x8"): ("32x32x8", "bf16"),
               ("fp16", "16x16x16"): ("16x16x16", "f16"), ("bf16", "16x16x16"): ("16x16x16", "bf16")}

_RESOURCE_FIELDS = {
    "SGPRs": "sgpr", "VGPRs": "vgpr", "AGPRs": "agpr", "ScratchSize [bytes/lane]": "scratch",
    "Occupancy [waves/SIMD]": "occupancy", "SGPRs Spill": "sgpr_spill", "VGPRs Spill": "vgpr_spill",
    "LDS Size [bytes/block]": "lds",
}
_REMARK = re.compile(r"(Function Name|" + "|".join(re.escape(k) for k in _RESOURCE_FIELDS) +
                     r"): (\S+) \[-Rpass-analysis=kernel-resource-usage\]")
_KERNEL_NAME = re.compile(r"probe_attention_(fp16|bf16)_(\d+x\d+x\d+)$")


def expected_mfma(kernel, target):
    """The one MFMA mnemonic kernel `probe_attention_<dtype>_<atom>` must use on target."""
    match = _KERNEL_NAME.match(kernel)
    if match is None:
        raise ValueError(f"not a probe kernel name: {kernel}")
    shape, element = _MFMA_STEMS[(match.group(1), match.group(2))]
    if target == "gfx90a":
        return f"v_mfma_f32_{shape}{element}" + ("_1k" if element == "bf16" else "")
    if target in ("gfx940", "gfx941", "gfx942"):
        return f"v_mfma_f32_{shape}_{element}"
    raise ValueError(f"no MFMA spelling known for {target}")


def parse_resources(remarks_text):
    """{kernel: {field: int}} from the kernel-resource-usage remarks."""
    resources, current = {}, None
    for line in remarks_text.splitlines():
        match = _REMARK.search(line)
        if match is None:
            continue
        field, value = match.groups()
        if field == "Function Name":
            current = resources.setdefault(value, {})
        elif current is not None:
            current[_RESOURCE_FIELDS[field]] = int(value)
    return resources


def kernel_bodies(isa_text):
    """{kernel: [instruction mnemonics]} for each function in the ISA listing."""
    bodies, current = {}, None
    for line in isa_text.splitlines():
        label = re.match(r"^([A-Za-z_]\w*):\s*(;.*)?$", line)
        if label:
            current = bodies.setdefault(label.group(1), [])
            continue
        if line.startswith(".Lfunc_end"):
            current = None
            continue
        instruction = re.match(r"^\s+([a-z][a-z0-9_]*)\b", line)
        if current is not None and instruction:
            current.append(instruction.group(1))
    return bodies


def check_kernel(kernel, target, mnemonics, resources):
    """Failure messages for one kernel (empty when it passes)."""
    failures = []
    wanted = expected_mfma(kernel, target)
    mfma = {m for m in mnemonics if m.startswith("v_mfma")}
    if wanted not in mfma:
        failures.append(f"{kernel}: no {wanted}")
    if mfma - {wanted}:
        failures.append(f"{kernel}: unexpected MFMA {sorted(mfma - {wanted})}")
    if not any(m in ("ds_read_b64", "ds_read2_b64", "ds_read2st64_b64") for m in mnemonics):
        failures.append(f"{kernel}: no 8-byte LDS reads")
    flat = sorted({m for m in mnemonics if m.startswith(("flat_", "scratch_"))})
    if flat:
        failures.append(f"{kernel}: flat / scratch instructions {flat}")
    for field in ("scratch", "sgpr_spill", "vgpr_spill"):
        if resources.get(field, 0) != 0:
            failures.append(f"{kernel}: {field} = {resources[field]}")
    if resources.get("lds", 0) > LDS_LIMIT:
        failures.append(f"{kernel}: LDS {resources['lds']} > {LDS_LIMIT}")
    return failures


def table_rows(target, kernels, bodies, resources):
    rows = []
    for kernel in kernels:
        r, mfma = resources[kernel], expected_mfma(kernel, target)
        count = bodies.get(kernel, []).count(mfma)
        rows.append([kernel, target, f"{mfma} x{count}", r.get("sgpr"), r.get("vgpr"), r.get("agpr"), r.get("scratch"),
                     f"{r.get('sgpr_spill')}/{r.get('vgpr_spill')}", r.get("occupancy"), r.get("lds")])
    return rows


HEADER = ["kernel", "target", "MFMA (count)", "SGPR", "VGPR", "AGPR", "scratch B/lane", "spills SGPR/VGPR",
          "occupancy waves/SIMD", "LDS B"]


def format_table(rows, markdown):
    cells = [HEADER] + [[str(c) for c in row] for row in rows]
    if markdown:
        lines = ["| " + " | ".join(row) + " |" for row in cells]
        lines.insert(1, "|" + "---|" * len(HEADER))
        return "\n".join(lines)
    widths = [max(len(row[i]) for row in cells) for i in range(len(HEADER))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in cells)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--isa", required=True)
    parser.add_argument("--remarks", required=True)
    parser.add_argument("--markdown", action="store_true", help="print the table in Markdown")
    args = parser.parse_args(argv)
    with open(args.isa, encoding="utf-8") as f:
        bodies = kernel_bodies(f.read())
    with open(args.remarks, encoding="utf-8") as f:
        resources = parse_resources(f.read())
    kernels = sorted(k for k in resources if _KERNEL_NAME.match(k))
    failures = [] if kernels else ["no probe kernel in the resource report"]
    for kernel in kernels:
        failures += check_kernel(kernel, args.target, bodies.get(kernel, []), resources[kernel])
    print(format_table(table_rows(args.target, kernels, bodies, resources), args.markdown))
    for failure in failures:
        print(f"FAIL {args.target} {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
