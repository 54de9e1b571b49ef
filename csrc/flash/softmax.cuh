// Online softmax over the rows a thread owns in its score fragments.
//
// Per row we keep the running max m of the logits x (q.k, or its capped and biased form:
// score_mod.cuh) and the running sum l of exp(scale * (x - m)), computed as
// exp2(x * scale_log2 - m * scale_log2): the scale is folded into one FFMA per score.
// A thread owns, for each of its MT row atoms, arch::kAccRows rows (the arch layer says which
// accumulator values belong to which row); the lanes sharing a row reduce the max with shuffles.
// The sum stays per-thread until `finalize` (rescaling is linear, so partial sums can wait).
// kProbScaleLog2 > 0: the probabilities (and so the sums and the running P.V) are 2^kProbScaleLog2
// times exp(scale * (x - m)), a row's largest exactly 2^kProbScaleLog2; finalize takes the factor
// back out of the lse (O / sum cancels it). For e4m3 P (FlashAttention 3 uses 2^8 there too): with
// the largest probability at 1, e4m3's smallest subnormal 2^-9 is only 6.2 nats below the max, and
// a row's long tail of smaller probabilities rounded to 0 in P.V while the row sum kept it; at 2^8
// the tail keeps e4m3's 3-bit precision down to 2^-14 of the max (normal numbers) and rounds to 0
// only below 2^-18 (12.5 nats).
#pragma once

#include <cmath>

#include "arch/arch.cuh"

namespace flash {

template <int MT, int kProbScaleLog2 = 0>
struct OnlineSoftmax {
  float row_max[MT][arch::kAccRows];
  float row_sum[MT][arch::kAccRows];

  __device__ __forceinline__ void init() {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < arch::kAccRows; ++h) {
        row_max[mt][h] = -INFINITY;
        row_sum[mt][h] = 0.f;
      }
  }

  // scores (kAtomM*MT x kAtomN*NT logits, -inf where masked) become probabilities
  // exp(scale * (s - m_new)) in place; acc (kAtomM*MT x kAtomN*DT), the running P.V, is rescaled by
  // exp(scale * (m_old - m_new)).
  // A row with no visible key so far keeps m = -inf, and every exponent is then exp2(-inf) = 0.
  template <int NT, int DT>
  __device__ __forceinline__ void update(float (&scores)[MT][NT][arch::kAccRegs], float (&acc)[MT][DT][arch::kAccRegs], float scale_log2) {
    float rescale[MT][arch::kAccRows];
    update_probs(scores, scale_log2, rescale);
    rescale_output(acc, rescale);
  }

  // The first half of update: the probabilities, and per row the factor by which the running P.V
  // must still be rescaled. Split so that a kernel whose P.V is still in flight on the tensor core
  // can compute these first and rescale once the MMA is done.
  // kSumRows false: the caller sums the probabilities elsewhere (the Hopper forward's P.V over a
  // column of ones) and row_sum stays unused.
  // kMaxLagLog2 > 0: a row keeps its earlier max (and O its scale) until a block's max passes it by
  // more than kMaxLagLog2 in the exponent's base-2 units, so probabilities reach 2^kMaxLagLog2 rather
  // than 1 (FlashAttention 4's lazy rescaling, for 16-bit P). O's rescale then runs about once a
  // row, at its first block, instead of on every step where any of a warp's 16 rows raised its max
  // (with random scores most steps up to a few thousand keys: benchmarks/NOTES.md v24, v33).
  template <bool kSumRows = true, int kMaxLagLog2 = 0, int NT>
  __device__ __forceinline__ void update_probs(float (&scores)[MT][NT][arch::kAccRegs], float scale_log2,
                                               float (&rescale)[MT][arch::kAccRows]) {
    static_assert(kMaxLagLog2 == 0 || kProbScaleLog2 == 0, "a lagging max and a scaled P compound their ranges");
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < arch::kAccRows; ++h) {
        float block_max = row_max[mt][h];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          float atom_max = scores[mt][nt][arch::acc_value(h, 0)];
#pragma unroll
          for (int j = 1; j < arch::kAccValuesPerRow; ++j)
            atom_max = fmaxf(atom_max, scores[mt][nt][arch::acc_value(h, j)]);
          block_max = fmaxf(block_max, atom_max);
        }
        block_max = arch::row_max(block_max);
        if constexpr (kMaxLagLog2 > 0) {
          const bool keeps = row_max[mt][h] != -INFINITY &&
                             (block_max - row_max[mt][h]) * scale_log2 <= static_cast<float>(kMaxLagLog2);
          if (keeps) block_max = row_max[mt][h];
        }
        const float max_scaled = block_max == -INFINITY ? 0.f : block_max * scale_log2;
        const float exponent_offset = max_scaled - static_cast<float>(kProbScaleLog2);  // of every probability
        // Exactly 1 where the max did not rise, so that rescale_output_where_needed can skip O: as
        // one expression, m_old * scale - max_scaled is contracted into an FMA whose result is the
        // rounding residue of max_scaled, not 0, and almost every factor differed from 1 (ncu: O's
        // rescale was 28% of the hd 256 forward's instructions; benchmarks/NOTES.md v23).
        rescale[mt][h] = row_max[mt][h] == -INFINITY ? 0.f
                         : row_max[mt][h] == block_max ? 1.f
                                                       : arch::exp2_approx(row_max[mt][h] * scale_log2 - max_scaled);
        row_max[mt][h] = block_max;
        float sum = row_sum[mt][h] * rescale[mt][h];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int j = 0; j < arch::kAccValuesPerRow; ++j) {
            float& x = scores[mt][nt][arch::acc_value(h, j)];
            const float p = arch::exp2_approx(fmaf(x, scale_log2, -exponent_offset));
            x = p;
            if constexpr (kSumRows) sum += p;
          }
        if constexpr (kSumRows) row_sum[mt][h] = sum;
      }
  }

  // rescale_output, skipped when no row of the warp has a factor other than 1 (no row's max rose:
  // late in a long walk most steps; an O row whose max was -inf is still 0).
  template <int DT>
  __device__ __forceinline__ static void rescale_output_where_needed(float (&acc)[MT][DT][arch::kAccRegs],
                                                                     const float (&rescale)[MT][arch::kAccRows]) {
    bool needed = false;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < arch::kAccRows; ++h) needed |= rescale[mt][h] != 1.f;
    if (arch::warp_any(needed)) rescale_output(acc, rescale);
  }

  template <int DT>
  __device__ __forceinline__ static void rescale_output(float (&acc)[MT][DT][arch::kAccRegs],
                                                        const float (&rescale)[MT][arch::kAccRows]) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int dt = 0; dt < DT; ++dt)
#pragma unroll
        for (int r = 0; r < arch::kAccRegs; ++r) acc[mt][dt][r] *= rescale[mt][arch::acc_row_slot(r)];
  }

  // Divides acc by the row sums, times output_scale (dropout's 1 / keep_prob), and returns each
  // row's log-sum-exp (natural log) in lse; a row that saw no key gets acc = 0 and lse = +inf.
  template <int DT>
  __device__ __forceinline__ void finalize(float (&acc)[MT][DT][arch::kAccRegs], float scale, float output_scale,
                                           float (&lse)[MT][arch::kAccRows]) {
    float sums[MT][arch::kAccRows];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < arch::kAccRows; ++h) sums[mt][h] = arch::row_sum(row_sum[mt][h]);
    finalize_with_sums(acc, sums, scale, output_scale, lse);
  }

  // finalize with each row's whole sum given (the same in every lane that holds the row).
  template <int DT>
  __device__ __forceinline__ void finalize_with_sums(float (&acc)[MT][DT][arch::kAccRegs],
                                                     const float (&sums)[MT][arch::kAccRows], float scale,
                                                     float output_scale, float (&lse)[MT][arch::kAccRows]) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < arch::kAccRows; ++h) {
        const float sum = sums[mt][h];
        const bool empty = sum == 0.f;
        const float inv_sum = empty ? 0.f : output_scale / sum;
        constexpr float kLogProbScale = kProbScaleLog2 * 0.69314718f;  // ln 2^kProbScaleLog2
        lse[mt][h] = empty ? INFINITY : row_max[mt][h] * scale + (logf(sum) - kLogProbScale);
#pragma unroll
        for (int dt = 0; dt < DT; ++dt)
#pragma unroll
          for (int j = 0; j < arch::kAccValuesPerRow; ++j) acc[mt][dt][arch::acc_value(h, j)] *= inv_sum;
      }
  }
};

}  // namespace flash
