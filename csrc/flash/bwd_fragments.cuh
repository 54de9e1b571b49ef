// Element-wise backward work on fp32 accumulator fragments in the mma.sync C layout (a warp's
// 16*MT x 8*NT tile), shared by the sm80 and sm90 backward kernels.
#pragma once

#include "arch/arch.cuh"
#include "common.cuh"
#include "dq_accum.cuh"
#include "params.h"

namespace flash {

// In place: S^T -> P^T = exp(scale * S^T - lse). Rows are keys, columns queries; lse is indexed by
// the tile's local query column (col0 + ...), where col0 is the fragment's first column.
template <int MT, int NT>
__device__ __forceinline__ void probs_from_scores(float (&scores_t)[MT][NT][4], const float* lse, int col0,
                                                  const FwdParams& fwd, int lane) {
  constexpr float kLog2e = 1.4426950408889634f;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const float lse_log2 = lse[col0 + nt * arch::kAtomN + arch::acc_col(lane, j)] * kLog2e;  // r = j and j + 2
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float& x = scores_t[mt][nt][2 * h + j];
          x = arch::exp2_approx(fmaf(x, fwd.scale_log2, -lse_log2));
        }
    }
}

// In place: dP^T -> dS^T = P^T * (dP^T - dsum) * scale, with dsum indexed like lse above.
template <int MT, int NT>
__device__ __forceinline__ void dscores_from_dprobs(float (&dprobs_t)[MT][NT][4], const float (&probs_t)[MT][NT][4],
                                                    const float* dsum, int col0, const FwdParams& fwd, int lane) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const float query_dsum = dsum[col0 + nt * arch::kAtomN + arch::acc_col(lane, j)];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = 2 * h + j;
          dprobs_t[mt][nt][r] = probs_t[mt][nt][r] * (dprobs_t[mt][nt][r] - query_dsum) * fwd.softmax_scale;
        }
    }
}

// Adds a warp's dQ fragment (rows row0.. of the query block at m0, head-dim columns col0..) into
// dq_accum with atomics. No bounds checks: dq_accum has whole query blocks and kHeadDim columns.
template <int kHeadDim, int MT, int NT>
__device__ __forceinline__ void add_dq_fragment(const float (&dq)[MT][NT][4], const BwdParams& p, int batch, int head,
                                                int m0, int row0, int col0, int lane) {
  using Layout = DqAccum<kHeadDim>;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = m0 + row0 + mt * arch::kAtomM + arch::acc_row(lane, 2 * h);
      float* dq_row = p.dq_accum + Layout::row_offset(p.fwd.shape, batch, head, row);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int col = col0 + nt * arch::kAtomN + arch::acc_col(lane, 0);
        arch::atomic_add_pair(dq_row + Layout::col_offset(row, col), dq[mt][nt][2 * h], dq[mt][nt][2 * h + 1]);
      }
    }
}

}  // namespace flash
