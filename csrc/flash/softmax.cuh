// Online softmax over the rows a thread owns in its score fragments.
//
// Per row we keep the running max m of the logits x (q.k, or its capped and biased form:
// score_mod.cuh) and the running sum l of exp(scale * (x - m)), computed as
// exp2(x * scale_log2 - m * scale_log2): the scale is folded into one FFMA per score.
// A thread owns, for each of its MT row atoms, two rows (its accumulator
// rows r = 0,1 and r = 2,3); the 4 lanes of a quad share a row and reduce the max with shuffles.
// The sum stays per-thread until `finalize` (rescaling is linear, so partial sums can wait).
#pragma once

#include <cmath>

#include "arch/arch.cuh"

namespace flash {

template <int MT>
struct OnlineSoftmax {
  float row_max[MT][2];
  float row_sum[MT][2];

  __device__ __forceinline__ void init() {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        row_max[mt][h] = -INFINITY;
        row_sum[mt][h] = 0.f;
      }
  }

  // scores (16*MT x 8*NT logits, -inf where masked) become probabilities exp(scale * (s - m_new))
  // in place; acc (16*MT x 8*DT), the running P.V, is rescaled by exp(scale * (m_old - m_new)).
  // A row with no visible key so far keeps m = -inf, and every exponent is then exp2(-inf) = 0.
  template <int NT, int DT>
  __device__ __forceinline__ void update(float (&scores)[MT][NT][4], float (&acc)[MT][DT][4], float scale_log2) {
    float rescale[MT][2];
    update_probs(scores, scale_log2, rescale);
    rescale_output(acc, rescale);
  }

  // The first half of update: the probabilities, and per row the factor by which the running P.V
  // must still be rescaled. Split so that a kernel whose P.V is still in flight on the tensor core
  // can compute these first and rescale once the MMA is done.
  template <int NT>
  __device__ __forceinline__ void update_probs(float (&scores)[MT][NT][4], float scale_log2, float (&rescale)[MT][2]) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float block_max = row_max[mt][h];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
          block_max = fmaxf(block_max, fmaxf(scores[mt][nt][2 * h], scores[mt][nt][2 * h + 1]));
        block_max = arch::quad_max(block_max);
        const float max_scaled = block_max == -INFINITY ? 0.f : block_max * scale_log2;
        rescale[mt][h] =
            row_max[mt][h] == -INFINITY ? 0.f : arch::exp2_approx(row_max[mt][h] * scale_log2 - max_scaled);
        row_max[mt][h] = block_max;
        float sum = row_sum[mt][h] * rescale[mt][h];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            const float p = arch::exp2_approx(fmaf(scores[mt][nt][2 * h + j], scale_log2, -max_scaled));
            scores[mt][nt][2 * h + j] = p;
            sum += p;
          }
        row_sum[mt][h] = sum;
      }
  }

  template <int DT>
  __device__ __forceinline__ static void rescale_output(float (&acc)[MT][DT][4], const float (&rescale)[MT][2]) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int dt = 0; dt < DT; ++dt)
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[mt][dt][r] *= rescale[mt][r / 2];
  }

  // Divides acc by the row sums, times output_scale (dropout's 1 / keep_prob), and returns each
  // row's log-sum-exp (natural log) in lse; a row that saw no key gets acc = 0 and lse = +inf.
  template <int DT>
  __device__ __forceinline__ void finalize(float (&acc)[MT][DT][4], float scale, float output_scale,
                                           float (&lse)[MT][2]) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float sum = arch::quad_sum(row_sum[mt][h]);
        const bool empty = sum == 0.f;
        const float inv_sum = empty ? 0.f : output_scale / sum;
        lse[mt][h] = empty ? INFINITY : row_max[mt][h] * scale + logf(sum);
#pragma unroll
        for (int dt = 0; dt < DT; ++dt) {
          acc[mt][dt][2 * h] *= inv_sum;
          acc[mt][dt][2 * h + 1] *= inv_sum;
        }
      }
  }
};

}  // namespace flash
