"""Argument checks of flash_attn_with_kvcache: every problem is reported, naming the argument, before
any kernel runs. Values held on the GPU (cache_seqlens, block_table entries) are not read here: the
kernels clamp them so that no value makes them touch memory outside the cache."""

import torch

from .validation import (ATTENTION_DTYPES, MAX_HEADDIM, check_cuda_capability, check_last_dim_contiguous,
                         check_like_q, check_tensor, check_typed_tensor)

PAGE_MULTIPLE = 16


def check_kvcache_tensors(q, k_cache, v_cache, k, v, block_table, cache_names=("k_cache", "v_cache")):
    """q (b, sq, h, d); caches (entries or pages, rows, hk, d); new k / v (b, s_new, hk, d). cache_names:
    what the caller calls the caches (paged flash_attn_varlen_func: k and v)."""
    k_name, v_name = cache_names
    check_tensor("q", q, 4, "(batch, seqlen_q, nheads, headdim)")
    cache_dims = "(num_pages, page_size, nheads_k, headdim)" if block_table is not None else \
        "(batch_cache, seqlen_cache, nheads_k, headdim)"
    check_tensor(k_name, k_cache, 4, cache_dims)
    check_tensor(v_name, v_cache, 4, cache_dims)
    if q.dtype not in ATTENTION_DTYPES:  # float32: the Triton backend on CUDA, the reference on CPU
        raise TypeError(f"flash_attn: q has dtype {q.dtype}; supported dtypes are float16, bfloat16 and float32")
    check_last_dim_contiguous("q", q)
    check_like_q(k_name, k_cache, q)
    check_like_q(v_name, v_cache, q)
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"flash_attn: {k_name} and {v_name} must have one shape, got {tuple(k_cache.shape)} and "
                         f"{tuple(v_cache.shape)}")
    headdim, nheads, nheads_k = q.shape[3], q.shape[2], k_cache.shape[2]
    if not 1 <= headdim <= MAX_HEADDIM:
        raise ValueError(f"flash_attn: headdim {headdim} is not supported; it must be between 1 and {MAX_HEADDIM}")
    if k_cache.shape[3] != headdim:
        raise ValueError(f"flash_attn: {k_name} has headdim {k_cache.shape[3]} but q has headdim {headdim}")
    if nheads_k == 0 or nheads % nheads_k != 0:
        raise ValueError(f"flash_attn: nheads of q ({nheads}) must be a multiple of nheads of {k_name} ({nheads_k})")
    if (k is None) != (v is None):
        raise ValueError("flash_attn: k and v (the new tokens) must be given together")
    if k is not None:
        for name, t in (("k", k), ("v", v)):
            check_tensor(name, t, 4, "(batch, seqlen_new, nheads_k, headdim)")
            check_like_q(name, t, q)
            if t.shape[0] != q.shape[0] or t.shape[2] != nheads_k or t.shape[3] != headdim:
                raise ValueError(f"flash_attn: {name} must have shape (batch, seqlen_new, nheads_k, headdim) = "
                                 f"({q.shape[0]}, seqlen_new, {nheads_k}, {headdim}), got {tuple(t.shape)}")
        if k.shape != v.shape:
            raise ValueError(f"flash_attn: k and v must have one shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if q.is_cuda and not torch.compiler.is_compiling():
        check_cuda_capability(q.device)


def _check_int32_vector(name, t, q):
    check_typed_tensor(name, t, torch.int32, q.device)
    if t.dim() != 1 or t.shape[0] != q.shape[0]:
        raise ValueError(f"flash_attn: {name} must have shape (batch,) = ({q.shape[0]},), got {tuple(t.shape)}")


def check_kvcache_metadata(q, k_cache, cache_seqlens, cache_batch_idx, cache_leftpad, block_table, has_new_tokens):
    if cache_seqlens is None:
        if has_new_tokens:
            raise ValueError("flash_attn: cache_seqlens is needed to append k and v (where the new tokens go)")
    elif isinstance(cache_seqlens, int) and not isinstance(cache_seqlens, bool):
        if cache_seqlens < 0:
            raise ValueError(f"flash_attn: cache_seqlens must be >= 0, got {cache_seqlens}")
    else:
        _check_int32_vector("cache_seqlens", cache_seqlens, q)
    for name, t in (("cache_batch_idx", cache_batch_idx), ("cache_leftpad", cache_leftpad)):
        if t is not None:
            _check_int32_vector(name, t, q)
    if block_table is None:
        if cache_batch_idx is None and k_cache.shape[0] < q.shape[0]:
            raise ValueError(f"flash_attn: k_cache has {k_cache.shape[0]} batch entries but q has batch {q.shape[0]}; "
                             "pass cache_batch_idx to choose entries")
        return
    if cache_batch_idx is not None:
        raise ValueError("flash_attn: cache_batch_idx cannot be used with block_table (a paged cache chooses its pages "
                         "per batch entry through block_table)")
    check_block_table(block_table, q.shape[0], q.device, k_cache)


def check_block_table(block_table, batch, device, k_cache, cache_name="k_cache"):
    """block_table (batch, max_pages) int32 on q's device into a paged cache of pages of a multiple of
    16 rows."""
    check_typed_tensor("block_table", block_table, torch.int32, device)
    if block_table.dim() != 2 or block_table.shape[0] != batch or block_table.shape[1] == 0:
        raise ValueError(f"flash_attn: block_table must have shape (batch, max_pages) with batch = {batch} and "
                         f"max_pages >= 1, got {tuple(block_table.shape)}")
    page_size = k_cache.shape[1]
    if page_size == 0 or page_size % PAGE_MULTIPLE != 0:
        raise ValueError(f"flash_attn: the paged cache's page size ({cache_name}.shape[1]) must be a multiple of "
                         f"{PAGE_MULTIPLE}, got {page_size}")
    if k_cache.shape[0] == 0:
        raise ValueError(f"flash_attn: the paged cache has no pages ({cache_name}.shape[0] == 0)")


def check_rotary(q, rotary_cos, rotary_sin, rotary_interleaved, capacity):
    if not isinstance(rotary_interleaved, bool):
        raise TypeError(f"flash_attn: rotary_interleaved must be a bool, got {type(rotary_interleaved).__name__}")
    if (rotary_cos is None) != (rotary_sin is None):
        raise ValueError("flash_attn: rotary_cos and rotary_sin must be given together")
    if rotary_cos is None:
        return
    for name, t in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
        check_tensor(name, t, 2, "(seqlen_ro, rotary_dim / 2)")
        if t.device != q.device or t.dtype != q.dtype:
            raise TypeError(f"flash_attn: {name} must be {q.dtype} on {q.device} like q, got {t.dtype} on {t.device}")
    if rotary_cos.shape != rotary_sin.shape:
        raise ValueError(f"flash_attn: rotary_cos and rotary_sin must have one shape, got {tuple(rotary_cos.shape)} "
                         f"and {tuple(rotary_sin.shape)}")
    rotary_dim = 2 * rotary_cos.shape[1]
    if rotary_dim == 0 or rotary_dim % 16 != 0 or rotary_dim > q.shape[-1]:
        raise ValueError(f"flash_attn: rotary_dim (2 * rotary_cos.shape[1] = {rotary_dim}) must be a positive "
                         f"multiple of 16 and at most headdim {q.shape[-1]}")
    if rotary_cos.shape[0] < capacity:
        raise ValueError(f"flash_attn: rotary_cos / rotary_sin need a row per cache position: at least {capacity} rows "
                         f"(the cache's length), got {rotary_cos.shape[0]}")


def check_call_flags(causal, num_splits, return_softmax_lse):
    if not isinstance(causal, bool):
        raise TypeError(f"flash_attn: causal must be a bool, got {type(causal).__name__}")
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 0:
        raise ValueError(f"flash_attn: num_splits must be an int >= 0 (0: chosen by a heuristic), got {num_splits!r}")
    if not isinstance(return_softmax_lse, bool):
        raise TypeError(f"flash_attn: return_softmax_lse must be a bool, got {type(return_softmax_lse).__name__}")
