"""Dropout's cost alone: forward and backward with dropout_p = 0.1 against 0 at the features suite's
dropout shape (b=2, s=8k, 16 heads, hd 128, bf16, non-causal) and at hd 64 (b=4, s=8k, 16 heads),
plus softcap 30 and ALiBi (slopes 2^(-8 h / heads)) without dropout (the same score-extras kernels:
the cost of the score modifiers).
do_bench median, L2 flushed per run.

    python benchmarks/experiments/dropout_cost.py [--label NAME]
"""

import argparse

import torch
from triton.testing import do_bench

from flash_attn import flash_attn_func

SHAPES = [(2, 8192, 16, 128), (4, 8192, 16, 64)]


def median_us(fn):
    fn()
    return do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3


def row(shape, **options):
    batch, seqlen, heads, headdim = shape
    q, k, v = (torch.randn(batch, seqlen, heads, headdim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    forward = median_us(lambda: flash_attn_func(q, k, v, **options))
    out = flash_attn_func(q, k, v, **options)
    dout = torch.randn_like(out)
    backward = median_us(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
    return forward, backward


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--label", default="")
    label = parser.parse_args().label
    print("| build | shape | fwd plain | fwd softcap | fwd alibi | fwd dropout | fwd extra | bwd plain | bwd softcap "
          "| bwd alibi | bwd dropout | bwd extra |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for shape in SHAPES:
        heads = shape[2]
        slopes = 2.0 ** (-8.0 * torch.arange(1, heads + 1, device="cuda") / heads)
        plain = row(shape)
        softcap = row(shape, softcap=30.0)
        alibi = row(shape, alibi_slopes=slopes)
        dropout = row(shape, dropout_p=0.1)
        print(f"| {label} | b={shape[0]} s={shape[1]} h={shape[2]} d={shape[3]} | {plain[0]:.0f} | {softcap[0]:.0f} | "
              f"{alibi[0]:.0f} | {dropout[0]:.0f} | {dropout[0] / plain[0] - 1:+.1%} | {plain[1]:.0f} | "
              f"{softcap[1]:.0f} | {alibi[1]:.0f} | {dropout[1]:.0f} | {dropout[1] / plain[1] - 1:+.1%} |")


if __name__ == "__main__":
    main()
