"""Forward A/B between two builds (scripts/gpu_check.sh STAGES=ab runs it on ./old_tree and on this
tree, each in its own process): our forward and SDPA cuDNN's at the speed suite's shapes (bf16,
hidden 2048, batch x seqlen = 16k), alternating over --rounds rounds (do_bench median, L2 flushed
per run), each keeping its best round.

    python benchmarks/experiments/forward_ab.py [--label NAME] [--headdims 64,128,256]
        [--seqlens 512,2048,8192,16384] [--rounds 2]

Prints markdown rows: µs of ours and cuDNN, and cuDNN µs / ours µs.
"""

import argparse
import itertools

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from flash_attn import flash_attn_func

HIDDEN, TOKENS = 2048, 16384


def cudnn(q, k, v, causal):
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                              is_causal=causal)


def timed_us(fn):
    fn()
    return do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--label", default="")
    parser.add_argument("--headdims", default="64,128,256")
    parser.add_argument("--seqlens", default="512,2048,8192,16384")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    print(f"\n{args.label}: {torch.cuda.get_device_name()}")
    print("| build | shape | ours µs | cuDNN µs | cuDNN / ours |")
    print("|---|---|---|---|---|")
    headdims = [int(h) for h in args.headdims.split(",")]
    seqlens = [int(s) for s in args.seqlens.split(",")]
    for headdim, seqlen, causal in itertools.product(headdims, seqlens, (False, True)):
        heads, batch = HIDDEN // headdim, TOKENS // seqlen
        q, k, v = (torch.randn(batch, seqlen, heads, headdim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        entries = {"ours": lambda: flash_attn_func(q, k, v, causal=causal), "cudnn": lambda: cudnn(q, k, v, causal)}
        best = {}
        for _ in range(args.rounds):
            for name, fn in entries.items():
                best[name] = min(best.get(name, float("inf")), timed_us(fn))
        print(f"| {args.label} | hd{headdim} s={seqlen}{' causal' if causal else ''} | {best['ours']:.1f} | "
              f"{best['cudnn']:.1f} | {best['cudnn'] / best['ours']:.3f} |", flush=True)


if __name__ == "__main__":
    main()
