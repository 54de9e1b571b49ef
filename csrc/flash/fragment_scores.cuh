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
// Each step is its own loop over the fragment behind a test of its flag, uniform over the CTA:
// with the tests inside one loop ptxas branched on them per score (18 instructions a score with
// softcap; ncu: the softcap forward ran 3.6x the plain one's instructions, 4.0x its time).
template <bool kRowsAreKeys, int MT, int NT>
__device__ __forceinline__ void scores_to_logits(float (&scores)[MT][NT][arch::kAccRegs], const AttentionMask& mask,
                                                 const ScoreMod& mod, bool needs_mask, int row0, int col0, int lane) {
  if (mod.has_softcap()) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int r = 0; r < arch::kAccRegs; ++r) scores[mt][nt][r] = mod.capped(scores[mt][nt][r]);
  }
  if (mod.has_alibi) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int r = 0; r < arch::kAccRegs; ++r) {
          const int row = row0 + mt * arch::kAtomM + arch::acc_row(lane, r);
          const int col = col0 + nt * arch::kAtomN + arch::acc_col(lane, r);
          scores[mt][nt][r] += kRowsAreKeys ? mod.bias(col, row) : mod.bias(row, col);
        }
  }
  if (!needs_mask) return;
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
      for (int r = 0; r < arch::kAccRegs; ++r)
        if (!visible[mt][r].contains(nt * arch::kAtomN)) scores[mt][nt][r] = -INFINITY;
}

}  // namespace flash

namespace flash {

// The same for the split-KV kernel's one atom of packed query rows (splitkv_schedule.cuh), whose
// rows can be different tokens of different heads: queries[h] and mods[h] belong to row slot h
// (arch::acc_row_slot). col0 is the first key of the tile. The modifier flags are the call's, the
// same in every slot, so each step is again its own loop behind one test of mods[0].
template <int NT>
__device__ __forceinline__ void packed_scores_to_logits(float (&scores)[1][NT][arch::kAccRegs],
                                                        const AttentionMask& mask,
                                                        const ScoreMod (&mods)[arch::kAccRows],
                                                        const int (&queries)[arch::kAccRows],
                                                        bool needs_mask, int col0, int lane) {
  if (mods[0].has_softcap()) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int r = 0; r < arch::kAccRegs; ++r)
        scores[0][nt][r] = mods[arch::acc_row_slot(r)].capped(scores[0][nt][r]);
  }
  if (mods[0].has_alibi) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int r = 0; r < arch::kAccRegs; ++r) {
        const int h = arch::acc_row_slot(r);
        scores[0][nt][r] += mods[h].bias(queries[h], col0 + nt * arch::kAtomN + arch::acc_col(lane, r));
      }
  }
  if (!needs_mask) return;
  IndexRange visible[arch::kAccRegs];  // as in scores_to_logits: each register's visible keys, from atom 0
#pragma unroll
  for (int r = 0; r < arch::kAccRegs; ++r)
    visible[r] = mask.keys_seen_by(queries[arch::acc_row_slot(r)]).shifted(-(col0 + arch::acc_col(lane, r)));
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int r = 0; r < arch::kAccRegs; ++r)
      if (!visible[r].contains(nt * arch::kAtomN)) scores[0][nt][r] = -INFINITY;
}

}  // namespace flash
