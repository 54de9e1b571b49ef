"""Host side of flash_attn_with_kvcache on the Triton backend (issue #9): the op
flash_attn::triton_fwd_kvcache (flash_attn/triton/ops.py) with fwd_kvcache's arguments, already
normalized by flash_attn/kvcache.py (cache_seqlens an int32 (batch,) tensor, the window resolved).

1. kvcache_append_kernel writes the new k / v tokens (k rotated) into their cache slots, in place;
2. kvcache_attention_kernel runs each (query block, head, batch entry) over one of num_splits parts
   of its attended keys, writing float32 partial outputs and lse;
3. the parts are combined here (a log-sum-exp over the splits), in torch.
Semantics and clamping: flash_attn/reference_kvcache.py. Works on any head dim (no padding needed).
"""

import torch
import triton

from ..reference_kvcache import cache_capacity
from . import poison, shared_memory_fit, tuning
from .attention import (DOT_PRECISION, MAX_GRID_YZ, check_grid_dims, check_offsets, check_tensors,
                        within_offset_limit)
from .kvcache_kernels import kvcache_append_kernel, kvcache_attention_kernel, kvcache_combine_kernel

APPEND_BLOCK_T = 16
MAX_AUTO_SPLITS = 16  # num_splits=0 never splits a sequence's keys further
# The attention kernel's autotuner key (tuning.py); BLOCK_M stays the host's (it follows seqlen_q),
# BLOCK_N is tuned. The number of splits is chosen with the fixed BLOCK_N: a tuned one only moves
# the split boundaries (a split past the keys is empty and weighs nothing in the combine).
TUNING_KEY = ("seqlen_q", "seqlen_new", "capacity", "group", "headdim", "left", "right", "splits", "PAGED",
              "HAS_SOFTCAP", "HAS_ALIBI", "BLOCK_M")
_attention_kernel = tuning.Launcher(kvcache_attention_kernel, tuning.KVCACHE_TILES, TUNING_KEY,
                                    tuning.INTERPRETER_TILES["kvcache"])


# Where the GPU refuses the attention kernel's tile for shared memory (shared_memory_fit), its key
# block may halve: the kernel splits the keys in blocks of BLOCK_N at run time, and a split the host
# counted in larger blocks may then hold more of them or none. BLOCK_M fixes the grid: it stays.
KVCACHE_SHRINKABLE = {"BLOCK_N": shared_memory_fit.SMALLEST_BLOCK}


def _blocks(seqlen_q, block_d):
    """(BLOCK_M, BLOCK_N): 16-row query blocks for decoding (tl.dot's smallest), 64 otherwise;
    32-key blocks above head dim 128, as the attention kernels' tiles. Fixed unless autotuned."""
    return (16 if seqlen_q <= 16 else 64), (64 if block_d <= 128 else 32)


def _num_splits(requested, programs, key_blocks, batch, device):
    """requested > 0: that many (at most one per key block, and at most MAX_GRID_YZ // batch: the
    attention kernel's grid z is batch x splits); 0: enough splits for about one program per SM when
    the (query block, head, batch) programs are fewer than the SMs."""
    if requested > 0:
        return max(1, min(requested, key_blocks, MAX_GRID_YZ // max(batch, 1)))
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
    if programs >= sms:
        return 1
    return max(1, min(sms // max(programs, 1), key_blocks, MAX_AUTO_SPLITS))


def _combine(out_parts, lse_parts, dtype):
    """(out (b, sq, h, d) in `dtype`, lse (b, h, sq) float32) from num_splits parts (splits, b, sq, h, d)
    and (splits, b, h, sq), by kvcache_combine_kernel in one launch (a part with no visible key has
    lse +inf, the kernels' convention, and weight 0); one part is only cast."""
    splits, batch, seqlen_q, heads, headdim = out_parts.shape
    if splits == 1:
        return out_parts[0].to(dtype), lse_parts[0]
    out = poison.unwritten((batch, seqlen_q, heads, headdim), dtype=dtype, device=out_parts.device)
    lse = poison.unwritten((batch, heads, seqlen_q), dtype=torch.float32, device=out_parts.device)
    if out.numel():
        kvcache_combine_kernel[(seqlen_q, heads, batch)](
            out_parts, lse_parts, out, lse, splits, seqlen_q, heads, headdim, *out_parts.stride()[:4],
            *lse_parts.stride()[:3], *out.stride()[:3], *lse.stride()[:2],
            BLOCK_S=triton.next_power_of_2(splits), BLOCK_D=max(16, triton.next_power_of_2(headdim)))
    return out, lse


def forward_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad,
                    block_table, softmax_scale, window, softcap, rotary_interleaved, alibi_slopes, num_splits):
    """fwd_kvcache's semantics (reference_kvcache.forward_kvcache): appends in place, returns (out in q's
    dtype, lse float32 (batch, heads, seqlen_q))."""
    # A cache of 2^31 elements or more is addressed by page (or batch entry) in int64 and by row within
    # one in int32 (kvcache_kernels._cache_pointers): each page must stay under 2^31 elements.
    check_tensors(q=q, k_cache=k_cache, v_cache=v_cache, k=k, v=v, wide=("k_cache", "v_cache"))
    check_offsets(**{"a k_cache page (or batch entry)": k_cache[:1], "a v_cache page (or batch entry)": v_cache[:1]})
    wide_cache = not within_offset_limit(k_cache) or not within_offset_limit(v_cache)
    batch, seqlen_q, heads, headdim = q.shape
    slabs, slab_rows, heads_k = k_cache.shape[:3]
    check_grid_dims(batch=batch, nheads=heads)
    paged = block_table is not None
    capacity = cache_capacity(k_cache, block_table)
    page_size, max_pages = (slab_rows, block_table.shape[1]) if paged else (1, 1)
    block_d = max(16, triton.next_power_of_2(headdim))
    block_m, block_n = _blocks(seqlen_q, block_d)
    unused = cache_seqlens  # an int32 tensor standing in for the absent optional ones (never read)
    has_rotary = rotary_cos is not None
    cos, sin = (rotary_cos, rotary_sin) if has_rotary else (unused, unused)
    rotary_rows, rotary_half = (cos.shape[0], cos.shape[1]) if has_rotary else (1, 0)
    batch_idx, leftpad = (unused if t is None else t for t in (cache_batch_idx, cache_leftpad))
    table = block_table if paged else unused
    stride_bt = block_table.stride(0) if paged else 0
    cache_strides = (*k_cache.stride()[:3], *v_cache.stride()[:3])
    m_blocks = triton.cdiv(seqlen_q, block_m)
    splits = _num_splits(num_splits, m_blocks * heads * batch, max(1, triton.cdiv(capacity, block_n)), batch,
                         q.device)
    parts_shape = (splits, batch, seqlen_q, heads, headdim)
    # checked before allocating it and before the append writes the cache
    parts_name = "the split-KV partial outputs (num_splits x q's elements)"
    check_offsets(**{parts_name: torch.empty(parts_shape, device="meta")})
    attends = q.numel() > 0  # then the attention kernel writes every element of both parts
    out_parts = (poison.unwritten(parts_shape, dtype=torch.float32, device=q.device) if attends
                 else torch.zeros(parts_shape, dtype=torch.float32, device=q.device))
    seqlen_new = 0 if k is None else k.shape[1]
    if seqlen_new > 0 and batch > 0:
        kvcache_append_kernel[(triton.cdiv(seqlen_new, APPEND_BLOCK_T), heads_k, batch)](
            k, v, k_cache, v_cache, cache_seqlens, batch_idx, table, cos, sin, *k.stride()[:3], *v.stride()[:3],
            *cache_strides, stride_bt, cos.stride(0) if has_rotary else 0, seqlen_new, capacity, slabs, page_size,
            max_pages, headdim, rotary_rows, rotary_half, BLOCK_T=APPEND_BLOCK_T, BLOCK_D=block_d, PAGED=paged,
            HAS_BATCH_IDX=cache_batch_idx is not None, HAS_ROTARY=has_rotary, INTERLEAVED=bool(rotary_interleaved),
            WIDE_CACHE=wide_cache, enable_fp_fusion=False)  # the rotation rounds each product, as layers/rotary.py does
    lse_shape = (splits, batch, heads, seqlen_q)
    lse_parts = (poison.unwritten(lse_shape, dtype=torch.float32, device=q.device) if attends
                 else torch.full(lse_shape, float("inf"), dtype=torch.float32, device=q.device))
    if attends:
        slopes = lse_parts if alibi_slopes is None else alibi_slopes.float().contiguous()  # lse_parts: unread
        slope_stride = slopes.stride(0) if alibi_slopes is not None and slopes.dim() == 2 else 0
        left, right = window
        _attention_kernel(
            (m_blocks, heads, batch * splits), q, k_cache, v_cache, out_parts, lse_parts, cache_seqlens, batch_idx,
            leftpad, table, slopes, cos, sin,
            *q.stride()[:3], *cache_strides, *out_parts.stride()[:4], *lse_parts.stride()[:3], stride_bt, slope_stride,
            cos.stride(0) if has_rotary else 0, seqlen_q, seqlen_new, capacity, slabs, page_size, max_pages,
            heads // heads_k, headdim, rotary_rows, rotary_half, float(softmax_scale), float(softcap), left, right,
            splits, BLOCK_M=block_m, fixed_blocks=dict(BLOCK_N=block_n), shrinkable=KVCACHE_SHRINKABLE,
            BLOCK_D=block_d, PAGED=paged,
            HAS_BATCH_IDX=cache_batch_idx is not None, HAS_LEFTPAD=cache_leftpad is not None, HAS_ROTARY=has_rotary,
            INTERLEAVED=bool(rotary_interleaved), ROTARY_PER_TOKEN=left >= 0 or right >= 0,
            HAS_SOFTCAP=softcap > 0, HAS_ALIBI=alibi_slopes is not None, DOT_PRECISION=DOT_PRECISION,
            WIDE_CACHE=wide_cache)
    return _combine(out_parts, lse_parts, q.dtype)
