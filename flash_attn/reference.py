"""Exact attention in plain PyTorch: the ground truth for tests and the CPU path.

Shapes follow FlashAttention: q (batch, seqlen_q, nheads, headdim), k and v
(batch, seqlen_k, nheads_k, headdim) with nheads % nheads_k == 0. The softmax
log-sum-exp is (batch, nheads, seqlen_q) float32 in natural-log units, and is
+inf for a query row that sees no key (its output row is 0), as in FlashAttention.

Causal masking is bottom-right aligned: query i sees key j iff j <= i + seqlen_k - seqlen_q.
"""

import math

import torch


def default_softmax_scale(headdim):
    return 1.0 / math.sqrt(headdim)


def causal_keep_mask(seqlen_q, seqlen_k, device):
    """Bool (seqlen_q, seqlen_k): True where query i may attend to key j."""
    rows = torch.arange(seqlen_q, device=device).unsqueeze(1)
    cols = torch.arange(seqlen_k, device=device).unsqueeze(0)
    return cols <= rows + (seqlen_k - seqlen_q)


def _expand_kv_heads(x, nheads):
    """(b, s, nheads_k, d) -> (b, s, nheads, d): each KV head serves nheads // nheads_k query heads."""
    return x.repeat_interleave(nheads // x.shape[2], dim=2)


def attention_ref(q, k, v, causal=False, softmax_scale=None, upcast=True, compute_dtype=torch.float32):
    """Materialized attention. Returns (out, lse).

    upcast=True does the math in `compute_dtype` (fp32 or fp64) and returns `out` in that dtype;
    upcast=False keeps q/k/v's low precision, the rounding users already accept from plain PyTorch.
    Differentiable, so tests take reference gradients from it with autograd.
    """
    if softmax_scale is None:
        softmax_scale = default_softmax_scale(q.shape[-1])
    if upcast:
        q, k, v = q.to(compute_dtype), k.to(compute_dtype), v.to(compute_dtype)
    nheads = q.shape[2]
    k, v = _expand_kv_heads(k, nheads), _expand_kv_heads(v, nheads)
    scores = torch.einsum("bthd,bshd->bhts", q, k) * softmax_scale  # (b, h, sq, sk)
    if causal:
        keep = causal_keep_mask(q.shape[1], k.shape[1], q.device)
        scores = scores.masked_fill(~keep, float("-inf"))
    lse_dtype = torch.float64 if scores.dtype == torch.float64 else torch.float32
    lse = torch.logsumexp(scores.to(lse_dtype), dim=-1)  # (b, h, sq), -inf on fully masked rows
    probs = torch.softmax(scores, dim=-1)
    probs = probs.nan_to_num(0.0)  # a fully masked row has no keys: its output is 0
    out = torch.einsum("bhts,bshd->bthd", probs.to(v.dtype), v)
    lse = lse.masked_fill(lse == float("-inf"), float("inf"))
    return out, lse


def _kv_chunks(seqlen_k, chunk):
    for start in range(0, seqlen_k, chunk):
        yield start, min(start + chunk, seqlen_k)


def _chunk_scores(qf, kf, start, end, causal, seqlen_q, seqlen_k, scale):
    """Scaled scores of all queries against keys [start, end): (b, h, sq, end - start), masked with -inf."""
    s = torch.einsum("bthd,bshd->bhts", qf, kf[:, start:end]) * scale
    if causal:
        rows = torch.arange(seqlen_q).unsqueeze(1)
        cols = torch.arange(start, end).unsqueeze(0)
        s = s.masked_fill(cols > rows + (seqlen_k - seqlen_q), float("-inf"))
    return s


def attention_forward_chunked(q, k, v, causal, softmax_scale, chunk=1024):
    """Forward in fp32, streaming over K/V chunks with an online softmax: O(seqlen) extra memory
    per (batch, head) beyond one (seqlen_q x chunk) score block. Returns (out in q.dtype, lse fp32)."""
    b, sq, h, d = q.shape
    sk = k.shape[1]
    qf = q.float()
    kf, vf = _expand_kv_heads(k.float(), h), _expand_kv_heads(v.float(), h)
    row_max = torch.full((b, h, sq, 1), float("-inf"))
    row_sum = torch.zeros((b, h, sq, 1))
    acc = torch.zeros((b, h, sq, d))
    for start, end in _kv_chunks(sk, chunk):
        s = _chunk_scores(qf, kf, start, end, causal, sq, sk, softmax_scale)
        new_max = torch.maximum(row_max, s.amax(dim=-1, keepdim=True))
        safe_max = new_max.masked_fill(new_max == float("-inf"), 0.0)
        p = torch.exp(s - safe_max)
        rescale = torch.exp(row_max - safe_max)
        row_sum = row_sum * rescale + p.sum(dim=-1, keepdim=True)
        acc = acc * rescale + torch.einsum("bhts,bshd->bhtd", p, vf[:, start:end])
        row_max = new_max
    empty = row_sum == 0
    out = torch.where(empty, 0.0, acc / row_sum.masked_fill(empty, 1.0))
    lse = torch.where(empty, float("inf"), row_max + torch.log(row_sum.masked_fill(empty, 1.0)))
    return out.permute(0, 2, 1, 3).to(q.dtype).contiguous(), lse.squeeze(-1)


def attention_backward_chunked(dout, q, k, v, out, lse, causal, softmax_scale, chunk=1024):
    """Backward in fp32 by recomputation from lse, chunked over K/V like the forward.
    Returns (dq, dk, dv) in the input dtypes; dk/dv are summed over the query heads sharing a KV head."""
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    qf, dof = q.float(), dout.float()
    kf, vf = _expand_kv_heads(k.float(), h), _expand_kv_heads(v.float(), h)
    lse_rows = lse.unsqueeze(-1)  # (b, h, sq, 1); +inf on empty rows makes their P exactly 0
    delta = (dof * out.float()).sum(-1).permute(0, 2, 1).unsqueeze(-1)  # rowsum(dO * O): (b, h, sq, 1)
    dq = torch.zeros((b, sq, h, d))
    dk = torch.zeros((b, sk, h, d))
    dv = torch.zeros((b, sk, h, d))
    for start, end in _kv_chunks(sk, chunk):
        s = _chunk_scores(qf, kf, start, end, causal, sq, sk, softmax_scale)
        p = torch.exp(s - lse_rows)  # (b, h, sq, n)
        dv[:, start:end] = torch.einsum("bhts,bthd->bshd", p, dof)
        dp = torch.einsum("bthd,bshd->bhts", dof, vf[:, start:end])
        ds = p * (dp - delta) * softmax_scale
        dq += torch.einsum("bhts,bshd->bthd", ds, kf[:, start:end])
        dk[:, start:end] = torch.einsum("bhts,bthd->bshd", ds, qf)
    group = h // hk
    dk = dk.view(b, sk, hk, group, d).sum(3)
    dv = dv.view(b, sk, hk, group, d).sum(3)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
