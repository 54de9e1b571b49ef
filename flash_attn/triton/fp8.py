"""Host side of the fp8 e4m3 forward on the Triton backend (FlashAttention 3's FP8 API): q, k, v
float8_e4m3fn with descales q_descale, k_descale, v_descale, each float32 (batch, nheads_k) or None
(1.0), out bfloat16. The kernel is the forward of attention.py with IS_FP8 (fp8_kernels.py says
what it computes); causal / local windows, softcap, ALiBi, GQA and varlen work as in the other
dtypes. Forward only: FlashAttention 3 has no fp8 backward either (ops.py's autograd formula
raises). The public functions' checks are in flash_attn/validation_fp8.py.
"""

import torch

from . import attention


def stacked_descales(q_descale, k_descale, v_descale, batch, heads_k, device):
    """The (3, batch, heads_k) float32 contiguous stack the kernel reads, 1.0 for an absent descale
    (FlashAttention 3's default; the ones are made only where one is absent)."""
    descales = (q_descale, k_descale, v_descale)
    if any(d is None for d in descales):
        ones = torch.ones((batch, heads_k), dtype=torch.float32, device=device)
        descales = tuple(ones if d is None else d for d in descales)
    return torch.stack([d.float() for d in descales])


def forward_fp8(q, k, v, q_descale, k_descale, v_descale, softmax_scale, window=(-1, -1), softcap=0.0,
                alibi_slopes=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None):
    """(out bfloat16, lse float32) of float8_e4m3fn q, k, v, dense (batch, seqlen, heads, headdim) or
    varlen (total, heads, headdim) with cu_seqlens, as attention.forward lays them out."""
    batch = q.shape[0] if cu_seqlens_q is None else cu_seqlens_q.numel() - 1
    descales = stacked_descales(q_descale, k_descale, v_descale, batch, k.shape[-2], q.device)
    return attention.forward(q, k, v, softmax_scale, window=window, softcap=softcap, alibi_slopes=alibi_slopes,
                             cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                             max_seqlen_k=max_seqlen_k, descales=descales)
