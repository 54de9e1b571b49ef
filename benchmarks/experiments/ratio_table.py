"""Ratio tables from speed-suite results: one column's TFLOP/s over another's, per (head dim, causal, pass)
row and seqlen column, each cell the rounds given joined by " / " (rounds: results.json files of the
same configurations, e.g. two runs, or one file per head dim).

    python benchmarks/experiments/ratio_table.py --of ours --over fa4 --round round1/hd*/results.json \
        --round round2/hd*/results.json

A ratio above 1 means `--of` is faster (TFLOP/s of --of over TFLOP/s of --over, from one run). With
--over-from, the --over column comes from those files instead (one round): a quotient across runs,
e.g. each implementation from the run where it followed the same peer (benchmarks/NOTES.md v40).
"""

import argparse
import json
from collections import defaultdict

from flash_attn.benchmark.shapes import format_seqlen

PASSES = ("fwd", "bwd", "fwd+bwd")


def column_values(paths, name, passes, dtype=None):
    """{(headdim, causal, pass, seqlen): TFLOP/s} of column `name` in the speed suites of `paths`, of
    the rows of `dtype` where given (a file of both dtypes would otherwise mix them)."""
    values = {}
    for path in paths:
        with open(path) as results:
            rows = json.load(results)["suites"]["speed"]["rows"]
        for row in rows:
            config, cell = row["config"], row["cells"][name]
            if dtype is not None and config["dtype"] != dtype:
                continue
            if config["pass"] in passes and cell["status"] == "ok":
                values[(config["headdim"], config["causal"], config["pass"], config["seqlen"])] = cell["value"]
    return values


def ratios(paths, of, over, passes, over_paths=None, dtype=None):
    """{(headdim, causal, pass): {seqlen: ratio}}: `of` in the speed suites of `paths` over `over` in
    those of over_paths (default: the same files), of the rows of `dtype` where given."""
    numerators = column_values(paths, of, passes, dtype)
    denominators = column_values(over_paths or paths, over, passes, dtype)
    table = defaultdict(dict)
    for (headdim, causal, pass_, seqlen), value in numerators.items():
        if (headdim, causal, pass_, seqlen) in denominators:
            table[(headdim, causal, pass_)][seqlen] = value / denominators[(headdim, causal, pass_, seqlen)]
    return table


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--of", required=True)
    parser.add_argument("--over", required=True)
    parser.add_argument("--passes", default="fwd,bwd")
    parser.add_argument("--round", dest="rounds", action="append", nargs="+", required=True, metavar="JSON")
    parser.add_argument("--over-from", nargs="+", metavar="JSON", help="files of the --over column (one round)")
    parser.add_argument("--dtype", help="only the rows of this dtype (bf16 or fp16)")
    args = parser.parse_args()
    if args.over_from and len(args.rounds) != 1:
        parser.error("--over-from pairs with one --round")
    passes = tuple(args.passes.split(","))
    tables = [ratios(paths, args.of, args.over, passes, args.over_from, args.dtype) for paths in args.rounds]
    keys = sorted({key for table in tables for key in table}, key=lambda k: (k[0], k[1], PASSES.index(k[2])))
    seqlens = sorted({s for table in tables for row in table.values() for s in row})
    print(f"{args.of} / {args.over}{' ' + args.dtype if args.dtype else ''} (TFLOP/s ratio; rounds joined by ' / ')\n")
    print("| hd | causal | pass | " + " | ".join(format_seqlen(s) for s in seqlens) + " |")
    print("|---|---|---|" + "---|" * len(seqlens))
    for headdim, causal, pass_ in keys:
        cells = [" / ".join(f"{t[(headdim, causal, pass_)][s]:.2f}" for t in tables if s in t.get((headdim, causal, pass_), {}))
                 for s in seqlens]
        print(f"| {headdim} | {'yes' if causal else 'no'} | {pass_} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
