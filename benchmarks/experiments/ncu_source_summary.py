"""Where a kernel's warps wait, from ncu_source.sh's CSVs (Nsight Compute's source page): the source
lines with the most warp-stall samples (with their top stall reasons), and the kernel's SASS cut
into address ranges of N instructions, each with its share of the samples and its heaviest source
lines, so that a prologue, a step loop or an epilogue shows as one run of ranges; then the step
loop's stall reasons, whole and per opcode (the step loop: the instructions executed within 30% of
the count that holds the most samples, in a forward the consumer warps' per-step count).

    python benchmarks/experiments/ncu_source_summary.py srcmix_fwd_ours_256_512_0.csv \
        src_fwd_ours_256_512_0.csv [--lines 30] [--range 64]

Samples count every warp, the producer's too (a warp-specialized kernel's producer warp mostly
waits on barriers).
"""

import argparse
import collections
import csv


def count(text):
    return int(text) if text.isdigit() else 0


def source_lines(mix_path):
    """(samples, file:line, text, stall counts) per source line, and each SASS address's line."""
    lines, line_of_address = [], {}
    header = path = current = None
    for row in csv.reader(open(mix_path)):
        if not row or row[0] == "Function Name":
            continue
        if row[0] == "File Path":
            path = row[1].split("/")[-1]
            continue
        if row[0] == "Line No":
            header = row
            continue
        if header is None:
            continue
        if row[0]:  # a source line, with its SASS rows below it
            current = f"{path}:{row[0]}"
            fields = dict(zip(header, row))
            stalls = {name[6:]: count(value) for name, value in zip(header, row)
                      if name.startswith("stall_") and "Not Issued" not in name and count(value)}
            lines.append((count(fields["Warp Stall Sampling (All Samples)"]), current, row[1].strip(), stalls))
        else:
            line_of_address[row[2]] = current
    return lines, line_of_address


def step_loop_stalls(sass, top=14):
    """The step loop's stall reasons (all samples), whole and by opcode, with executed counts."""
    stall_names = [name for name in sass[0] if name.startswith("stall_") and "Not Issued" not in name]
    weight = collections.Counter()
    for s in sass:
        if count(s["Instructions Executed"]):
            weight[count(s["Instructions Executed"])] += count(s["# Samples"])
    mode = weight.most_common(1)[0][0]
    loop = [s for s in sass if 0.7 * mode <= count(s["Instructions Executed"]) <= 1.3 * mode]
    reasons, by_op, executed = collections.Counter(), collections.defaultdict(collections.Counter), collections.Counter()
    for s in loop:
        op = [word for word in s["Source"].split() if not word.startswith("@")][0].split(".")[0]
        executed[op] += count(s["Instructions Executed"])
        for name in stall_names:
            reasons[name[6:]] += count(s[name])
            by_op[op][name[6:]] += count(s[name])
    total = sum(reasons.values()) or 1
    print(f"\n## Step loop: {len(loop)} instructions executed ~{mode} times, {total} samples\n")
    print("  " + ", ".join(f"{name} {100 * n / total:.1f}%" for name, n in reasons.most_common(10)))
    for op, stalls in sorted(by_op.items(), key=lambda kv: -sum(kv[1].values()))[:top]:
        samples = sum(stalls.values())
        top3 = ", ".join(f"{name}={n}" for name, n in stalls.most_common(3))
        print(f"  {op:10s} {100 * samples / total:5.1f}%  executed {executed[op]:>11d}  {top3}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("mix", help="srcmix_*.csv (CUDA source with SASS)")
    parser.add_argument("sass", help="src_*.csv (SASS)")
    parser.add_argument("--lines", type=int, default=30)
    parser.add_argument("--range", type=int, default=64, help="instructions per address range")
    args = parser.parse_args()

    lines, line_of_address = source_lines(args.mix)
    total = sum(line[0] for line in lines) or 1
    print(f"## Source lines by warp-stall samples ({total} samples)\n")
    for samples, where, text, stalls in sorted(lines, key=lambda line: -line[0])[:args.lines]:
        top = " ".join(f"{name}={value}" for name, value in sorted(stalls.items(), key=lambda kv: -kv[1])[:3])
        print(f"{100 * samples / total:5.1f}%  {where}  {text[:70]}  | {top}")

    rows = list(csv.reader(open(args.sass)))
    header = rows[1]
    sass = [dict(zip(header, row)) for row in rows[2:]]
    total = sum(count(s["Warp Stall Sampling (All Samples)"]) for s in sass) or 1
    print(f"\n## SASS in ranges of {args.range} instructions (ranges under 0.4% of {total} samples left out)\n")
    for start in range(0, len(sass), args.range):
        part = sass[start:start + args.range]
        samples = sum(count(s["Warp Stall Sampling (All Samples)"]) for s in part)
        if samples < 0.004 * total:
            continue
        by_line = collections.Counter()
        for s in part:
            by_line[line_of_address.get(s["Address"], "?")] += count(s["Warp Stall Sampling (All Samples)"])
        executed = max(count(s["Instructions Executed"]) for s in part)
        heaviest = ", ".join(f"{where} ({n})" for where, n in by_line.most_common(3))
        print(f"{part[0]['Address'][-5:]}  {100 * samples / total:5.1f}%  max executed {executed:9d}  {heaviest}")
    step_loop_stalls(sass)


if __name__ == "__main__":
    main()
