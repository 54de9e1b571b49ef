"""Exact attention in plain PyTorch: the ground truth for tests and the CPU path.

Shapes follow FlashAttention: q (batch, seqlen_q, nheads, headdim), k and v
(batch, seqlen_k, nheads_k, headdim) with nheads % nheads_k == 0. The softmax
log-sum-exp is (batch, nheads, seqlen_q) float32 in natural-log units, and is
+inf for a query row that sees no key (its output row is 0), as in FlashAttention.

Scores, in FlashAttention 2's order (its attention_ref and kernels):
    s = q.k * softmax_scale
    s = softcap * tanh(s / softcap)                       if softcap > 0
    s = s - slope[b, h] * |i + seqlen_k - seqlen_q - j|   with alibi_slopes
    masked to -inf outside the window: query i sees key j iff
        j <= i + seqlen_k - seqlen_q + right  (right >= 0; causal is right = 0) and
        j >= i + seqlen_k - seqlen_q - left   (left >= 0)
    P = softmax(s); lse = logsumexp(s), before dropout
    out = (P * keep / (1 - dropout_p)) v, keep the dropout keep mask (flash_attn.dropout).
"""

import dataclasses
import math
from typing import Optional, Tuple

import torch

from . import dropout as dropout_lib


def default_softmax_scale(headdim):
    return 1.0 / math.sqrt(headdim)


def normalize_window(window_size, causal, seqlen_k):
    """FlashAttention 2's reading of (window_size, causal) as (left, right), -1 for unbounded: a side
    of at least seqlen_k (max_seqlen_k for varlen) is unbounded, and causal sets right = 0."""
    left, right = (int(w) for w in window_size)
    left = -1 if left >= seqlen_k else left
    right = -1 if right >= seqlen_k else right
    if causal:
        right = 0
    return left, right


@dataclasses.dataclass(frozen=True)
class ScoreOptions:
    """Everything but q, k, v and the scale that shapes the attention matrix. window is normalized
    (see normalize_window). rng_state is the [seed, offset] pair of the dropout keep mask."""
    window: Tuple[int, int] = (-1, -1)
    softcap: float = 0.0
    alibi_slopes: Optional[torch.Tensor] = None  # (nheads,) or (batch, nheads) float32
    dropout_p: float = 0.0
    rng_state: Optional[torch.Tensor] = None

    def for_sequence(self, batch_index):
        """The options of sequence `batch_index` of a varlen batch run as a batch of one."""
        slopes = self.alibi_slopes
        if slopes is not None and slopes.dim() == 2:
            slopes = slopes[batch_index:batch_index + 1]
        return dataclasses.replace(self, alibi_slopes=slopes)


def visible_keys(rows, cols, seqlen_q, seqlen_k, window):
    """Bool, broadcast of rows (.., 1) and cols (1, ..): True where query row i sees key col j."""
    left, right = window
    diagonal = rows + (seqlen_k - seqlen_q)
    keep = torch.ones(torch.broadcast_shapes(rows.shape, cols.shape), dtype=torch.bool, device=rows.device)
    if right >= 0:
        keep &= cols <= diagonal + right
    if left >= 0:
        keep &= cols >= diagonal - left
    return keep


def causal_keep_mask(seqlen_q, seqlen_k, device):
    """Bool (seqlen_q, seqlen_k): True where query i may attend to key j under causal masking."""
    return window_keep_mask(seqlen_q, seqlen_k, (-1, 0), device)


def window_keep_mask(seqlen_q, seqlen_k, window, device):
    """Bool (seqlen_q, seqlen_k) of visible_keys."""
    rows = torch.arange(seqlen_q, device=device).unsqueeze(1)
    cols = torch.arange(seqlen_k, device=device).unsqueeze(0)
    return visible_keys(rows, cols, seqlen_q, seqlen_k, window)


def alibi_bias(alibi_slopes, batch, nheads, rows, cols, seqlen_q, seqlen_k):
    """-slope * |i + seqlen_k - seqlen_q - j|: (batch, nheads, len(rows), len(cols)) float32."""
    slopes = alibi_slopes.float().to(rows.device)
    slopes = slopes.view(1, nheads, 1, 1) if slopes.dim() == 1 else slopes.view(batch, nheads, 1, 1)
    distance = (rows.view(-1, 1) + (seqlen_k - seqlen_q) - cols.view(1, -1)).abs()
    return -slopes * distance.to(slopes.dtype)


def _expand_kv_heads(x, nheads):
    """(b, s, nheads_k, d) -> (b, s, nheads, d): each KV head serves nheads // nheads_k query heads."""
    return x.repeat_interleave(nheads // x.shape[2], dim=2)


def scores_and_capped(qf, kf, rows, cols, seqlen_q, seqlen_k, scale, options):
    """Final masked scores (b, h, len(rows), len(cols)) of queries qf against keys kf (both already in
    the compute dtype, heads expanded), and t = tanh(scaled / softcap) (None without softcap)."""
    s = torch.einsum("bthd,bshd->bhts", qf, kf) * scale
    capped = None
    if options.softcap > 0:
        capped = torch.tanh(s / options.softcap)
        s = capped * options.softcap
    if options.alibi_slopes is not None:
        s = s + alibi_bias(options.alibi_slopes, qf.shape[0], qf.shape[2], rows, cols, seqlen_q,
                           seqlen_k).to(s.dtype)
    if options.window != (-1, -1):
        keep = visible_keys(rows.view(-1, 1), cols.view(1, -1), seqlen_q, seqlen_k, options.window)
        s = s.masked_fill(~keep, float("-inf"))
    return s, capped


def dropout_keep(options, batch, nheads, seqlen_q, seqlen_k, key_start=0, key_end=None, batch_indices=None):
    """The keep mask (b, h, seqlen_q, keys [key_start, key_end)) of options.rng_state, or None."""
    if options.dropout_p <= 0:
        return None
    seed, offset = (int(x) for x in options.rng_state.tolist())
    return dropout_lib.keep_mask(seed, offset, batch, nheads, seqlen_q, seqlen_k, options.dropout_p,
                                 batch_indices=batch_indices, key_start=key_start, key_end=key_end)


def attention_ref(q, k, v, causal=False, softmax_scale=None, upcast=True, compute_dtype=torch.float32,
                  window_size=(-1, -1), softcap=0.0, alibi_slopes=None, dropout_p=0.0, dropout_mask=None):
    """Materialized attention. Returns (out, lse).

    upcast=True does the math in `compute_dtype` (fp32 or fp64) and returns `out` in that dtype;
    upcast=False keeps q/k/v's low precision, the rounding users already accept from plain PyTorch.
    window_size and causal as flash_attn_func takes them; dropout_mask (b, h, sq, sk) bool, True
    where kept, applies dropout_p. Differentiable: tests take reference gradients with autograd.
    """
    if softmax_scale is None:
        softmax_scale = default_softmax_scale(q.shape[-1])
    if upcast:
        q, k, v = q.to(compute_dtype), k.to(compute_dtype), v.to(compute_dtype)
    seqlen_q, seqlen_k, nheads = q.shape[1], k.shape[1], q.shape[2]
    k, v = _expand_kv_heads(k, nheads), _expand_kv_heads(v, nheads)
    window = (int(window_size[0]), 0 if causal else int(window_size[1]))  # as given: FA2's test reference
    options = ScoreOptions(window=window, softcap=softcap, alibi_slopes=alibi_slopes)
    rows, cols = torch.arange(seqlen_q, device=q.device), torch.arange(seqlen_k, device=q.device)
    scores, _ = scores_and_capped(q, k, rows, cols, seqlen_q, seqlen_k, softmax_scale, options)
    lse_dtype = torch.float64 if scores.dtype == torch.float64 else torch.float32
    lse = torch.logsumexp(scores.to(lse_dtype), dim=-1)  # (b, h, sq), -inf on fully masked rows
    probs = torch.softmax(scores, dim=-1)
    probs = probs.nan_to_num(0.0)  # a fully masked row has no keys: its output is 0
    if dropout_mask is not None and dropout_p > 0:
        probs = probs.masked_fill(~dropout_mask, 0.0) / (1 - dropout_p)
    out = torch.einsum("bhts,bshd->bthd", probs.to(v.dtype), v)
    lse = lse.masked_fill(lse == float("-inf"), float("inf"))
    return out, lse


def _kv_chunks(seqlen_k, chunk):
    for start in range(0, seqlen_k, chunk):
        yield start, min(start + chunk, seqlen_k)


def attention_forward_chunked(q, k, v, causal, softmax_scale, chunk=1024, options=None, batch_indices=None):
    """Forward in fp32, streaming over K/V chunks with an online softmax: O(seqlen) extra memory
    per (batch, head) beyond one (seqlen_q x chunk) score block. options (ScoreOptions, window
    normalized) replaces `causal` when given; batch_indices are the dropout's batch numbers of the
    rows (varlen runs one sequence at a time). Returns (out in q.dtype, lse fp32)."""
    options = options or ScoreOptions(window=(-1, 0) if causal else (-1, -1))
    b, sq, h, d = q.shape
    sk = k.shape[1]
    qf = q.float()
    kf, vf = _expand_kv_heads(k.float(), h), _expand_kv_heads(v.float(), h)
    rows = torch.arange(sq)
    row_max = torch.full((b, h, sq, 1), float("-inf"))
    row_sum = torch.zeros((b, h, sq, 1))
    acc = torch.zeros((b, h, sq, d))
    for start, end in _kv_chunks(sk, chunk):
        s, _ = scores_and_capped(qf, kf[:, start:end], rows, torch.arange(start, end), sq, sk, softmax_scale, options)
        new_max = torch.maximum(row_max, s.amax(dim=-1, keepdim=True))
        safe_max = new_max.masked_fill(new_max == float("-inf"), 0.0)
        p = torch.exp(s - safe_max)
        rescale = torch.exp(row_max - safe_max)
        row_sum = row_sum * rescale + p.sum(dim=-1, keepdim=True)
        keep = dropout_keep(options, b, h, sq, sk, start, end, batch_indices)
        p_out = p if keep is None else p * keep
        acc = acc * rescale + torch.einsum("bhts,bshd->bhtd", p_out, vf[:, start:end])
        row_max = new_max
    empty = row_sum == 0
    keep_scale = 1.0 / (1.0 - options.dropout_p)
    out = torch.where(empty, 0.0, acc * keep_scale / row_sum.masked_fill(empty, 1.0))
    lse = torch.where(empty, float("inf"), row_max + torch.log(row_sum.masked_fill(empty, 1.0)))
    return out.permute(0, 2, 1, 3).to(q.dtype).contiguous(), lse.squeeze(-1)


def attention_backward_chunked(dout, q, k, v, out, lse, causal, softmax_scale, chunk=1024, options=None,
                               batch_indices=None):
    """Backward in fp32 by recomputation from lse, chunked over K/V like the forward.
    Returns (dq, dk, dv) in the input dtypes; dk/dv are summed over the query heads sharing a KV head."""
    options = options or ScoreOptions(window=(-1, 0) if causal else (-1, -1))
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    qf, dof = q.float(), dout.float()
    kf, vf = _expand_kv_heads(k.float(), h), _expand_kv_heads(v.float(), h)
    rows = torch.arange(sq)
    lse_rows = lse.unsqueeze(-1)  # (b, h, sq, 1); +inf on empty rows makes their P exactly 0
    delta = (dof * out.float()).sum(-1).permute(0, 2, 1).unsqueeze(-1)  # rowsum(dO * O): (b, h, sq, 1)
    keep_scale = 1.0 / (1.0 - options.dropout_p)
    dq = torch.zeros((b, sq, h, d))
    dk = torch.zeros((b, sk, h, d))
    dv = torch.zeros((b, sk, h, d))
    for start, end in _kv_chunks(sk, chunk):
        s, capped = scores_and_capped(qf, kf[:, start:end], rows, torch.arange(start, end), sq, sk, softmax_scale,
                                      options)
        p = torch.exp(s - lse_rows)  # (b, h, sq, n)
        dp = torch.einsum("bthd,bshd->bhts", dof, vf[:, start:end])
        keep = dropout_keep(options, b, h, sq, sk, start, end, batch_indices)
        if keep is not None:
            dp = dp * keep * keep_scale
            dv[:, start:end] = torch.einsum("bhts,bthd->bshd", p * keep * keep_scale, dof)
        else:
            dv[:, start:end] = torch.einsum("bhts,bthd->bshd", p, dof)
        ds = p * (dp - delta)
        if capped is not None:
            ds = ds * (1 - capped * capped)
        ds = ds * softmax_scale
        dq += torch.einsum("bhts,bshd->bthd", ds, kf[:, start:end])
        dk[:, start:end] = torch.einsum("bhts,bthd->bshd", ds, qf)
    group = h // hk
    dk = dk.view(b, sk, hk, group, d).sum(3)
    dv = dv.view(b, sk, hk, group, d).sum(3)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _sequences(cu_seqlens_q, cu_seqlens_k):
    """(batch index, q rows, k rows) of each sequence of a varlen batch."""
    bq, bk = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for index in range(len(bq) - 1):
        yield index, slice(bq[index], bq[index + 1]), slice(bk[index], bk[index + 1])


def forward_any_layout(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale, options):
    """The CPU op's forward: dense (b, s, h, d) tensors, or varlen (total, h, d) ones with cu_seqlens,
    run one sequence at a time. Varlen lse is (h, total_q); rows outside every sequence get out 0
    and lse +inf."""
    if cu_seqlens_q is None:
        return attention_forward_chunked(q, k, v, False, softmax_scale, options=options)
    out = torch.zeros(q.shape, dtype=q.dtype)
    lse = torch.full((q.shape[1], q.shape[0]), float("inf"))
    for index, rows_q, rows_k in _sequences(cu_seqlens_q, cu_seqlens_k):
        seq_out, seq_lse = attention_forward_chunked(q[rows_q].unsqueeze(0), k[rows_k].unsqueeze(0),
                                                     v[rows_k].unsqueeze(0), False, softmax_scale,
                                                     options=options.for_sequence(index), batch_indices=[index])
        out[rows_q] = seq_out[0]
        lse[:, rows_q] = seq_lse[0]
    return out, lse


def backward_any_layout(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, softmax_scale, options):
    """The CPU op's backward, dense or varlen (see forward_any_layout); rows outside every sequence
    get zero gradients."""
    if cu_seqlens_q is None:
        return attention_backward_chunked(dout, q, k, v, out, lse, False, softmax_scale, options=options)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for index, rows_q, rows_k in _sequences(cu_seqlens_q, cu_seqlens_k):
        one = lambda t, rows: t[rows].unsqueeze(0)  # noqa: E731
        grads = attention_backward_chunked(one(dout, rows_q), one(q, rows_q), one(k, rows_k), one(v, rows_k),
                                           one(out, rows_q), lse[:, rows_q].unsqueeze(0), False, softmax_scale,
                                           options=options.for_sequence(index), batch_indices=[index])
        dq[rows_q], dk[rows_k], dv[rows_k] = (g[0] for g in grads)
    return dq, dk, dv
