// The math of one query block in the Hopper backward at head dims whose dK and dV do not fit one
// warpgroup's registers (issue #13: hd 256, where 64 keys x 256 columns of dK and dV are 256 fp32
// per thread). A CTA owns 64 keys; its two math warpgroups split the work by head dim where the
// head dim is the output (dK, dV, dQ) and by query where it is the contraction (S^T, dP^T):
//   1. S^T, dP^T of all 64 keys x this warpgroup's 32 queries   (A = K / V, B = Q / dO, all shared)
//      P^T = exp(logits^T - lse) and dS^T in registers, as bwd_sm90_step.cuh computes them, then
//      written as 16-bit tiles into shared memory: the next products need both warpgroups' halves
//   2. dV[:, half] += P^T.dO[:, half], dK[:, half] += dS^T.Q[:, half]   (64 keys x hd / 2 each)
//   3. dQ[:, half] = dS.K[:, half]                                      (64 queries x hd / 2)
// so each thread holds its warpgroup's columns of dK and dV for its warp's 16 keys (128 registers
// at hd 256) beside those of dQ (64). The head-dim halves are whole 64-column blocks of the
// swizzled tiles (an MN-major operand may not cross a block boundary from inside a block): 128 +
// 128 at hd 256, 128 + 64 at hd 192, where the tensor core, which both warpgroups feed, does the
// same total work and the second warpgroup waits at the step's barriers. Every product reads both operands from shared memory. The step's dQ tile (64 x
// hd float32, exactly the bytes of its Q and dO tiles) is written over the stage's Q and dO once
// both warpgroups' MMAs are done with them, so the 227 KB hold two stages: K, V (64 KB), P^T and
// dS^T (16 KB), two stages of Q, dO, lse, dsum (130 KB). The dQ writer adds it into dq_accum from
// there and frees the stage for the next load (bwd_kernel_sm90_head_split.cuh).
#pragma once

#include "arch/sm90_swizzled_tile.cuh"
#include "arch/sm90_wgmma.cuh"
#include "bwd_fragments.cuh"
#include "bwd_sm90_step.cuh"
#include "common.cuh"
#include "dropout.cuh"
#include "fragment_scores.cuh"
#include "mask.cuh"
#include "params.h"
#include "score_mod.cuh"

namespace flash {

template <int kHeadDim_, int kStages_>
struct BwdHeadSplitConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = 64;  // queries per step: the M of dQ's wgmma
  static constexpr int kBlockN = 64;  // keys per CTA: the M of every key-side wgmma
  static constexpr int kWarpgroups = 2;
  static constexpr int kGroupQueries = kBlockM / kWarpgroups;  // S^T / dP^T columns per warpgroup
  // dK / dV / dQ columns of each warpgroup: the first takes the first half rounded up to whole
  // 64-column blocks, the second the rest.
  static constexpr int kFirstGroupCols = (kHeadDim / 2 + 63) / 64 * 64;
  template <int kGroup>
  static constexpr int kGroupCols = kGroup == 0 ? kFirstGroupCols : kHeadDim - kFirstGroupCols;
  static_assert(kGroupQueries % 16 == 0 && kGroupCols<1> > 0, "whole dropout tiles, work for both warpgroups");
  static constexpr int kMathThreads = kWarpgroups * arch::kWarpgroupThreads;
  static constexpr int kThreads = kMathThreads + arch::kWarpgroupThreads;  // + the producer warpgroup
  // FlashAttention 3's split of the register file for two math warpgroups.
  static constexpr int kProducerRegs = 24;
  static constexpr int kMathRegs = 240;
  static_assert(kProducerRegs * arch::kWarpgroupThreads + kMathRegs * kMathThreads <= 65536, "register file");
  static constexpr int kStages = kStages_;
  static_assert(kStages >= 2, "one query block loads while another is computed");
  static_assert(kHeadDim % 64 == 0, "TMA boxes of 64 columns");
  using KVTile = arch::SwizzledTile<kBlockN, kHeadDim>;    // K, V: rows keys
  using QTile = arch::SwizzledTile<kBlockM, kHeadDim>;     // Q, dO: rows queries
  using ScoreTile = arch::CoreTile<kBlockN, kBlockM>;      // P^T, dS^T: rows keys, columns queries
  static constexpr int kDqTileBytes = kBlockM * kHeadDim * 4;  // float32, the dq_accum tile layout
  static_assert(kDqTileBytes == 2 * QTile::kBytes, "the dQ tile takes exactly its step's Q and dO bytes");
  // Q, dO, lse, dsum; padded so that every stage starts 1024-byte aligned (the swizzle).
  static constexpr int kStageBytes =
      (2 * QTile::kBytes + 2 * kBlockM * 4 + arch::kSwizzleAtomBytes - 1) / arch::kSwizzleAtomBytes *
      arch::kSwizzleAtomBytes;
  // K, V, P^T, dS^T, the stages (all 1024-byte aligned), then the mbarriers.
  static constexpr int kProbsOffset = 2 * KVTile::kBytes;
  static constexpr int kDsOffset = kProbsOffset + ScoreTile::kBytes;
  static constexpr int kStageOffset = kDsOffset + ScoreTile::kBytes;
  static_assert(kStageOffset % arch::kSwizzleAtomBytes == 0, "the stages start 1024-byte aligned");
  static constexpr int kBarrierOffset = kStageOffset + kStages * kStageBytes;
  static constexpr int kBarriers = 1 + 2 * kStages;  // K/V full; per stage full, empty
  static constexpr int kSmemBytes = kBarrierOffset + kBarriers * 8;
  static_assert(kSmemBytes <= arch::kMaxSmemBytesPerBlock, "Hopper's shared memory per block");
  // The epilogue stages dK and dV row-major (padded) in the space of K, V, P^T and dS^T.
  static constexpr int kEpilogueStride = padded_stride<kHeadDim>();
  static_assert(2 * kBlockN * kEpilogueStride * 2 <= kStageOffset, "epilogue fits");
};

// Named barriers of the two math warpgroups (0 is __syncthreads'), and one per stage between them
// and the dQ-writer warp.
struct BwdHeadSplitBarriers {
  static constexpr int kProbsWritten = 1;  // both halves of P^T are in shared memory
  static constexpr int kDsWritten = 2;     // both halves of dS^T are
  static constexpr int kMmasDone = 3;      // every MMA of the step retired: Q, dO, P^T, dS^T free
  static constexpr int kDqFull = 4;        // + stage slot: the step's dQ tile is in the stage
};

// Where a math warp sits: its warpgroup's query half and head-dim part, its 16 keys.
struct BwdHeadSplitLanes {
  int warpgroup;    // 0, 1
  int warp_in_group;
  int lane;
  int key0;         // this warp's first key (accumulator row) in the block
  int query0;       // this warpgroup's first query (S^T column) in the query block
  int col0;         // this warpgroup's first head-dim column of dK, dV and dQ
};

template <typename Cfg>
__device__ __forceinline__ BwdHeadSplitLanes bwd_head_split_lanes(int math_tid) {
  BwdHeadSplitLanes l;
  l.warpgroup = arch::warp_uniform(math_tid / arch::kWarpgroupThreads);
  l.warp_in_group = arch::warp_uniform((math_tid / arch::kWarpSize) % 4);
  l.lane = math_tid % arch::kWarpSize;
  l.key0 = l.warp_in_group * 16;
  l.query0 = l.warpgroup * Cfg::kGroupQueries;
  l.col0 = l.warpgroup * Cfg::kFirstGroupCols;
  return l;
}

// This warp's dK and dV accumulators across the walk: 16 keys x its warpgroup's kCols columns.
template <int kCols>
struct BwdHeadSplitGradients {
  float dk[1][kCols / 8][4];
  float dv[1][kCols / 8][4];
};

// acc (64 keys or queries x kCols = 8 kNT) = / += A (a_view(ks): a ScoreTile view per k-step) . B (BTile's
// columns col0.. read MN-major), over the block's 64 queries or keys, as one wgmma group.
template <typename T, bool kTransA, typename BTile, int kNT, typename AView>
__device__ __forceinline__ void issue_half_product(float (&acc)[1][kNT][4], const AView& a_view, const char* b_tile,
                                                   int col0, bool accumulate) {
  constexpr int kCols = 8 * kNT;
  arch::wgmma_fence_operand(acc[0]);
  arch::wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < 64 / 16; ++ks)
    arch::Wgmma<T, kCols>::template ss<kTransA, true>(acc[0], a_view(ks), BTile::mn_major(b_tile, col0, ks),
                                                      accumulate || ks > 0);
  arch::wgmma_commit();
}

// One query block (m0) for one math warp of a warpgroup with kCols head-dim columns, up to its dQ
// part in registers; every MMA of the step has retired in both warpgroups when it returns (the
// caller may then write dQ over the stage's Q, dO).
template <typename T, typename Cfg, bool kScoreExtras, int kCols, typename KeyBlock>
__device__ __forceinline__ void head_split_step(BwdHeadSplitGradients<kCols>& grads, float (&dq)[1][kCols / 8][4],
                                                const BwdParams& p, const KeyBlock& kb, const ScoreMod& mod,
                                                const Dropout& dropout, const char* sK, const char* sV, char* sP,
                                                char* sdS, const QueryStageSm90<Cfg>& stage, int m0,
                                                const BwdHeadSplitLanes& at) {
  constexpr int kNT = Cfg::kGroupQueries / 8, kMath = Cfg::kMathThreads;
  using Scores = arch::Wgmma<T, Cfg::kGroupQueries>;
  using ScoreTile = typename Cfg::ScoreTile;
  const int n0 = kb.n0, lane = at.lane, key = n0 + at.key0, query = m0 + at.query0;
  // 1. S^T then dP^T: all keys x this warpgroup's queries.
  float scores_t[1][kNT][4], dprobs_t[1][kNT][4];
  arch::wgmma_fence_operand(scores_t[0]);
  arch::wgmma_fence_operand(dprobs_t[0]);
  arch::wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < Cfg::kHeadDim / 16; ++ks)
    Scores::template ss<false, false>(scores_t[0], Cfg::KVTile::k_major(sK, 0, ks),
                                      Cfg::QTile::k_major(stage.q, at.query0, ks), ks > 0);
  arch::wgmma_commit();
#pragma unroll
  for (int ks = 0; ks < Cfg::kHeadDim / 16; ++ks)
    Scores::template ss<false, false>(dprobs_t[0], Cfg::KVTile::k_major(sV, 0, ks),
                                      Cfg::QTile::k_major(stage.dout, at.query0, ks), ks > 0);
  arch::wgmma_commit();
  // Dropout's random bytes do not depend on S^T: drawn while the MMAs run.
  BwdDropTests<1, kNT> drop_tests;
  if (kScoreExtras && dropout.enabled) drop_tests = drop_tests_bwd<1, kNT>(dropout, key, query, lane);
  arch::wgmma_wait<1>();  // S^T is done; dP^T may still run
  arch::wgmma_fence_operand(scores_t[0]);
  const AttentionMask& mask = kb.mask;
  scores_to_logits</*kRowsAreKeys=*/true>(scores_t, mask, mod, !mask.block_fully_visible(m0, Cfg::kBlockM, n0, Cfg::kBlockN),
                                          key, query, lane);
  probs_from_logits(scores_t, stage.lse, at.query0, p.fwd, lane);
  uint32_t probs_a[1][kNT / 2][4];  // P^T * Z (1 / keep_prob: at the end)
  arch::accumulators_to_a_fragments<T>(probs_a, scores_t);
  if (kScoreExtras && dropout.enabled) drop_packed_probs(probs_a, drop_tests);
  arch::store_a_fragments<ScoreTile>(sP, at.key0, at.query0, probs_a, lane);
  arch::fence_proxy_async();
  arch::named_barrier_sync(BwdHeadSplitBarriers::kProbsWritten, kMath);
  // 2. dV += P^T.dO, under the dS^T math.
  issue_half_product<T, false, typename Cfg::QTile>(
      grads.dv, [&](int ks) { return ScoreTile::k_major(sP, 0, ks); }, stage.dout, at.col0, true);
  arch::wgmma_wait<1>();  // dP^T is done; dV may still run
  arch::wgmma_fence_operand(dprobs_t[0]);
  // The context's query is that of local column 0 (m0): the fragment's columns start at query0.
  const DscoreContext<1, kNT> ctx{mod, kScoreExtras && dropout.enabled ? &drop_tests : nullptr, dropout.keep_scale,
                                  key, m0};
  dscores_from_dprobs(dprobs_t, scores_t, stage.dsum, stage.lse, at.query0, p.fwd, ctx, lane);
  uint32_t dscores_a[1][kNT / 2][4];  // dS^T packed as P^T is, for the same store
  arch::accumulators_to_a_fragments<T>(dscores_a, dprobs_t);
  arch::store_a_fragments<ScoreTile>(sdS, at.key0, at.query0, dscores_a, lane);
  arch::fence_proxy_async();
  arch::named_barrier_sync(BwdHeadSplitBarriers::kDsWritten, kMath);
  // dK += dS^T.Q; 3. dQ = dS.K.
  issue_half_product<T, false, typename Cfg::QTile>(
      grads.dk, [&](int ks) { return ScoreTile::k_major(sdS, 0, ks); }, stage.q, at.col0, true);
  issue_half_product<T, true, typename Cfg::KVTile>(
      dq, [&](int ks) { return ScoreTile::mn_major(sdS, 0, ks); }, sK, at.col0, false);
  arch::wgmma_wait<0>();
  arch::wgmma_fence_operand(dq[0]);
  arch::wgmma_fence_operand(grads.dv[0]);
  arch::wgmma_fence_operand(grads.dk[0]);
  arch::named_barrier_sync(BwdHeadSplitBarriers::kMmasDone, kMath);
}

}  // namespace flash
