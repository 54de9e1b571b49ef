// Turns a warp's raw score accumulators (q.k) into softmax logits in place: the score modifiers
// (score_mod.cuh), then -inf where the mask hides the pair, which the exponentials turn into
// probability 0. Blocks that the mask does not cut and that have no modifier skip it entirely.
#pragma once

#include <cmath>

#include "arch/arch.cuh"
#include "mask.cuh"
#include "score_mod.cuh"

namespace flash {

// scores: a (kAtomM*MT x kAtomN*NT) tile whose first row is row0 and first column col0 (absolute
// indices within the sequence). The forward holds S (rows are queries); the backward holds S^T
// (rows are keys): kRowsAreKeys.
template <bool kRowsAreKeys, int MT, int NT>
__device__ __forceinline__ void scores_to_logits(float (&scores)[MT][NT][arch::kAccRegs], const AttentionMask& mask,
                                                 const ScoreMod& mod, bool needs_mask, int row0, int col0, int lane) {
  if (!needs_mask && !mod.active()) return;
  // Each fragment row's visible columns, counted from its register's column in atom 0, computed
  // once before the score loop (inside it, ptxas rebuilt them per score, branches and all), so
  // that each score compares a constant.
  IndexRange visible[MT][arch::kAccRegs];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int r = 0; r < arch::kAccRegs; ++r) {
      const int row = row0 + mt * arch::kAtomM + arch::acc_row(lane, r);
      visible[mt][r] = (kRowsAreKeys ? mask.queries_seeing(row) : mask.keys_seen_by(row))
                           .shifted(-(col0 + arch::acc_col(lane, r)));
    }
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int r = 0; r < arch::kAccRegs; ++r) {
        const int row = row0 + mt * arch::kAtomM + arch::acc_row(lane, r);
        const int col = col0 + nt * arch::kAtomN + arch::acc_col(lane, r);
        const int query = kRowsAreKeys ? col : row, key = kRowsAreKeys ? row : col;
        float& x = scores[mt][nt][r];
        if (mod.active()) x = mod.logit(x, query, key);
        if (needs_mask && !visible[mt][r].contains(nt * arch::kAtomN)) x = -INFINITY;
      }
}

}  // namespace flash

namespace flash {

// The same for the split-KV kernel's one atom of packed query rows (splitkv_schedule.cuh), whose
// rows can be different tokens of different heads: queries[h] and mods[h] belong to row slot h
// (arch::acc_row_slot). col0 is the first key of the tile.
template <int NT>
__device__ __forceinline__ void packed_scores_to_logits(float (&scores)[1][NT][4], const AttentionMask& mask,
                                                        const ScoreMod (&mods)[arch::kAccRows],
                                                        const int (&queries)[arch::kAccRows],
                                                        bool needs_mask, int col0, int lane) {
  if (!needs_mask && !mods[0].active()) return;
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int h = arch::acc_row_slot(r);
    const IndexRange visible = mask.keys_seen_by(queries[h]).shifted(-(col0 + arch::acc_col(lane, r)));
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int key = col0 + nt * arch::kAtomN + arch::acc_col(lane, r);
      float& x = scores[0][nt][r];
      if (mods[h].active()) x = mods[h].logit(x, queries[h], key);
      if (needs_mask && !visible.contains(nt * arch::kAtomN)) x = -INFINITY;
    }
  }
}

}  // namespace flash
