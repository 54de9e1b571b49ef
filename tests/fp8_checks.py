"""Shared code of the fp8 forward tests (test_triton_fp8.py): quantizing inputs the way FlashAttention
3's FP8 API expects them, and the fp8 version of the tolerance rule, on RMSE.

The rule (docs/TESTING.md), for fp8: with
    ref = exact attention (fp64) of the dequantized inputs q8 * q_descale, k8 * k_descale, v8 * v_descale,
    pt  = the rounding an fp8 attention cannot avoid, done by plain PyTorch (fp32 math): P =
          exp(s - rowmax) rounded to e4m3 for the P . V product (the row sums use P before rounding),
          the output rounded to bfloat16,
    out = ours,
pass iff RMSE(out - ref) <= 2 * RMSE(pt - ref) + atol_floor, over the rows that see a key.
Why RMSE and factor 2: each rounded P carries a relative error of up to 2^-4 (e4m3's 3 mantissa
bits), so the output's error is a sum of many small independent terms, and its RMSE is the stable
statistic (the maximum is an extreme of that noise). Ours rounds P against the running row maximum
of its key block walk rather than the final one, which draws other rounding errors of the same size;
the factor 2 is the rule's allowance for such a different order. Ours also scales P by 2^8, so that
probabilities pt rounds to 0 (below 2^-10 of the row's largest) keep their relative precision:
pt is the plain fp8 baseline, not the best fp8 attention can do (long_tail_inputs shows the
difference). atol_floor is the fp32 ulp of the
reference's largest value (helpers.fp32_rounding_floor), negligible next to fp8 noise. The lse does
not depend on P's rounding: it follows the ordinary rule against the fp32 math of pt, plus, on a GPU,
the error of the fp8 tensor cores' own accumulation (mma_allowance): Hopper adds the products of an
fp8 MMA with about 14 mantissa bits, not fp32's 24 (DeepSeek-V3 technical report, section 3.3.2, on
H800), so a score s = scale * sum_d q_d k_d can be off by up to ~2^-14 * scale * sum_d |q_d k_d|, and
lse, 1-Lipschitz in the scores, by the row's largest such bound. Measured on an H100 (2026-11-24):
lse errors 5e-5 to 3.4e-4 against pt's 3e-7 to 5e-7; the allowance uses 2^-13 (a factor of 2 over
the report's figure). An indexing or masking bug moves lse by far more.
"""

import math

import torch

from flash_attn.reference import ScoreOptions, attention_ref, normalize_window, scores_and_capped
from helpers import assert_fa_close, fp32_rounding_floor

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max


def quantize(x, nheads_k):
    """(x8 float8_e4m3fn, descale float32 (batch, nheads_k)) of x (batch, seqlen, nheads, headdim):
    one scale per batch entry and KV head (its query heads share it, as FlashAttention 3 reads
    q_descale), mapping the largest magnitude to e4m3's largest value."""
    group = x.shape[2] // nheads_k
    if x.shape[1] == 0:  # an empty sequence: any scale
        return x.to(FP8), torch.ones(x.shape[0], nheads_k)
    amax = x.float().abs().unflatten(2, (nheads_k, group)).amax(dim=(1, 3, 4)).clamp(min=1e-12)
    descale = amax / FP8_MAX
    x8 = (x.float() / _per_head(descale, x.shape[2])).to(FP8)
    return x8, descale


def _per_head(descale, nheads):
    """(batch, nheads_k) -> (batch, 1, nheads, 1), broadcastable over (batch, seqlen, nheads, headdim)."""
    return descale.repeat_interleave(nheads // descale.shape[1], dim=1)[:, None, :, None]


def dequantize(x8, descale, dtype=torch.float64):
    return x8.to(dtype) * _per_head(descale.to(dtype), x8.shape[2])


def emulated(qf, kf, vf, softmax_scale, options):
    """pt of the module docstring: (out rounded to bfloat16, lse), both returned in float32, of
    dequantized fp32 inputs (dense, batch first); rows that see no key give 0 and +inf."""
    nheads, seqlen_q, seqlen_k = qf.shape[2], qf.shape[1], kf.shape[1]
    kf, vf = (x.repeat_interleave(nheads // x.shape[2], dim=2) for x in (kf, vf))
    rows, cols = torch.arange(seqlen_q), torch.arange(seqlen_k)
    s, _ = scores_and_capped(qf, kf, rows, cols, seqlen_q, seqlen_k, softmax_scale, options)
    m = s.amax(-1, keepdim=True)
    m = torch.where(torch.isinf(m), 0.0, m)
    p = torch.exp(s - m)
    l = p.sum(-1, keepdim=True)
    out = torch.einsum("bhts,bshd->bthd", p.to(FP8).float(), vf) / l.clamp(min=1e-30).transpose(1, 2)
    lse = torch.where(l > 0, m + torch.log(l), math.inf).squeeze(-1)
    return out.to(torch.bfloat16).float(), lse


FP8_MMA_ACCUMULATOR_BITS = 13  # the module docstring: ~14 on Hopper, one bit of margin


def mma_allowance(q8, k8, descales, softmax_scale, bits=FP8_MMA_ACCUMULATOR_BITS):
    """(batch, nheads, seqlen_q) fp64: per query row, 2^-13 * softmax_scale * max over keys of
    sum_d |q_d k_d| of the dequantized inputs, the bound on a score's error from an fp8 MMA's
    narrow accumulator (module docstring). Softcap (slope <= 1) and ALiBi (exact) do not widen it."""
    qf, kf = dequantize(q8, descales[0]), dequantize(k8, descales[1])
    kf = kf.repeat_interleave(qf.shape[2] // kf.shape[2], dim=2)
    sums = torch.einsum("bthd,bshd->bhts", qf.abs(), kf.abs())
    widest = sums.amax(-1) if sums.shape[-1] > 0 else sums.new_zeros(sums.shape[:-1])
    return widest * softmax_scale * 2.0 ** -bits


def references(q8, k8, v8, descales, softmax_scale, causal, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
               accumulator_bits=FP8_MMA_ACCUMULATOR_BITS):
    """((ref_out, ref_lse) fp64, (pt_out, pt_lse) fp32, the lse's MMA allowance (mma_allowance, of
    accumulator_bits) where the kernel runs on a GPU, else 0) of quantized dense inputs and their
    descales."""
    ref = attention_ref(*(dequantize(x, d) for x, d in zip((q8, k8, v8), descales)), causal=causal,
                        softmax_scale=softmax_scale, compute_dtype=torch.float64, window_size=window_size,
                        softcap=softcap, alibi_slopes=alibi_slopes)
    window = normalize_window(window_size, causal, k8.shape[1])
    options = ScoreOptions(window=window, softcap=softcap, alibi_slopes=alibi_slopes)
    pt = emulated(*(dequantize(x, d, torch.float32) for x, d in zip((q8, k8, v8), descales)), softmax_scale, options)
    allowance = mma_allowance(q8, k8, descales, softmax_scale, accumulator_bits) if torch.cuda.is_available() else 0.0
    return ref, pt, allowance


def rmse(a, b):
    return (a.double() - b.double()).pow(2).mean().sqrt().item()


def assert_fp8_close(out, lse, ref, pt, lse_allowance=0.0):
    """The fp8 rule of the module docstring on out (RMSE) and the ordinary rule on lse, widened by
    lse_allowance (a tensor of lse's shape, or 0: mma_allowance); ours and the references are dense
    (batch, seqlen_q, nheads, headdim) / (batch, nheads, seqlen_q)."""
    (ref_out, ref_lse), (pt_out, pt_lse) = ref, pt
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all(), "fp8 output: bfloat16 and finite"
    seen = torch.isfinite(ref_lse).transpose(1, 2)  # (batch, seqlen_q, nheads): rows that see a key
    assert (out.float()[~seen] == 0).all(), "rows that see no key must be 0"
    ours_err, pt_err = rmse(out.float()[seen], ref_out[seen]), rmse(pt_out[seen], ref_out[seen])
    tol = 2 * pt_err + fp32_rounding_floor(ref_out)
    assert ours_err <= tol, (f"fp8 out: RMSE(out - ref) = {ours_err:.4g} > 2 * RMSE(pt - ref) ({pt_err:.4g}) + floor "
                             f"= {tol:.4g} (RMS of ref {ref_out[seen].pow(2).mean().sqrt().item():.4g})")
    assert_lse_close(lse, ref_lse, pt_lse, lse_allowance)
    return ours_err, pt_err


def assert_lse_close(lse, ref_lse, pt_lse, allowance):
    """The ordinary rule (factor 2) where there is no allowance; with one, per row |lse - ref| <=
    2 * max|pt - ref| + floor + allowance of that row."""
    if not isinstance(allowance, torch.Tensor):
        assert_fa_close("lse", lse, ref_lse, pt_lse, 2)
        return
    finite = torch.isfinite(ref_lse)
    assert (lse[~finite] == ref_lse[~finite]).all(), "lse: rows that see no key must be +inf"
    err = (lse.double() - ref_lse)[finite].abs()
    base = 2 * (pt_lse.double() - ref_lse)[finite].abs().max().item() + fp32_rounding_floor(ref_lse)
    bound = base + allowance[finite]
    worst = (err - bound).argmax()
    assert (err <= bound).all(), (f"lse: |lse - ref| = {err[worst].item():.4g} > 2 * max|pt - ref| + floor "
                                  f"({base:.4g}) + MMA allowance ({allowance[finite][worst].item():.4g})")


def long_tail_inputs(seqlen_q=32, seqlen_k=2048, nheads=2, headdim=128, peak_key=777):
    """Quantized (q8, k8, v8) and descales of rows whose softmax mass lies partly in one key
    (peak_key) and partly in a long tail of keys 8 nats below it: each tail probability is ~e^-8 =
    3.4e-4 of the peak, below 2^-10, so that P in [0, 1] rounds it to 0 in e4m3, while the tail
    holds ~0.7 of the peak's mass over 2k keys. v is 1 + 0.1 * randn: mass lost from P . V shows
    as an output too small by about the lost share (~0.4). q and k share a random unit direction u
    (q = 16 u, k = -5.66 u in the tail, so its scores are 16 * 5.66 / sqrt(128) = 8 nats below the
    peak's) plus noise of 0.05 per element; the peak key is noise only, its score near 0. (With the
    peak at +8.5 nats instead, its score's products q_d k_d all share a sign, and the fp8 MMA's
    narrow accumulation put the CUDA kernel's lse 2^-10.4 * scale * sum |q k| off, past
    chained_accumulator_bits' bound: H200, NOTES.md v35.)"""
    u = torch.nn.functional.normalize(torch.randn(headdim), dim=0)
    weights = torch.full((seqlen_k,), -5.66)
    weights[peak_key] = 0.0
    q = 16 * u + 0.05 * torch.randn(1, seqlen_q, nheads, headdim)
    k = weights[None, :, None, None] * u + 0.05 * torch.randn(1, seqlen_k, nheads, headdim)
    v = 1 + 0.1 * torch.randn(1, seqlen_k, nheads, headdim)
    quantized = [quantize(x, nheads) for x in (q, k, v)]
    return [x8 for x8, _ in quantized], [d for _, d in quantized]


def chained_accumulator_bits(headdim):
    """The MMA allowance's bits for a score summed over the head dim in k-steps of 32, each step of the
    chain rounding the running sum to the accumulator's ~14 bits: the bound grows with the number of
    steps, 2^-14 * headdim / 32, plus fp8_checks' bit of margin (11 bits at hd 128, 10 at 256). Random
    q and k mostly cancel these roundings (2^-13 holds there); q and k that share a direction make
    every product of a score the same sign, and they add up. Not a worst-case bound: with a
    dominant score of 8.5 nats built that way (H200, hd 128) the lse was off by 2^-11.4 * scale *
    sum |q k| on the Triton backend and 2^-10.4 on the CUDA kernel (NOTES.md v35)."""
    return FP8_MMA_ACCUMULATOR_BITS - int(math.log2(max(headdim, 32) // 32))


def assert_long_tail_kept(out, lse, q8, k8, v8, descales):
    """out of long_tail_inputs within 2^-3 * max|v| of the reference everywhere: each probability
    rounds to e4m3 with a relative error of at most 2^-4 while it is a normal number, and the row
    sums use P unrounded, so out - ref = sum_i delta_i p_i v_i / sum_i p_i is at most 2^-4 * max|v|
    (the factor 2 covers the fp8 MMA's accumulation and the bfloat16 output). The rule's own pt,
    plain fp8 attention with P in [0, 1], breaks this bound (it loses the tail): checked, so the test
    can fail. lse by the ordinary fp8 rule with the chained MMA allowance (q and k share a direction
    here)."""
    scale = q8.shape[-1] ** -0.5
    (ref_out, ref_lse), (pt_out, pt_lse), allowance = references(
        q8, k8, v8, descales, scale, False, accumulator_bits=chained_accumulator_bits(q8.shape[-1]))
    bound = 2.0 ** -3 * dequantize(v8, descales[2]).abs().max().item()
    pt_err = (pt_out.double() - ref_out).abs().max().item()
    assert pt_err > bound, f"the inputs lost their tail: plain fp8 is off by only {pt_err:.4g} <= {bound:.4g}"
    err = (out.double() - ref_out).abs().max().item()
    assert err <= bound, (f"fp8 out lost the long tail: max |out - ref| = {err:.4g} > 2^-3 * max|v| = {bound:.4g} "
                          f"(plain fp8 attention: {pt_err:.4g})")
    assert_lse_close(lse, ref_lse, pt_lse, allowance)
