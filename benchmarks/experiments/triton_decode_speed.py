"""The Triton backend's decode (issue #9): flash_attn_with_kvcache with FLASH_ATTENTION_TRITON_AMD_ENABLE
on, at the decode suite's (batch, context) pairs (flash_attn.benchmark.plan.DECODE_CONFIGS: one query
token, 32 / 8 heads, head dim 128, bf16), on the contiguous cache and on pages of 256 rows in a
shuffled order (decode.paged_problem); do_bench median (L2 flushed per run), µs and GB/s of K + V read.

    python benchmarks/experiments/triton_decode_speed.py [--label NAME]
"""

import argparse
import os

import torch
from triton.testing import do_bench

from flash_attn import flash_attn_with_kvcache
from flash_attn.benchmark.decode import decode_problem, paged_problem
from flash_attn.benchmark.plan import DECODE_CONFIGS

HEADS = (32, 8, 128)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    os.environ["FLASH_ATTENTION_TRITON_AMD_ENABLE"] = "TRUE"
    print(f"{args.label} {torch.cuda.get_device_name()}: Triton decode, µs (GB/s of K + V)")
    print("| batch | context | contiguous | paged 256 |")
    print("|---|---|---|---|")
    for batch, context in DECODE_CONFIGS:
        problem = decode_problem(batch, context, HEADS, torch.bfloat16, "cuda")
        k_pages, v_pages, block_table = paged_problem(problem, 256)
        cells = []
        for k, v, table in ((problem.k_cache, problem.v_cache, None), (k_pages, v_pages, block_table)):
            ms = do_bench(lambda: flash_attn_with_kvcache(problem.q, k, v, cache_seqlens=problem.cache_seqlens,
                                                          block_table=table), warmup=25, rep=100, return_mode="median")
            cells.append(f"{ms * 1000:.1f} ({problem.kv_bytes / ms / 1e6:.0f})")
        print(f"| {batch} | {context} | {' | '.join(cells)} |", flush=True)
        del problem, k_pages, v_pages


if __name__ == "__main__":
    main()
