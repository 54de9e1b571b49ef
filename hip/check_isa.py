"""Checks a CDNA compile from its ISA and resource report: the probe kernels of
hip/probe_attention_block.hip, the forward kernels of hip/fwd_kernels_cdna.hip, the backward
kernels of hip/bwd_kernels_cdna.hip (main kernel, preprocess, dQ convert) and the split-KV decode
kernels of hip/kvcache_kernels_cdna.hip (append / rotary, split-KV, combine).

    python hip/check_isa.py --target gfx90a --isa X-hip-amdgcn-amd-amdhsa-gfx90a.s --remarks remarks.txt [--markdown]

--isa is the `.s` that `--save-temps` leaves, --remarks the compiler's stderr with
`-Rpass-analysis=kernel-resource-usage`. For every kernel it recognizes it asserts: the MFMA
instruction of its element type and atom, in the target's spelling, and no other MFMA (none at all
in the backward's preprocess and convert and the decode's append and combine, which have no
product); 8-byte LDS reads for the
operands (kernels with MFMA); no flat memory instructions (a pointer whose address space the compiler
lost: an LDS one, or a value it copied to scratch); no scratch and no VGPR spills; LDS (static plus
dynamic) <= 64 KiB. SGPR spills are reported, not failed: with no scratch they sit in VGPR lanes
(v_writelane / v_readlane); the forward's score-extras kernels have them (a partial block's mask
compares, 2 SGPRs each, which the scheduler hoists). The dynamic LDS of the forward and backward
main kernels is read from the fwd_lds_* / bwd_lds_<head dim>_<block m>_<block n>_<warps>
constants that hip/fwd_kernels_cdna.hip and hip/bwd_kernels_cdna.hip leave in the ISA, the
split-KV kernel's from hip/kvcache_kernels_cdna.hip's splitkv_lds_<head dim>_<keys per step>_
<stages>_<waves>. Prints one table row per kernel (SGPR, VGPR, AGPR, scratch, spills, occupancy from the
report and as the LDS allows it, LDS) and exits 1 if a check fails.
"""

import argparse
import re
import sys

LDS_LIMIT = 65536  # per workgroup, and per CU on gfx90a and gfx942
SIMDS_PER_CU = 4

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
_PROBE_NAME = re.compile(r"probe_attention_(fp16|bf16)_(\d+x\d+x\d+)$")
PROBE_WAVES = 4  # hip/probe_attention_block.hip kWaves
# flash::fwd_kernel<T, flash::FwdConfig<head dim, block m, block n, warps>, kScoreExtras> as mangled
_FWD_NAME = re.compile(r"_ZN5flash10fwd_kernelI(\w+?)NS_9FwdConfigILi(\d+)ELi(\d+)ELi(\d+)ELi(\d+)EEELb([01])EEE"
                       r"vNS_9FwdParamsE$")
# flash::bwd_kernel<T, flash::BwdConfig<head dim, block m, block n, warps, three warp grids>, kScoreExtras>,
# with flash::BwdConfigVPInRegisters<head dim, block m, block n, warps, dQ grid> (V and P^T in registers), or
# with flash::BwdConfigDimSplit<head dim, block m, block n, warps, score waves along dims, V in registers>
_BWD_NAME = re.compile(r"_ZN5flash10bwd_kernelI(\w+?)NS_(9BwdConfig|22BwdConfigVPInRegisters|17BwdConfigDimSplit)"
                       r"ILi(\d+)ELi(\d+)ELi(\d+)ELi(\d+)(?:ELi\d+)+(?:ELb([01]))?EEELb([01])EEEvNS_9BwdParamsEi$")
_BWD_VARIANTS = {"9BwdConfig": "", "22BwdConfigVPInRegisters": "_vp", "17BwdConfigDimSplit": "_split"}
# flash::bwd_preprocess_kernel<T, head dim> (8 waves) and flash::convert_dq_kernel<T, head dim> (4 waves)
_BWD_HELPER_NAME = re.compile(r"_ZN5flash(21bwd_preprocess|17convert_dq)_kernelI(\w+?)Li(\d+)EEEvNS_9BwdParamsE$")
_BWD_HELPER_WAVES = {"21bwd_preprocess": ("bwd_preprocess", 8), "17convert_dq": ("convert_dq", 4)}
# flash::splitkv_kernel<T, flash::SplitKvConfig<head dim, keys per step, stages, waves, workgroups per CU>,
#                       flash::<Loader><T, Cfg, kPaged>>(SplitKvParams, Loader::Maps)
_SPLITKV_NAME = re.compile(r"_ZN5flash14splitkv_kernelI(\w+?)NS_13SplitKvConfigILi(\d+)ELi(\d+)ELi(\d+)ELi(\d+)ELi\d+EEE"
                           r"NS_\d+(\w+?KvLoader)I\w+?Lb([01])EEEEEvNS_13SplitKvParamsENT1_4MapsE$")
# flash::kvcache_append_kernel<T> (kAppendThreads = 128: 2 waves) and flash::splitkv_combine_kernel<T>
# (kCombineWarps = 4 waves)
_KVCACHE_HELPER_NAME = re.compile(r"_ZN5flash(21kvcache_append|22splitkv_combine)_kernelI(\w+?)EEvNS_\d+\w+ParamsE$")
_KVCACHE_HELPER_WAVES = {"21kvcache_append": ("kvcache_append", 2), "22splitkv_combine": ("splitkv_combine", 4)}
_ELEMENT_TYPES = {"6__half": "fp16", "12hip_bfloat16": "bf16", "14__hip_bfloat16": "bf16"}
FWD_ATOM = "32x32x8"  # csrc/flash/arch/cdna_gemm.cuh FragmentAtom (the backward's too)
_DYNAMIC_LDS = re.compile(r"^((?:fwd|bwd|splitkv)_lds_\d+_\d+_\d+_\d+):[^\n]*\n\s*\.long\s+(\d+)", re.MULTILINE)


def _tiled_spec(kind, element_type, tile, extras, variant=""):
    """Spec of a forward or backward main kernel: tile (head dim, block m, block n, warps); variant
    "_vp" for a backward with V and P^T in registers, "_split" for one that splits the head dim over
    waves (BwdConfigDimSplit), "_split_v" for that with V in registers."""
    dtype = _ELEMENT_TYPES[element_type]
    label = f"{kind}_{dtype}_hd{tile[0]}_m{tile[1]}n{tile[2]}w{tile[3]}{variant}" + ("_extras" if extras == "1" else "")
    return dict(label=label, dtype=dtype, atom=FWD_ATOM, waves=tile[3], tile=tile,
                lds_constant=f"{kind}_lds_" + "_".join(str(x) for x in tile))


def _splitkv_spec(element_type, tile, loader, paged):
    """Spec of a split-KV kernel: tile (head dim, keys per step, stages, waves), its loader's name
    (CpAsyncKvLoader, the one CDNA builds, adds nothing to the label)."""
    dtype = _ELEMENT_TYPES[element_type]
    loader_suffix = "" if loader == "CpAsyncKvLoader" else "_" + loader
    label = (f"splitkv_{dtype}_hd{tile[0]}_k{tile[1]}s{tile[2]}w{tile[3]}" + ("_paged" if paged == "1" else "") +
             loader_suffix)
    return dict(label=label, dtype=dtype, atom=FWD_ATOM, waves=tile[3], tile=tile,
                lds_constant="splitkv_lds_" + "_".join(str(x) for x in tile))


def _helper_spec(name, waves, element_type, headdim=None):
    """Spec of a kernel without products or dynamic LDS (the backward's and the decode's helpers)."""
    dtype = _ELEMENT_TYPES[element_type]
    label = f"{name}_{dtype}" + ("" if headdim is None else f"_hd{headdim}")
    return dict(label=label, dtype=dtype, atom=None, waves=waves, tile=None, lds_constant=None)


def kernel_spec(kernel):
    """{label, dtype, atom, waves, tile, lds_constant} of a probe, forward, backward or decode kernel
    (atom None: a kernel without products; lds_constant None: no dynamic LDS); None for any other
    function."""
    match = _PROBE_NAME.match(kernel)
    if match:
        return dict(label=kernel, dtype=match.group(1), atom=match.group(2), waves=PROBE_WAVES, tile=None,
                    lds_constant=None)
    match = _FWD_NAME.match(kernel)
    if match and match.group(1) in _ELEMENT_TYPES:
        return _tiled_spec("fwd", match.group(1), tuple(int(g) for g in match.groups()[1:5]), match.group(6))
    match = _BWD_NAME.match(kernel)
    if match and match.group(1) in _ELEMENT_TYPES:
        variant = _BWD_VARIANTS[match.group(2)] + ("_v" if match.group(7) == "1" else "")
        return _tiled_spec("bwd", match.group(1), tuple(int(g) for g in match.groups()[2:6]), match.group(8), variant)
    match = _BWD_HELPER_NAME.match(kernel)
    if match and match.group(2) in _ELEMENT_TYPES:
        return _helper_spec(*_BWD_HELPER_WAVES[match.group(1)], match.group(2), match.group(3))
    match = _SPLITKV_NAME.match(kernel)
    if match and match.group(1) in _ELEMENT_TYPES:
        return _splitkv_spec(match.group(1), tuple(int(g) for g in match.groups()[1:5]), *match.groups()[5:7])
    match = _KVCACHE_HELPER_NAME.match(kernel)
    if match and match.group(2) in _ELEMENT_TYPES:
        return _helper_spec(*_KVCACHE_HELPER_WAVES[match.group(1)], match.group(2))
    return None


def unrecognized_kernels(names):
    """The flash:: kernels among `names` (mangled) that kernel_spec cannot name."""
    return sorted(k for k in names if k.startswith("_ZN5flash") and kernel_spec(k) is None)


def expected_mfma(kernel, target):
    """The one MFMA mnemonic a probe, forward, backward or split-KV kernel must use on target; None for
    the backward's preprocess and convert and the decode's append and combine (no MFMA)."""
    spec = kernel_spec(kernel)
    if spec is None:
        raise ValueError(f"not a probe, forward, backward or decode kernel name: {kernel}")
    if spec["atom"] is None:
        return None
    shape, element = _MFMA_STEMS[(spec["dtype"], spec["atom"])]
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


def dynamic_lds(isa_text):
    """{constant name: bytes} from the fwd_lds_* / bwd_lds_* / splitkv_lds_* constants in the ISA."""
    return {name: int(value) for name, value in _DYNAMIC_LDS.findall(isa_text)}


def lds_bytes(kernel, resources, dynamic):
    """Static LDS of the report plus a main kernel's dynamic LDS; None when its tile has no constant."""
    constant = kernel_spec(kernel)["lds_constant"]
    extra = 0 if constant is None else dynamic.get(constant)
    return None if extra is None else resources.get("lds", 0) + extra


def lds_occupancy(kernel, lds):
    """Waves per SIMD that the LDS admits: whole workgroups per CU, spread over its SIMDs."""
    if not lds:
        return None
    return LDS_LIMIT // lds * kernel_spec(kernel)["waves"] / SIMDS_PER_CU


def check_kernel(kernel, target, mnemonics, resources, lds=0):
    """Failure messages for one kernel (empty when it passes); lds: its static plus dynamic LDS bytes."""
    failures = []
    wanted = expected_mfma(kernel, target)
    mfma = {m for m in mnemonics if m.startswith("v_mfma")}
    if wanted is not None and wanted not in mfma:
        failures.append(f"{kernel}: no {wanted}")
    if mfma - {wanted}:
        failures.append(f"{kernel}: unexpected MFMA {sorted(mfma - {wanted})}")
    if wanted is not None and not any(m in ("ds_read_b64", "ds_read2_b64", "ds_read2st64_b64") for m in mnemonics):
        failures.append(f"{kernel}: no 8-byte LDS reads")
    flat = sorted({m for m in mnemonics if m.startswith(("flat_", "scratch_"))})
    if flat:
        failures.append(f"{kernel}: flat / scratch instructions {flat}")
    for field in ("scratch", "vgpr_spill"):
        if resources.get(field, 0) != 0:
            failures.append(f"{kernel}: {field} = {resources[field]}")
    lds = max(lds or 0, resources.get("lds", 0))
    if lds > LDS_LIMIT:
        failures.append(f"{kernel}: LDS {lds} > {LDS_LIMIT}")
    return failures


def table_rows(target, kernels, bodies, resources, dynamic):
    rows = []
    for kernel in kernels:
        r, mfma = resources[kernel], expected_mfma(kernel, target)
        mfma_cell = "-" if mfma is None else f"{mfma} x{bodies.get(kernel, []).count(mfma)}"
        lds = lds_bytes(kernel, r, dynamic)
        with_lds = lds_occupancy(kernel, lds)
        rows.append([kernel_spec(kernel)["label"], target, mfma_cell, r.get("sgpr"), r.get("vgpr"),
                     r.get("agpr"), r.get("scratch"), f"{r.get('sgpr_spill')}/{r.get('vgpr_spill')}",
                     r.get("occupancy"), None if with_lds is None else f"{with_lds:g}", lds])
    return rows


HEADER = ["kernel", "target", "MFMA (count)", "SGPR", "VGPR", "AGPR", "scratch B/lane", "spills SGPR/VGPR",
          "occupancy waves/SIMD", "with LDS", "LDS B"]


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
        isa = f.read()
    bodies, dynamic = kernel_bodies(isa), dynamic_lds(isa)
    with open(args.remarks, encoding="utf-8") as f:
        resources = parse_resources(f.read())
    kernels = sorted((k for k in resources if kernel_spec(k)), key=lambda k: kernel_spec(k)["label"])
    failures = [] if kernels else ["no probe, forward, backward or decode kernel in the resource report"]
    # A kernel of ours this script cannot name (a template that changed its parameters) would go
    # unchecked: that fails too.
    failures += [f"{k}: a flash kernel check_isa.py does not recognize" for k in unrecognized_kernels(resources)]
    for kernel in kernels:
        lds = lds_bytes(kernel, resources[kernel], dynamic)
        if lds is None:
            failures.append(f"{kernel}: no {kernel_spec(kernel)['lds_constant']} constant in the ISA")
        failures += check_kernel(kernel, args.target, bodies.get(kernel, []), resources[kernel], lds or 0)
    print(format_table(table_rows(args.target, kernels, bodies, resources, dynamic), args.markdown))
    for failure in failures:
        print(f"FAIL {args.target} {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
