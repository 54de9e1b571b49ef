// Score modifiers, applied to a raw score q.k of (query, key) before the mask and the softmax
// (FlashAttention 2's order): softcap, then ALiBi.
//
// The softmax works on logits x with probability exp(x * logit_scale - lse) (params.h):
//   plain:    x = q.k,                                   logit_scale = softmax_scale
//   softcap:  x = tanh(q.k * softmax_scale / softcap),   logit_scale = softcap
// so the capped score softcap * tanh(scaled / softcap) is x * logit_scale, and the scale stays
// folded into one FFMA per exponential. ALiBi adds -slope * |i + seqlen_k - seqlen_q - j| to the
// (capped) score, i.e. that bias / logit_scale to x.
// Backward: d(score)/d(q.k) is softmax_scale, times 1 - t^2 with softcap (t = tanh(...)).
// Both modifiers are runtime flags uniform over a CTA: with both off, `logit` returns its input
// and the kernels' plain path is what it was (no extra registers live across the loop). A
// fragment's loops test them once, outside the loop over its scores (fragment_scores.cuh).
#pragma once

#include <cmath>

#include "arch/arch.cuh"
#include "features.h"
#include "params.h"

namespace flash {

constexpr float kTwoLog2e = 2.8853900817779268f;  // 2 * log2(e)

// tanh(v) from u = 2 log2(e) v: 1 - 2 / (2^u + 1), one exp2 and one reciprocal on the
// special-function unit and one FFMA; absolute error about 1e-7 (tanh.approx.f32 has a relative
// error near 2^-11, enough to fail the fp16 tolerance rule).
__device__ __forceinline__ float tanh_of_exp2_argument(float u) {
  return fmaf(-2.f, arch::reciprocal_approx(arch::exp2_approx(u) + 1.f), 1.f);
}

struct ScoreMod {
  float softcap_exp2_scale;  // 2 log2(e) softmax_scale / softcap: q.k to tanh's exp2 argument; 0: no softcap
  float alibi_slope;       // slope / logit_scale, in units of x
  bool has_alibi;
  int diagonal_offset;     // seqlen_k - seqlen_q of this sequence
  float inv_logit_scale_log2;  // 1 / (logit_scale * log2(e))

  __device__ __forceinline__ static ScoreMod of(const FwdParams& p, int batch, int head, int diagonal_offset) {
    ScoreMod m;
    const ScoreModArgs& a = p.score_mod;
    m.softcap_exp2_scale = kSoftcapCompiled && a.softcap > 0.f ? kTwoLog2e * p.softmax_scale / a.softcap : 0.f;
    m.has_alibi = kAlibiCompiled && a.alibi_slopes != nullptr;
    m.alibi_slope = m.has_alibi ? a.alibi_slopes[batch * a.alibi_batch_stride + head] / p.logit_scale : 0.f;
    m.diagonal_offset = diagonal_offset;
    m.inv_logit_scale_log2 = 1.f / p.logit_scale_log2;
    return m;
  }

  // No modifier: what the kernels' plain variants use, known at compile time.
  __device__ __forceinline__ static ScoreMod none() { return ScoreMod{0.f, 0.f, false, 0, 0.f}; }

  __device__ __forceinline__ bool has_softcap() const { return softcap_exp2_scale != 0.f; }
  __device__ __forceinline__ bool active() const { return has_softcap() || has_alibi; }

  // The capped score before the bias: t = tanh(s * softmax_scale / softcap), or s.
  __device__ __forceinline__ float capped(float score) const {
    return has_softcap() ? tanh_of_exp2_argument(score * softcap_exp2_scale) : score;
  }

  // ALiBi's bias of (query, key) in units of x.
  __device__ __forceinline__ float bias(int query, int key) const {
    return has_alibi ? -alibi_slope * static_cast<float>(abs(query + diagonal_offset - key)) : 0.f;
  }

  // x of a raw score q.k.
  __device__ __forceinline__ float logit(float score, int query, int key) const {
    return capped(score) + bias(query, key);
  }

  // d(capped score)/d(scaled score) recovered from the probability: with softcap, 1 - t^2 where
  // t = x - bias and x = (ln p + lse) / logit_scale (the forward's probabilities are exp(x *
  // logit_scale - lse)). Recovering t from p costs one lg2 per element only when softcap is on,
  // instead of keeping t in registers next to P from the exponentials until dP is ready (the
  // Hopper backward has no registers to spare there). p = 0 gives dS = 0 whatever this returns.
  __device__ __forceinline__ float capped_derivative(float prob, float lse_log2, int query, int key) const {
    if (!has_softcap() || prob <= 0.f) return 1.f;
    const float t = (arch::log2_approx(prob) + lse_log2) * inv_logit_scale_log2 - bias(query, key);
    return 1.f - t * t;
  }
};

}  // namespace flash
