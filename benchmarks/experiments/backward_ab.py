"""Backward A/B between two builds (scripts/gpu_check.sh STAGES=ab runs it on ./old_tree and on this
tree, each in its own process): the backward alone, default and deterministic=True, at the features
suite's deterministic shapes and two causal / hd 128 controls, plus forward+backward at its
host-overhead shapes. bf16, non-causal unless named; do_bench median, L2 flushed per run.

    python benchmarks/experiments/backward_ab.py [--label NAME] [--wide] [--speed] [--headdims 64,128]

Prints markdown rows: µs, and for the backward rows the deterministic / default speed ratio (and,
for the --speed cells, SDPA cuDNN's backward in the same process).
"""

import argparse

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from flash_attn import flash_attn_func

# (batch, seqlen, heads, headdim, causal): the features suite's two deterministic shapes first
BACKWARD_SHAPES = [(2, 8192, 16, 128, False), (8, 2048, 32, 64, False), (8, 2048, 16, 128, False),
                   (8, 2048, 16, 128, True), (8, 2048, 32, 64, True)]
# --wide adds the head-split kernel's head dims (hd 192: 16 heads, 2048 / 192 not being whole) and the
# speed suite's long hd 128 cell
WIDE_SHAPES = [(1, 16384, 16, 128, False), (2, 8192, 8, 256, False), (8, 2048, 8, 256, True),
               (2, 8192, 16, 192, False), (8, 2048, 16, 192, True)]
# --speed adds speed-suite cells (hidden 2048, 16k tokens) of hd 128 and 64 not above, each with SDPA
# cuDNN's backward measured in the same process
SPEED_SHAPES = [(16, 1024, 16, 128, False), (4, 4096, 16, 128, False), (16, 1024, 16, 128, True),
                (4, 4096, 16, 128, True), (16, 1024, 32, 64, False), (4, 4096, 32, 64, True)]
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


def cudnn_backward_us(shape):
    batch, seqlen, heads, headdim, causal = shape
    q, k, v, dout = (t.transpose(1, 2) for t in inputs(batch, seqlen, heads, headdim))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return median_us(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--label", default="")
    parser.add_argument("--wide", action="store_true", help="also hd 128 at 16k and hd 192 / 256")
    parser.add_argument("--speed", action="store_true", help="also speed-suite cells, with SDPA cuDNN")
    parser.add_argument("--headdims", default="", help="only these head dims (comma-separated; those built)")
    args = parser.parse_args()
    shapes = BACKWARD_SHAPES + (WIDE_SHAPES if args.wide else []) + (SPEED_SHAPES if args.speed else [])
    headdims = {int(h) for h in args.headdims.split(",")} if args.headdims else None
    if headdims:
        shapes = [s for s in shapes if s[3] in headdims]
    print(f"\n{args.label}: {torch.cuda.get_device_name()}")
    print("| build | backward | default µs | deterministic µs | ratio | cuDNN µs |")
    print("|---|---|---|---|---|---|")
    for shape in shapes:
        default, deterministic = backward_us(shape, False), backward_us(shape, True)
        cudnn = f"{cudnn_backward_us(shape):.1f}" if shape in SPEED_SHAPES else ""
        batch, seqlen, heads, headdim, causal = shape
        print(f"| {args.label} | b={batch} s={seqlen} h={heads} d={headdim}{' causal' if causal else ''} | "
              f"{default:.1f} | {deterministic:.1f} | {default / deterministic:.3f} | {cudnn} |", flush=True)
    if headdims and 64 not in headdims:
        return
    print("| build | fwd+bwd b=8 h=12 d=64 | µs | | |")
    for seqlen in HOST_SEQLENS:
        q, k, v, dout = inputs(8, seqlen, 12, 64)
        us = median_us(lambda: torch.autograd.grad(flash_attn_func(q, k, v), (q, k, v), dout))
        print(f"| {args.label} | s={seqlen} | {us:.1f} | | |", flush=True)


if __name__ == "__main__":
    main()
