"""Public functions, with FlashAttention 2's names, argument names, defaults and return values,
so that switching is a change of import.

Dense tensors are (batch, seqlen, nheads, headdim), varlen ones (total_tokens, nheads, headdim)
with cu_seqlens; float16, bfloat16 or float32.
CUDA tensors run our kernels (sm80 or newer), float32 ones the Triton backend (flash_attn/triton;
FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE sends every call there; backend.py chooses); CPU tensors run the exact chunked
fp32 reference, which is correct but slow. float8_e4m3fn inputs (FlashAttention 3's FP8 API: keyword
arguments q_descale, k_descale, v_descale of flash_attn_func and flash_attn_varlen_func) run the CUDA
fp8 forward on Hopper or the Triton backend's (backend.py chooses), with a bfloat16 output; there is
no fp8 backward.
"""

from . import backend, paged_prefill, validation, validation_fp8
from .attention_probs import dropout_attention_probs
from .headdim import pad_headdim, padded_headdim, unpad_headdim
from .reference import normalize_window


NO_DESCALES = (None, None, None)


def _attention(q, k, v, varlen, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
               deterministic, return_attn_probs, descales=NO_DESCALES):
    """varlen: None for dense tensors, else (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k);
    descales: (q_descale, k_descale, v_descale) of float8_e4m3fn inputs."""
    validation.check_qkv(q, k, v, varlen=varlen is not None)
    if varlen is None:
        batch, seqlen_k = q.shape[0], k.shape[1]
        cu_seqlens_q = cu_seqlens_k = None
        max_seqlen_q, max_seqlen_k = q.shape[1], seqlen_k
    else:
        cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k = varlen
        validation.check_cu_seqlens(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, q)
        batch, seqlen_k = cu_seqlens_q.shape[0] - 1, max_seqlen_k
    validation.check_options(dropout_p, window_size, softcap, alibi_slopes, deterministic, q, batch)
    validation_fp8.check_descales(q, k, descales, batch)
    headdim = q.shape[-1]
    softmax_scale = validation.softmax_scale_or_default(softmax_scale, headdim)
    window_left, window_right = normalize_window(window_size, causal, seqlen_k)
    if validation_fp8.is_fp8(q):
        validation_fp8.check_fp8_call(q, dropout_p)
        out, softmax_lse = backend.fp8_forward_op(q, varlen is not None, softcap, alibi_slopes)(
            q, k, v, *descales, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, float(softmax_scale),
            window_left, window_right, float(softcap), alibi_slopes)
        return (out, softmax_lse, None) if return_attn_probs else out
    headdim_padded = padded_headdim(headdim)
    q, k, v = (pad_headdim(t, headdim_padded) for t in (q, k, v))
    out, softmax_lse, rng_state = backend.op_for(q, "fwd")(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, float(dropout_p), float(softmax_scale),
        window_left, window_right, float(softcap), alibi_slopes, deterministic)
    out = unpad_headdim(out, headdim)
    if not return_attn_probs:
        return out
    probs = None  # S_dmask exists only with dropout, as in FlashAttention 2
    if dropout_p > 0:
        probs = dropout_attention_probs(q.detach(), k.detach(), varlen, float(softmax_scale),
                                        (window_left, window_right), float(softcap), alibi_slopes,
                                        float(dropout_p), rng_state, headdim)
    return out, softmax_lse, probs


def _paged_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
                     causal, window_size, softcap, alibi_slopes, return_attn_probs, block_table):
    """flash_attn_varlen_func with block_table (paged_prefill.py)."""
    paged_prefill.check_paged_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, block_table,
                                     dropout_p)
    validation.check_options(0.0, window_size, softcap, alibi_slopes, False, q, cu_seqlens_q.shape[0] - 1)
    headdim = q.shape[-1]
    softmax_scale = validation.softmax_scale_or_default(softmax_scale, headdim)
    window = normalize_window(window_size, causal, max_seqlen_k)
    headdim_padded = padded_headdim(headdim)
    q, k, v = (pad_headdim(t, headdim_padded) for t in (q, k, v))
    out, softmax_lse = paged_prefill.paged_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                                          block_table.contiguous(), float(softmax_scale), window,
                                                          float(softcap), alibi_slopes)
    out = unpad_headdim(out, headdim)
    return (out, softmax_lse, None) if return_attn_probs else out


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False, *, q_descale=None,
                    k_descale=None, v_descale=None):
    """softmax(q k^T * softmax_scale [+ modifiers]) v, with dropout on the probabilities.

    q: (batch, seqlen_q, nheads, headdim); k, v: (batch, seqlen_k, nheads_k, headdim), with nheads
    a multiple of nheads_k (MQA / GQA). headdim <= 256 (padded to a multiple of 8 internally).
    softmax_scale defaults to 1 / sqrt(headdim). causal=True masks key j for query i when
    j > i + seqlen_k - seqlen_q (bottom-right aligned, as FlashAttention >= 2.1); window_size
    (left, right) keeps keys j in [i + seqlen_k - seqlen_q - left, i + seqlen_k - seqlen_q + right]
    (-1: unbounded on that side). softcap > 0 caps scores to softcap * tanh(score / softcap).
    alibi_slopes (nheads,) or (batch, nheads) float32 adds -slope * |i + seqlen_k - seqlen_q - j|.
    dropout_p drops probabilities with a Philox mask seeded from torch's generator (recomputed in the
    backward). deterministic=True makes the backward bitwise reproducible. A query that sees no key
    gets a zero output row and lse = +inf.

    Returns out (batch, seqlen_q, nheads, headdim), or with return_attn_probs=True the tuple
    (out, softmax_lse (batch, nheads, seqlen_q) float32, S_dmask), S_dmask None without dropout
    (see attention_probs.dropout_attention_probs; for testing only).

    fp8 (FlashAttention 3's FP8 API, forward only): q, k, v float8_e4m3fn, and q_descale, k_descale,
    v_descale float32 (batch, nheads_k) or None (1.0): the attention of q * q_descale, k * k_descale,
    v * v_descale (each KV head's descale shared by its query heads), out bfloat16; no dropout; runs
    the Triton backend (a GPU of sm89 or newer, or TRITON_INTERPRET=1 for CPU tensors).
    """
    return _attention(q, k, v, None, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                      deterministic, return_attn_probs, (q_descale, k_descale, v_descale))


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                              softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash_attn_func with qkv packed as (batch, seqlen, 3, nheads, headdim).
    The gradient w.r.t. qkv is assembled by autograd from the three slices, no copy of the input."""
    validation.check_packed("qkv", qkv, rank=5, packed_dim=2, packed_size=3)
    q, k, v = qkv.unbind(dim=2)
    return _attention(q, k, v, None, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                      deterministic, return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash_attn_func with k and v packed as kv (batch, seqlen_k, 2, nheads_k, headdim)."""
    validation.check_packed("kv", kv, rank=5, packed_dim=2, packed_size=2)
    k, v = kv.unbind(dim=2)
    return _attention(q, k, v, None, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                      deterministic, return_attn_probs)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None, *, q_descale=None,
                           k_descale=None, v_descale=None):
    """flash_attn_func over a batch of sequences of different lengths, concatenated.

    q: (total_q, nheads, headdim); k, v: (total_k, nheads_k, headdim); cu_seqlens_q / cu_seqlens_k:
    int32 (batch + 1,), sequence b holding rows cu_seqlens[b]:cu_seqlens[b + 1]; max_seqlen_q /
    max_seqlen_k: the longest sequence (python ints). Masks and ALiBi positions are per sequence.
    Offsets are clamped to the tensors' rows, so bad offsets cannot make the kernels touch memory
    outside q, k, v; rows outside every sequence are left unwritten in out (as in FlashAttention 2).
    Returns out (total_q, nheads, headdim), or (out, softmax_lse (nheads, total_q), S_dmask).
    block_table (batch, max_pages) int32: k and v are paged caches (num_pages, page_size, nheads_k,
    headdim), page_size a multiple of 16, sequence b's keys the first cu_seqlens_k[b + 1] -
    cu_seqlens_k[b] positions of its pages (paged prefill: forward only, no dropout, as in FA2).
    q_descale, k_descale, v_descale: float32 (batch, nheads_k) for float8_e4m3fn q, k, v, as in
    flash_attn_func (not with block_table).
    """
    descales = (q_descale, k_descale, v_descale)
    if block_table is not None:
        validation_fp8.check_descales(q, k, descales, cu_seqlens_q.shape[0] - 1)
        return _paged_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                                softmax_scale, causal, window_size, softcap, alibi_slopes, return_attn_probs,
                                block_table)
    return _attention(q, k, v, (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k), dropout_p, softmax_scale,
                      causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs, descales)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None, causal=False,
                                     window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False):
    """flash_attn_varlen_func with qkv packed as (total, 3, nheads, headdim), one cu_seqlens."""
    validation.check_packed("qkv", qkv, rank=4, packed_dim=1, packed_size=3)
    q, k, v = qkv.unbind(dim=1)
    return _attention(q, k, v, (cu_seqlens, cu_seqlens, max_seqlen, max_seqlen), dropout_p, softmax_scale, causal,
                      window_size, softcap, alibi_slopes, deterministic, return_attn_probs)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                                    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash_attn_varlen_func with k and v packed as kv (total_k, 2, nheads_k, headdim)."""
    validation.check_packed("kv", kv, rank=4, packed_dim=1, packed_size=2)
    k, v = kv.unbind(dim=1)
    return _attention(q, k, v, (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k), dropout_p, softmax_scale,
                      causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs)
