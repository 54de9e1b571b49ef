"""Backward A/B between two builds (scripts/gpu_check.sh STAGES=ab runs it on ./old_tree and on this
tree, each in its own process): the backward alone, default and deterministic=True, at the features
suite's deterministic shapes and two causal / hd 128 controls, plus forward+backward at its
host-overhead shapes. bf16, non-causal unless named; do_bench median, L2 flushed per run.

    python benchmarks/experiments/backward_ab.py [--label NAME]

Prints markdown rows: µs, and for the backward rows the deterministic / default speed ratio.
"""

import argparse

import torch
from triton.testing import do_bench

from flash_attn import flash_attn_func

# (batch, seqlen, heads, headdim, causal): the features suite's two deterministic shapes first
BACKWARD_SHAPES = [(2, 8192, 16, 128, False), (8, 2048, 32, 64, False), (8, 2048, 16, 128, False),
                   (8, 2048, 16, 128, True), (8, 2048, 32, 64, True)]
# --wide adds the head-split kernel's head dim and the speed suite's long hd 128 cell
WIDE_SHAPES = [(1, 16384, 16, 128, False), (2, 8192, 8, 256, False), (8, 2048, 8, 256, True)]
HOST_SEQLENS = (128, 256, 512, 1024)  # batch 8, 12 heads, hd 64


def inputs(batch, seqlen, heads, headdim):
    q, k, v = (torch.randn(batch, seqlen, heads, headdim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    return q, k, v, torch.randn_like(q)


def median_us(fn):
    fn()
    return do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3


def backward_us(shape, deterministic):
    batch, seqlen, heads, headdim, causal = shape
    q, k, v, dout = inputs(batch, seqlen, heads, headdim)
    out = flash_attn_func(q, k, v, causal=causal, deterministic=deterministic)
    return median_us(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--label", default="")
    parser.add_argument("--wide", action="store_true", help="also hd 128 at 16k and hd 256")
    args = parser.parse_args()
    print(f"\n{args.label}: {torch.cuda.get_device_name()}")
    print("| build | backward | default µs | deterministic µs | ratio |")
    print("|---|---|---|---|---|")
    for shape in BACKWARD_SHAPES + (WIDE_SHAPES if args.wide else []):
        default, deterministic = backward_us(shape, False), backward_us(shape, True)
        batch, seqlen, heads, headdim, causal = shape
        print(f"| {args.label} | b={batch} s={seqlen} h={heads} d={headdim}{' causal' if causal else ''} | "
              f"{default:.1f} | {deterministic:.1f} | {default / deterministic:.3f} |", flush=True)
    print("| build | fwd+bwd b=8 h=12 d=64 | µs | | |")
    for seqlen in HOST_SEQLENS:
        q, k, v, dout = inputs(8, seqlen, 12, 64)
        us = median_us(lambda: torch.autograd.grad(flash_attn_func(q, k, v), (q, k, v), dout))
        print(f"| {args.label} | s={seqlen} | {us:.1f} | | |", flush=True)


if __name__ == "__main__":
    main()
