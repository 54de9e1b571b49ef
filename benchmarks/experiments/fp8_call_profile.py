"""Where the time of one fp8 forward call goes: torch.profiler's CUDA kernel table of 10 calls of
flash_attn_func on float8_e4m3fn q, k, v (unit descales), hd 128 by default, 16 heads, 16k tokens,
seqlen 4k and 16k, causal and not: the attention kernel and whatever else the call launches (the
layout copy of V, the descale stack). Runs the CUDA fp8 forward, or the Triton one with
FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE.

    python benchmarks/experiments/fp8_call_profile.py [--headdim 128] [--seqlens 4096 16384]
"""

import argparse

import torch
from call_profile import kernel_table  # a sibling script: its directory is on sys.path when run

from flash_attn import flash_attn_func

HEADS, TOKENS, CALLS = 16, 16384, 10


def profile_calls(seqlen, headdim, causal):
    batch = TOKENS // seqlen
    q, k, v = (torch.randn(batch, seqlen, HEADS, headdim, device="cuda", dtype=torch.bfloat16).to(torch.float8_e4m3fn)
               for _ in range(3))
    ones = torch.ones(batch, HEADS, device="cuda")

    def call():
        return flash_attn_func(q, k, v, causal=causal, q_descale=ones, k_descale=ones, v_descale=ones)

    return kernel_table(call, CALLS, row_limit=6)  # the warm-up calls compile outside the profile


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--headdim", type=int, default=128)
    parser.add_argument("--seqlens", nargs="+", type=int, default=(4096, 16384))
    args = parser.parse_args()
    for seqlen in args.seqlens:
        for causal in (False, True):
            print(f"=== hd {args.headdim} seqlen {seqlen} causal {causal}, {CALLS} calls")
            print(profile_calls(seqlen, args.headdim, causal))


if __name__ == "__main__":
    main()
