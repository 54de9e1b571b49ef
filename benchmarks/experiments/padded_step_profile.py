"""Where the time of the speedup suite's dropout+mask step goes for ours (unpad_input ->
flash_attn_varlen_func(dropout_p) -> pad_input, forward + backward) at its short sequences:
torch.profiler over back-to-back steps, the top operators by self CPU time and by CUDA time, and
the step's wall time per call with and without dropout and with and without the padding.

    python benchmarks/experiments/padded_step_profile.py [--seqlen 128]
"""

import argparse
import time

import torch

from flash_attn.benchmark import impls as impl_lib
from flash_attn.benchmark.shapes import padding_lengths

BATCH, HEADS, HEADDIM, DROPOUT_P = 8, 12, 64, 0.1
STEPS = 50


def inputs(seqlen):
    q, k, v = (torch.randn(BATCH, seqlen, HEADS, HEADDIM, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    lengths = torch.tensor(padding_lengths(BATCH, seqlen, 0), device="cuda")
    key_mask = torch.arange(seqlen, device="cuda") < lengths[:, None]
    return q, k, v, key_mask, torch.randn_like(q)


def wall_us(step, steps=STEPS, warmup=5):
    """Wall time per call (µs) of `steps` calls back to back, after `warmup` untimed ones."""
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps * 1e6


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seqlen", type=int, default=128)
    seqlen = parser.parse_args().seqlen
    q, k, v, key_mask, dout = inputs(seqlen)
    full_mask = torch.ones_like(key_mask)

    def padded(mask, p):
        return lambda: torch.autograd.grad(impl_lib.ours_padded(q, k, v, mask, p), (q, k, v), dout)

    def dense(p):
        return lambda: torch.autograd.grad(impl_lib.ours_attention(q, k, v, dropout_p=p), (q, k, v), dout)

    for name, step in [("padded dropout", padded(key_mask, DROPOUT_P)), ("padded no dropout", padded(key_mask, 0.0)),
                       ("full mask dropout", padded(full_mask, DROPOUT_P)), ("dense dropout", dense(DROPOUT_P)),
                       ("dense no dropout", dense(0.0))]:
        print(f"{name:20s} {wall_us(step):8.1f} µs per step (wall, {STEPS} steps back to back)")
    step = padded(key_mask, DROPOUT_P)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            step()
        torch.cuda.synchronize()
    averages = prof.key_averages()
    print(averages.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))
    print(averages.table(sort_by="cuda_time_total", row_limit=15, max_name_column_width=60))


if __name__ == "__main__":
    main()
