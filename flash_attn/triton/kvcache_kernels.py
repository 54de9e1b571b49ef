"""Triton kernels of flash_attn_with_kvcache (issue #9), with flash_attn/reference_kvcache.py's
semantics: an append kernel (new k / v tokens, k rotated, into their cache slots) and a split-KV
attention kernel (q rotated at its positions; the attended keys [leftpad, cache_seqlens + seqlen_new)
gathered from a contiguous or paged cache, split across programs; flash_attn/triton/kvcache.py
combines the splits).

Metadata is clamped as reference_kvcache.py and csrc/flash/kvcache_view.cuh clamp it: append
positions into [0, capacity], leftpad into [0, end], cache_batch_idx and block_table entries into
the cache's first dimension, rotary positions into the table's rows. So no metadata makes a kernel
read or write outside the tensors.
"""

import triton
import triton.language as tl

from .kernels import _alibi_slope, _key_range, _normalized_rows, _online_softmax, _scores


@triton.jit
def _clamp(x, lo, hi):
    return tl.minimum(tl.maximum(x, lo), hi)


@triton.jit
def _cache_rows(positions, batch, BatchIdx, BlockTable, stride_bt, slabs, page_size, max_pages,
                PAGED: tl.constexpr, HAS_BATCH_IDX: tl.constexpr):
    """(slab, row) of cache positions of batch entry `batch` (reference_kvcache.cache_slots): paged,
    row j % page_size of page block_table[batch, j // page_size]; contiguous, row j of entry
    cache_batch_idx[batch] (or batch). Positions must be >= 0."""
    if PAGED:
        page = tl.load(BlockTable + batch * stride_bt + tl.minimum(positions // page_size, max_pages - 1))
        return _clamp(page, 0, slabs - 1), positions % page_size
    entry = batch
    if HAS_BATCH_IDX:
        entry = tl.load(BatchIdx + batch)
    return positions * 0 + _clamp(entry, 0, slabs - 1), positions


@triton.jit
def _cache_pointers(Cache, slab, row, head, dims, stride_slab, stride_row, stride_head, WIDE_CACHE: tl.constexpr):
    """Pointers [rows, dims] to the cache rows (slab, row) of KV head `head`. In 32-bit offsets, except
    in a cache of 2^31 elements or more (WIDE_CACHE): there the slab's offset (a page index times
    the page stride) is taken in int64 per row, the row's within its slab in int32 (the host checks
    that one slab stays under 2^31 elements). Only such caches take it: on an H200 the 64-bit form
    made the paged decode 17-20% slower (benchmarks/NOTES.md v30)."""
    if WIDE_CACHE:
        rows = Cache + slab.to(tl.int64) * stride_slab + (row * stride_row + head * stride_head)
        return rows[:, None] + dims[None, :]
    return Cache + slab[:, None] * stride_slab + row[:, None] * stride_row + head * stride_head + dims[None, :]


@triton.jit
def _rotated(X, offsets, mask, dims, positions, Cos, Sin, stride_rot, rotary_rows, rotary_half,
             INTERLEAVED: tl.constexpr):
    """x[offsets] (rows, BLOCK_D) with its first 2 * rotary_half features rotated at `positions` (rows,)
    (clamped to the table): interleaved pairs (2i, 2i + 1) or halves (i, i + rotary_half), products
    and sums in fp32 rounded one by one, as layers/rotary.py computes them (the caller launches
    without FMA contraction), in x's dtype."""
    x = tl.load(X + offsets, mask=mask, other=0.0)
    rotary = dims < 2 * rotary_half
    if INTERLEAVED:
        partner_dims, table_col, first = dims ^ 1, dims // 2, dims % 2 == 0
    else:
        first = dims < rotary_half
        partner_dims = tl.where(first, dims + rotary_half, dims - rotary_half)
        table_col = tl.where(first, dims, dims - rotary_half)
    partner = tl.load(X + offsets + (partner_dims - dims)[None, :], mask=mask & rotary[None, :], other=0.0)
    table = _clamp(positions, 0, rotary_rows - 1)[:, None] * stride_rot + table_col[None, :]
    cos = tl.load(Cos + table, mask=mask & rotary[None, :], other=1.0).to(tl.float32)
    sin = tl.load(Sin + table, mask=mask & rotary[None, :], other=0.0).to(tl.float32)
    x_cos = x.to(tl.float32) * cos
    partner_sin = partner.to(tl.float32) * sin
    out = x_cos + tl.where(first[None, :], -partner_sin, partner_sin)
    return tl.where(rotary[None, :], out, x.to(tl.float32)).to(x.dtype)


@triton.jit
def kvcache_append_kernel(
        KNew, VNew, KCache, VCache, SeqlensK, BatchIdx, BlockTable, Cos, Sin,
        stride_nb, stride_ns, stride_nh, stride_vnb, stride_vns, stride_vnh,
        stride_kp, stride_kr, stride_kh, stride_vp, stride_vr, stride_vh, stride_bt, stride_rot,
        seqlen_new, capacity, slabs, page_size, max_pages, headdim, rotary_rows, rotary_half,
        BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, PAGED: tl.constexpr, HAS_BATCH_IDX: tl.constexpr,
        HAS_ROTARY: tl.constexpr, INTERLEAVED: tl.constexpr, WIDE_CACHE: tl.constexpr):
    """New tokens [t0, t0 + BLOCK_T) of batch entry `batch`, KV head `head`, written at positions
    cache_seqlens[batch] + t; those at or past the capacity are dropped."""
    t_block, head, batch = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    tokens = t_block * BLOCK_T + tl.arange(0, BLOCK_T)
    dims = tl.arange(0, BLOCK_D)
    append_at = _clamp(tl.load(SeqlensK + batch), 0, capacity)
    positions = append_at + tokens
    valid = (tokens < seqlen_new) & (positions < capacity)
    mask = valid[:, None] & (dims[None, :] < headdim)
    slab, row = _cache_rows(tl.where(valid, positions, 0), batch, BatchIdx, BlockTable, stride_bt, slabs, page_size,
                            max_pages, PAGED, HAS_BATCH_IDX)
    k_offsets = batch * stride_nb + tokens[:, None] * stride_ns + head * stride_nh + dims[None, :]
    if HAS_ROTARY:
        k = _rotated(KNew, k_offsets, mask, dims, positions, Cos, Sin, stride_rot, rotary_rows, rotary_half,
                     INTERLEAVED)
    else:
        k = tl.load(KNew + k_offsets, mask=mask)
    v = tl.load(VNew + batch * stride_vnb + tokens[:, None] * stride_vns + head * stride_vnh + dims[None, :],
                mask=mask)
    tl.store(_cache_pointers(KCache, slab, row, head, dims, stride_kp, stride_kr, stride_kh, WIDE_CACHE), k, mask=mask)
    tl.store(_cache_pointers(VCache, slab, row, head, dims, stride_vp, stride_vr, stride_vh, WIDE_CACHE), v, mask=mask)


@triton.jit
def kvcache_attention_kernel(
        Q, KCache, VCache, Out, Lse, SeqlensK, BatchIdx, LeftPad, BlockTable, Slopes, Cos, Sin,
        stride_qb, stride_qs, stride_qh, stride_kp, stride_kr, stride_kh, stride_vp, stride_vr, stride_vh,
        stride_os, stride_ob, stride_oq, stride_oh, stride_ls, stride_lb, stride_lh,
        stride_bt, stride_slope_b, stride_rot,
        seqlen_q, seqlen_new, capacity, slabs, page_size, max_pages, group, headdim, rotary_rows, rotary_half,
        scale, softcap, left, right, splits,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PAGED: tl.constexpr,
        HAS_BATCH_IDX: tl.constexpr, HAS_LEFTPAD: tl.constexpr, HAS_ROTARY: tl.constexpr, INTERLEAVED: tl.constexpr,
        ROTARY_PER_TOKEN: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
        DOT_PRECISION: tl.constexpr, WIDE_CACHE: tl.constexpr):
    """Query rows [m0, m0 + BLOCK_M) of (batch, head) over split `split` of its attended keys: their
    normalized output and lse (+inf where the split holds no visible key) into Out (splits, batch,
    seqlen_q, heads, d) and Lse (splits, batch, heads, seqlen_q), both float32."""
    m_block, head, batch_split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    batch, split = batch_split // splits, batch_split % splits
    append_at = _clamp(tl.load(SeqlensK + batch), 0, capacity)
    end = tl.minimum(append_at + seqlen_new, capacity)
    first = 0
    if HAS_LEFTPAD:
        first = _clamp(tl.load(LeftPad + batch), 0, end)
    len_k = end - first
    m0 = m_block * BLOCK_M
    rows = m0 + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    q_offsets = batch * stride_qb + rows[:, None] * stride_qs + head * stride_qh + dims[None, :]
    q_mask = (rows[:, None] < seqlen_q) & (dims[None, :] < headdim)
    if HAS_ROTARY:
        if ROTARY_PER_TOKEN:  # causal or local attention: each query at its own position
            q_positions = append_at + rows
        else:
            q_positions = append_at + rows * 0
        q = _rotated(Q, q_offsets, q_mask, dims, q_positions, Cos, Sin, stride_rot, rotary_rows, rotary_half,
                     INTERLEAVED)
    else:
        q = tl.load(Q + q_offsets, mask=q_mask, other=0.0)
    kv_head = head // group
    slope = _alibi_slope(Slopes, batch, head, stride_slope_b, HAS_ALIBI)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    blocks_per_split = tl.cdiv(tl.cdiv(len_k, BLOCK_N), splits)
    lo, hi = _key_range(m0, BLOCK_M, seqlen_q, len_k, left, right, BLOCK_N)
    lo = tl.maximum(lo, split * blocks_per_split * BLOCK_N)
    hi = tl.minimum(hi, (split + 1) * blocks_per_split * BLOCK_N)
    for n0 in range(lo, hi, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)  # keys of the attended range; cache positions first + cols
        in_range = cols < len_k
        slab, row = _cache_rows(first + tl.where(in_range, cols, 0), batch, BatchIdx, BlockTable, stride_bt, slabs,
                                page_size, max_pages, PAGED, HAS_BATCH_IDX)
        kv_mask = in_range[:, None] & (dims[None, :] < headdim)
        k = tl.load(_cache_pointers(KCache, slab, row, kv_head, dims, stride_kp, stride_kr, stride_kh, WIDE_CACHE),
                    mask=kv_mask, other=0.0)
        v = tl.load(_cache_pointers(VCache, slab, row, kv_head, dims, stride_vp, stride_vr, stride_vh, WIDE_CACHE),
                    mask=kv_mask, other=0.0)
        s, _ = _scores(q, k, rows, cols, seqlen_q, len_k, scale, softcap, slope, left, right, HAS_SOFTCAP, HAS_ALIBI,
                       DOT_PRECISION, MASKED=True, LEFT_BOUNDED=True)
        p, alpha, m_i, l_i = _online_softmax(s, m_i, l_i, 0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    out, lse = _normalized_rows(acc, m_i, l_i, 1.0, 0)
    out_offsets = split * stride_os + batch * stride_ob + rows[:, None] * stride_oq + head * stride_oh + dims[None, :]
    tl.store(Out + out_offsets, out, mask=q_mask)
    tl.store(Lse + split * stride_ls + batch * stride_lb + head * stride_lh + rows, lse, mask=rows < seqlen_q)


@triton.jit
def kvcache_combine_kernel(Parts, PartLse, Out, Lse, splits, seqlen_q, heads, headdim,
                           stride_ps, stride_pb, stride_pq, stride_ph, stride_ls, stride_lb, stride_lh,
                           stride_ob, stride_oq, stride_oh, stride_lob, stride_loh,
                           BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    """Out[batch, row, head] and Lse[batch, head, row] of one query row from its `splits` partial
    outputs and lses (kvcache_attention_kernel's): the parts weighted by exp(lse_s - lse), lse the
    log-sum-exp of theirs; a part with no visible key (lse +inf) weighs 0, and a row with none in any
    part gets out 0 and lse +inf (the reference's convention). Out takes its dtype (q's) on store."""
    row, head, batch = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    parts = tl.arange(0, BLOCK_S)
    lse_s = tl.load(PartLse + parts * stride_ls + batch * stride_lb + head * stride_lh + row, mask=parts < splits,
                    other=float("inf"))
    lse_s = tl.where(lse_s == float("inf"), float("-inf"), lse_s)  # no key: weight 0
    top = tl.max(lse_s, 0)
    seen = top > float("-inf")
    weights = tl.where(seen, tl.exp(lse_s - tl.where(seen, top, 0.0)), 0.0)
    total = tl.sum(weights, 0)
    dims = tl.arange(0, BLOCK_D)
    part_offsets = parts[:, None] * stride_ps + batch * stride_pb + row * stride_pq + head * stride_ph + dims[None, :]
    values = tl.load(Parts + part_offsets, mask=(parts[:, None] < splits) & (dims[None, :] < headdim), other=0.0)
    out = tl.sum(values * weights[:, None], 0) / tl.where(seen, total, 1.0)
    tl.store(Out + batch * stride_ob + row * stride_oq + head * stride_oh + dims, out.to(Out.dtype.element_ty),
             mask=dims < headdim)
    lse = tl.where(seen, top + tl.log(tl.where(seen, total, 1.0)), float("inf"))
    tl.store(Lse + batch * stride_lob + head * stride_loh + row, lse)
