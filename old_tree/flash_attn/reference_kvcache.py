"""flash_attn_with_kvcache in plain PyTorch: the CPU path of flash_attn::fwd_kvcache and the tests'
ground truth for the CUDA kernels. One batch entry at a time:

1. the cache positions: contiguous caches are (entries, capacity, nheads_k, d) and batch entry b uses
   entry cache_batch_idx[b] (or b); paged caches are (pages, page_size, nheads_k, d) and position j
   of batch entry b is row j % page_size of page block_table[b, j // page_size];
2. the new k / v tokens (rotated) are written at positions cache_seqlens[b] + t, in place; tokens
   past the capacity are dropped;
3. attention of q (rotated at cache_seqlens[b] + t for causal / local attention, at cache_seqlens[b]
   otherwise, as FlashAttention 2 does) over positions [leftpad[b], cache_seqlens[b] + seqlen_new),
   the mask bottom-right aligned to that range.

Metadata is clamped as the kernels clamp it (csrc/flash/kvcache_view.cuh), so the two agree on any
input.
"""

import torch

from .layers.rotary import apply_rotary_at_positions
from .reference import ScoreOptions, attention_forward_chunked


def cache_capacity(k_cache, block_table):
    """Positions one batch entry can hold."""
    return k_cache.shape[1] if block_table is None else block_table.shape[1] * k_cache.shape[1]


def cache_slots(k_cache, block_table, cache_batch_idx, batch_index, positions):
    """(slab, row) index tensors of cache positions of one batch entry."""
    positions = positions.to(torch.int64)
    if block_table is None:
        entry = batch_index if cache_batch_idx is None else int(cache_batch_idx[batch_index])
        entry = min(max(entry, 0), k_cache.shape[0] - 1)
        return torch.full_like(positions, entry), positions
    page_size = k_cache.shape[1]
    pages = block_table[batch_index].to(torch.int64).cpu()
    page_index = (positions // page_size).clamp(max=pages.numel() - 1)
    return pages[page_index].clamp(0, k_cache.shape[0] - 1), positions % page_size


def _rotate(x, rotary_cos, rotary_sin, positions, interleaved):
    """x (1, s, h, d) rotated at positions (s,), clamped to the table."""
    if rotary_cos is None:
        return x
    positions = positions.clamp(0, rotary_cos.shape[0] - 1).view(1, -1)
    return apply_rotary_at_positions(x, rotary_cos, rotary_sin, positions, interleaved)


def append_new_tokens(k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, block_table,
                      rotary_interleaved):
    """Step 2 for every batch entry, in place; returns the clamped append positions (python ints)."""
    capacity = cache_capacity(k_cache, block_table)
    seqlen_new = 0 if k is None else k.shape[1]
    starts = [min(max(int(s), 0), capacity) for s in cache_seqlens.tolist()]
    for b, append_at in enumerate(starts):
        end = min(append_at + seqlen_new, capacity)
        if end > append_at:
            positions = torch.arange(append_at, end)
            slabs, rows = cache_slots(k_cache, block_table, cache_batch_idx, b, positions)
            new = slice(0, end - append_at)
            k_cache[slabs, rows] = _rotate(k[b:b + 1, new], rotary_cos, rotary_sin, positions, rotary_interleaved)[0]
            v_cache[slabs, rows] = v[b, new]
    return starts


def attended_keys(k_cache, v_cache, block_table, cache_batch_idx, cache_leftpad, batch_index, append_at, seqlen_new):
    """Keys and values (1, seqlen_k, nheads_k, d) batch entry `batch_index` attends to, after the append."""
    end = min(append_at + seqlen_new, cache_capacity(k_cache, block_table))
    first = 0 if cache_leftpad is None else min(max(int(cache_leftpad[batch_index]), 0), end)
    slabs, rows = cache_slots(k_cache, block_table, cache_batch_idx, batch_index, torch.arange(first, end))
    return k_cache[slabs, rows].unsqueeze(0), v_cache[slabs, rows].unsqueeze(0)


def rotated_queries(q, rotary_cos, rotary_sin, batch_index, append_at, window, rotary_interleaved):
    """q[batch_index] (1, sq, h, d) rotated at its positions (step 3), in q's dtype."""
    seqlen_q = q.shape[1]
    per_token = window[0] >= 0 or window[1] >= 0
    offsets = torch.arange(seqlen_q) if per_token else torch.zeros(seqlen_q, dtype=torch.int64)
    return _rotate(q[batch_index:batch_index + 1], rotary_cos, rotary_sin, append_at + offsets, rotary_interleaved)


def forward_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                    cache_leftpad, block_table, softmax_scale, window, softcap, rotary_interleaved, alibi_slopes):
    """The op's semantics (window already normalized); writes k_cache / v_cache in place and returns
    (out (b, sq, h, d) in q's dtype, lse (b, h, sq) float32)."""
    batch, seqlen_q, nheads, _ = q.shape
    seqlen_new = 0 if k is None else k.shape[1]
    starts = append_new_tokens(k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                               block_table, rotary_interleaved)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, nheads, seqlen_q), dtype=torch.float32, device=q.device)
    options = ScoreOptions(window=tuple(window), softcap=softcap, alibi_slopes=alibi_slopes)
    for b, append_at in enumerate(starts):
        keys, values = attended_keys(k_cache, v_cache, block_table, cache_batch_idx, cache_leftpad, b, append_at,
                                     seqlen_new)
        query = rotated_queries(q, rotary_cos, rotary_sin, b, append_at, window, rotary_interleaved)
        seq_out, seq_lse = attention_forward_chunked(query, keys, values, False, softmax_scale,
                                                     options=options.for_sequence(b))
        out[b], lse[b] = seq_out[0], seq_lse[0]
    return out, lse
