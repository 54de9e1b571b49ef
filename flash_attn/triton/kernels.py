"""Triton kernels of the portable backend (issue #9): forward, and the backward as a D = rowsum(dO
* O) kernel and two attention kernels (dK/dV per key block, dQ per query block: no atomics, so the
gradients are deterministic).

Every kernel runs on a grid of (block, query head, batch) over dense tensors (batch, seqlen, heads,
headdim) or packed varlen ones (total, heads, headdim) whose sequence b is rows [cu[b], cu[b+1]);
scores follow flash_attn/reference.py (FlashAttention 2's order): s = q.k * scale, then softcap,
then ALiBi, then the window mask (bottom-right aligned; left / right -1 unbounded).
The exponentials are base 2 with log2(e) folded into the scores: where there is no softcap or
ALiBi, one FMA per score before exp2 (forward: qk * scale log2(e) - row max; backward: qk * scale
log2(e) - lse log2(e)), and the backward applies the scale once to the finished dQ and dK. Every
key walk is split into masked blocks and blocks seen whole, which skip the mask; the masked walks
are compiled only where the call can need them (CLIP_LEFT / CLIP_RIGHT). The dK / dV kernel works
in the transposed orientation (S^T = K Q^T), so that P^T and dS^T feed their MMAs from registers.
Dropout keeps element (i, j)
exactly as csrc/flash/dropout.cuh defines it (Philox4x32-7 bytes, the same counters), so a Triton
and a CUDA run with the same rng_state drop the same elements. The forward also takes fp8 e4m3
inputs with descales (IS_FP8, fp8_kernels.py). Tiles (BLOCK_M, BLOCK_N, warps, stages) are the
host's or autotuned (tuning.py).
"""

import triton
import triton.language as tl

from .fp8_kernels import E4M3_P_SCALE_LOG2, _descaled_scales, _output, _pv_operand

LOG2E = tl.constexpr(1.4426950408889634)  # a constexpr: jit functions read only those globals
# Where the forward's blocks come from (its DESCRIPTORS constexpr; attention._forward_descriptors
# chooses): pointer loads and stores; K / V through tensor descriptors the kernel makes per head
# (_key_descriptor); or Q / K / V / Out through descriptors the host made (_row_block_view).
POINTER_BLOCKS = tl.constexpr(0)
DEVICE_KV_DESCRIPTORS = tl.constexpr(1)
HOST_DESCRIPTORS = tl.constexpr(2)


@triton.jit
def _sequence(cu_ptr, batch, seqlen, total, VARLEN: tl.constexpr):
    """(first row, length) of sequence `batch`: from cu_seqlens (varlen) or (0, seqlen) (dense).
    Varlen metadata is clamped as the CUDA kernels' SequenceView clamps it: each entry into
    [0, total] (the packed tensor's rows), each length to at most seqlen (max_seqlen), so no
    cu_seqlens makes a kernel touch rows outside the tensors."""
    if VARLEN:
        first = tl.minimum(tl.maximum(tl.load(cu_ptr + batch), 0), total)
        end = tl.minimum(tl.maximum(tl.load(cu_ptr + batch + 1), first), total)
        length = tl.minimum(end - first, seqlen)
    else:
        first = 0
        length = seqlen
    return first, length


@triton.jit
def _sequences(CuQ, CuK, batch, seqlen_q, seqlen_k, total_q, total_k, VARLEN: tl.constexpr):
    """(q_first, len_q, k_first, len_k) of sequence `batch`: _sequence for the queries and the keys."""
    q_first, len_q = _sequence(CuQ, batch, seqlen_q, total_q, VARLEN)
    k_first, len_k = _sequence(CuK, batch, seqlen_k, total_k, VARLEN)
    return q_first, len_q, k_first, len_k


@triton.jit
def _tanh(x):
    """tanh to about fp32 rounding everywhere: the Taylor series to x^15 below |x| = 0.4 (next term
    under 1e-10 relative there), (1 - e) / (1 + e) with e = exp(-2|x|) <= 0.45 above, where 1 - e
    does not cancel. (2 sigmoid(2x) - 1 cancels near 0: 1e-6 absolute errors on softcapped scores
    failed the fp32 tolerance rule on short rows.)"""
    x2 = x * x
    series = x * (1.0 + x2 * (-1.0 / 3.0 + x2 * (2.0 / 15.0 + x2 * (-17.0 / 315.0 + x2 * (
        62.0 / 2835.0 + x2 * (-1382.0 / 155925.0 + x2 * (21844.0 / 6081075.0 + x2 * (-929569.0 / 638512875.0))))))))
    e = tl.exp(-2.0 * tl.abs(x))
    far = (1.0 - e) / (1.0 + e)
    return tl.where(tl.abs(x) < 0.4, series, tl.where(x < 0, -far, far))


@triton.jit
def _philox4x32_7(c0, c1, c2, c3, k0, k1):
    """Philox4x32 with dropout.cuh's kPhiloxRounds (7) rounds on uint32 tensors of one shape."""
    for _ in tl.static_range(7):
        hi0 = tl.umulhi(c0, tl.full(c0.shape, 0xD2511F53, tl.uint32))
        lo0 = c0 * tl.full(c0.shape, 0xD2511F53, tl.uint32)
        hi1 = tl.umulhi(c2, tl.full(c0.shape, 0xCD9E8D57, tl.uint32))
        lo1 = c2 * tl.full(c0.shape, 0xCD9E8D57, tl.uint32)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = k0 + tl.full(k0.shape, 0x9E3779B9, tl.uint32)
        k1 = k1 + tl.full(k1.shape, 0xBB67AE85, tl.uint32)
    return c0, c1, c2, c3


@triton.jit
def _dropout_keep(i, j, Rng, batch, heads, head, threshold):
    """Bool tensor of the broadcast shape of i and j (2D query and key indices: i[:, None] and
    j[None, :], or i[None, :] and j[:, None] for a transposed tile): element (query i, key j) of
    (batch, head) is kept, from the (seed, offset) int64 pair at Rng (dropout.cuh: counter
    (j // 16, (i // 16) * 16 + v, stream), v = 4 ((i % 8) / 2) + (j % 8) / 2, stream = offset +
    batch * heads + head, key = seed; word 2 (i % 2) + j % 2, byte 2 ((i % 16) / 8) + (j % 16) / 8;
    kept iff the byte < threshold). One Philox call per element: 16 times the work of the CUDA
    kernels' one call per 16 bytes."""
    seed = tl.load(Rng)
    stream = tl.load(Rng + 1) + batch * heads + head
    zero = (i * 0 + j * 0).to(tl.uint32)
    c0 = (j // 16).to(tl.uint32) + zero
    c1 = ((i // 16) * 16 + 4 * ((i % 8) // 2) + (j % 8) // 2).to(tl.uint32) + zero
    c2 = zero + (stream & 0xFFFFFFFF).to(tl.uint32)
    c3 = zero + (stream >> 32).to(tl.uint32)
    k0 = zero + (seed & 0xFFFFFFFF).to(tl.uint32)
    k1 = zero + (seed >> 32).to(tl.uint32)
    w0, w1, w2, w3 = _philox4x32_7(c0, c1, c2, c3, k0, k1)
    word_index = 2 * (i % 2) + j % 2
    word = tl.where(word_index == 0, w0, tl.where(word_index == 1, w1, tl.where(word_index == 2, w2, w3)))
    shift = (8 * (2 * ((i % 16) // 8) + (j % 16) // 8)).to(tl.uint32)
    return ((word >> shift) & 0xFF).to(tl.int32) < threshold


@triton.jit
def _visible(i, j, seqlen_q, seqlen_k, left, right, LEFT_BOUNDED: tl.constexpr, BOUNDS_BY_KEY: tl.constexpr):
    """Bool tensor of the broadcast shape of the 2D query / key indices i and j (as _dropout_keep
    takes them): key j exists and lies in query i's window (bottom-right aligned). Queries past
    seqlen_q are not masked: no kernel stores their rows, and the backward's lse of +inf makes
    their P 0. LEFT_BOUNDED False: the caller knows there is no left window (left < 0; the kernels'
    CLIP_LEFT), so that bound is not compared; True compares it (any left, -1 included).

    The window becomes bounds on the side a walk holds fixed (loop-invariant, so Triton hoists them
    out of the walk), so that a score costs one compare (two with a left window) and no predicate
    logic: the keys each query sees (the last one clipped to the sequence's last key), or with
    BOUNDS_BY_KEY (the dK / dV walk, whose keys are fixed) the queries that see each key (none for a
    key past the sequence). An unbounded side (-1) becomes a bound no index reaches by arithmetic,
    not by a branch. The former form, three compares a score with the left one under a runtime `if`,
    compiled to 848 instructions a step in the masked loop of the hd 128 8-warp forward tile against
    479 now (360 unmasked), most of them LOP3 / SEL packing predicates (Triton 3.6, sm_90, offline;
    benchmarks/NOTES.md v48)."""
    no_bound = 1 << 30
    right_reach = tl.where(right >= 0, right, no_bound)
    if LEFT_BOUNDED:
        left_reach = tl.where(left >= 0, left, no_bound)
    if BOUNDS_BY_KEY:
        key_diagonal = j - (seqlen_k - seqlen_q)
        visible = i >= tl.where(j < seqlen_k, key_diagonal - right_reach, no_bound)
        if LEFT_BOUNDED:
            visible = visible & (i <= key_diagonal + left_reach)
    else:
        diagonal = i + (seqlen_k - seqlen_q)
        visible = j <= tl.minimum(diagonal + right_reach, seqlen_k - 1)
        if LEFT_BOUNDED:
            visible = visible & (j >= diagonal - left_reach)
    return visible


@triton.jit
def _final_scores(qk, i, j, seqlen_q, seqlen_k, scale, softcap, slope, left, right,
                  HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, MASKED: tl.constexpr, LEFT_BOUNDED: tl.constexpr,
                  BOUNDS_BY_KEY: tl.constexpr):
    """Final scores of the raw products qk (either orientation; i and j the 2D query and key indices
    as _visible takes them), -inf where masked, and t = tanh(qk * scale / softcap) (1 without
    softcap) for the backward's chain rule. MASKED False: the caller knows every key is visible to
    every query that matters (_full_key_blocks, _full_query_blocks)."""
    s = qk * scale
    t = tl.full(s.shape, 1.0, tl.float32)
    if HAS_SOFTCAP:
        t = _tanh(s / softcap)
        s = softcap * t
    if HAS_ALIBI:
        distance = i + (seqlen_k - seqlen_q) - j
        s = s - slope * tl.where(distance < 0, -distance, distance).to(tl.float32)
    if MASKED:
        s = tl.where(_visible(i, j, seqlen_q, seqlen_k, left, right, LEFT_BOUNDED, BOUNDS_BY_KEY), s, float("-inf"))
    return s, t


@triton.jit
def _scores(q, k, rows, cols, seqlen_q, seqlen_k, scale, softcap, slope, left, right,
            HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, DOT_PRECISION: tl.constexpr,
            MASKED: tl.constexpr, LEFT_BOUNDED: tl.constexpr):
    """_final_scores (BLOCK_M, BLOCK_N) of q (BLOCK_M, D) against k (BLOCK_N, D), queries `rows`,
    keys `cols` (the kvcache kernel's form)."""
    qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
    return _final_scores(qk, rows[:, None], cols[None, :], seqlen_q, seqlen_k, scale, softcap, slope, left, right,
                         HAS_SOFTCAP, HAS_ALIBI, MASKED, LEFT_BOUNDED, False)


@triton.jit
def _key_range(m0, block_m, seqlen_q, seqlen_k, left, right, BLOCK_N: tl.constexpr):
    """Keys [lo, hi) that queries [m0, m0 + block_m) can see, lo a multiple of BLOCK_N."""
    diagonal = seqlen_k - seqlen_q
    hi = seqlen_k
    if right >= 0:
        hi = tl.minimum(hi, m0 + block_m - 1 + diagonal + right + 1)
    lo = 0
    if left >= 0:
        lo = tl.maximum(0, m0 + diagonal - left) // BLOCK_N * BLOCK_N
    return lo, hi


@triton.jit
def _full_key_blocks(m0, lo, hi, seqlen_q, seqlen_k, left, right, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(full_lo, full_hi): the key blocks of the walk [lo, hi) (lo a multiple of BLOCK_N) split as
    [lo, full_lo) masked, [full_lo, full_hi) seen whole by every query of [m0, m0 + BLOCK_M), and
    [full_hi, hi) masked; all bounds multiples of BLOCK_N from lo. The whole blocks skip the mask,
    which off the diagonal costs as much as the softmax's other work on an fp8 tile. Without a left
    window full_lo is lo; without a right window and with seqlen_k a multiple of BLOCK_N, full_hi
    is the walk's end (the kernels compile the masked walks only where they can be non-empty:
    CLIP_LEFT, CLIP_RIGHT)."""
    diagonal = seqlen_k - seqlen_q
    end = lo + (tl.maximum(hi - lo, 0) + BLOCK_N - 1) // BLOCK_N * BLOCK_N
    full_lo = lo
    if left >= 0:  # the last row's first key, rounded up to a block
        first = tl.maximum(m0 + BLOCK_M - 1 + diagonal - left, 0)
        full_lo = tl.maximum(lo, (first + BLOCK_N - 1) // BLOCK_N * BLOCK_N)
    full_lo = tl.minimum(full_lo, end)
    stop = seqlen_k
    if right >= 0:  # one past the first row's last key
        stop = tl.minimum(stop, m0 + diagonal + right + 1)
    full_hi = full_lo + tl.maximum(stop - full_lo, 0) // BLOCK_N * BLOCK_N
    return full_lo, full_hi


@triton.jit
def _query_range(n0, block_n, seqlen_q, seqlen_k, left, right, BLOCK_M: tl.constexpr):
    """Queries [lo, hi) that can see some key of [n0, n0 + block_n), lo a multiple of BLOCK_M."""
    diagonal = seqlen_k - seqlen_q
    lo = 0
    if right >= 0:
        lo = tl.maximum(0, n0 - diagonal - right) // BLOCK_M * BLOCK_M
    hi = seqlen_q
    if left >= 0:
        hi = tl.minimum(hi, n0 + block_n - 1 - diagonal + left + 1)
    return lo, hi


@triton.jit
def _full_query_blocks(n0, lo, hi, seqlen_q, seqlen_k, left, right, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The backward's dK / dV walk over the query blocks [lo, hi) of the key block [n0, n0 + BLOCK_N)
    (lo a multiple of BLOCK_M), split as _full_key_blocks splits the forward's: [lo, full_lo) masked
    (the causal / right window's diagonal, or every block when the key block reaches past
    seqlen_k), [full_lo, full_hi) blocks whose every query sees every key of the block, [full_hi,
    hi) masked (the left window's edge). Queries past seqlen_q need no mask here: they load zero q
    and dO and an lse of +inf, so P, dS and their products are 0. Without a right window and with
    seqlen_k a multiple of BLOCK_N, full_lo is lo; without a left window, full_hi is the walk's end."""
    diagonal = seqlen_k - seqlen_q
    end = lo + (tl.maximum(hi - lo, 0) + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    full_lo = lo
    if right >= 0:  # the first query that sees the block's last key, rounded up to a block
        first = tl.maximum(n0 + BLOCK_N - 1 - diagonal - right, 0)
        full_lo = tl.maximum(lo, (first + BLOCK_M - 1) // BLOCK_M * BLOCK_M)
    if n0 + BLOCK_N > seqlen_k:  # keys past the sequence's end: every block masks them
        full_lo = end
    full_lo = tl.minimum(full_lo, end)
    stop = end
    if left >= 0:  # one past the last query that sees the block's first key
        stop = tl.minimum(stop, n0 + left - diagonal + 1)
    full_hi = full_lo + tl.maximum(stop - full_lo, 0) // BLOCK_M * BLOCK_M
    return full_lo, full_hi


@triton.jit
def _block_indices(start, BLOCK: tl.constexpr):
    """start + [0, BLOCK): the indices of the block that starts at `start`, a multiple of BLOCK (a
    walk's loop variable), written so that Triton's alignment analysis sees the multiple: a
    tl.multiple_of hint on a loop's induction variable reached none of Triton 3.6's passes (it has
    no defining op to carry it), and without it the fp8 forward's keys-contiguous V was read with byte
    loads outside the software pipeline (64 LDG.E.U8 a thread per step at hd 128, sm_90;
    benchmarks/NOTES.md "Triton backend (#9), session 23")."""
    return start // BLOCK * BLOCK + tl.arange(0, BLOCK)


@triton.jit
def _walk_part(part: tl.constexpr, lo, full_lo, full_hi, hi):
    """Bounds [start, stop) of part `part` of a walk split by _full_key_blocks / _full_query_blocks:
    0 the masked blocks before the whole ones, 1 the blocks seen whole (no mask), 2 the masked
    blocks after. The kernels run the parts in a tl.static_range, so each is its own loop,
    compiled only where its flag says it can run."""
    start = lo if part == 0 else (full_lo if part == 1 else full_hi)
    stop = full_lo if part == 0 else (full_hi if part == 1 else hi)
    return start, stop


@triton.jit
def _row_block(batch, first, rows, length, head, dims, headdim, stride_b, stride_s, stride_h, PAD_D: tl.constexpr):
    """Offsets and mask of a (len(rows), BLOCK_D) block: rows `rows` of sequence `batch` (whose
    first row is `first`, `length` long) in head `head` of a q/k/v-like tensor. PAD_D: the head dim
    is narrower than BLOCK_D, so the mask covers the padded dims too."""
    offsets = batch * stride_b + (first + rows[:, None]) * stride_s + head * stride_h + dims[None, :]
    mask = rows[:, None] < length
    if PAD_D:
        mask = mask & (dims[None, :] < headdim)
    return offsets, mask


@triton.jit
def _load_row_block(ptr, batch, first, rows, length, head, dims, headdim, stride_b, stride_s, stride_h,
                    PAD_D: tl.constexpr):
    offsets, mask = _row_block(batch, first, rows, length, head, dims, headdim, stride_b, stride_s, stride_h, PAD_D)
    return tl.load(ptr + offsets, mask=mask, other=0.0)


@triton.jit
def _row_statistics(Lse, Delta, batch, head, first, rows, length, stride_lb, stride_lh):
    """The forward's lse in base 2 (lse * log2(e)) and D = rowsum(dO * O) of the rows (+inf and 0
    past the sequence, where P is then 0)."""
    offsets = batch * stride_lb + head * stride_lh + first + rows
    lse = tl.load(Lse + offsets, mask=rows < length, other=float("inf"))
    return lse * LOG2E, tl.load(Delta + offsets, mask=rows < length, other=0.0)


@triton.jit
def _online_softmax(s, m_i, l_i, P_SCALE_LOG2: tl.constexpr):
    """One key block of the online softmax: s the block's final scores (-inf where masked), m_i / l_i
    the rows' running maximum and sum (base 2). Returns p = 2^P_SCALE_LOG2 * exp2(s - max)
    unnormalized (the scale: fp8_kernels.E4M3_P_SCALE_LOG2; l_i sums p as scaled and
    _normalized_rows takes the scale back out of the lse), the factor alpha that rescales what was
    accumulated before, and the new m_i, l_i."""
    s = s * LOG2E
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_base = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that see no key yet
    p = tl.exp2(s - (m_base - P_SCALE_LOG2)[:, None])
    alpha = tl.exp2(m_i - m_base)
    return p, alpha, m_new, l_i * alpha + tl.sum(p, 1)


@triton.jit
def _online_softmax_of_products(qk, m_i, l_i, scale_log2, rows, cols, len_q, len_k, left, right,
                                MASKED: tl.constexpr, LEFT_BOUNDED: tl.constexpr, P_SCALE_LOG2: tl.constexpr):
    """_online_softmax of plain scaled scores (no softcap, no ALiBi) from the raw products qk, with
    scale_log2 = scale * log2(e) > 0 folded in: an unmasked block takes the row maximum of qk
    before scaling, then p = exp2(qk * scale_log2 - max) is one FMA per score (FlashAttention's own
    order, csrc/flash/softmax.cuh; it needs the scale positive, which validation and the fp8
    descales' meaning give). A masked block scales first, so that a zero scale cannot meet -inf."""
    if MASKED:
        s = tl.where(_visible(rows[:, None], cols[None, :], len_q, len_k, left, right, LEFT_BOUNDED, False),
                     qk * scale_log2, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_base = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that see no key yet
        p = tl.exp2(s - (m_base - P_SCALE_LOG2)[:, None])
    else:
        m_new = tl.maximum(m_i, tl.max(qk, 1) * scale_log2)
        m_base = m_new
        p = tl.exp2(qk * scale_log2 - (m_base - P_SCALE_LOG2)[:, None])
    alpha = tl.exp2(m_i - m_base)
    return p, alpha, m_new, l_i * alpha + tl.sum(p, 1)


@triton.jit
def _normalized_rows(acc, m_i, l_i, keep_scale, P_SCALE_LOG2: tl.constexpr):
    """(out, lse) of rows at the end of the key walk: out = acc / l (times dropout's 1 / keep_prob),
    and for a row that saw no key out 0 and lse +inf (flash_attn/reference.py's convention). p and l
    carry the factor 2^P_SCALE_LOG2 (_online_softmax): out's quotient cancels it, the lse subtracts it."""
    seen = l_i > 0
    out = acc * (keep_scale / tl.where(seen, l_i, 1.0))[:, None]
    lse = tl.where(seen, (m_i + tl.log2(tl.where(seen, l_i, 1.0)) - P_SCALE_LOG2) / LOG2E, float("inf"))
    return out, lse


@triton.jit
def _alibi_slope(Slopes, batch, head, stride_slope_b, HAS_ALIBI: tl.constexpr):
    slope = 0.0
    if HAS_ALIBI:
        slope = tl.load(Slopes + batch * stride_slope_b + head)
    return slope


@triton.jit
def _key_block(base, cols, len_k, dims, headdim, stride_s, stride_d, MASKED: tl.constexpr, PAD_D: tl.constexpr):
    """The (BLOCK_N, BLOCK_D) block of keys `cols` of one head at `base` (its first key, dim 0).
    MASKED: keys past len_k read as 0; whole blocks (MASKED False) lie inside the sequence. PAD_D:
    the padded head dims read as 0; without it the load has no mask at all."""
    pointers = base + cols[:, None] * stride_s + dims[None, :] * stride_d
    if MASKED:
        if PAD_D:
            block = tl.load(pointers, mask=(cols[:, None] < len_k) & (dims[None, :] < headdim), other=0.0)
        else:
            block = tl.load(pointers, mask=cols[:, None] < len_k, other=0.0)
    else:
        if PAD_D:
            block = tl.load(pointers, mask=dims[None, :] < headdim, other=0.0)
        else:
            block = tl.load(pointers)
    return block


@triton.jit
def _key_descriptor(base, len_k, headdim, stride_s, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """A tensor descriptor, made on the device, of one head's (len_k, headdim) keys or values from
    base (row stride stride_s, the head dim contiguous) in blocks of (BLOCK_N, BLOCK_D): on Hopper
    its loads are TMA copies (cp.async.bulk.tensor in Triton 3.9's sm_90 PTX), which read the rows
    past len_k and the columns past headdim as 0 themselves, so a block needs no pointer tensor and
    no mask. The host takes this path only where TMA can address the tensor
    (attention._forward_descriptors)."""
    return tl.make_tensor_descriptor(base, [len_k, headdim], [stride_s, 1], [BLOCK_N, BLOCK_D])


@triton.jit
def _row_block_view(desc, batch, first, column, ROWS: tl.constexpr, COLUMNS: tl.constexpr):
    """The (ROWS, COLUMNS) block of rows [first, first + ROWS) and columns [column, column + COLUMNS)
    of batch entry `batch` of a host-made rank-3 descriptor: over a (batch, seqlen, heads * headdim)
    view of a dense q / k / v-like tensor (attention._host_descriptor; rows are tokens, the columns
    one head's dims), or over the (batch, heads * headdim, keys) view of fp8 V's keys-contiguous copy
    (attention._keys_contiguous_descriptor; rows are dims, columns keys). One TMA copy on Hopper; rows
    and columns past the view's ends read as 0."""
    return desc.load([batch, first, column]).reshape(ROWS, COLUMNS)


@triton.jit
def _attend(acc, m_i, l_i, q, K_head, V_head, start, stop, rows, dims, headdim, len_q, len_k, stride_ks, stride_vs,
            stride_vd, score_scale, scale_log2, softcap, slope, left, right, Rng, batch, heads, head, kv_column,
            keep_threshold, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
            HAS_ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr, DOT_PRECISION: tl.constexpr,
            INTERPRETER_ROUNDING: tl.constexpr, MASKED: tl.constexpr, LEFT_BOUNDED: tl.constexpr, PAD_D: tl.constexpr,
            P_SCALE_LOG2: tl.constexpr, DESCRIPTORS: tl.constexpr, V_KEYS_CONTIGUOUS: tl.constexpr):
    """The forward's walk over the key blocks [start, stop) (multiples of BLOCK_N): returns acc, m_i,
    l_i updated. MASKED False: every key of every block is visible (_full_key_blocks). P_SCALE_LOG2:
    _online_softmax's scale of p. DESCRIPTORS: K_head and V_head are the head's own tensor
    descriptors (DEVICE_KV_DESCRIPTORS, _key_descriptor), the host's over every head
    (HOST_DESCRIPTORS: the head's columns start at kv_column), or pointers to the head's first key.
    V_KEYS_CONTIGUOUS (fp8): V is the keys-contiguous copy (attention.keys_contiguous), whose host-made
    descriptor is over its (batch, heads * headdim, keys) view, so a block is the head's rows
    [kv_column, kv_column + BLOCK_D) of keys [n0, n0 + BLOCK_N), which P . V reads transposed."""
    for n0 in range(start, stop, BLOCK_N):
        cols = _block_indices(n0, BLOCK_N)
        if DESCRIPTORS == DEVICE_KV_DESCRIPTORS:
            k = K_head.load([n0, 0])
            v = V_head.load([n0, 0])
        elif DESCRIPTORS == HOST_DESCRIPTORS:
            k = _row_block_view(K_head, batch, n0, kv_column, BLOCK_N, BLOCK_D)
            if V_KEYS_CONTIGUOUS:  # the (BLOCK_D, BLOCK_N) block of the head's dims, transposed in place
                v = tl.trans(_row_block_view(V_head, batch, kv_column, n0, BLOCK_D, BLOCK_N))
            else:
                v = _row_block_view(V_head, batch, n0, kv_column, BLOCK_N, BLOCK_D)
        else:
            k = _key_block(K_head, cols, len_k, dims, headdim, stride_ks, 1, MASKED, PAD_D)
            v = _key_block(V_head, cols, len_k, dims, headdim, stride_vs, stride_vd, MASKED, PAD_D)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        if HAS_SOFTCAP or HAS_ALIBI:
            s, _ = _final_scores(qk, rows[:, None], cols[None, :], len_q, len_k, score_scale, softcap, slope, left,
                                 right, HAS_SOFTCAP, HAS_ALIBI, MASKED, LEFT_BOUNDED, False)
            p, alpha, m_i, l_i = _online_softmax(s, m_i, l_i, P_SCALE_LOG2)
        else:
            p, alpha, m_i, l_i = _online_softmax_of_products(qk, m_i, l_i, scale_log2, rows, cols, len_q, len_k, left,
                                                             right, MASKED, LEFT_BOUNDED, P_SCALE_LOG2)
        if HAS_DROPOUT:  # the softmax normalizes before dropout
            p = tl.where(_dropout_keep(rows[:, None], cols[None, :], Rng, batch, heads, head, keep_threshold), p, 0.0)
        acc = tl.dot(_pv_operand(p, v.dtype, INTERPRETER_ROUNDING), v, acc * alpha[:, None],
                     input_precision=DOT_PRECISION)
    return acc, m_i, l_i


@triton.jit
def _scheduled_query_block(seqlen_q, heads, pairs_per_group, BLOCK_M: tl.constexpr, GROUPED: tl.constexpr):
    """(query block, head, batch entry) of this program in the host's schedule
    (attention.pairs_per_group, attention._Problem.scheduled_query_grid). GROUPED (a 1D grid over
    query blocks x heads x batch): the (head, batch) pairs run in groups of pairs_per_group, and within
    a group every pair's last query block first, then every pair's last but one, and so on. Under a
    causal mask the last blocks walk the most keys, so a group's longest walks start first and its
    shortest fill the tail, the last group's included; the host sizes a group's K and V to a third of
    the L2 (attention.SCHEDULE_GROUP_BYTES). Not GROUPED (groups of one pair): the (query blocks, heads,
    batch) grid, each pair's blocks last to first, the same order without the 1D grid's index
    arithmetic, which had cost the hd 64 causal 64 x 64 tile 7 registers a thread (128 -> 135, Triton
    3.6 for sm_90), its fourth CTA an SM and 8-10% of its 1k kernel time (benchmarks/NOTES.md v49)."""
    if GROUPED:
        query_blocks = tl.cdiv(seqlen_q, BLOCK_M)
        pairs = tl.num_programs(0) // query_blocks
        group_programs = pairs_per_group * query_blocks
        group = tl.program_id(0) // group_programs
        rank = tl.program_id(0) - group * group_programs
        pairs_here = tl.minimum(pairs_per_group, pairs - group * pairs_per_group)  # the last group's may be fewer
        pair = group * pairs_per_group + rank % pairs_here
        m_block, head, batch = query_blocks - 1 - rank // pairs_here, pair % heads, pair // heads
    else:
        m_block, head, batch = tl.num_programs(0) - 1 - tl.program_id(0), tl.program_id(1), tl.program_id(2)
    return m_block, head, batch


@triton.jit
def attention_forward_kernel(
        Q, K, V, Out, Lse, CuQ, CuK, Slopes, Rng, Descales,
        stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_vd,
        stride_ob, stride_os, stride_oh, stride_lb, stride_lh, stride_slope_b, stride_descale_t, stride_descale_b,
        seqlen_q, seqlen_k, total_q, total_k, group, headdim, scale, softcap, left, right, heads, keep_threshold,
        keep_scale, pairs_per_group, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
        VARLEN: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr,
        DOT_PRECISION: tl.constexpr, PAD_D: tl.constexpr, CLIP_LEFT: tl.constexpr, CLIP_RIGHT: tl.constexpr,
        IS_FP8: tl.constexpr, INTERPRETER_ROUNDING: tl.constexpr, DESCRIPTORS: tl.constexpr,
        GROUPED: tl.constexpr):
    """Out and Lse of one query block. IS_FP8: q, k, v are e4m3 with the descales of Descales
    (fp8_kernels.py); Out may then be of another dtype (the host allocates bf16). DESCRIPTORS: where
    the blocks come from (POINTER_BLOCKS, DEVICE_KV_DESCRIPTORS, HOST_DESCRIPTORS; fp32 calls take
    pointers, fp8 calls pointers or host-made descriptors, attention._forward_descriptors): with
    HOST_DESCRIPTORS, Q, K, V (fp8: its keys-contiguous copy) and Out are tensor descriptors, not
    pointers, and their strides are unread.

    The key walk runs in up to three loops (_full_key_blocks): masked blocks before and after the
    ones every query sees whole, which skip the mask. The host compiles the masked loops only where
    they can run: CLIP_LEFT (a left window) the first, CLIP_RIGHT (a causal / right window, varlen,
    or seqlen_k not a multiple of every BLOCK_N) the last. Each loop compiled costs registers even
    when it runs no block (Triton 3.9 for sm_90, hd 128, 128 x 64, 8 warps: 177 registers with the
    whole-block loop alone, 227 with one masked loop, 255 and 64 bytes of spills with both), so a
    plain non-causal call runs one loop, a causal one two. The programs run in the order of
    _scheduled_query_block (pairs_per_group, GROUPED)."""
    m_block, head, batch = _scheduled_query_block(seqlen_q, heads, pairs_per_group, BLOCK_M, GROUPED)
    q_first, len_q, k_first, len_k = _sequences(CuQ, CuK, batch, seqlen_q, seqlen_k, total_q, total_k, VARLEN)
    m0 = m_block * BLOCK_M
    if m0 < len_q:
        rows = m0 + tl.arange(0, BLOCK_M)
        dims = tl.arange(0, BLOCK_D)
        kv_head = head // group
        if DESCRIPTORS == HOST_DESCRIPTORS:
            q = _row_block_view(Q, batch, m0, head * headdim, BLOCK_M, BLOCK_D)
        else:
            q = _load_row_block(Q, batch, q_first, rows, len_q, head, dims, headdim, stride_qb, stride_qs, stride_qh,
                                PAD_D)
        slope = _alibi_slope(Slopes, batch, head, stride_slope_b, HAS_ALIBI)
        score_scale, out_scale = scale, keep_scale
        if IS_FP8:
            score_scale, out_scale = _descaled_scales(Descales, batch, kv_head, stride_descale_t, stride_descale_b,
                                                      scale, keep_scale)
        if DESCRIPTORS == HOST_DESCRIPTORS:
            K_head, V_head = K, V
        else:
            K_head = K + batch * stride_kb + k_first * stride_ks + kv_head * stride_kh
            V_head = V + batch * stride_vb + k_first * stride_vs + kv_head * stride_vh
            if DESCRIPTORS == DEVICE_KV_DESCRIPTORS:
                K_head = _key_descriptor(K_head, len_k, headdim, stride_ks, BLOCK_N, BLOCK_D)
                V_head = _key_descriptor(V_head, len_k, headdim, stride_vs, BLOCK_N, BLOCK_D)
        m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
        l_i = tl.zeros((BLOCK_M,), tl.float32)
        acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
        lo, hi = _key_range(m0, BLOCK_M, len_q, len_k, left, right, BLOCK_N)
        full_lo, full_hi = _full_key_blocks(m0, lo, hi, len_q, len_k, left, right, BLOCK_M, BLOCK_N)
        scale_log2 = score_scale * LOG2E
        P_SCALE_LOG2: tl.constexpr = E4M3_P_SCALE_LOG2 if IS_FP8 else 0  # of p (_online_softmax)
        for part in tl.static_range(3):
            if part == 1 or (part == 0 and CLIP_LEFT) or (part == 2 and CLIP_RIGHT):
                start, stop = _walk_part(part, lo, full_lo, full_hi, hi)
                acc, m_i, l_i = _attend(acc, m_i, l_i, q, K_head, V_head, start, stop, rows, dims, headdim, len_q,
                                        len_k, stride_ks, stride_vs, stride_vd, score_scale, scale_log2, softcap, slope,
                                        left, right, Rng, batch, heads, head, kv_head * headdim, keep_threshold,
                                        BLOCK_N, BLOCK_D, HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT, DOT_PRECISION,
                                        INTERPRETER_ROUNDING, part != 1, CLIP_LEFT, PAD_D, P_SCALE_LOG2, DESCRIPTORS,
                                        IS_FP8)
        out, lse = _normalized_rows(acc, m_i, l_i, out_scale, P_SCALE_LOG2)
        if DESCRIPTORS == HOST_DESCRIPTORS:  # the copy stops at the sequence's end
            Out.store([batch, m0, head * headdim],
                      _output(out, Out.dtype, INTERPRETER_ROUNDING).reshape(1, BLOCK_M, BLOCK_D))
        else:
            out_offsets, out_mask = _row_block(batch, q_first, rows, len_q, head, dims, headdim, stride_ob,
                                               stride_os, stride_oh, PAD_D)
            tl.store(Out + out_offsets, _output(out, Out.dtype.element_ty, INTERPRETER_ROUNDING), mask=out_mask)
        tl.store(Lse + batch * stride_lb + head * stride_lh + q_first + rows, lse, mask=rows < len_q)


@triton.jit
def attention_backward_delta_kernel(
        Out, DOut, Delta, CuQ, stride_ob, stride_os, stride_oh, stride_db, stride_ds, stride_dh, stride_lb, stride_lh,
        seqlen_q, total_q, headdim, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, VARLEN: tl.constexpr,
        PAD_D: tl.constexpr):
    """D = rowsum(dO * O) in fp32 of one block of rows of one head, laid out like lse (the
    backward's first kernel; rows outside every varlen sequence are left unwritten: no kernel reads
    them)."""
    m_block, head, batch = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    q_first, len_q = _sequence(CuQ, batch, seqlen_q, total_q, VARLEN)
    m0 = m_block * BLOCK_M
    if m0 < len_q:
        rows = m0 + tl.arange(0, BLOCK_M)
        dims = tl.arange(0, BLOCK_D)
        o = _load_row_block(Out, batch, q_first, rows, len_q, head, dims, headdim, stride_ob, stride_os, stride_oh,
                            PAD_D)
        do = _load_row_block(DOut, batch, q_first, rows, len_q, head, dims, headdim, stride_db, stride_ds, stride_dh,
                             PAD_D)
        delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
        tl.store(Delta + batch * stride_lb + head * stride_lh + q_first + rows, delta, mask=rows < len_q)


@triton.jit
def _probabilities(qk, i, j, lse_log2, len_q, len_k, scale, scale_log2, softcap, slope, left, right,
                   HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, MASKED: tl.constexpr,
                   LEFT_BOUNDED: tl.constexpr, BOUNDS_BY_KEY: tl.constexpr):
    """P recomputed from the raw products qk (either orientation: i, j the 2D query / key indices,
    lse_log2 the rows' lse * log2(e) broadcast like i) and t = tanh(qk * scale / softcap) (1
    without softcap): dS = P (dP - D) (1 - t^2) times the scale, which the kernels apply once to
    the finished dQ / dK. Plain scores take one FMA per element: exp2(qk * scale_log2 - lse_log2)."""
    if HAS_SOFTCAP or HAS_ALIBI:
        s, t = _final_scores(qk, i, j, len_q, len_k, scale, softcap, slope, left, right, HAS_SOFTCAP, HAS_ALIBI,
                             MASKED, LEFT_BOUNDED, BOUNDS_BY_KEY)
        p = tl.exp2(s * LOG2E - lse_log2)
    else:
        t = tl.full(qk.shape, 1.0, tl.float32)
        if MASKED:
            p = tl.exp2(tl.where(_visible(i, j, len_q, len_k, left, right, LEFT_BOUNDED, BOUNDS_BY_KEY),
                                 qk * scale_log2 - lse_log2, float("-inf")))
        else:
            p = tl.exp2(qk * scale_log2 - lse_log2)
    return p, t


@triton.jit
def _dkdv_walk(dk, dv, k, v, Q, DOut, Lse, Delta, start, stop, cols, dims, headdim, batch, head, heads, q_first, len_q,
               len_k, stride_qb, stride_qs, stride_qh, stride_ob, stride_os, stride_oh, stride_lb, stride_lh, scale,
               scale_log2, softcap, slope, left, right, Rng, keep_threshold, keep_scale, BLOCK_M: tl.constexpr,
               HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr,
               DOT_PRECISION: tl.constexpr, MASKED: tl.constexpr, LEFT_BOUNDED: tl.constexpr, PAD_D: tl.constexpr):
    """dK (unscaled) and dV of the key block `cols` over the query blocks [start, stop), in the
    transposed orientation: S^T = K Q^T (keys down the rows), so that P^T and dS^T are the A
    operands of dV += P^T dO and dK += dS^T Q as they come out of the MMA, with no transpose through
    shared memory. MASKED False: every query of the blocks sees every key (_full_query_blocks)."""
    for m0 in range(start, stop, BLOCK_M):
        rows = _block_indices(m0, BLOCK_M)
        q = _load_row_block(Q, batch, q_first, rows, len_q, head, dims, headdim, stride_qb, stride_qs, stride_qh,
                            PAD_D)
        do = _load_row_block(DOut, batch, q_first, rows, len_q, head, dims, headdim, stride_ob, stride_os, stride_oh,
                             PAD_D)
        lse_log2, delta = _row_statistics(Lse, Delta, batch, head, q_first, rows, len_q, stride_lb, stride_lh)
        qk_t = tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION)
        p_t, t_t = _probabilities(qk_t, rows[None, :], cols[:, None], lse_log2[None, :], len_q, len_k, scale,
                                  scale_log2, softcap, slope, left, right, HAS_SOFTCAP, HAS_ALIBI, MASKED, LEFT_BOUNDED,
                                  True)
        dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
        p_out = p_t  # P as the output saw it: dropped entries 0, kept ones scaled
        if HAS_DROPOUT:
            keep = _dropout_keep(rows[None, :], cols[:, None], Rng, batch, heads, head, keep_threshold)
            p_out = tl.where(keep, p_t * keep_scale, 0.0)
            dp_t = tl.where(keep, dp_t * keep_scale, 0.0)
        dv += tl.dot(p_out.to(do.dtype), do, input_precision=DOT_PRECISION)
        ds_t = p_t * (dp_t - delta[None, :])
        if HAS_SOFTCAP:
            ds_t = ds_t * (1.0 - t_t * t_t)
        dk += tl.dot(ds_t.to(q.dtype), q, input_precision=DOT_PRECISION)
    return dk, dv


@triton.jit
def attention_backward_dkdv_kernel(
        Q, K, V, DOut, Lse, Delta, DK, DV, CuQ, CuK, Slopes, Rng,
        stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
        stride_ob, stride_os, stride_oh, stride_lb, stride_lh, stride_slope_b,
        stride_gb, stride_gs, stride_gh,
        seqlen_q, seqlen_k, total_q, total_k, group, headdim, scale, softcap, left, right, heads, keep_threshold,
        keep_scale, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, VARLEN: tl.constexpr,
        HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr, DOT_PRECISION: tl.constexpr,
        PAD_D: tl.constexpr, CLIP_LEFT: tl.constexpr, CLIP_RIGHT: tl.constexpr):
    """dK, dV of one key block for one query head (DK, DV hold one slice per query head, strides
    stride_g*; the caller sums the slices of a KV head). The query walk runs in up to three loops
    (_full_query_blocks; CLIP_RIGHT compiles the masked first one, CLIP_LEFT the masked last one)."""
    n_block, head, batch = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    q_first, len_q, k_first, len_k = _sequences(CuQ, CuK, batch, seqlen_q, seqlen_k, total_q, total_k, VARLEN)
    n0 = n_block * BLOCK_N
    if n0 < len_k:
        cols = n0 + tl.arange(0, BLOCK_N)
        dims = tl.arange(0, BLOCK_D)
        kv_head = head // group
        k = _load_row_block(K, batch, k_first, cols, len_k, kv_head, dims, headdim, stride_kb, stride_ks, stride_kh,
                            PAD_D)
        v = _load_row_block(V, batch, k_first, cols, len_k, kv_head, dims, headdim, stride_vb, stride_vs, stride_vh,
                            PAD_D)
        slope = _alibi_slope(Slopes, batch, head, stride_slope_b, HAS_ALIBI)
        scale_log2 = scale * LOG2E
        dk = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
        dv = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
        lo, hi = _query_range(n0, BLOCK_N, len_q, len_k, left, right, BLOCK_M)
        full_lo, full_hi = _full_query_blocks(n0, lo, hi, len_q, len_k, left, right, BLOCK_M, BLOCK_N)
        for part in tl.static_range(3):  # queries ascend: the causal diagonal comes first
            if part == 1 or (part == 0 and CLIP_RIGHT) or (part == 2 and CLIP_LEFT):
                start, stop = _walk_part(part, lo, full_lo, full_hi, hi)
                dk, dv = _dkdv_walk(dk, dv, k, v, Q, DOut, Lse, Delta, start, stop, cols, dims, headdim, batch, head,
                                    heads, q_first, len_q, len_k, stride_qb, stride_qs, stride_qh, stride_ob, stride_os,
                                    stride_oh, stride_lb, stride_lh, scale, scale_log2, softcap, slope, left, right,
                                    Rng, keep_threshold, keep_scale, BLOCK_M, HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT,
                                    DOT_PRECISION, part != 1, CLIP_LEFT, PAD_D)
        g_offsets, g_mask = _row_block(batch, k_first, cols, len_k, head, dims, headdim, stride_gb, stride_gs,
                                       stride_gh, PAD_D)
        tl.store(DK + g_offsets, (dk * scale).to(DK.dtype.element_ty), mask=g_mask)
        tl.store(DV + g_offsets, dv.to(DV.dtype.element_ty), mask=g_mask)


@triton.jit
def _dq_walk(dq, q, do, lse_log2, delta, K_head, V_head, start, stop, rows, dims, headdim, batch, head, heads, len_q,
             len_k, stride_ks, stride_vs, scale, scale_log2, softcap, slope, left, right, Rng, keep_threshold,
             keep_scale, BLOCK_N: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
             HAS_DROPOUT: tl.constexpr, DOT_PRECISION: tl.constexpr, MASKED: tl.constexpr, LEFT_BOUNDED: tl.constexpr,
             PAD_D: tl.constexpr):
    """dQ (unscaled) of the query block `rows` over the key blocks [start, stop); MASKED False: every
    key of the blocks is visible to every query (_full_key_blocks)."""
    for n0 in range(start, stop, BLOCK_N):
        cols = _block_indices(n0, BLOCK_N)
        k = _key_block(K_head, cols, len_k, dims, headdim, stride_ks, 1, MASKED, PAD_D)
        v = _key_block(V_head, cols, len_k, dims, headdim, stride_vs, 1, MASKED, PAD_D)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        p, t = _probabilities(qk, rows[:, None], cols[None, :], lse_log2[:, None], len_q, len_k, scale, scale_log2,
                              softcap, slope, left, right, HAS_SOFTCAP, HAS_ALIBI, MASKED, LEFT_BOUNDED, False)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
        if HAS_DROPOUT:
            dp = tl.where(_dropout_keep(rows[:, None], cols[None, :], Rng, batch, heads, head, keep_threshold),
                          dp * keep_scale, 0.0)
        ds = p * (dp - delta[:, None])
        if HAS_SOFTCAP:
            ds = ds * (1.0 - t * t)
        dq += tl.dot(ds.to(k.dtype), k, input_precision=DOT_PRECISION)
    return dq


@triton.jit
def attention_backward_dq_kernel(
        Q, K, V, DOut, Lse, Delta, DQ, CuQ, CuK, Slopes, Rng,
        stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
        stride_ob, stride_os, stride_oh, stride_lb, stride_lh, stride_slope_b,
        stride_gb, stride_gs, stride_gh,
        seqlen_q, seqlen_k, total_q, total_k, group, headdim, scale, softcap, left, right, heads, keep_threshold,
        keep_scale, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, VARLEN: tl.constexpr,
        HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr, DOT_PRECISION: tl.constexpr,
        PAD_D: tl.constexpr, CLIP_LEFT: tl.constexpr, CLIP_RIGHT: tl.constexpr):
    """dQ of one query block (DQ's strides stride_g*: Q may be a view into a packed or padded tensor
    while DQ is a tensor of its own); its key walk is the forward's (_full_key_blocks), query blocks
    last to first as there."""
    m_block, head, batch = tl.num_programs(0) - 1 - tl.program_id(0), tl.program_id(1), tl.program_id(2)
    q_first, len_q, k_first, len_k = _sequences(CuQ, CuK, batch, seqlen_q, seqlen_k, total_q, total_k, VARLEN)
    m0 = m_block * BLOCK_M
    if m0 < len_q:
        rows = m0 + tl.arange(0, BLOCK_M)
        dims = tl.arange(0, BLOCK_D)
        kv_head = head // group
        q_offsets, q_mask = _row_block(batch, q_first, rows, len_q, head, dims, headdim, stride_qb, stride_qs,
                                       stride_qh, PAD_D)
        q = tl.load(Q + q_offsets, mask=q_mask, other=0.0)
        do = _load_row_block(DOut, batch, q_first, rows, len_q, head, dims, headdim, stride_ob, stride_os, stride_oh,
                             PAD_D)
        lse_log2, delta = _row_statistics(Lse, Delta, batch, head, q_first, rows, len_q, stride_lb, stride_lh)
        slope = _alibi_slope(Slopes, batch, head, stride_slope_b, HAS_ALIBI)
        scale_log2 = scale * LOG2E
        K_head = K + batch * stride_kb + k_first * stride_ks + kv_head * stride_kh
        V_head = V + batch * stride_vb + k_first * stride_vs + kv_head * stride_vh
        dq = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
        lo, hi = _key_range(m0, BLOCK_M, len_q, len_k, left, right, BLOCK_N)
        full_lo, full_hi = _full_key_blocks(m0, lo, hi, len_q, len_k, left, right, BLOCK_M, BLOCK_N)
        for part in tl.static_range(3):
            if part == 1 or (part == 0 and CLIP_LEFT) or (part == 2 and CLIP_RIGHT):
                start, stop = _walk_part(part, lo, full_lo, full_hi, hi)
                dq = _dq_walk(dq, q, do, lse_log2, delta, K_head, V_head, start, stop, rows, dims, headdim, batch,
                              head, heads, len_q, len_k, stride_ks, stride_vs, scale, scale_log2, softcap, slope, left,
                              right, Rng, keep_threshold, keep_scale, BLOCK_N, HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT,
                              DOT_PRECISION, part != 1, CLIP_LEFT, PAD_D)
        g_offsets, g_mask = _row_block(batch, q_first, rows, len_q, head, dims, headdim, stride_gb, stride_gs,
                                       stride_gh, PAD_D)
        tl.store(DQ + g_offsets, (dq * scale).to(DQ.dtype.element_ty), mask=g_mask)
