"""Forward A/B on Hopper: the warp-specialized TMA kernel (with its default grid, persistent where
every tile has the same work, and with one CTA per tile: FLASH_ATTN_SM90_FWD_GRID=tiles) against the
cp.async one (FLASH_ATTN_SM90_FWD=cpasync; both variables are read per call, so everything runs in
this one process) and SDPA's cuDNN backend, on BENCHMARKS.md's training shapes (bf16, hidden 2048,
batch x seqlen = 16k), plus the cost of dropout 0.1 on each kernel. First checks that the kernels
agree on every shape.

    python benchmarks/experiments/fwd_pipeline_ab.py [--headdims 64,128] [--seqlens 512,2048,4096,8192,16384]

Prints a markdown table: TFLOP/s (causal counts half the FLOPs) and the ratios.
"""

import argparse
import os

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from flash_attn import flash_attn_func

HIDDEN, TOKENS = 2048, 16384


def ours(kernel, q, k, v, causal, dropout_p=0.0):
    """kernel: ws, ws-tiles (one CTA per tile) or cpasync."""
    os.environ["FLASH_ATTN_SM90_FWD"] = kernel.split("-")[0]
    os.environ["FLASH_ATTN_SM90_FWD_GRID"] = "tiles" if kernel == "ws-tiles" else "default"
    return flash_attn_func(q, k, v, dropout_p=dropout_p, causal=causal)


def cudnn(q, k, v, causal):
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal)
    return out.transpose(1, 2)


def timed_ms(fn):
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def row(headdim, seqlen, causal):
    heads, batch = HIDDEN // headdim, TOKENS // seqlen
    q, k, v = (torch.randn(batch, seqlen, heads, headdim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    ws, tiles, cp = (ours(kernel, q, k, v, causal) for kernel in ("ws", "ws-tiles", "cpasync"))
    diff = max((ws.float() - cp.float()).abs().max().item(), (ws.float() - tiles.float()).abs().max().item())
    flops = 4 * batch * heads * seqlen * seqlen * headdim / (2 if causal else 1)
    ms = {
        "ws": timed_ms(lambda: ours("ws", q, k, v, causal)),
        "ws_tiles": timed_ms(lambda: ours("ws-tiles", q, k, v, causal)),
        "cpasync": timed_ms(lambda: ours("cpasync", q, k, v, causal)),
        "cudnn": timed_ms(lambda: cudnn(q, k, v, causal)),
        "ws_drop": timed_ms(lambda: ours("ws", q, k, v, causal, 0.1)),
        "cpasync_drop": timed_ms(lambda: ours("cpasync", q, k, v, causal, 0.1)),
    }
    tflops = {name: flops / t / 1e9 for name, t in ms.items()}
    print(f"| {headdim} | {seqlen} | {int(causal)} | {tflops['ws']:.0f} | {tflops['ws_tiles']:.0f} | "
          f"{tflops['cpasync']:.0f} | "
          f"{tflops['cudnn']:.0f} | {ms['cpasync'] / ms['ws']:.3f} | {ms['cudnn'] / ms['ws']:.3f} | "
          f"{ms['cudnn'] / ms['cpasync']:.3f} | {ms['ws_drop'] / ms['ws'] - 1:+.0%} | "
          f"{ms['cpasync_drop'] / ms['cpasync'] - 1:+.0%} | {diff:.1e} |", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--headdims", default="64,128")
    parser.add_argument("--seqlens", default="512,2048,4096,8192,16384")
    args = parser.parse_args()
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "cudnn", torch.backends.cudnn.version())
    print("| hd | seqlen | causal | ws TFLOP/s | ws, CTA per tile | cp.async | cuDNN | ws / cp.async | ws / cuDNN "
          "| cp.async / cuDNN | dropout 0.1 ws | dropout cp.async | max abs diff between the kernels |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for headdim in map(int, args.headdims.split(",")):
        for seqlen in map(int, args.seqlens.split(",")):
            for causal in (False, True):
                row(headdim, seqlen, causal)


if __name__ == "__main__":
    main()
