"""flash_attn_with_kvcache: FlashAttention 2's inference entry point, same arguments and semantics.

CUDA tensors run our kernels: an append kernel (new tokens into the cache, keys rotated), a
split-KV decode kernel (query heads of a KV head packed into one tile and rotated as they are
loaded, the keys split across CTAs, contiguous or paged caches) and a combine kernel. float32 CUDA tensors, and every call with
FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE, run the Triton backend's (flash_attn/triton/kvcache.py;
backend.py chooses). CPU tensors run reference_kvcache.py.
"""

import torch

from . import backend, validation, validation_kvcache
from .headdim import pad_headdim, padded_headdim
from .reference import normalize_window
from .reference_kvcache import cache_capacity


def _cache_seqlens_tensor(cache_seqlens, batch, capacity, device):
    """FA2 takes an int, a (batch,) int32 tensor, or None (the whole cache is valid)."""
    if cache_seqlens is None:
        cache_seqlens = capacity
    if isinstance(cache_seqlens, int):
        return torch.full((batch,), cache_seqlens, dtype=torch.int32, device=device)
    return cache_seqlens


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False):
    """Attention of q over a KV cache, appending k / v to the cache first (in place).

    q: (batch, seqlen_q, nheads, headdim). k_cache, v_cache: (batch_cache, seqlen_cache, nheads_k,
    headdim), or paged (num_pages, page_size, nheads_k, headdim) with block_table (batch, max_pages)
    int32, page_size any multiple of 16. k, v: (batch, seqlen_new, nheads_k, headdim) new tokens,
    written at positions cache_seqlens[b] .. + seqlen_new (tokens past the cache's end are dropped).
    rotary_cos / rotary_sin (seqlen_ro, rotary_dim / 2): rotary embedding applied to q and the new
    k at their positions (q at cache_seqlens[b] + t with causal or local attention, else at
    cache_seqlens[b]), interleaved (GPT-J) or not (GPT-NeoX). cache_seqlens: int or (batch,) int32,
    tokens already in the cache (None: the whole cache). cache_batch_idx (batch,) int32: the cache
    entry of each batch entry. cache_leftpad (batch,) int32: the first valid cache position.
    causal / window_size / softcap / alibi_slopes as in flash_attn_func, bottom-right aligned to the
    attended keys [cache_leftpad, cache_seqlens + seqlen_new). num_splits: how many CTAs share one
    sequence's keys (0: chosen from the SM count, batch x nheads_k and the cache length).

    Returns out (batch, seqlen_q, nheads, headdim), and softmax_lse (batch, nheads, seqlen_q) float32
    with return_softmax_lse=True.
    """
    validation_kvcache.check_kvcache_tensors(q, k_cache, v_cache, k, v, block_table)
    batch, headdim = q.shape[0], q.shape[-1]
    capacity = cache_capacity(k_cache, block_table)
    validation_kvcache.check_kvcache_metadata(q, k_cache, cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
                                              k is not None)
    validation_kvcache.check_rotary(q, rotary_cos, rotary_sin, rotary_interleaved, capacity)
    validation.check_options(0.0, window_size, softcap, alibi_slopes, False, q, batch)
    validation_kvcache.check_call_flags(causal, num_splits, return_softmax_lse)
    softmax_scale = validation.softmax_scale_or_default(softmax_scale, headdim)
    window_left, window_right = normalize_window(window_size, causal, capacity)
    cache_seqlens = _cache_seqlens_tensor(cache_seqlens, batch, capacity, q.device)
    cache_seqlens, cache_batch_idx, cache_leftpad, block_table, rotary_cos, rotary_sin = (
        None if t is None else t.contiguous()
        for t in (cache_seqlens, cache_batch_idx, cache_leftpad, block_table, rotary_cos, rotary_sin))
    headdim_padded = padded_headdim(headdim)
    q_op, k_cache_op, v_cache_op, k_op, v_op = (pad_headdim(t, headdim_padded) for t in (q, k_cache, v_cache, k, v))
    out, softmax_lse = backend.op_for(q, "fwd_kvcache")(
        q_op, k_cache_op, v_cache_op, k_op, v_op, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
        cache_leftpad, block_table, float(softmax_scale), window_left, window_right, float(softcap),
        bool(rotary_interleaved), alibi_slopes, int(num_splits))
    if headdim_padded != headdim:  # the op appended to padded copies: bring the new tokens home
        out = out[..., :headdim]
        if k is not None:
            k_cache.copy_(k_cache_op[..., :headdim])
            v_cache.copy_(v_cache_op[..., :headdim])
    return (out, softmax_lse) if return_softmax_lse else out
