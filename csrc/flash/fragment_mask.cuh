// Applies the attention mask to a warp's score accumulators: a masked entry becomes -inf, which
// the exponentials turn into probability 0. Only blocks that the mask cuts (causal diagonal,
// sequence ends) call this; the others skip it entirely.
#pragma once

#include <cmath>

#include "arch/arch.cuh"
#include "mask.cuh"

namespace flash {

// scores: a (16*MT x 8*NT) tile whose first row is row0 and first column col0 (absolute indices).
// The forward holds S (rows are queries); the backward holds S^T (rows are keys): kRowsAreKeys.
template <bool kRowsAreKeys, int MT, int NT>
__device__ __forceinline__ void mask_score_fragment(float (&scores)[MT][NT][4], const AttentionMask& mask, int row0,
                                                    int col0, int lane) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int row = row0 + mt * arch::kAtomM + arch::acc_row(lane, r);
        const int col = col0 + nt * arch::kAtomN + arch::acc_col(lane, r);
        const bool visible = kRowsAreKeys ? mask.visible(col, row) : mask.visible(row, col);
        if (!visible) scores[mt][nt][r] = -INFINITY;
      }
}

}  // namespace flash
