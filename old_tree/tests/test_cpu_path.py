"""The public functions on CPU tensors (the chunked fp32 path, runs in CI) against the reference with
the tolerance rule, forward and backward. The GPU tests run the same helpers on CUDA tensors."""

import pytest
import torch

import flash_attn
from helpers import (LAYOUTS, check_flash_attn, check_layouts, check_public,
                     check_rows_without_keys, make_qkv)

DTYPES = [torch.bfloat16, torch.float16]
F64 = torch.float64  # the CPU tests can afford an fp64 reference
SEQLENS = [(1, 1), (239, 1), (1, 239), (17, 33), (33, 17)]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlen_q,seqlen_k", SEQLENS)
@pytest.mark.parametrize("headdim", [40, 59, 64])  # 40 and 59 are padded to 40 and 64 inside
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_flash_attn_func(dtype, headdim, seqlen_q, seqlen_k, causal):
    check_flash_attn(2, seqlen_q, seqlen_k, 2, 2, headdim, dtype, causal, "cpu", compute_dtype=F64)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(17, 33), (33, 17), (239, 1)])
@pytest.mark.parametrize("nheads,nheads_k", [(4, 2), (6, 1)], ids=["gqa", "mqa"])
def test_gqa_mqa(nheads, nheads_k, seqlen_q, seqlen_k, causal):
    check_flash_attn(2, seqlen_q, seqlen_k, nheads, nheads_k, 40, torch.bfloat16, causal, "cpu", compute_dtype=F64)


@pytest.mark.parametrize("softmax_scale", [0.05, 0.5])
def test_softmax_scale(softmax_scale):
    check_flash_attn(1, 20, 30, 2, 1, 32, torch.float16, True, "cpu", softmax_scale, compute_dtype=F64)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("headdim", [40, 59])
@pytest.mark.parametrize("function,seqlen_q,seqlen_k,nheads_k", [("qkvpacked", 23, 23, 4), ("kvpacked", 23, 37, 2),
                                                                 ("kvpacked", 37, 23, 1)])
def test_packed(function, seqlen_q, seqlen_k, nheads_k, headdim, causal):
    check_public(function, 2, seqlen_q, seqlen_k, 4, nheads_k, headdim, torch.bfloat16, causal, "cpu",
                 compute_dtype=F64)


@pytest.mark.parametrize("input_layout,dout_layout", [(layout, "contiguous") for layout in LAYOUTS]
                         + [("contiguous", "expanded"), ("heads_major", "heads_major")])
def test_layouts(input_layout, dout_layout):
    check_layouts(input_layout, dout_layout, 2, 19, 27, 2, 24, torch.bfloat16, True, "cpu")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(0, 16), (16, 0), (0, 0)])
def test_empty_sequences(seqlen_q, seqlen_k, causal):
    """No query: empty out and lse, zero dk, dv. No key: out 0, lse +inf, zero dq."""
    check_flash_attn(2, seqlen_q, seqlen_k, 4, 2, 40, torch.bfloat16, causal, "cpu", compute_dtype=F64)


@pytest.mark.parametrize("seqlen_q,seqlen_k", [(9, 4), (239, 1)])
def test_rows_without_keys(seqlen_q, seqlen_k):
    check_rows_without_keys(seqlen_q, seqlen_k, 16, torch.bfloat16, "cpu")


def test_return_values():
    """out alone by default; (out, lse, None) with return_attn_probs; padded head dims come back
    unpadded; all three functions agree on the same values."""
    q, k, v, _ = make_qkv(2, 5, 7, 2, 2, 59, torch.bfloat16, "cpu")
    out = flash_attn.flash_attn_func(q, k, v, causal=True)
    assert isinstance(out, torch.Tensor) and out.shape == (2, 5, 2, 59) and out.dtype == torch.bfloat16
    out2, lse, probs = flash_attn.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert probs is None and lse.shape == (2, 2, 5) and lse.dtype == torch.float32
    assert torch.equal(out, out2)
    out_kv = flash_attn.flash_attn_kvpacked_func(q, torch.stack((k, v), dim=2), causal=True)
    assert torch.equal(out, out_kv)
    qkv = torch.stack(make_qkv(1, 6, 6, 2, 2, 16, torch.float16, "cpu")[:3], dim=2)
    assert torch.equal(flash_attn.flash_attn_qkvpacked_func(qkv), flash_attn.flash_attn_func(*qkv.unbind(2)))


def test_backward_through_lse_only_is_zero():
    """Like FlashAttention 2, no gradient flows through softmax_lse: a loss on lse alone gives zero
    input gradients (documents the behavior; not a supported use)."""
    q, k, v, _ = make_qkv(1, 4, 6, 2, 2, 8, torch.bfloat16, "cpu")
    leaves = [t.requires_grad_() for t in (q, k, v)]
    _, lse, _ = flash_attn.flash_attn_func(*leaves, return_attn_probs=True)
    grads = torch.autograd.grad(lse.sum(), leaves)
    assert all((g == 0).all() for g in grads)


def test_meta_tensors_give_shapes():
    """The fake kernels: meta tensors flow through the public function (padding included)."""
    q = torch.empty(2, 300, 8, 59, dtype=torch.bfloat16, device="meta")
    k = v = torch.empty(2, 100, 2, 59, dtype=torch.bfloat16, device="meta")
    out, lse, _ = flash_attn.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert out.device.type == "meta" and out.shape == q.shape and out.dtype == q.dtype
    assert lse.shape == (2, 8, 300) and lse.dtype == torch.float32


@pytest.mark.parametrize("function,seqlen_q,nheads_k", [("func", 11, 2), ("qkvpacked", 13, 4), ("kvpacked", 11, 1)])
def test_compile(function, seqlen_q, nheads_k):
    """torch.compile(fullgraph=True) traces the custom ops (fake kernels, autograd) on CPU; the GPU
    tests compile with inductor."""
    check_public(function, 2, seqlen_q, 13, 4, nheads_k, 40, torch.bfloat16, True, "cpu", compile_backend="aot_eager",
                 compute_dtype=F64)
