"""The loops of a kernel's SASS with their instruction mix: which opcodes a step loop issues, and
whether it touches local memory. Reads `cuobjdump -sass` output (a file, or stdin); a loop is the
range from a backward branch's target to the branch. Static counts: instructions a branch skips
(the mask code of an unmasked step, say) are counted as if issued.

    cuobjdump -sass kernel.cubin | python benchmarks/experiments/sass_loops.py [--function REGEX] [--all]
    python benchmarks/experiments/sass_loops.py dump.sass --function bwd_kernel_sm90_ws

Each loop's line gives its local-memory accesses (spills) and its R2UR, per-thread values moved to
uniform registers: in a step loop these are wgmma descriptors built from per-thread values, which
cost the fp8 hd 256 forward 5-14% (benchmarks/NOTES.md v42); removing the 8-14 of the softcap
forwards' step loops gained nothing measurable (v43 item 3). A block that retries an mbarrier wait
out of line and branches back to the loop head counts as a loop reaching that far.
Without --all only loops holding a warpgroup MMA (HGMMA, QGMMA) are listed, innermost first. The
opcode is the mnemonic without its modifiers and predicate (UMOV and MOV stay apart: the uniform
datapath's instructions take issue slots too). cuobjdump ships in the triton wheel
(triton/backends/nvidia/bin) where the CUDA toolkit does not have it.
"""

import argparse
import collections
import re
import signal
import sys

FUNCTION = re.compile(r"^\s*Function : (\S+)")
INSTRUCTION = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
BRANCH_TARGET = re.compile(r"\bBRA\b.*?0x([0-9a-f]+)")
MMA_OPCODES = ("HGMMA", "QGMMA")


def functions(lines):
    """{function name: [(address, instruction text)]} in the dump's order."""
    listing, name = {}, None
    for line in lines:
        match = FUNCTION.match(line)
        if match:
            name = match.group(1)
            listing[name] = []
            continue
        match = INSTRUCTION.match(line)
        if match and name is not None:
            listing[name].append((int(match.group(1), 16), match.group(2)))
    return listing


def opcode(text):
    """The mnemonic of one instruction without predicate and modifiers: '@!P0 UMOV.64 UR4, ...' -> 'UMOV'."""
    words = text.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else ""


def loops(instructions):
    """[(first address, last address, Counter of opcodes)] of every backward branch, innermost first."""
    found = []
    for address, text in instructions:
        match = BRANCH_TARGET.search(text)
        if match and int(match.group(1), 16) < address:
            first = int(match.group(1), 16)
            body = [opcode(t) for a, t in instructions if first <= a <= address]
            found.append((first, address, collections.Counter(body)))
    return sorted(found, key=lambda loop: sum(loop[2].values()))


def report(name, instructions, show_all, most):
    for first, last, counts in loops(instructions):
        if not show_all and not any(counts[op] for op in MMA_OPCODES):
            continue
        local = counts["LDL"] + counts["STL"]
        mix = ", ".join(f"{op} {n}" for op, n in counts.most_common(most))
        print(f"{name} loop {first:#x}-{last:#x}: {sum(counts.values())} instructions, local memory {local}, "
              f"R2UR {counts['R2UR']}; {mix}")


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends the listing quietly
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dump", nargs="?", help="cuobjdump -sass output (default: stdin)")
    parser.add_argument("--function", default="", help="only functions whose mangled name matches this regex")
    parser.add_argument("--all", action="store_true", help="every loop, not only those with a warpgroup MMA")
    parser.add_argument("--most", type=int, default=24, help="opcodes listed per loop")
    args = parser.parse_args()
    lines = open(args.dump).read().splitlines() if args.dump else sys.stdin.read().splitlines()
    for name, instructions in functions(lines).items():
        if re.search(args.function, name):
            report(name, instructions, args.all, args.most)


if __name__ == "__main__":
    main()
