"""The heaviest-first order's group size on Hopper (query_tile_scheduler.cuh, NOTES.md v23): the
warp-specialized forward on causal and windowed calls, by FLASH_ATTN_SM90_FWD_GROUP_STRIDES
(read per call; "default" unsets it: whole strides within the L2 budget), against SDPA cuDNN in
the same process; bf16, hidden 2048, batch x seqlen = 16k. Variants and cuDNN alternate per shape
over --rounds rounds (do_bench median, L2 flushed per run); the row keeps each one's best round.
--variable names another per-call switch to vary the same way (FLASH_ATTN_SM90_FWD_SHORT_STEPS: the
hd 256 plain kernel on 64- or 80-key steps, launch_fwd_sm90.cuh); --headdims / --seqlens keep the
causal shapes of those head dims and lengths.

    python benchmarks/experiments/causal_groups_ab.py [--label NAME] [--variants default,1] [--rounds 2]
        [--variable FLASH_ATTN_SM90_FWD_GROUP_STRIDES] [--headdims 256] [--seqlens 512,1024]

A build without the variable (before v23) runs every variant as its default: pass --variants default.
Prints markdown rows: µs per variant and cuDNN, and cuDNN µs / ours µs per variant.
"""

import argparse
import os

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from flash_attn import flash_attn_func

HIDDEN, TOKENS = 2048, 16384
# (headdim, seqlen, window left or None for causal): hd 64 runs the warp-specialized kernel from 2k
SHAPES = [(hd, s, None) for hd in (128, 256) for s in (512, 1024, 2048, 4096, 8192, 16384)] + \
         [(64, 2048, None), (64, 8192, None), (128, 16384, 4096)]


def set_variant(variable, variant):
    if variant == "default":
        os.environ.pop(variable, None)
    else:
        os.environ[variable] = variant


def cudnn(q, k, v):
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)


def timed_us(fn):
    fn()
    return do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--label", default="")
    parser.add_argument("--variants", default="default,1")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--variable", default="FLASH_ATTN_SM90_FWD_GROUP_STRIDES")
    parser.add_argument("--headdims", help="comma-separated; causal shapes of these head dims only")
    parser.add_argument("--seqlens", help="comma-separated; causal shapes of these lengths only")
    args = parser.parse_args()
    variants = args.variants.split(",")
    shapes = SHAPES
    if args.headdims or args.seqlens:
        headdims = [int(h) for h in args.headdims.split(",")] if args.headdims else (64, 128, 256)
        seqlens = [int(s) for s in args.seqlens.split(",")] if args.seqlens else sorted({s for _, s, _ in SHAPES})
        shapes = [(hd, s, None) for hd in headdims for s in seqlens]
    print(f"\n{args.label}: {torch.cuda.get_device_name()}")
    print("| build | shape | " + " | ".join(f"ours ({v}) µs" for v in variants) + " | cuDNN µs | " +
          " | ".join(f"cuDNN / ours ({v})" for v in variants) + " |")
    print("|---|---|" + "---|" * (2 * len(variants) + 1))
    for headdim, seqlen, left in shapes:
        heads, batch = HIDDEN // headdim, TOKENS // seqlen
        q, k, v = (torch.randn(batch, seqlen, heads, headdim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        window = (left, 0) if left is not None else (-1, -1)
        entries = [(variant, lambda: flash_attn_func(q, k, v, causal=True, window_size=window)) for variant in variants]
        if left is None:
            entries.append(("cudnn", lambda: cudnn(q, k, v)))
        best = {}
        for _ in range(args.rounds):
            for name, fn in entries:
                set_variant(args.variable, name if name != "cudnn" else "default")
                best[name] = min(best.get(name, float("inf")), timed_us(fn))
        set_variant(args.variable, "default")
        reference = best.get("cudnn")
        ratios = [f"{reference / best[v]:.3f}" if reference else "-" for v in variants]
        name = f"hd{headdim} s={seqlen} " + (f"window ({left}, 0)" if left is not None else "causal")
        cells = [f"{best[v]:.1f}" for v in variants] + [f"{reference:.1f}" if reference else "-"] + ratios
        print(f"| {args.label} | {name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
