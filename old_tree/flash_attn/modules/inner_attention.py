"""The attention step of MHA, on projected q (..., nheads, headdim) and packed kv (..., 2, nheads_kv,
headdim): dense, variable-length (cu_seqlens), or padded (key_padding_mask), the last run as
variable-length attention on the valid tokens only, which is how FlashAttention 2 handles padding
(flash_attn.bert_padding) and keeps padded keys out of the work as well as out of the softmax."""

import dataclasses
from typing import Optional, Tuple

import torch

from ..bert_padding import index_first_axis, pad_input, unpad_input
from ..interface import flash_attn_kvpacked_func, flash_attn_varlen_kvpacked_func


@dataclasses.dataclass(frozen=True)
class AttentionOptions:
    """The options every attention call of one MHA forward shares (FA2's argument names)."""

    dropout_p: float
    softmax_scale: Optional[float]
    causal: bool
    window_size: Tuple[int, int]
    alibi_slopes: Optional[torch.Tensor]

    def kwargs(self):
        return dict(dropout_p=self.dropout_p, softmax_scale=self.softmax_scale, causal=self.causal,
                    window_size=self.window_size, alibi_slopes=self.alibi_slopes)


def dense_attention(q, kv, options):
    """q (batch, seqlen_q, nheads, headdim), kv (batch, seqlen_k, 2, nheads_kv, headdim)."""
    return flash_attn_kvpacked_func(q, kv, **options.kwargs())


def varlen_attention(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, options):
    """q (total_q, nheads, headdim), kv (total_k, 2, nheads_kv, headdim) packed by cu_seqlens."""
    return flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                           **options.kwargs())


def padded_attention(q, kv, key_padding_mask, options, mask_covers_queries):
    """Dense q and kv with key_padding_mask (batch, seqlen_k), True / nonzero for valid tokens.

    mask_covers_queries (self-attention): the mask selects the queries too; each sequence is its
    valid tokens back to back, and the outputs at padded positions are 0. Otherwise (cross-attention)
    every query is valid and attends to the valid keys of its sample. Positions inside a sequence
    (causal, window, ALiBi) are those of the packed valid tokens, as in FA2's unpadded models."""
    batch, seqlen_q = q.shape[:2]
    kv_packed, indices_k, cu_seqlens_k, max_seqlen_k, _ = unpad_input(kv, key_padding_mask)
    if mask_covers_queries:
        q_packed = index_first_axis(q.flatten(0, 1), indices_k)
        out = varlen_attention(q_packed, kv_packed, cu_seqlens_k, cu_seqlens_k, max_seqlen_k, max_seqlen_k, options)
        return pad_input(out, indices_k, batch, seqlen_q)
    cu_seqlens_q = torch.arange(0, (batch + 1) * seqlen_q, seqlen_q, dtype=torch.int32, device=q.device)
    out = varlen_attention(q.flatten(0, 1), kv_packed, cu_seqlens_q, cu_seqlens_k, seqlen_q, max_seqlen_k, options)
    return out.unflatten(0, (batch, seqlen_q))
