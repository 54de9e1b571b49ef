"""The reference itself (CPU, runs in CI): attention_ref against an independent fp64 row-by-row
computation, and the chunked CPU path (online softmax forward, recomputing backward) against fp64
autograd of attention_ref, with chunk sizes small enough to cross chunk boundaries."""

import math

import pytest
import torch

from flash_attn import reference
from flash_attn.reference import attention_ref
from helpers import Results, assert_matches_reference, assert_rounding_close, make_qkv

EPS = {dtype: torch.finfo(dtype).eps for dtype in (torch.float64, torch.float32, torch.bfloat16, torch.float16)}
INF = float("inf")

# (seqlen_q, seqlen_k): square, sq < sk, sq > sk (causal rows without keys), single query, single key
SEQLENS = [(1, 1), (5, 5), (3, 11), (11, 3), (1, 7), (7, 1)]
HEADS = [(4, 4), (4, 2), (4, 1)]  # MHA, GQA, MQA


def naive_attention(q, k, v, causal, softmax_scale):
    """fp64, one query row at a time, sharing no code with attention_ref: query i of head h reads KV
    head h // (nheads // nheads_k) and, when causal, keys 0 .. i + seqlen_k - seqlen_q (bottom-right
    aligned); a row with no key gives out 0 and lse +inf. Differentiable."""
    q, k, v = q.double(), k.double(), v.double()
    batch, seqlen_q, nheads, headdim = q.shape
    seqlen_k, nheads_k = k.shape[1], k.shape[2]
    outs, lses = [], []
    for b in range(batch):
        for h in range(nheads):
            kv_head = h // (nheads // nheads_k)
            for i in range(seqlen_q):
                last = i + seqlen_k - seqlen_q if causal else seqlen_k - 1
                if last < 0:
                    outs.append(torch.zeros(headdim, dtype=torch.float64))
                    lses.append(torch.tensor(INF, dtype=torch.float64))
                    continue
                scores = (k[b, : last + 1, kv_head] @ q[b, i, h]) * softmax_scale
                row_max = scores.max()
                lse = row_max + torch.log(torch.exp(scores - row_max).sum())
                outs.append(torch.exp(scores - lse) @ v[b, : last + 1, kv_head])
                lses.append(lse)
    out = torch.stack(outs).view(batch, nheads, seqlen_q, headdim).transpose(1, 2)
    return out, torch.stack(lses).view(batch, nheads, seqlen_q)


def test_causal_keep_mask_is_bottom_right_aligned():
    assert reference.causal_keep_mask(2, 4, "cpu").tolist() == [[True, True, True, False], [True] * 4]
    assert reference.causal_keep_mask(4, 2, "cpu").tolist() == [
        [False, False], [False, False], [True, False], [True, True]]
    assert torch.equal(reference.causal_keep_mask(3, 3, "cpu"), torch.ones(3, 3, dtype=torch.bool).tril())


@pytest.mark.parametrize("nheads,nheads_k", HEADS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen_q,seqlen_k", SEQLENS)
def test_attention_ref_fp64_matches_naive(seqlen_q, seqlen_k, causal, nheads, nheads_k):
    """out, lse and gradients of attention_ref in fp64 equal the naive fp64 computation up to rounding."""
    headdim, scale = 16, 0.3
    q, k, v, dout = (t.double().requires_grad_() for t in make_qkv(2, seqlen_q, seqlen_k, nheads, nheads_k,
                                                                     headdim, torch.float64, "cpu"))
    out, lse = attention_ref(q, k, v, causal, scale, compute_dtype=torch.float64)
    exact_out, exact_lse = naive_attention(q, k, v, causal, scale)
    terms = seqlen_k + headdim
    assert out.dtype == torch.float64
    assert_rounding_close("out", out, exact_out, EPS[torch.float64], terms)
    assert_rounding_close("lse", lse, exact_lse, EPS[torch.float32], terms)  # attention_ref's lse is fp32
    grads = torch.autograd.grad(out, (q, k, v), dout)
    exact_grads = torch.autograd.grad(exact_out, (q, k, v), dout)
    for name, grad, exact in zip(("dq", "dk", "dv"), grads, exact_grads):
        assert_rounding_close(name, grad, exact, EPS[torch.float64], seqlen_q + seqlen_k + headdim)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(5, 5), (3, 11), (11, 3)])
def test_attention_ref_upcast_and_low_precision(seqlen_q, seqlen_k, causal, dtype):
    """From low-precision inputs: upcast=True (fp32 math) is fp32-accurate, and the pt baseline
    (upcast=False) is accurate to its own dtype, gradients included, so the tolerance rule
    (max|out - ref| <= factor * max|pt - ref| + floor) is never vacuous."""
    headdim, scale = 16, 0.25
    q, k, v, dout = make_qkv(2, seqlen_q, seqlen_k, 4, 2, headdim, dtype, "cpu")
    exact_out, exact_lse = naive_attention(q, k, v, causal, scale)
    terms = seqlen_k + headdim
    out, lse = attention_ref(q, k, v, causal, scale)
    assert out.dtype == torch.float32 and lse.dtype == torch.float32
    assert_rounding_close("out fp32", out, exact_out, EPS[torch.float32], terms)
    assert_rounding_close("lse fp32", lse, exact_lse, EPS[torch.float32], terms)
    out, lse = attention_ref(q, k, v, causal, scale, upcast=False)
    assert out.dtype == dtype
    # scores, probabilities and the output are each rounded once to `dtype`: 4 roundings in all
    assert_rounding_close("out pt", out, exact_out, EPS[dtype], 4)
    assert_rounding_close("lse pt", lse, exact_lse, EPS[dtype], 4)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    grads = torch.autograd.grad(attention_ref(*leaves, causal, scale, upcast=False)[0], leaves, dout)
    exact_leaves = [t.double().requires_grad_() for t in (q, k, v)]
    exact_grads = torch.autograd.grad(naive_attention(*exact_leaves, causal, scale)[0], exact_leaves, dout.double())
    for name, grad, exact in zip(("dq pt", "dk pt", "dv pt"), grads, exact_grads):
        assert grad.dtype == dtype
        # the backward rounds P, dP, rowsum(dP * P), dS and the gradient to `dtype`: 8 covers them
        assert_rounding_close(name, grad, exact, EPS[dtype], 8)


@pytest.mark.parametrize("upcast", [True, False])
def test_rows_without_keys_in_reference(upcast):
    """Causal seqlen_q > seqlen_k: the first seqlen_q - seqlen_k rows see no key: out 0, lse +inf,
    and the gradients are finite, with dq 0 on those rows."""
    q, k, v, dout = make_qkv(2, 9, 4, 2, 1, 8, torch.bfloat16, "cpu")
    leaves = [t.float().requires_grad_() if upcast else t.clone().requires_grad_() for t in (q, k, v)]
    out, lse = attention_ref(*leaves, causal=True, upcast=upcast)
    assert (out[:, :5] == 0).all() and (lse[:, :, :5] == INF).all()
    assert torch.isfinite(out).all() and torch.isfinite(lse[:, :, 5:]).all()
    dq, dk, dv = torch.autograd.grad(out, leaves, dout.to(out.dtype))
    assert all(torch.isfinite(g).all() for g in (dq, dk, dv))
    assert (dq[:, :5] == 0).all()


CHUNKED_CASES = [  # (seqlen_q, seqlen_k, chunk): chunk boundaries inside the keys, and a single chunk
    (1, 1, 1), (7, 1, 3), (1, 7, 3), (9, 16, 5), (16, 9, 4), (23, 23, 8), (13, 11, 64),
]


@pytest.mark.parametrize("nheads,nheads_k", HEADS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen_q,seqlen_k,chunk", CHUNKED_CASES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_chunked_matches_reference(dtype, seqlen_q, seqlen_k, chunk, causal, nheads, nheads_k):
    """attention_forward_chunked / attention_backward_chunked (the CPU path) against fp64 autograd of
    attention_ref, with the tolerance rule."""
    q, k, v, dout = make_qkv(2, seqlen_q, seqlen_k, nheads, nheads_k, 24, dtype, "cpu")
    scale = 1 / math.sqrt(24)
    out, lse = reference.attention_forward_chunked(q, k, v, causal, scale, chunk=chunk)
    assert out.dtype == dtype and lse.dtype == torch.float32 and out.is_contiguous()
    grads = reference.attention_backward_chunked(dout, q, k, v, out, lse, causal, scale, chunk=chunk)
    assert [g.dtype for g in grads] == [dtype] * 3
    assert_matches_reference(Results(out, lse, *grads), q, k, v, dout, causal, scale, torch.float64)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen_q,seqlen_k,chunk", CHUNKED_CASES)
def test_chunked_fp32_is_exact_to_rounding(seqlen_q, seqlen_k, chunk, causal):
    """With fp32 inputs the chunked path is plain fp32 math: equal to the naive fp64 result (and its
    autograd gradients) up to fp32 rounding."""
    q, k, v, dout = (t.double().requires_grad_() for t in make_qkv(1, seqlen_q, seqlen_k, 4, 2, 16,
                                                                     torch.float64, "cpu"))
    q32, k32, v32, dout32 = (t.detach().float() for t in (q, k, v, dout))
    out, lse = reference.attention_forward_chunked(q32, k32, v32, causal, 0.25, chunk=chunk)
    grads = reference.attention_backward_chunked(dout32, q32, k32, v32, out, lse, causal, 0.25, chunk=chunk)
    exact_out, exact_lse = naive_attention(q, k, v, causal, 0.25)
    exact_grads = torch.autograd.grad(exact_out, (q, k, v), dout)
    terms = seqlen_q + seqlen_k + 16
    for name, ours, exact in zip(("out", "lse", "dq", "dk", "dv"), (out, lse, *grads), (exact_out, exact_lse,
                                                                                        *exact_grads)):
        assert_rounding_close(name, ours, exact, EPS[torch.float32], terms)
