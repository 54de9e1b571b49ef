"""Ratio tables from speed-suite results: one column's TFLOP/s over another's, per (head dim, causal, pass)
row and seqlen column, each cell the rounds given joined by " / " (rounds: results.json files of the
same configurations, e.g. two runs, or one file per head dim).

    python benchmarks/experiments/ratio_table.py --of ours --over fa4 --round round1/hd*/results.json \
        --round round2/hd*/results.json

A ratio above 1 means `--of` is faster (TFLOP/s of --of over TFLOP/s of --over, from one run).
"""

import argparse
import json
from collections import defaultdict

PASSES = ("fwd", "bwd", "fwd+bwd")


def seqlen_label(seqlen):
    return f"{seqlen // 1024}k" if seqlen >= 1024 else str(seqlen)


def ratios(paths, of, over, passes):
    """{(headdim, causal, pass): {seqlen: ratio}} from the speed suites of `paths`."""
    table = defaultdict(dict)
    for path in paths:
        with open(path) as results:
            rows = json.load(results)["suites"]["speed"]["rows"]
        for row in rows:
            config, cells = row["config"], row["cells"]
            if config["pass"] not in passes or cells[of]["status"] != "ok" or cells[over]["status"] != "ok":
                continue
            key = (config["headdim"], config["causal"], config["pass"])
            table[key][config["seqlen"]] = cells[of]["value"] / cells[over]["value"]
    return table


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--of", required=True)
    parser.add_argument("--over", required=True)
    parser.add_argument("--passes", default="fwd,bwd")
    parser.add_argument("--round", dest="rounds", action="append", nargs="+", required=True, metavar="JSON")
    args = parser.parse_args()
    passes = tuple(args.passes.split(","))
    tables = [ratios(paths, args.of, args.over, passes) for paths in args.rounds]
    keys = sorted({key for table in tables for key in table}, key=lambda k: (k[0], k[1], PASSES.index(k[2])))
    seqlens = sorted({s for table in tables for row in table.values() for s in row})
    print(f"{args.of} / {args.over} (TFLOP/s ratio; rounds joined by ' / ')\n")
    print("| hd | causal | pass | " + " | ".join(seqlen_label(s) for s in seqlens) + " |")
    print("|---|---|---|" + "---|" * len(seqlens))
    for headdim, causal, pass_ in keys:
        cells = [" / ".join(f"{t[(headdim, causal, pass_)][s]:.2f}" for t in tables if s in t.get((headdim, causal, pass_), {}))
                 for s in seqlens]
        print(f"| {headdim} | {'yes' if causal else 'no'} | {pass_} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
