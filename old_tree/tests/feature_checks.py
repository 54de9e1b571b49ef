"""Test code for the options of the training API (window, softcap, ALiBi, dropout, deterministic,
varlen), shared by the CPU tests (test_features_cpu.py, CI) and the GPU tests
(test_gpu_features.py): ours forward + backward against attention_ref with the tolerance rule.

Dropout: the keep mask is read from the S_dmask that return_attn_probs=True gives (its sign bit:
dropped entries are negated, -0.0 included), so the reference applies exactly the mask the kernels
drew; test_dropout_* check separately that this mask is the documented Philox mask and that it
keeps 1 - p of the entries.
"""

import dataclasses

import torch

import flash_attn
from helpers import Results, assert_matches_reference


@dataclasses.dataclass(frozen=True)
class Mods:
    """One combination of options; alibi: None, "head" (nheads,) or "batch" (batch, nheads)."""
    causal: bool = False
    window_size: tuple = (-1, -1)
    softcap: float = 0.0
    alibi: str = None
    dropout_p: float = 0.0
    deterministic: bool = False

    def slopes(self, batch, nheads, device):
        if self.alibi is None:
            return None
        shape = (nheads,) if self.alibi == "head" else (batch, nheads)
        return (torch.rand(shape, device=device) * 0.5 + 0.05).float()

    def kwargs(self, alibi_slopes):
        return dict(causal=self.causal, window_size=self.window_size, softcap=self.softcap, alibi_slopes=alibi_slopes,
                    dropout_p=self.dropout_p, deterministic=self.deterministic)


def keep_mask_from_probs(s_dmask, seqlen_q, seqlen_k):
    """Bool (b, h, seqlen_q, seqlen_k): True where S_dmask's entry is not negated (kept)."""
    return ~torch.signbit(s_dmask[:, :, :seqlen_q, :seqlen_k])


def _reference_mods(mods, alibi_slopes, keep):
    return dict(window_size=mods.window_size, softcap=mods.softcap, alibi_slopes=alibi_slopes,
                dropout_p=mods.dropout_p, dropout_mask=keep)


def check_dense(mods, batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, dtype, device,
                compute_dtype=torch.float32):
    """flash_attn_func with `mods`, forward and backward, against the reference."""
    new = lambda s, h: torch.randn(batch, s, h, headdim, dtype=dtype, device=device)  # noqa: E731
    q, k, v, dout = new(seqlen_q, nheads), new(seqlen_k, nheads_k), new(seqlen_k, nheads_k), new(seqlen_q, nheads)
    alibi_slopes = mods.slopes(batch, nheads, device)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse, s_dmask = flash_attn.flash_attn_func(*leaves, **mods.kwargs(alibi_slopes), return_attn_probs=True)
    assert out.shape == q.shape and lse.shape == (batch, nheads, seqlen_q) and lse.dtype == torch.float32
    ours = Results(out, lse, *torch.autograd.grad(out, leaves, dout))
    keep = None
    if mods.dropout_p > 0:
        assert s_dmask.shape == (batch, nheads, -(-seqlen_q // 128) * 128, -(-seqlen_k // 128) * 128)
        keep = keep_mask_from_probs(s_dmask, seqlen_q, seqlen_k)
    else:
        assert s_dmask is None
    assert_matches_reference(ours, q, k, v, dout, mods.causal, None, compute_dtype,
                             **_reference_mods(mods, alibi_slopes, keep))
    return ours


def make_cu_seqlens(lengths, device):
    bounds = [0]
    for length in lengths:
        bounds.append(bounds[-1] + length)
    return torch.tensor(bounds, dtype=torch.int32, device=device)


def _sequence(results, b, cu_q, cu_k):
    """Results of sequence b of a varlen batch, as a batch of one."""
    rq, rk = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
    one = lambda t, rows: t[rows].unsqueeze(0)  # noqa: E731
    return Results(one(results.out, rq), results.lse[:, rq].unsqueeze(0), one(results.dq, rq), one(results.dk, rk),
                   one(results.dv, rk))


def check_varlen(mods, lengths_q, lengths_k, nheads, nheads_k, headdim, dtype, device, compute_dtype=torch.float32,
                 packing="none"):
    """flash_attn_varlen_func (packing "none"), _kvpacked_func ("kv") or _qkvpacked_func ("qkv";
    needs lengths_q == lengths_k, nheads == nheads_k) with `mods`, each sequence against the
    reference run on it alone."""
    batch = len(lengths_q)
    total_q, total_k = sum(lengths_q), sum(lengths_k)
    new = lambda s, h: torch.randn(s, h, headdim, dtype=dtype, device=device)  # noqa: E731
    q, k, v, dout = new(total_q, nheads), new(total_k, nheads_k), new(total_k, nheads_k), new(total_q, nheads)
    cu_q, cu_k = make_cu_seqlens(lengths_q, device), make_cu_seqlens(lengths_k, device)
    max_q, max_k = max(lengths_q), max(lengths_k)
    alibi_slopes = mods.slopes(batch, nheads, device)
    kwargs = dict(**mods.kwargs(alibi_slopes), return_attn_probs=True)
    if packing == "qkv":
        qkv = torch.stack([q, k, v], dim=1).requires_grad_()
        out, lse, s_dmask = flash_attn.flash_attn_varlen_qkvpacked_func(qkv, cu_q, max_q, **kwargs)
        grads = tuple(torch.autograd.grad(out, qkv, dout)[0].unbind(1))
    elif packing == "kv":
        q_leaf, kv = q.clone().requires_grad_(), torch.stack([k, v], dim=1).requires_grad_()
        out, lse, s_dmask = flash_attn.flash_attn_varlen_kvpacked_func(q_leaf, kv, cu_q, cu_k, max_q, max_k, **kwargs)
        dq, dkv = torch.autograd.grad(out, (q_leaf, kv), dout)
        grads = (dq, *dkv.unbind(1))
    else:
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out, lse, s_dmask = flash_attn.flash_attn_varlen_func(*leaves, cu_q, cu_k, max_q, max_k, **kwargs)
        grads = torch.autograd.grad(out, leaves, dout)
    assert out.shape == q.shape and lse.shape == (nheads, total_q)
    ours = Results(out, lse, *grads)
    bounds_q, bounds_k = cu_q.tolist(), cu_k.tolist()
    for b in range(batch):
        if lengths_q[b] == 0:
            continue
        keep = None
        if mods.dropout_p > 0:
            keep = keep_mask_from_probs(s_dmask[b:b + 1], lengths_q[b], lengths_k[b])
        slopes = alibi_slopes[b:b + 1] if mods.alibi == "batch" else alibi_slopes
        seq = lambda t, bounds: t[bounds[b]:bounds[b + 1]].unsqueeze(0)  # noqa: E731
        assert_matches_reference(_sequence(ours, b, bounds_q, bounds_k), seq(q, bounds_q), seq(k, bounds_k),
                                 seq(v, bounds_k), seq(dout, bounds_q), mods.causal, None, compute_dtype,
                                 **_reference_mods(mods, slopes, keep))
    for b in range(batch):  # keys of a sequence without queries get no gradient
        if lengths_q[b] == 0 and lengths_k[b] > 0:
            rows = slice(bounds_k[b], bounds_k[b + 1])
            assert not ours.dk[rows].any() and not ours.dv[rows].any()
    return ours


def dropped_fraction(keep, visible):
    """Fraction of the visible entries that the mask drops."""
    return 1.0 - keep[visible.expand_as(keep)].float().mean().item()
