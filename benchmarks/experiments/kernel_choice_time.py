"""GPU time of the forward or the backward under two or more kernel choices, in one process: an
environment variable the launchers read per call (FLASH_ATTN_SM90_FWD, FLASH_ATTN_SM90_BWD) is
switched between rounds. do_bench median, L2 flushed per run; bf16, hidden 2048 (heads = 2048 /
headdim), batch x seqlen = 16k tokens as in the speed suite.

    python benchmarks/experiments/kernel_choice_time.py --env FLASH_ATTN_SM90_FWD --values cpasync,ws \
        --pass fwd --cases 64:512:causal,64:2048:causal [--rounds 2]

Cases are headdim:seqlen[:causal]. Prints one markdown row per case and round: µs per choice.
"""

import argparse
import os

import torch
from triton.testing import do_bench

from flash_attn import flash_attn_func


def timer(headdim, seqlen, causal, which):
    heads, batch = 2048 // headdim, max(1, 16384 // seqlen)
    q, k, v = (torch.randn(batch, seqlen, heads, headdim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    dout = torch.randn_like(q)
    if which == "fwd":
        return lambda: flash_attn_func(q, k, v, causal=causal)

    def backward():
        out = flash_attn_func(q, k, v, causal=causal)  # the forward of the same choice, outside the timing
        return lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    return backward


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--env", required=True)
    parser.add_argument("--values", required=True)
    parser.add_argument("--pass", dest="which", default="fwd", choices=["fwd", "bwd"])
    parser.add_argument("--cases", required=True)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    values = args.values.split(",")
    print(f"{torch.cuda.get_device_name()}: {args.which} µs, {args.env} in {values}")
    print("| case | round | " + " | ".join(values) + " |")
    print("|---|---|" + "---|" * len(values))
    for case in args.cases.split(","):
        parts = case.split(":")
        headdim, seqlen, causal = int(parts[0]), int(parts[1]), len(parts) > 2 and parts[2] == "causal"
        make = timer(headdim, seqlen, causal, args.which)
        for round_index in range(args.rounds):
            cells = []
            for value in values:
                os.environ[args.env] = value
                fn = make if args.which == "fwd" else make()
                fn()
                cells.append(do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3)
            print(f"| hd {headdim} s {seqlen}{' causal' if causal else ''} | {round_index} | " +
                  " | ".join(f"{c:.1f}" for c in cells) + " |", flush=True)


if __name__ == "__main__":
    main()
