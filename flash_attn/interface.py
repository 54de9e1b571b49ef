"""Public functions, with FlashAttention 2's names, argument names, defaults and return values,
so that switching is a change of import.

Tensors are (batch, seqlen, nheads, headdim), float16 or bfloat16. CUDA tensors run our kernels
(sm80 or newer); CPU tensors run the exact chunked fp32 reference, which is correct but slow.
"""

import torch
import torch.nn.functional as F

from . import ops  # noqa: F401 - importing it defines torch.ops.flash_attn.fwd / bwd
from . import validation
from .reference import default_softmax_scale

_HEADDIM_ALIGNMENT = 8  # the kernels move rows in 16-byte pieces


def _pad_headdim(t, headdim_padded):
    """Zeros appended to the head dim change no score and no output column."""
    return t if t.shape[-1] == headdim_padded else F.pad(t, (0, headdim_padded - t.shape[-1]))


def _attention(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
               return_attn_probs):
    validation.check_qkv(q, k, v)
    validation.check_not_yet_implemented(dropout_p, window_size, softcap, alibi_slopes, deterministic)
    headdim = q.shape[-1]
    if softmax_scale is None:
        softmax_scale = default_softmax_scale(headdim)
    validation.check_softmax_scale(softmax_scale)
    headdim_padded = -(-headdim // _HEADDIM_ALIGNMENT) * _HEADDIM_ALIGNMENT
    q, k, v = (_pad_headdim(t, headdim_padded) for t in (q, k, v))
    out, softmax_lse = torch.ops.flash_attn.fwd(q, k, v, float(softmax_scale), bool(causal))
    out = out[..., :headdim]
    if return_attn_probs:
        return out, softmax_lse, None  # S_dmask exists only with dropout, as in FlashAttention 2
    return out


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """Exact softmax(q k^T * softmax_scale) v.

    q: (batch, seqlen_q, nheads, headdim); k, v: (batch, seqlen_k, nheads_k, headdim), with nheads
    a multiple of nheads_k (MQA / GQA). headdim <= 256 (padded to a multiple of 8 internally).
    softmax_scale defaults to 1 / sqrt(headdim). causal=True masks key j for query i when
    j > i + seqlen_k - seqlen_q (bottom-right aligned, as FlashAttention >= 2.1); a query that sees
    no key gets a zero output row and lse = +inf.
    dropout_p, window_size, softcap, alibi_slopes and deterministic accept only their defaults in
    this version and raise NotImplementedError otherwise.

    Returns out (batch, seqlen_q, nheads, headdim), or with return_attn_probs=True the tuple
    (out, softmax_lse (batch, nheads, seqlen_q) float32, None).
    """
    return _attention(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                      return_attn_probs)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                              softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash_attn_func with qkv packed as (batch, seqlen, 3, nheads, headdim).
    The gradient w.r.t. qkv is assembled by autograd from the three slices, no copy of the input."""
    validation.check_packed("qkv", qkv, rank=5, packed_dim=2, packed_size=3)
    q, k, v = qkv.unbind(dim=2)
    return _attention(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                      return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash_attn_func with k and v packed as kv (batch, seqlen_k, 2, nheads_k, headdim)."""
    validation.check_packed("kv", kv, rank=5, packed_dim=2, packed_size=2)
    k, v = kv.unbind(dim=2)
    return _attention(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                      return_attn_probs)
