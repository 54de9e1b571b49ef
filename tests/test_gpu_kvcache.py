"""flash_attn_with_kvcache on the CUDA kernels (append + rotary, split-KV decode, combine) against the
reference with the tolerance rule, the cache after the append compared exactly (kvcache_checks.py),
outputs poisoned with NaN before every kernel. Also torch.compile(fullgraph=True) of a decode step,
the cp.async loader that
non-Hopper GPUs use (forced with FLASH_ATTN_DISABLE_SM90=1), a decode loop replayed as a CUDA graph with changing cache_seqlens, and the `sanitizer` tests
(metadata pointing outside the cache), which scripts/gpu_check.sh also runs under compute-sanitizer.
"""

import dataclasses

import pytest
import torch

import flash_attn
from flash_attn import flash_attn_with_kvcache
from helpers import CUDA_KERNELS_ONLY, GPU_TEST_MARKS, require_kernel
from kvcache_checks import KvCase, check_kvcache, check_paged_varlen, make_inputs, run_ours

pytestmark = GPU_TEST_MARKS

CASES = {
    "decode": KvCase(),
    "no_new_tokens": KvCase(seqlen_new=0),
    "append_many": KvCase(seqlen_q=7, seqlen_new=7, causal=True),
    "rotary_interleaved": KvCase(seqlen_q=3, seqlen_new=3, rotary_dim=64, causal=True),
    "rotary_halves": KvCase(seqlen_q=2, seqlen_new=2, rotary_dim=128, rotary_interleaved=False),
    "rotary_noncausal": KvCase(seqlen_q=3, seqlen_new=1, rotary_dim=32, rotary_interleaved=False),
    "paged_16": KvCase(page_size=16, seqlen_new=2, seqlen_q=2, causal=True, rotary_dim=32),
    "paged_64": KvCase(page_size=64, capacity=1000, seqlen_new=1),
    "paged_256": KvCase(page_size=256, capacity=1000, leftpad=True, seqlen_q=2, seqlen_new=2, causal=True),
    "paged_48": KvCase(page_size=48, capacity=500, seqlen_new=1),
    "batch_idx": KvCase(batch_idx=True, seqlen_q=4, seqlen_new=4, causal=True),
    "leftpad": KvCase(leftpad=True, seqlen_q=4, seqlen_new=2, causal=True),
    "window": KvCase(seqlen_q=3, seqlen_new=3, window_size=(40, 0), capacity=500),
    "window_both": KvCase(seqlen_q=5, seqlen_new=0, window_size=(30, 7), capacity=400),
    "softcap": KvCase(softcap=10.0, seqlen_q=2, seqlen_new=2, causal=True),
    "alibi": KvCase(alibi=True, causal=True, seqlen_q=3, seqlen_new=1),
    "mqa": KvCase(nheads=6, nheads_k=1, headdim=64),
    "mha": KvCase(nheads=3, nheads_k=3, seqlen_q=9, seqlen_new=9, causal=True),
    "many_rows": KvCase(nheads=16, nheads_k=2, seqlen_q=5, seqlen_new=5, causal=True),  # 80 packed rows
    "full_cache": KvCase(full_cache=True, seqlen_new=3, seqlen_q=3, causal=True),
    "long_context": KvCase(batch=1, capacity=8192, nheads=32, nheads_k=8),
    "batch_8": KvCase(batch=8, capacity=2048, leftpad=True, page_size=16),
    "fp16": KvCase(dtype=torch.float16, headdim=64, rotary_dim=64, seqlen_new=2, seqlen_q=2, causal=True),
    "everything": KvCase(batch=3, seqlen_q=4, seqlen_new=3, page_size=32, capacity=600, rotary_dim=64,
                         rotary_interleaved=False, causal=True, window_size=(100, 0), softcap=15.0, alibi=True,
                         leftpad=True),
}
SPLITS = [1, 3, 0, 40]


@pytest.mark.parametrize("num_splits", SPLITS)
@pytest.mark.parametrize("name", CASES)
def test_kvcache(name, num_splits):
    case = dataclasses.replace(CASES[name], num_splits=num_splits)
    require_kernel(case.dtype, case.headdim)
    check_kvcache(case, "cuda")


@CUDA_KERNELS_ONLY
@pytest.mark.parametrize("name", ["decode", "append_many", "paged_16", "paged_48", "leftpad", "window_both",
                                  "everything", "long_context"])
def test_kvcache_cp_async_loader(monkeypatch, name):
    """The sm80 loader (per-lane cp.async) that Hopper replaces with TMA boxes (whole 64-column head
    dims) or row bulk copies."""
    monkeypatch.setenv("FLASH_ATTN_DISABLE_SM90", "1")
    case = dataclasses.replace(CASES[name], num_splits=3)
    require_kernel(case.dtype, case.headdim)
    check_kvcache(case, "cuda")


@CUDA_KERNELS_ONLY
@pytest.mark.parametrize("name", ["decode", "append_many", "paged_16", "leftpad", "everything", "long_context",
                                  "batch_8", "no_new_tokens"])
@pytest.mark.parametrize("num_splits", [1, 0])
def test_kvcache_plain_launches(monkeypatch, name, num_splits):
    """Hopper launches the split-KV and combine kernels as dependent launches (launch_dependent.h);
    the plain launches that older GPUs get, forced with FLASH_ATTN_PDL=0."""
    monkeypatch.setenv("FLASH_ATTN_PDL", "0")
    case = dataclasses.replace(CASES[name], num_splits=num_splits)
    require_kernel(case.dtype, case.headdim)
    check_kvcache(case, "cuda")


@pytest.mark.parametrize("headdim", [32, 64, 96, 128, 192, 256, 80])
def test_kvcache_headdims(headdim):
    require_kernel(torch.bfloat16, headdim)
    check_kvcache(KvCase(headdim=headdim, seqlen_q=2, seqlen_new=2, causal=True, rotary_dim=16 * (headdim // 32),
                         page_size=16), "cuda")
    check_kvcache(KvCase(headdim=headdim, num_splits=5, capacity=1500), "cuda")


@pytest.mark.parametrize("headdim", [32, 64])
def test_kvcache_combine_of_many_splits(headdim):
    """Splits past the 8th (hd 32) or the 16th (hd 64) hold keys: the combine kernel's lanes without a
    column of the head dim still take part in its shuffles of the split weights (they once skipped
    them, and the weights the other lanes read from them were garbage)."""
    require_kernel(torch.bfloat16, headdim)
    check_kvcache(KvCase(headdim=headdim, nheads=6, nheads_k=1, capacity=8192, seqlen_new=0, full_cache=True,
                         num_splits=40), "cuda")


def test_kvcache_split_counts_agree():
    """Every split count gives the same result up to fp32 rounding of the combine."""
    require_kernel(torch.bfloat16, 128)
    case = KvCase(batch=2, capacity=4000, seqlen_new=0)
    x = make_inputs(case).to("cuda")
    outs = [run_ours(dataclasses.replace(case, num_splits=s), x)[0].float() for s in (1, 2, 7, 64)]
    for out in outs[1:]:
        torch.testing.assert_close(out, outs[0], rtol=0, atol=2 ** -7 * outs[0].abs().max().item())


# Metadata that points outside the cache: the kernels clamp it exactly as the reference does.
BAD_METADATA = {
    "seqlens_past_capacity": dict(cache_seqlens=[500, -3]),
    "leftpad_past_end": dict(cache_seqlens=[10, 20], cache_leftpad=[50, -4]),
    "pages_out_of_range": dict(cache_seqlens=[100, 200], block_table=[[1000, -1, 2, 99999], [3, 4, -7, 5]]),
    "batch_idx_out_of_range": dict(cache_seqlens=[5, 6], cache_batch_idx=[100, -2]),
}


@pytest.mark.parametrize("name", BAD_METADATA)
def test_kvcache_sanitizer_bad_metadata(name):
    require_kernel(torch.bfloat16, 64)
    bad = BAD_METADATA[name]
    paged = "block_table" in bad
    case = KvCase(headdim=64, capacity=256, seqlen_new=0 if paged or "cache_batch_idx" in bad else 2,
                  page_size=64 if paged else None, batch_idx="cache_batch_idx" in bad, leftpad="cache_leftpad" in bad)
    x = make_inputs(case)
    for field, value in bad.items():
        setattr(x, field, torch.tensor(value, dtype=torch.int32))
    for num_splits in (1, 4):
        ours = x.to("cuda")
        out, lse = run_ours(dataclasses.replace(case, num_splits=num_splits), ours)
        torch.cuda.synchronize()
        assert not out.isnan().any() and not lse.isnan().any()
        reference = x.to("cpu")
        ref_out, ref_lse = run_ours(case, reference)
        atol = 2 ** -6 * max(1.0, ref_out.float().abs().max().item())  # two bf16 roundings apart at most
        torch.testing.assert_close(out.cpu().float(), ref_out.float(), rtol=0, atol=atol)
        assert torch.equal(ours.k_cache.cpu(), reference.k_cache)


def test_kvcache_compile_fullgraph():
    require_kernel(torch.bfloat16, 128)
    case = KvCase(seqlen_new=1, rotary_dim=64, page_size=16, causal=True)
    x = make_inputs(case).to("cuda")
    eager = x.to("cuda")
    step = torch.compile(
        lambda q, kc, vc, k, v, cos, sin, seqlens, table: flash_attn_with_kvcache(
            q, kc, vc, k, v, rotary_cos=cos, rotary_sin=sin, cache_seqlens=seqlens, block_table=table, causal=True,
            return_softmax_lse=True),
        fullgraph=True)
    out, lse = step(x.q, x.k_cache, x.v_cache, x.k, x.v, x.rotary_cos, x.rotary_sin, x.cache_seqlens, x.block_table)
    ref_out, ref_lse = run_ours(case, eager)
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)
    assert torch.equal(x.k_cache, eager.k_cache) and torch.equal(x.v_cache, eager.v_cache)


def test_kvcache_cuda_graph_decode_loop():
    """A decode step captured once, replayed with cache_seqlens advancing: each replay appends its
    token and attends over the grown cache, as eager calls do."""
    require_kernel(torch.bfloat16, 128)
    case = KvCase(batch=2, seqlen_new=1, capacity=512, rotary_dim=128, page_size=64, causal=True)
    x = make_inputs(case).to("cuda")
    x.cache_seqlens.copy_(torch.tensor([10, 200], dtype=torch.int32))
    eager = x.to("cuda")
    static = {"q": x.q.clone(), "k": x.k.clone(), "v": x.v.clone()}

    def step():
        return flash_attn_with_kvcache(static["q"], x.k_cache, x.v_cache, static["k"], static["v"],
                                       rotary_cos=x.rotary_cos, rotary_sin=x.rotary_sin,
                                       cache_seqlens=x.cache_seqlens, block_table=x.block_table, causal=True)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # warm-up on the side stream, then undo its append by restoring the caches
    torch.cuda.current_stream().wait_stream(stream)
    x.k_cache.copy_(eager.k_cache)
    x.v_cache.copy_(eager.v_cache)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graph_out = step()
    for i in range(5):
        for name in static:
            static[name].copy_(torch.randn_like(static[name]))
        graph.replay()
        expected = flash_attn_with_kvcache(static["q"], eager.k_cache, eager.v_cache, static["k"], static["v"],
                                           rotary_cos=eager.rotary_cos, rotary_sin=eager.rotary_sin,
                                           cache_seqlens=eager.cache_seqlens, block_table=eager.block_table,
                                           causal=True)
        assert torch.equal(graph_out, expected), f"replay {i}"
        assert torch.equal(x.k_cache, eager.k_cache)
        x.cache_seqlens += 1
        eager.cache_seqlens += 1


@CUDA_KERNELS_ONLY
def test_kvcache_opcheck():
    require_kernel(torch.bfloat16, 64)
    case = KvCase(headdim=64, seqlen_new=2, seqlen_q=2, rotary_dim=32, page_size=16, capacity=64)
    x = make_inputs(case).to("cuda")
    args = (x.q, x.k_cache, x.v_cache, x.k, x.v, x.rotary_cos, x.rotary_sin, x.cache_seqlens, None, None,
            x.block_table, 0.125, -1, 0, 0.0, True, None, 0)
    result = torch.library.opcheck(torch.ops.flash_attn.fwd_kvcache.default, args,
                                   test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))
    assert set(result.values()) == {"SUCCESS"}, result


def test_kvcache_example_from_the_guides():
    """The inference example users copy: a max_seq_len cache, int32 cache_seqlens, num_splits,
    return_softmax_lse."""
    require_kernel(torch.bfloat16, 128)
    batch, max_seq_len, nheads, nheads_k, headdim = 4, 1024, 32, 8, 128
    k_cache = torch.zeros(batch, max_seq_len, nheads_k, headdim, dtype=torch.bfloat16, device="cuda")
    v_cache = torch.zeros_like(k_cache)
    cache_seqlens = torch.zeros(batch, dtype=torch.int32, device="cuda")
    prompt = torch.randn(batch, 16, nheads_k, headdim, dtype=torch.bfloat16, device="cuda")
    q = torch.randn(batch, 16, nheads, headdim, dtype=torch.bfloat16, device="cuda")
    flash_attn_with_kvcache(q, k_cache, v_cache, prompt, prompt, cache_seqlens=cache_seqlens, causal=True)
    cache_seqlens += 16
    new = torch.randn(batch, 1, nheads_k, headdim, dtype=torch.bfloat16, device="cuda")
    out, lse = flash_attn_with_kvcache(q[:, :1], k_cache, v_cache, new, new, cache_seqlens=cache_seqlens, causal=True,
                                       num_splits=4, return_softmax_lse=True)
    assert out.shape == (batch, 1, nheads, headdim) and lse.shape == (batch, nheads, 1)
    assert torch.equal(k_cache[:, 16], new[:, 0]) and torch.isfinite(out).all()
    assert flash_attn.__version__


@pytest.mark.parametrize("page_size", [16, 64, 256])
@pytest.mark.parametrize("causal,window_size,softcap,alibi", [(False, (-1, -1), 0.0, False), (True, (-1, -1), 0.0, True),
                                                              (True, (50, 0), 5.0, False)])
def test_paged_varlen(page_size, causal, window_size, softcap, alibi):
    """flash_attn_varlen_func with block_table (paged prefill), lengths 0, 1 and uneven."""
    require_kernel(torch.bfloat16, 128)
    check_paged_varlen("cuda", [37, 1, 0, 200, 64], [300, 1, 17, 200, 513], page_size, causal, window_size, softcap,
                       alibi, nheads=8, nheads_k=2, headdim=128)
