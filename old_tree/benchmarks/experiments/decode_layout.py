"""Decode K+V read bandwidth of flash_attn_with_kvcache by cache layout: the usual (b, s, hk, d)
cache, whose rows of one KV head are 256 B out of every 2 KB, against a head-major (b, hk, s, d)
buffer viewed as (b, s, hk, d), where one KV head's keys are contiguous. GQA 32/8, hd 128, bf16."""

import sys

import torch
from triton.testing import do_bench

from flash_attn import flash_attn_with_kvcache


def measure(batch, context, head_major, num_splits=0):
    nheads, nheads_k, d = 32, 8, 128
    q = torch.randn(batch, 1, nheads, d, dtype=torch.bfloat16, device="cuda")
    if head_major:
        k = torch.randn(batch, nheads_k, context, d, dtype=torch.bfloat16, device="cuda").transpose(1, 2)
        v = torch.randn(batch, nheads_k, context, d, dtype=torch.bfloat16, device="cuda").transpose(1, 2)
    else:
        k = torch.randn(batch, context, nheads_k, d, dtype=torch.bfloat16, device="cuda")
        v = torch.randn_like(k)
    seqlens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
    ms = do_bench(lambda: flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, num_splits=num_splits),
                  warmup=25, rep=100)
    gbps = 2 * k.numel() * 2 / ms / 1e6
    print(f"b={batch} ctx={context} {'head-major' if head_major else 'seq-major '} splits={num_splits}: "
          f"{ms * 1e3:8.1f} us {gbps:7.0f} GB/s", flush=True)


if __name__ == "__main__" and "--kernels" not in sys.argv:
    for batch, context in ((1, 131072), (64, 16384), (1, 8192)):
        for head_major in (False, True):
            measure(batch, context, head_major)
    for splits in (8, 32, 64):
        measure(1, 131072, False, splits)


def kernel_times(batch, context):
    """GPU time per kernel of one decode call (torch.profiler), ours and SDPA cuDNN."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.profiler import ProfilerActivity, profile

    q = torch.randn(batch, 1, 32, 128, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(batch, context, 8, 128, dtype=torch.bfloat16, device="cuda")
    v = torch.randn_like(k)
    seqlens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    calls = {"ours": lambda: flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens)}

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)

    calls["cudnn"] = cudnn
    for name, fn in calls.items():
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
        for event in prof.key_averages():
            if event.device_time_total > 0:
                print(f"  {name} b={batch} ctx={context}: {event.key[:70]:70s} {event.device_time_total / 20:8.1f} us")


if __name__ == "__main__" and "--kernels" in sys.argv:
    kernel_times(1, 8192)
    kernel_times(1, 131072)
