"""flash_attn_with_kvcache on the CPU path: every argument against the reference (kvcache_checks.py),
an independent FlashAttention-2-test-style construction of the expected cache and masks, paged and
contiguous caches agreeing, and the argument errors."""

import math

import pytest
import torch

from flash_attn import flash_attn_with_kvcache
from flash_attn.layers.rotary import apply_rotary_emb
from flash_attn.reference import attention_ref
from kvcache_checks import KvCase, check_kvcache, check_paged_varlen, make_inputs, run_ours

CASES = {
    "decode": KvCase(),
    "no_new_tokens": KvCase(seqlen_new=0),
    "prefill_chunk": KvCase(seqlen_q=5, seqlen_new=5, causal=True),
    "rotary_interleaved": KvCase(seqlen_q=3, seqlen_new=3, rotary_dim=64, causal=True),
    "rotary_halves": KvCase(seqlen_q=2, seqlen_new=2, rotary_dim=128, rotary_interleaved=False),
    "paged_16": KvCase(page_size=16, seqlen_new=2, seqlen_q=2, causal=True, rotary_dim=32),
    "paged_48": KvCase(page_size=48, leftpad=True),
    "batch_idx_leftpad": KvCase(batch_idx=True, leftpad=True, seqlen_q=4, seqlen_new=4, causal=True),
    "window": KvCase(seqlen_q=3, seqlen_new=3, window_size=(40, 0)),
    "softcap_alibi": KvCase(softcap=10.0, alibi=True, causal=True, seqlen_q=2, seqlen_new=1),
    "mqa": KvCase(nheads=6, nheads_k=1, headdim=64),
    "full_cache": KvCase(full_cache=True, seqlen_new=3, seqlen_q=3, causal=True),
    "fp16": KvCase(dtype=torch.float16, headdim=64),
}


@pytest.mark.parametrize("name", CASES)
def test_kvcache_cpu_matches_reference(name):
    check_kvcache(CASES[name], "cpu")


def test_kvcache_cpu_independent_construction():
    """FA2's test: the expected cache built by slicing, masks from explicit key positions; out is
    compared to one bf16 rounding of the exact result, lse (fp32 math) closely."""
    c = KvCase(batch=3, seqlen_q=4, seqlen_new=4, rotary_dim=64, rotary_interleaved=False, causal=True,
               leftpad=True, capacity=64)
    x = make_inputs(c, seed=3)
    expected_k, expected_v = x.k_cache.clone(), x.v_cache.clone()
    out, lse = run_ours(c, x)
    seqlens = x.cache_seqlens.long()
    k_ro = apply_rotary_emb(x.k, x.rotary_cos, x.rotary_sin, seqlen_offsets=seqlens, interleaved=False)
    q_ro = apply_rotary_emb(x.q, x.rotary_cos, x.rotary_sin, seqlen_offsets=seqlens, interleaved=False)
    for b in range(c.batch):
        s = int(seqlens[b])
        expected_k[b, s:s + c.seqlen_new], expected_v[b, s:s + c.seqlen_new] = k_ro[b], x.v[b]
    torch.testing.assert_close(x.k_cache, expected_k, rtol=0, atol=0)
    torch.testing.assert_close(x.v_cache, expected_v, rtol=0, atol=0)
    for b in range(c.batch):
        first, end = int(x.cache_leftpad[b]), int(seqlens[b]) + c.seqlen_new
        scores = torch.einsum("thd,shd->hts", q_ro[b].double(),
                              expected_k[b, first:end].double().repeat_interleave(4, 1)) / math.sqrt(c.headdim)
        keys = torch.arange(end - first)
        queries = torch.arange(c.seqlen_q) + (end - first - c.seqlen_q)
        scores = scores.masked_fill(keys.view(1, 1, -1) > queries.view(1, -1, 1), float("-inf"))
        probs = scores.softmax(-1).nan_to_num(0.0)
        expected = torch.einsum("hts,shd->thd", probs, expected_v[b, first:end].double().repeat_interleave(4, 1))
        torch.testing.assert_close(out[b].double(), expected, rtol=0, atol=2 ** -7 * expected.abs().max().item())
        torch.testing.assert_close(lse[b].double(), scores.logsumexp(-1), rtol=1e-5, atol=1e-5)


def test_kvcache_cpu_paged_equals_contiguous():
    c = KvCase(batch=2, seqlen_q=2, seqlen_new=2, capacity=64, causal=True, rotary_dim=32)
    x = make_inputs(c, seed=5)
    page = 16
    pages = torch.randperm(2 * 64 // page).to(torch.int32).view(2, -1)
    paged_k = torch.empty(pages.numel(), page, c.nheads_k, c.headdim, dtype=c.dtype)
    paged_v = torch.empty_like(paged_k)
    for b in range(2):
        for j in range(pages.shape[1]):
            paged_k[pages[b, j]] = x.k_cache[b, j * page:(j + 1) * page]
            paged_v[pages[b, j]] = x.v_cache[b, j * page:(j + 1) * page]
    contiguous = run_ours(c, x)
    paged_inputs = make_inputs(c, seed=5)
    paged_inputs.k_cache, paged_inputs.v_cache, paged_inputs.block_table = paged_k, paged_v, pages
    paged = run_ours(c, paged_inputs)
    assert torch.equal(contiguous[0], paged[0]) and torch.equal(contiguous[1], paged[1])
    for b in range(2):
        for j in range(pages.shape[1]):
            assert torch.equal(paged_k[pages[b, j]], x.k_cache[b, j * page:(j + 1) * page])


def test_kvcache_cpu_headdim_not_multiple_of_8_appends():
    c = KvCase(headdim=60, seqlen_new=2, seqlen_q=2, causal=True)
    x = make_inputs(c, seed=7)
    before = x.k_cache.clone()
    out = flash_attn_with_kvcache(x.q, x.k_cache, x.v_cache, x.k, x.v, cache_seqlens=x.cache_seqlens, causal=True)
    assert out.shape == x.q.shape
    for b in range(c.batch):
        s = int(x.cache_seqlens[b])
        assert torch.equal(x.k_cache[b, s:s + 2], x.k[b])
        assert torch.equal(x.k_cache[b, :s], before[b, :s])
    keys = x.k_cache[0, :int(x.cache_seqlens[0]) + 2].unsqueeze(0)
    values = x.v_cache[0, :int(x.cache_seqlens[0]) + 2].unsqueeze(0)
    expected, _ = attention_ref(x.q[:1], keys, values, causal=True)
    torch.testing.assert_close(out[:1].float(), expected, rtol=2e-2, atol=2e-2)


def test_kvcache_cpu_int_cache_seqlens_and_none():
    c = KvCase(batch=2, seqlen_new=0, capacity=40)
    x = make_inputs(c)
    out_int = flash_attn_with_kvcache(x.q, x.k_cache, x.v_cache, cache_seqlens=40)
    out_none = flash_attn_with_kvcache(x.q, x.k_cache, x.v_cache)
    assert torch.equal(out_int, out_none)
    assert flash_attn_with_kvcache(x.q, x.k_cache, x.v_cache, cache_seqlens=0).abs().max() == 0


def _call(**overrides):
    c = KvCase(batch=2, seqlen_new=1, capacity=32, headdim=64, rotary_dim=16)
    x = make_inputs(c)
    args = dict(q=x.q, k_cache=x.k_cache, v_cache=x.v_cache, k=x.k, v=x.v, rotary_cos=x.rotary_cos,
                rotary_sin=x.rotary_sin, cache_seqlens=x.cache_seqlens)
    args.update(overrides)
    return flash_attn_with_kvcache(**args)


BAD_ARGUMENTS = {
    "q": (dict(q=torch.randn(2, 1, 8, 64)), TypeError),
    "k_cache": (dict(k_cache=torch.randn(4, 32, 2, 64, dtype=torch.float16)), TypeError),
    "v_cache": (dict(v_cache=torch.randn(4, 31, 2, 64, dtype=torch.bfloat16)), ValueError),
    "k": (dict(v=None), ValueError),
    "cache_seqlens": (dict(cache_seqlens=torch.zeros(2, dtype=torch.int64)), TypeError),
    "cache_batch_idx": (dict(cache_batch_idx=torch.zeros(3, dtype=torch.int32)), ValueError),
    "cache_leftpad": (dict(cache_leftpad=torch.zeros(2)), TypeError),
    "block_table": (dict(block_table=torch.zeros(2, 2, dtype=torch.int64)), TypeError),
    "rotary_cos": (dict(rotary_sin=None), ValueError),
    "rotary_dim": (dict(rotary_cos=torch.zeros(32, 4, dtype=torch.bfloat16),
                        rotary_sin=torch.zeros(32, 4, dtype=torch.bfloat16)), ValueError),
    "rotary_cos rows": (dict(rotary_cos=torch.zeros(8, 8, dtype=torch.bfloat16),
                             rotary_sin=torch.zeros(8, 8, dtype=torch.bfloat16)), ValueError),
    "num_splits": (dict(num_splits=-1), ValueError),
    "window_size": (dict(window_size=(1,)), ValueError),
    "softcap": (dict(softcap=-1.0), ValueError),
    "alibi_slopes": (dict(alibi_slopes=torch.zeros(3)), ValueError),
    "causal": (dict(causal=1), TypeError),
}


@pytest.mark.parametrize("name", BAD_ARGUMENTS)
def test_kvcache_bad_arguments_name_themselves(name):
    overrides, error = BAD_ARGUMENTS[name]
    with pytest.raises(error, match=name.split()[0]):
        _call(**overrides)


def test_kvcache_paged_errors():
    x = make_inputs(KvCase(page_size=16, capacity=32, headdim=64))
    with pytest.raises(ValueError, match="cache_batch_idx"):
        flash_attn_with_kvcache(x.q, x.k_cache, x.v_cache, cache_seqlens=x.cache_seqlens, block_table=x.block_table,
                                cache_batch_idx=torch.zeros(2, dtype=torch.int32))
    bad_pages = x.k_cache[:, :15]
    with pytest.raises(ValueError, match="multiple of 16"):
        flash_attn_with_kvcache(x.q, bad_pages, bad_pages.clone(), cache_seqlens=x.cache_seqlens,
                                block_table=x.block_table)
    with pytest.raises(ValueError, match="cache_seqlens"):
        flash_attn_with_kvcache(x.q, x.k_cache, x.v_cache, torch.zeros_like(x.k_cache[:2, :1]),
                                torch.zeros_like(x.k_cache[:2, :1]), block_table=x.block_table)


@pytest.mark.parametrize("causal,window_size,softcap,alibi", [(False, (-1, -1), 0.0, False), (True, (-1, -1), 0.0, True),
                                                              (False, (20, 5), 5.0, False)])
def test_paged_varlen_cpu(causal, window_size, softcap, alibi):
    check_paged_varlen("cpu", [5, 1, 0, 40], [70, 3, 9, 40], 16, causal, window_size, softcap, alibi)
