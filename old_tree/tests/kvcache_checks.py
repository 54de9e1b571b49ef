"""Shared checks of flash_attn_with_kvcache, run on the CPU path (test_kvcache_cpu.py) and on the CUDA
kernels (test_gpu_kvcache.py).

A case builds fresh random inputs: a contiguous cache (with spare entries, reached through
cache_batch_idx when asked) or a paged one (pages in a random order through block_table),
cache_seqlens and leftpad drawn per batch entry, rotary tables of random angles. Ours runs on the
given device; the reference runs reference_kvcache's append on CPU copies, and the cache after our
append must equal it exactly. Out and lse are judged by the tolerance rule (helpers.py) per batch
entry, with ref = attention_ref in fp32 (fp64 for fp32 inputs) and pt = the same in the inputs' dtype, both over the keys
the reference says the entry attends to and q rotated as the reference rotates it.
"""

import dataclasses
import math
from typing import Optional, Tuple

import torch

from flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache
from flash_attn import reference_kvcache as rk
from flash_attn.reference import attention_ref, normalize_window
from helpers import OUT_FACTOR, assert_fa_close


@dataclasses.dataclass(frozen=True)
class KvCase:
    batch: int = 2
    seqlen_q: int = 1
    seqlen_new: int = 1            # 0: no k / v given
    nheads: int = 8
    nheads_k: int = 2
    headdim: int = 128
    capacity: int = 300            # positions per batch entry
    page_size: Optional[int] = None
    rotary_dim: int = 0
    rotary_interleaved: bool = True
    causal: bool = False
    window_size: Tuple[int, int] = (-1, -1)
    softcap: float = 0.0
    alibi: bool = False
    batch_idx: bool = False
    leftpad: bool = False
    num_splits: int = 0
    full_cache: bool = False       # cache_seqlens = capacity - seqlen_new for every entry
    dtype: torch.dtype = torch.bfloat16


@dataclasses.dataclass
class KvInputs:
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    k: Optional[torch.Tensor]
    v: Optional[torch.Tensor]
    rotary_cos: Optional[torch.Tensor]
    rotary_sin: Optional[torch.Tensor]
    cache_seqlens: torch.Tensor
    cache_batch_idx: Optional[torch.Tensor]
    cache_leftpad: Optional[torch.Tensor]
    block_table: Optional[torch.Tensor]
    alibi_slopes: Optional[torch.Tensor]

    def to(self, device):
        return KvInputs(**{f.name: None if getattr(self, f.name) is None else getattr(self, f.name).to(device).clone()
                           for f in dataclasses.fields(self)})


def make_inputs(c: KvCase, seed=0):
    g = torch.Generator().manual_seed(seed)
    randn = lambda *shape: torch.randn(*shape, generator=g).to(c.dtype)  # noqa: E731
    q = randn(c.batch, c.seqlen_q, c.nheads, c.headdim)
    if c.page_size is None:
        entries = c.batch + 2
        k_cache, v_cache = randn(entries, c.capacity, c.nheads_k, c.headdim), randn(entries, c.capacity, c.nheads_k,
                                                                                   c.headdim)
        block_table = None
        batch_idx = torch.randperm(entries, generator=g)[:c.batch].to(torch.int32) if c.batch_idx else None
    else:
        max_pages = math.ceil(c.capacity / c.page_size)
        pages = c.batch * max_pages + 3
        k_cache, v_cache = randn(pages, c.page_size, c.nheads_k, c.headdim), randn(pages, c.page_size, c.nheads_k,
                                                                                  c.headdim)
        block_table = torch.randperm(pages, generator=g)[:c.batch * max_pages].view(c.batch, max_pages).to(torch.int32)
        batch_idx = None
    capacity = rk.cache_capacity(k_cache, block_table)
    room = capacity - c.seqlen_new
    if c.full_cache:
        seqlens = torch.full((c.batch,), room, dtype=torch.int32)
    else:
        seqlens = torch.randint(0, room + 1, (c.batch,), generator=g, dtype=torch.int32)
    leftpad = None
    if c.leftpad:
        leftpad = torch.stack([torch.randint(0, int(s) + 1, (1,), generator=g)[0] for s in seqlens]).to(torch.int32)
    k = v = None
    if c.seqlen_new > 0:
        k, v = randn(c.batch, c.seqlen_new, c.nheads_k, c.headdim), randn(c.batch, c.seqlen_new, c.nheads_k,
                                                                         c.headdim)
    cos = sin = None
    if c.rotary_dim > 0:
        angle = torch.rand(capacity, c.rotary_dim // 2, generator=g) * 2 * math.pi
        cos, sin = angle.cos().to(c.dtype), angle.sin().to(c.dtype)
    slopes = torch.rand(c.batch, c.nheads, generator=g) * 0.3 if c.alibi else None
    return KvInputs(q, k_cache, v_cache, k, v, cos, sin, seqlens, batch_idx, leftpad, block_table, slopes)


def run_ours(c: KvCase, x: KvInputs):
    return flash_attn_with_kvcache(x.q, x.k_cache, x.v_cache, x.k, x.v, rotary_cos=x.rotary_cos,
                                   rotary_sin=x.rotary_sin, cache_seqlens=x.cache_seqlens,
                                   cache_batch_idx=x.cache_batch_idx, cache_leftpad=x.cache_leftpad,
                                   block_table=x.block_table, causal=c.causal, window_size=c.window_size,
                                   softcap=c.softcap, rotary_interleaved=c.rotary_interleaved,
                                   alibi_slopes=x.alibi_slopes, num_splits=c.num_splits, return_softmax_lse=True)


def reference_entry(c: KvCase, x: KvInputs, b, append_at, window, compute_dtype, upcast):
    """(out (sq, h, d), lse (h, sq)) of batch entry b by attention_ref, after the append."""
    keys, values = rk.attended_keys(x.k_cache, x.v_cache, x.block_table, x.cache_batch_idx, x.cache_leftpad, b,
                                    append_at, c.seqlen_new)
    query = rk.rotated_queries(x.q, x.rotary_cos, x.rotary_sin, b, append_at, window, c.rotary_interleaved)
    slopes = None if x.alibi_slopes is None else x.alibi_slopes[b:b + 1]
    out, lse = attention_ref(query, keys, values, causal=False, upcast=upcast, compute_dtype=compute_dtype,
                             window_size=window, softcap=c.softcap, alibi_slopes=slopes)
    return out[0], lse[0]


def check_kvcache(c: KvCase, device, seed=0):
    """Ours on `device` against the reference (see the module docstring)."""
    x = make_inputs(c, seed)
    ours_inputs = x.to(device)
    out, lse = run_ours(c, ours_inputs)
    ref_inputs = x.to("cpu")
    starts = rk.append_new_tokens(ref_inputs.k_cache, ref_inputs.v_cache, ref_inputs.k, ref_inputs.v,
                                  ref_inputs.rotary_cos, ref_inputs.rotary_sin, ref_inputs.cache_seqlens,
                                  ref_inputs.cache_batch_idx, ref_inputs.block_table, c.rotary_interleaved)
    for name in ("k_cache", "v_cache"):
        ours_cache, ref_cache = getattr(ours_inputs, name).cpu(), getattr(ref_inputs, name)
        differ = ours_cache != ref_cache
        assert not differ.any(), f"{name}: {int(differ.sum())} elements differ after the append (first at " \
                                 f"{tuple(differ.nonzero()[0].tolist())})"
    assert out.shape == x.q.shape and lse.shape == (c.batch, c.nheads, c.seqlen_q)
    window = normalize_window(c.window_size, c.causal, rk.cache_capacity(x.k_cache, x.block_table))
    compute_dtype = torch.float64 if c.dtype == torch.float32 else torch.float32  # fp32 inputs: fp64 reference
    for b, append_at in enumerate(starts):
        ref = reference_entry(c, ref_inputs, b, append_at, window, compute_dtype, True)
        pt = reference_entry(c, ref_inputs, b, append_at, window, compute_dtype, False)
        assert_fa_close(f"out[{b}]", out[b].cpu(), ref[0], pt[0], OUT_FACTOR)
        assert_fa_close(f"lse[{b}]", lse[b].cpu(), ref[1], pt[1], OUT_FACTOR)
    return out, lse


def check_paged_varlen(device, lengths_q, lengths_k, page_size, causal=False, window_size=(-1, -1), softcap=0.0,
                       alibi=False, nheads=4, nheads_k=2, headdim=64, dtype=torch.bfloat16, seed=0):
    """flash_attn_varlen_func with block_table: the sequences' keys laid out in shuffled pages of a pool
    (the rest of the pool random), against attention_ref per sequence on the packed keys."""
    g = torch.Generator().manual_seed(seed)
    randn = lambda *shape: torch.randn(*shape, generator=g).to(dtype)  # noqa: E731
    batch = len(lengths_q)
    cu_q = torch.tensor([0, *torch.tensor(lengths_q).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(lengths_k).cumsum(0).tolist()], dtype=torch.int32)
    q, k, v = randn(int(cu_q[-1]), nheads, headdim), randn(int(cu_k[-1]), nheads_k, headdim), randn(
        int(cu_k[-1]), nheads_k, headdim)
    pages_per_sequence = max(1, math.ceil(max(lengths_k) / page_size))
    pool = batch * pages_per_sequence + 2
    block_table = torch.randperm(pool, generator=g)[:batch * pages_per_sequence].view(batch, -1).to(torch.int32)
    k_pages, v_pages = randn(pool, page_size, nheads_k, headdim), randn(pool, page_size, nheads_k, headdim)
    for b in range(batch):
        for j in range(lengths_k[b]):
            page, row = int(block_table[b, j // page_size]), j % page_size
            k_pages[page, row], v_pages[page, row] = k[int(cu_k[b]) + j], v[int(cu_k[b]) + j]
    slopes = torch.rand(batch, nheads, generator=g) * 0.3 if alibi else None
    to = lambda t: None if t is None else t.to(device)  # noqa: E731
    out, lse, probs = flash_attn_varlen_func(to(q), to(k_pages), to(v_pages), to(cu_q), to(cu_k), max(lengths_q),
                                             max(lengths_k), causal=causal, window_size=window_size, softcap=softcap,
                                             alibi_slopes=to(slopes), return_attn_probs=True,
                                             block_table=to(block_table))
    assert probs is None and out.shape == q.shape and lse.shape == (nheads, q.shape[0])
    window = normalize_window(window_size, causal, max(lengths_k))
    for b in range(batch):
        rows_q, rows_k = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        one = dict(window_size=window, softcap=softcap, alibi_slopes=None if slopes is None else slopes[b:b + 1])
        ref = attention_ref(q[None, rows_q], k[None, rows_k], v[None, rows_k], **one)
        pt = attention_ref(q[None, rows_q], k[None, rows_k], v[None, rows_k], upcast=False, **one)
        assert_fa_close(f"out[{b}]", out[rows_q].cpu(), ref[0][0], pt[0][0], OUT_FACTOR)
        assert_fa_close(f"lse[{b}]", lse[:, rows_q].cpu(), ref[1][0], pt[1][0], OUT_FACTOR)
