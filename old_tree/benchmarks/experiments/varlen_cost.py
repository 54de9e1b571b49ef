"""Where the varlen forward loses against a dense batch of the same tokens (features suite: 0.89x).

Times, in one process (triton do_bench medians, hd 128, 16 heads, bf16, non-causal):
- dense (8, 2048): the plain kernel;
- dense (8, 2048) with ALiBi slopes of zero: the same math on the extras kernel (what varlen runs);
- varlen of 8 x 2048: the extras kernel plus the sequence view, no partial tiles;
- varlen of the features suite's mixed lengths (16k tokens), with the TFLOP/s of its unmasked FLOPs
  and of the FLOPs the 128 x 128 tiles compute (partial tiles counted whole).
"""

import itertools
import math

import torch
from triton.testing import do_bench

from flash_attn import flash_attn_func, flash_attn_varlen_func

HEADS, HEADDIM, TILE = 16, 128, 128
MIXED = (3586, 1705, 3232, 3774, 1850, 293, 1188, 756)


def time_pair(forward, inputs):
    """(forward ms, backward ms) of forward(*inputs)."""
    fwd_ms = do_bench(forward, warmup=10, rep=50)
    out = forward()
    grad = torch.randn_like(out)
    bwd_ms = do_bench(lambda: torch.autograd.grad(out, inputs, grad, retain_graph=True), warmup=10, rep=50)
    return fwd_ms, bwd_ms


def report(name, flops, times, tile_flops=None):
    fwd_ms, bwd_ms = times
    line = f"{name:44s} fwd {fwd_ms * 1e3:8.1f} us {flops / fwd_ms / 1e9:6.1f} TFLOP/s"
    line += f"   bwd {bwd_ms * 1e3:8.1f} us {2.5 * flops / bwd_ms / 1e9:6.1f} TFLOP/s"
    if tile_flops is not None:
        line += f"   fwd on whole tiles {tile_flops / fwd_ms / 1e9:6.1f} TFLOP/s"
    print(line, flush=True)


def dense(batch, seqlen, alibi):
    q, k, v = (torch.randn(batch, seqlen, HEADS, HEADDIM, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    slopes = torch.zeros(HEADS, device="cuda", dtype=torch.float32) if alibi else None
    times = time_pair(lambda: flash_attn_func(q, k, v, alibi_slopes=slopes), (q, k, v))
    return 4 * HEADDIM * HEADS * batch * seqlen * seqlen, times


def varlen(lengths):
    total = sum(lengths)
    q, k, v = (torch.randn(total, HEADS, HEADDIM, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    cu = torch.tensor([0, *itertools.accumulate(lengths)], device="cuda", dtype=torch.int32)
    longest = max(lengths)
    times = time_pair(lambda: flash_attn_varlen_func(q, k, v, cu, cu, longest, longest), (q, k, v))
    flops = 4 * HEADDIM * HEADS * sum(n * n for n in lengths)
    tile_flops = 4 * HEADDIM * HEADS * sum((math.ceil(n / TILE) * TILE) ** 2 for n in lengths)
    return flops, times, tile_flops


if __name__ == "__main__":
    torch.manual_seed(0)
    report("dense 8 x 2048 (plain kernel)", *dense(8, 2048, alibi=False))
    report("dense 8 x 2048, ALiBi 0 (extras kernel)", *dense(8, 2048, alibi=True))
    flops, times, tiles = varlen([2048] * 8)
    report("varlen 8 x 2048", flops, times, tiles)
    flops, times, tiles = varlen(list(MIXED))
    report("varlen mixed 128..4096 (features suite)", flops, times, tiles)
