"""The backward at wide head dims (192, 256) on Hopper: our default (the head-split wgmma kernel),
our sm80 kernel (FLASH_ATTN_SM90_BWD=cpasync, read per call), SDPA cuDNN and SDPA flash, in one
process. The speed suite needs hidden / headdim whole (2048 / 192 is not), so this script uses
2048 // headdim heads (10 at hd 192, 8 at hd 256), 16k tokens, bf16; TFLOP/s of the backward
(2.5 forwards, causal halved), do_bench median, L2 flushed per run. Peers that fail print `error`.

    python benchmarks/experiments/wide_head_backward.py [--headdims 192,256] [--seqlens 512,2048,8192,16384]
"""

import argparse
import os

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from flash_attn import flash_attn_func

TOKENS = 16384


def backward_ms(make_out, leaves, dout):
    out = make_out()
    grad = lambda: torch.autograd.grad(out, leaves, dout, retain_graph=True)  # noqa: E731
    grad()
    return do_bench(grad, warmup=25, rep=100, return_mode="median")


def ours(q, k, v, dout, causal, kernel):
    os.environ.pop("FLASH_ATTN_SM90_BWD", None)
    if kernel == "sm80":
        os.environ["FLASH_ATTN_SM90_BWD"] = "cpasync"
    try:
        return backward_ms(lambda: flash_attn_func(q, k, v, causal=causal), (q, k, v), dout)
    finally:
        os.environ.pop("FLASH_ATTN_SM90_BWD", None)


def sdpa(q, k, v, dout, causal, backend):
    qt, kt, vt, dt = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v, dout))
    with sdpa_kernel([backend]):
        return backward_ms(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal), (qt, kt, vt),
                           dt.detach())


def row(headdim, seqlen, causal):
    heads, batch = 2048 // headdim, TOKENS // seqlen
    q, k, v, dout = (torch.randn(batch, seqlen, heads, headdim, device="cuda", dtype=torch.bfloat16)
                     for _ in range(4))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    flops = 2.5 * 4 * batch * seqlen * seqlen * heads * headdim / (2 if causal else 1)
    cells = {}
    for name, fn in (("ours", lambda: ours(q, k, v, dout, causal, "default")),
                     ("ours sm80", lambda: ours(q, k, v, dout, causal, "sm80")),
                     ("cudnn", lambda: sdpa(q, k, v, dout, causal, SDPBackend.CUDNN_ATTENTION)),
                     ("flash", lambda: sdpa(q, k, v, dout, causal, SDPBackend.FLASH_ATTENTION))):
        try:
            cells[name] = flops / fn() / 1e9
        except RuntimeError:
            cells[name] = None
    text = [f"{cells[n]:.1f}" if cells[n] else "error" for n in cells]
    ratio = f"{cells['ours'] / cells['cudnn']:.2f}" if cells["ours"] and cells["cudnn"] else "-"
    print(f"| {headdim} | {seqlen} | {causal} | {heads} | {' | '.join(text)} | {ratio} |", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--headdims", default="192,256")
    parser.add_argument("--seqlens", default="512,2048,8192,16384")
    args = parser.parse_args()
    print(torch.cuda.get_device_name(), "bf16, 16k tokens, backward TFLOP/s")
    print("| hd | seqlen | causal | heads | ours | ours sm80 | sdpa cudnn | sdpa flash | ours / cudnn |")
    print("|---|---|---|---|---|---|---|---|---|")
    for headdim in (int(h) for h in args.headdims.split(",")):
        for seqlen in (int(s) for s in args.seqlens.split(",")):
            for causal in (False, True):
                row(headdim, seqlen, causal)


if __name__ == "__main__":
    main()
