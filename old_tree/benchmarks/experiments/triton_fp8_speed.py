"""Issue #9's fp8 target, measured: the Triton backend's fp8 e4m3 forward against its bf16 forward
(target: >= 1.3x at head dim 128, seqlen >= 4k), with autotuning off and on. Hidden 2048 (16 heads),
16k tokens, non-causal and causal; do_bench median, L2 flushed per run; TFLOP/s of the forward.

    FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE python benchmarks/experiments/triton_fp8_speed.py
"""

import os

import torch
from triton.testing import do_bench

from flash_attn import flash_attn_func

HEADDIM, HEADS, TOKENS = 128, 16, 16384
FP8 = torch.float8_e4m3fn


def tflops(seqlen, batch, causal, ms):
    flops = 4 * batch * seqlen * seqlen * HEADS * HEADDIM / (2 if causal else 1)
    return flops / ms / 1e9


def time_forward(seqlen, causal):
    """(bf16 TFLOP/s, fp8 TFLOP/s) of the same problem; fp8 inputs quantized with unit descales."""
    batch = TOKENS // seqlen
    q, k, v = (torch.randn(batch, seqlen, HEADS, HEADDIM, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    q8, k8, v8 = (t.to(FP8) for t in (q, k, v))
    ones = torch.ones(batch, HEADS, device="cuda", dtype=torch.float32)
    bf16 = do_bench(lambda: flash_attn_func(q, k, v, causal=causal), warmup=25, rep=100, return_mode="median")
    fp8 = do_bench(lambda: flash_attn_func(q8, k8, v8, causal=causal, q_descale=ones, k_descale=ones, v_descale=ones),
                   warmup=25, rep=100, return_mode="median")
    return tflops(seqlen, batch, causal, bf16), tflops(seqlen, batch, causal, fp8)


def main():
    assert os.environ.get("FLASH_ATTENTION_TRITON_AMD_ENABLE", "").upper() == "TRUE", "run with the Triton switch on"
    print(f"{torch.cuda.get_device_name()}, hd {HEADDIM}, {HEADS} heads, {TOKENS} tokens, forward TFLOP/s")
    print("| autotune | seqlen | causal | bf16 | fp8 | fp8 / bf16 |")
    print("|---|---|---|---|---|---|")
    for autotune in ("FALSE", "TRUE"):
        os.environ["FLASH_ATTENTION_TRITON_AMD_AUTOTUNE"] = autotune
        for seqlen in (4096, 8192):
            for causal in (False, True):
                bf16, fp8 = time_forward(seqlen, causal)
                print(f"| {autotune.lower()} | {seqlen} | {causal} | {bf16:.1f} | {fp8:.1f} | {fp8 / bf16:.2f} |",
                      flush=True)


if __name__ == "__main__":
    main()
