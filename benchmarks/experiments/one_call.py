"""One attention call for a profiler or a compiler dump to catch (ncu_shapes.sh, fa4_sass.sh): bf16,
hidden 2048, batch x seqlen = 16k tokens (the speed suite's shapes), the forward and, for PASS bwd,
its backward.

    python benchmarks/experiments/one_call.py HEADDIM SEQLEN CAUSAL(0|1) PASS(fwd|bwd) WHO

WHO: ours | ours-det (deterministic=True) | ours-fp8 (e4m3 q, k, v; forward) | fa4 (FlashAttention 4,
importable) | cudnn (SDPA's cuDNN backend).
"""

import sys
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import flash_attn
headdim, seqlen, causal, pass_, who = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4], sys.argv[5]
shape = (16384 // seqlen, seqlen, 2048 // headdim, headdim)
q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=pass_ == "bwd") for _ in range(3))
if who == "ours-fp8":
    out = flash_attn.flash_attn_func(*(t.to(torch.float8_e4m3fn) for t in (q, k, v)), causal=causal)
elif who == "fa4":
    from flash_attn.benchmark import impls
    out = impls.fa4_forward(q, k, v, causal)
elif who.startswith("ours"):
    out = flash_attn.flash_attn_func(q, k, v, causal=causal, deterministic=who == "ours-det")
else:
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=causal)
if pass_ == "bwd":
    out.backward(torch.randn_like(out))
torch.cuda.synchronize()
