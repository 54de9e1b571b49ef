"""Decode time of flash_attn_with_kvcache by split count: is the heuristic's choice (num_splits=0)
the fastest? One query token, 32 / 8 heads, hd 128, bf16, contiguous cache, the decode suite's
timing (do_bench median, L2 flushed per run), and the device copy bandwidth for reference.

    python benchmarks/experiments/decode_splits.py [--shapes 1x8k,32x4k] [--splits 0,1,2,4,8]
"""

import argparse

import torch
from triton.testing import do_bench

from flash_attn import flash_attn_with_kvcache

HEADS, HEADS_K, HEADDIM = 32, 8, 128
DEFAULT_SHAPES = "1x8k,8x8k,32x4k,64x16k,1x128k"
DEFAULT_SPLITS = "0,1,2,3,4,6,8,12,16,24,32,48,64"


def parse_shape(text):
    batch, context = text.split("x")
    return int(batch), int(context.replace("k", "")) * (1024 if context.endswith("k") else 1)


def copy_gbps():
    src = torch.randn(128 * 2**20, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=25, rep=100, return_mode="median")
    return 2 * src.numel() * 2 / ms / 1e6


def sweep(batch, context, splits):
    q = torch.randn(batch, 1, HEADS, HEADDIM, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(batch, context, HEADS_K, HEADDIM, dtype=torch.bfloat16, device="cuda")
    v = torch.randn_like(k)
    seqlens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
    kv_bytes = 2 * k.numel() * 2
    for num_splits in splits:
        if num_splits > 0 and context // num_splits < 64:
            continue
        ms = do_bench(lambda: flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, num_splits=num_splits),
                      warmup=25, rep=100, return_mode="median")
        print(f"b={batch:<3} ctx={context:<7} splits={num_splits:<3} {ms * 1e3:8.1f} us "
              f"{kv_bytes / ms / 1e6:7.0f} GB/s", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=DEFAULT_SHAPES)
    parser.add_argument("--splits", default=DEFAULT_SPLITS)
    args = parser.parse_args()
    print(f"copy {copy_gbps():.0f} GB/s (read + write)")
    splits = [int(s) for s in args.splits.split(",")]
    for shape in args.shapes.split(","):
        sweep(*parse_shape(shape), splits)


if __name__ == "__main__":
    main()
