// Turns a warp's raw score accumulators (q.k) into softmax logits in place: the score modifiers
// (score_mod.cuh), then -inf where the mask hides the pair, which the exponentials turn into
// probability 0. Blocks that the mask does not cut and that have no modifier skip it entirely.
#pragma once

#include <cmath>

#include "arch/arch.cuh"
#include "mask.cuh"
#include "score_mod.cuh"

namespace flash {

// scores: a (16*MT x 8*NT) tile whose first row is row0 and first column col0 (absolute indices
// within the sequence). The forward holds S (rows are queries); the backward holds S^T (rows are
// keys): kRowsAreKeys.
template <bool kRowsAreKeys, int MT, int NT>
__device__ __forceinline__ void scores_to_logits(float (&scores)[MT][NT][4], const AttentionMask& mask,
                                                 const ScoreMod& mod, bool needs_mask, int row0, int col0, int lane) {
  if (!needs_mask && !mod.active()) return;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int row = row0 + mt * arch::kAtomM + arch::acc_row(lane, r);
        const int col = col0 + nt * arch::kAtomN + arch::acc_col(lane, r);
        const int query = kRowsAreKeys ? col : row, key = kRowsAreKeys ? row : col;
        float& x = scores[mt][nt][r];
        if (mod.active()) x = mod.logit(x, query, key);
        if (needs_mask && !mask.visible(query, key)) x = -INFINITY;
      }
}

}  // namespace flash
