"""The decode suite: one query token against a KV cache (GQA 32/8 heads, headdim 128, bf16) at each
(batch, context) pair of the plan. Cells are GB/s of K+V read, with their time in µs:

- ours-kvcache: flash_attn_with_kvcache on the contiguous cache, cache_seqlens = context;
- ours-paged16, ours-paged256: the same keys and values laid out in pages of 16 and 256 rows, the
  pages in a random order (block_table a shuffled permutation), cache_seqlens = context;
- ours: flash_attn_func on the one-token query (our prefill kernel);
- SDPA's backends and naive attention.

Each row also carries numbers measured in the same run, as extra columns: the device's copy
bandwidth (dst.copy_(src) of a buffer as large as the cache), ours over it, ours' speed-up over
sdpa-cudnn, contiguous over paged-16 time, and the extra time of a decode step that also appends
one token with rotary.
"""

from dataclasses import dataclass

import torch

from . import impls as impl_lib
from .cells import ERROR, OK, Cell, Row, Suite, format_cell, short_text
from .measure import guarded
from .plan import DTYPES
from .runner import random_inputs, run_configs
from .shapes import AttnShape, format_seqlen, gb_per_s, kv_cache_bytes

SDPA_PEERS = ("flash", "cudnn", "efficient", "math")
CONTIGUOUS = "ours-kvcache"
PAGE_SIZES = (16, 256)
PAGE_ORDER_SEED = 0  # the random permutation of the pages in block_table
ROTARY_BASE = 10000.0
APPEND_ROTARY = "append+rotary step"
COPY = "copy"


def paged_column(page_size):
    return f"ours-paged{page_size}"


PAGED_COLUMNS = {paged_column(size): size for size in PAGE_SIZES}
EXTRA_COLUMNS = [  # (key in Row.extra, header, digits); the notes define each
    ("copy_GBps", "copy GB/s (read+write)", 0),
    ("ours_vs_copy", "ours kvcache GB/s / copy GB/s", 2),
    ("ours_vs_cudnn", "sdpa-cudnn µs / ours kvcache µs", 2),
    ("paged16_vs_contiguous", "ours kvcache µs / paged16 µs", 2),
    ("append_rotary_us", "append+rotary extra µs", 1),
]
COPY_ONLY_EXTRA_COLUMNS = EXTRA_COLUMNS[:1]  # without flash_attn_with_kvcache: the device reference only


@dataclass
class DecodeProblem:
    """One decode step's inputs: q (batch, 1, nheads, headdim), the contiguous caches (batch, context,
    nheads_k, headdim), cache_seqlens (batch,) int32 = context, and the K+V bytes a step reads."""

    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    cache_seqlens: torch.Tensor
    kv_bytes: int


def decode_problem(batch, context, heads, dtype, device):
    nheads, nheads_k, headdim = heads
    shape = AttnShape(batch, 1, context, nheads, nheads_k, headdim)
    q, k, v, _ = random_inputs(shape, dtype, device, requires_grad=False)
    cache_seqlens = torch.full((batch,), context, dtype=torch.int32, device=device)
    return DecodeProblem(q, k, v, cache_seqlens, kv_cache_bytes(batch, context, nheads_k, headdim, q.element_size()))


# ---- the paged layout ----

def shuffled_block_table(batch, pages_per_sequence, seed, device):
    """(batch, pages_per_sequence) int32: a random permutation of the page indices, so a sequence's
    consecutive pages lie scattered over the pool, as they do after a serving engine's churn."""
    order = torch.randperm(batch * pages_per_sequence, generator=torch.Generator().manual_seed(seed))
    return order.view(batch, pages_per_sequence).to(device=device, dtype=torch.int32)


def paged_layout(cache, page_size, block_table):
    """The contiguous cache (batch, context, nheads_k, headdim) copied into pages (num_pages, page_size,
    nheads_k, headdim): row t of sequence b goes to row t % page_size of page block_table[b, t //
    page_size]. One index_copy_ into a fresh pool (rows past context stay zero): the only new memory is
    the pool and a (batch, context) index."""
    batch, context, *row_shape = cache.shape
    pages = cache.new_zeros(block_table.numel(), page_size, *row_shape)
    positions = torch.arange(context, device=cache.device)
    rows = block_table.long()[:, positions // page_size] * page_size + positions % page_size
    pages.view(-1, *row_shape).index_copy_(0, rows.flatten(), cache.reshape(batch * context, *row_shape))
    return pages


def paged_problem(problem, page_size, seed=PAGE_ORDER_SEED):
    """k_pages, v_pages and the block_table of the problem's cache in pages of page_size rows."""
    batch, context = problem.k_cache.shape[:2]
    block_table = shuffled_block_table(batch, -(-context // page_size), seed, problem.q.device)
    return paged_layout(problem.k_cache, page_size, block_table), paged_layout(problem.v_cache, page_size,
                                                                               block_table), block_table


# ---- the cells ----

def _bandwidth_cell(bench, fn, nbytes):
    """A GB/s cell (nbytes over the median time)."""
    ms = bench.timer(fn)
    return Cell(OK, gb_per_s(nbytes, ms), ms)


def _sdpa_decode_cell(bench, name, problem):
    """An SDPA backend on the GQA decode: with enable_gqa=True, else on K and V repeated to the query
    heads beforehand (the GB/s still count the cache's own bytes, the problem's)."""
    q, k, v, nbytes = problem.q, problem.k_cache, problem.v_cache, problem.kv_bytes
    with impl_lib.training_impl(name).context():
        cell = guarded(lambda: _bandwidth_cell(bench, lambda: impl_lib.sdpa_decode_gqa(q, k, v), nbytes))
        if cell.status != ERROR:
            return cell
        gqa_error = cell.note
        nheads = q.shape[2]

        def repeated():
            k_rep, v_rep = impl_lib.repeat_kv(k, nheads), impl_lib.repeat_kv(v, nheads)
            return _bandwidth_cell(bench, lambda: impl_lib.sdpa_decode_repeated(q, k_rep, v_rep), nbytes)

        cell = guarded(repeated)
    if cell.ok:
        cell.note = f"K/V repeated to {nheads} heads (enable_gqa=True failed: {short_text(gqa_error, 120)})"
    else:
        cell.note = f"{cell.note}; with enable_gqa=True: {gqa_error}"
    return cell


def _paged_cell(bench, problem, page_size):
    """ours on the cache re-laid out in pages (built inside, so the pages are freed on return)."""
    def measure():
        k_pages, v_pages, block_table = paged_problem(problem, page_size)
        return _bandwidth_cell(bench, lambda: impl_lib.ours_kvcache_decode(
            problem.q, k_pages, v_pages, problem.cache_seqlens, block_table), problem.kv_bytes)

    return guarded(measure)


def _decode_step(name, problem):
    """The zero-argument call the cell of implementation `name` times on the contiguous cache."""
    q, k, v = problem.q, problem.k_cache, problem.v_cache
    if name == CONTIGUOUS:
        return lambda: impl_lib.ours_kvcache_decode(q, k, v, problem.cache_seqlens)
    forward = {"ours": impl_lib.ours_decode, "naive": impl_lib.naive_decode}[name]
    return lambda: forward(q, k, v)


def decode_cell(bench, name, problem):
    if name in SDPA_PEERS:
        return _sdpa_decode_cell(bench, name, problem)
    if name in PAGED_COLUMNS:
        return _paged_cell(bench, problem, PAGED_COLUMNS[name])
    step = _decode_step(name, problem)
    return guarded(lambda: _bandwidth_cell(bench, step, problem.kv_bytes))


def copy_bandwidth_cell(bench, kv_bytes, min_bytes, dtype):
    """GB/s of dst.copy_(src), both buffers max(kv_bytes, min_bytes) large (random data), counting
    each byte read and written: the device's copy bandwidth, measured with the same timer."""
    def measure():
        nbytes = max(kv_bytes, min_bytes)
        src = torch.randn(-(-nbytes // dtype.itemsize), dtype=dtype, device=bench.device)
        dst = torch.empty_like(src)
        return _bandwidth_cell(bench, lambda: dst.copy_(src), 2 * src.nbytes)

    return guarded(measure)


def rotary_tables(positions, rotary_dim, dtype, device, base=ROTARY_BASE):
    """cos and sin (positions, rotary_dim / 2) of the standard rotary frequencies base^(-2i / rotary_dim)."""
    inv_freq = base ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float32, device=device) / rotary_dim)
    angles = torch.arange(positions, dtype=torch.float32, device=device)[:, None] * inv_freq
    return angles.cos().to(dtype), angles.sin().to(dtype)


def append_rotary_cell(bench, problem):
    """A cell (value: µs) timing the decode step that also appends one token: k, v (batch, 1, nheads_k,
    headdim) written at cache_seqlens = context - 1 (the cache's last row, so it fits its capacity),
    rotary over the whole head dim (interleaved) on q and the new k, causal."""
    def measure():
        batch, context, nheads_k, headdim = problem.k_cache.shape
        q = problem.q
        k_new, v_new = (torch.randn(batch, 1, nheads_k, headdim, dtype=q.dtype, device=q.device) for _ in range(2))
        cos, sin = rotary_tables(context + 1, headdim, q.dtype, q.device)
        seqlens = problem.cache_seqlens - 1
        ms = bench.timer(lambda: impl_lib.ours_kvcache_append_rotary(q, problem.k_cache, problem.v_cache, k_new,
                                                                     v_new, cos, sin, seqlens))
        return Cell(OK, ms * 1000, ms)

    return guarded(measure)


# ---- the row's derived columns ----

def _time_over(numerator, denominator):
    """numerator's time over denominator's, where both cells have one; else None."""
    if numerator is None or denominator is None or not (numerator.ok and denominator.ok):
        return None
    return numerator.ms / denominator.ms


def decode_extra(cells, copy, append):
    """The derived columns of a row: copy GB/s always; ours (kvcache) against copy, sdpa-cudnn, paged-16
    and the append+rotary step where those cells exist (None where a side has no value)."""
    extra = {"copy_GBps": copy.value if copy.ok else None}
    ours = cells.get(CONTIGUOUS)
    if ours is None:
        return extra
    both_ok = ours.ok and copy.ok
    extra["ours_vs_copy"] = ours.value / copy.value if both_ok else None
    extra["ours_vs_cudnn"] = _time_over(cells.get("cudnn"), ours)
    extra["paged16_vs_contiguous"] = _time_over(ours, cells.get(paged_column(16)))
    appended = append is not None and append.ok
    extra["append_rotary_step_us"] = append.ms * 1000 if appended else None
    extra["append_rotary_us"] = (append.ms - ours.ms) * 1000 if appended and ours.ok else None
    return extra


def _note_failure(suite, what, where, cell):
    """A suite note naming a reference measurement that has no value (its column stays empty)."""
    if cell is None or cell.ok:
        return
    text = f"{what} at {where}: {format_cell(cell)}" + (f" ({short_text(cell.note, 200)})" if cell.note else "")
    if text not in suite.notes:
        suite.notes.append(text)


# ---- the suite ----

def _decode_notes(plan, has_kvcache):
    """What each measurement times, exactly."""
    nheads, nheads_k, headdim = plan.decode_heads
    dtype, copy_mib = plan.decode_dtype, plan.decode_copy_min_bytes >> 20
    notes = [
        f"One query token, {nheads}/{nheads_k} heads, headdim {headdim}, {dtype}; GB/s = K+V of the context "
        f"(2·batch·context·{nheads_k}·{headdim}·2 bytes) over the median time.",
        f"copy GB/s: dst.copy_(src) of a {dtype} buffer of max(K+V bytes, {copy_mib} MiB) (not L2-resident), "
        "timed like the cells, in the same run; 2 × its bytes (each read once, written once) over the median time.",
    ]
    if not has_kvcache:
        return notes
    pages = " and ".join(str(size) for size in PAGE_SIZES)
    return notes + [
        f"{impl_lib.label(CONTIGUOUS)}: flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens) on the contiguous "
        "(batch, context, nheads_k, headdim) cache, cache_seqlens a (batch,) int32 tensor equal to context, no new "
        "tokens: each step attends over exactly context keys.",
        f"ours (paged {pages}): the same K and V copied into pools of pages of {pages} rows ((num_pages, page_size, "
        "nheads_k, headdim), batch × ceil(context / page_size) pages), block_table (batch, pages) int32 a random "
        f"permutation of the pages (seed {PAGE_ORDER_SEED}), so a sequence's pages are out of order; cache_seqlens = "
        "context; bytes counted as for the contiguous cache. Laying out the pages is not timed; each pool is freed "
        "before the next is built.",
        "ours kvcache GB/s / copy GB/s: ours (kvcache)'s GB/s of K+V read over the copy GB/s of the same row. "
        "sdpa-cudnn µs / ours kvcache µs: ours' speed-up over SDPA's cuDNN backend. ours kvcache µs / paged16 µs: "
        "> 1 where the paged cache is faster than the contiguous one.",
        "append+rotary extra µs: the time of flash_attn_with_kvcache(q, k_cache, v_cache, k, v, rotary_cos, "
        f"rotary_sin, cache_seqlens = context - 1, causal=True, rotary_interleaved=True), k and v (batch, 1, "
        f"{nheads_k}, {headdim}) new tokens, rotary_cos / rotary_sin (context + 1, {headdim // 2}) {dtype}, minus "
        "ours (kvcache)'s time in the same row. cache_seqlens is context - 1 so the appended token lands in the "
        "cache's last row (its capacity is context) and the step attends over the same context keys; every timed "
        "call rewrites that row. The step's own time is append_rotary_step_us in the JSON.",
    ]


def _decode_columns(plan):
    """Our columns (the kvcache ones only where flash_attn_with_kvcache exists) and the peers."""
    ours = []
    if "ours" in plan.impls:
        kvcache = [CONTIGUOUS, *PAGED_COLUMNS] if impl_lib.kvcache_function() else []
        ours = kvcache + ["ours"]
    peers = [name for name in (*SDPA_PEERS, "naive") if name in plan.impls]
    return ours, peers


def run_decode(bench, plan):
    """One query token against a KV cache (GQA 32/8 heads, headdim 128): µs and GB/s of K+V read, with
    the copy bandwidth, paged caches and the append+rotary step measured in the same run."""
    ours, peers = _decode_columns(plan)
    dtype = DTYPES[plan.decode_dtype]
    has_kvcache = CONTIGUOUS in ours
    suite = Suite(
        "decode", "Decode, one query token (µs · GB/s of K+V read, higher GB/s is better)", "GB/s", True,
        columns=ours + peers, ours=ours, config_keys=["batch", "context", "nheads", "nheads_k", "headdim"],
        extra_columns=list(EXTRA_COLUMNS if has_kvcache else COPY_ONLY_EXTRA_COLUMNS), digits=0, show_us=True,
    )
    suite.notes.extend(_decode_notes(plan, has_kvcache))
    if impl_lib.kvcache_function() is None:
        suite.notes.append("flash_attn.flash_attn_with_kvcache does not exist in this version: this suite measures "
                           "the peers; `ours` is flash_attn_func on the one-token query (the prefill kernel).")
    nheads, nheads_k, headdim = plan.decode_heads

    def run_one(cfg):
        batch, context = cfg
        problem = decode_problem(batch, context, plan.decode_heads, dtype, bench.device)
        cells = {name: decode_cell(bench, name, problem) for name in suite.columns}
        append = append_rotary_cell(bench, problem) if has_kvcache else None
        copy = copy_bandwidth_cell(bench, problem.kv_bytes, plan.decode_copy_min_bytes, dtype)
        for what, cell in ((COPY, copy), (APPEND_ROTARY, append)):
            _note_failure(suite, what, describe(cfg), cell)
        return [Row({"batch": batch, "context": context, "nheads": nheads, "nheads_k": nheads_k,
                     "headdim": headdim}, cells, decode_extra(cells, copy, append))]

    def describe(cfg):
        return f"b={cfg[0]} ctx={format_seqlen(cfg[1])}"

    with torch.no_grad():
        return run_configs(bench, suite, plan.decode, run_one, describe)
