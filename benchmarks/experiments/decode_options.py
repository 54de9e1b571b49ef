"""flash_attn_with_kvcache per option and per kernel at the decode suite's shapes (GQA 32/8, hd 128,
bf16, cache_seqlens = context).

Default: one table of do_bench medians (µs, L2 flushed per run, as the decode suite times): the plain
decode, the append+rotary step (one new token, interleaved rotary, causal, as the suite's extra
column), softcap 30 and ALiBi.
--kernels: the GPU time of each kernel of those calls and of SDPA cuDNN's, from torch.profiler over
calls that each follow an L2 flush (so the cache is read from HBM, as in the timed runs).

    python benchmarks/experiments/decode_options.py [--label NAME] [--shapes 1:8192,64:16384] [--kernels]
"""

import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile
from triton.testing import do_bench

from flash_attn import flash_attn_with_kvcache

NHEADS, NHEADS_K, HEADDIM = 32, 8, 128
DEFAULT_SHAPES = "1:8192,8:8192,32:4096,64:16384"
FLUSH_BYTES = 256 << 20


def decode_calls(batch, context):
    """name -> zero-argument call, on one shared cache."""
    def randn(*shape):
        return torch.randn(*shape, dtype=torch.bfloat16, device="cuda")

    q, k_new, v_new = randn(batch, 1, NHEADS, HEADDIM), randn(batch, 1, NHEADS_K, HEADDIM), randn(batch, 1, NHEADS_K, HEADDIM)
    k, v = randn(batch, context, NHEADS_K, HEADDIM), randn(batch, context, NHEADS_K, HEADDIM)
    seqlens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
    append_at = seqlens - 1  # the new token lands in the cache's last row (its capacity is context)
    angles = torch.arange(context + 1, device="cuda")[:, None] * 10000.0 ** (
        -torch.arange(0, HEADDIM, 2, device="cuda") / HEADDIM)
    cos, sin = angles.cos().bfloat16(), angles.sin().bfloat16()
    slopes = torch.rand(NHEADS, device="cuda") * 0.1
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)

    return {
        "plain": lambda: flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens),
        "append+rotary": lambda: flash_attn_with_kvcache(q, k, v, k=k_new, v=v_new, rotary_cos=cos, rotary_sin=sin,
                                                         cache_seqlens=append_at, causal=True),
        "softcap 30": lambda: flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, softcap=30.0),
        "alibi": lambda: flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, alibi_slopes=slopes),
        "sdpa-cudnn": cudnn,
    }


def parse_shapes(text):
    return [tuple(int(x) for x in item.split(":")) for item in text.split(",")]


def time_table(shapes, label):
    names = list(decode_calls(1, 256))
    print(f"| build | batch, context | {' | '.join(names)} |")
    print("|---|---|" + "---|" * len(names))
    for batch, context in shapes:
        calls = decode_calls(batch, context)
        cells = [f"{do_bench(fn, warmup=25, rep=100, return_mode='median') * 1e3:.1f}" for fn in calls.values()]
        print(f"| {label} | {batch}, {context} | {' | '.join(cells)} |", flush=True)


def is_flush(kernel, us):
    """The 256 MB zero_ (a fill far longer than any fill a decode call makes)."""
    return "fill" in kernel.lower() and us > 30


def kernel_table(shapes, iterations=20):
    flush = torch.empty(FLUSH_BYTES, dtype=torch.int8, device="cuda")
    for batch, context in shapes:
        for name, fn in decode_calls(batch, context).items():
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(iterations):
                    flush.zero_()
                    fn()
                torch.cuda.synchronize()
            kernels = [(e.key, e.device_time_total / iterations) for e in prof.key_averages()
                       if e.device_time_total > 0 and not is_flush(e.key, e.device_time_total / iterations)]
            total = sum(t for _, t in kernels)
            parts = ", ".join(f"{key[:60]} {t:.1f}" for key, t in kernels)
            print(f"b={batch} ctx={context} {name}: {total:.1f} us in kernels: {parts}", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--label", default="")
    parser.add_argument("--shapes", default=DEFAULT_SHAPES, help="batch:context pairs")
    parser.add_argument("--kernels", action="store_true")
    args = parser.parse_args()
    shapes = parse_shapes(args.shapes)
    if args.kernels:
        kernel_table(shapes)
    else:
        time_table(shapes, args.label)


if __name__ == "__main__":
    main()
