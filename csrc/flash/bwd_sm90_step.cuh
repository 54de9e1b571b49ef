// The math of one query block in the Hopper (sm_90a) backward, shared by its two kernels: the
// cp.async one (bwd_kernel_sm90.cuh, every thread computes and loads) and the warp-specialized one
// (bwd_kernel_sm90_ws.cuh, a producer warp loads and a dQ-writer warp adds dQ). A CTA owns a block
// of 64 or 128 keys, one warpgroup per 64 of them. Per block of kBlockM queries, each warpgroup:
//   1. S^T = K.Q^T, dP^T = V.dO^T        (64 keys x kBlockM, A and B from shared memory)
//      P^T = exp(logits^T - lse), dS^T = P^T * (dP^T - dsum) * scale, in registers (logits with
//      the score modifiers and mask; dropout's keep bits, drawn while the MMAs run, on the dV
//      operand P^T and on dP^T)
//   2. dV += P^T.dO                      (64 keys x hd; A = P^T straight from registers, which is
//                                         what the sm80 kernel cannot do with its grids), issued
//                                         so that the exponentials run under the dP^T wgmmas and,
//                                         unless kDvAfterDs, dS^T under the dV ones
//   3. its part of dQ = dS.K             (kBlockM x hd, split between two warpgroups by head dim
//                                         or, with 128-query steps, by query; dS^T of all
//                                         warpgroups through shared memory), written to a shared
//                                         copy of the dq_accum tile, and dK += dS^T.Q (A = dS^T
//                                         from registers) issued after it, so that dK's MMAs run
//                                         under the dQ store (in the warp-specialized kernel; the
//                                         cp.async one waits for them before the store)
// One thread then adds the whole dQ tile into dq_accum with a single bulk reduction (TMA engine;
// in a fixed order of key blocks when deterministic, dq_order.cuh): per-element atomics from every
// thread kept L2 two-thirds busy and stalled the warps that issued them (ncu, benchmarks/NOTES.md).
// K, V, Q and dO use the 128-byte swizzled layout of arch/sm90_swizzled_tile.cuh, dS^T the
// core-matrix layout of arch/sm90_wgmma.cuh (written from dK's A fragments by stmatrix,
// arch::store_a_fragments).
#pragma once

#include "arch/sm90_bulk.cuh"
#include "arch/sm90_swizzled_tile.cuh"
#include "arch/sm90_wgmma.cuh"
#include "bwd_fragments.cuh"
#include "bwd_key_block.cuh"
#include "common.cuh"
#include "dq_accum.cuh"
#include "dropout.cuh"
#include "fragment_scores.cuh"
#include "mask.cuh"
#include "params.h"
#include "score_mod.cuh"
#include "sequence.cuh"

namespace flash {

template <int kHeadDim_, int kBlockM_, int kStages_, int kWarpgroups_, bool kDvAfterDs_ = false>
struct BwdSm90Config {
  static constexpr int kHeadDim = kHeadDim_;
  // The order of phase 2 (kv_gradients_sm90): dV's MMAs issued under the dS^T math (false), or
  // after it, so that P^T's A fragments are not live beside P^T, dP^T and dS^T's (true: fewer
  // registers at the peak, for the 240 a warp-specialized math warp has).
  static constexpr bool kDvAfterDs = kDvAfterDs_;
  static constexpr int kBlockM = kBlockM_;  // queries per step: the N of the S^T wgmma
  // Each warpgroup owns 64 keys (the M of the other wgmmas). With one, a CTA is small enough that
  // two share an SM and interleave their phases; with two, dQ atomics and Q/dO loads per key halve.
  static constexpr int kWarpgroups = kWarpgroups_;
  static constexpr int kBlockN = 64 * kWarpgroups;  // keys per CTA
  static constexpr int kThreads = kWarpgroups * arch::kWarpgroupThreads;
  // dQ (kBlockM x kHeadDim) is m64 wgmma tiles: one warpgroup takes all of it (64 queries); two
  // split it by head dim for 64-query steps, by query for 128-query steps.
  static constexpr bool kDqSplitByQuery = kWarpgroups == 2 && kBlockM == 128;
  static constexpr int kDqCols = kDqSplitByQuery ? kHeadDim : kHeadDim / kWarpgroups;
  static_assert(kBlockM == 64 * (kDqSplitByQuery ? 2 : 1), "one m64 dQ wgmma per warpgroup");
  static_assert(kWarpgroups == 1 || kWarpgroups == 2, "one or two warpgroups");
  static_assert(kBlockM >= kMinBwdBlockM, "the deterministic counters are sized for kMinBwdBlockM");
  using KVTile = arch::SwizzledTile<kBlockN, kHeadDim>;  // K, V: rows keys
  using QTile = arch::SwizzledTile<kBlockM, kHeadDim>;   // Q, dO: rows queries
  using DsTile = arch::CoreTile<kBlockN, kBlockM>;       // dS^T: rows keys, columns queries
  // Q, dO, lse, dsum; padded so that every stage's tiles start 1024-byte aligned (the swizzle).
  static constexpr int kStageBytes =
      (2 * QTile::kBytes + 2 * kBlockM * 4 + arch::kSwizzleAtomBytes - 1) / arch::kSwizzleAtomBytes *
      arch::kSwizzleAtomBytes;
  static_assert(KVTile::kBytes % arch::kSwizzleAtomBytes == 0 && DsTile::kBytes % arch::kSwizzleAtomBytes == 0,
                "the stages start 1024-byte aligned");
  // Query blocks in shared memory: the current one and kStages - 1 loading ahead of it.
  static constexpr int kStages = kStages_;
  static_assert(kStages >= 2, "at least one block loads ahead");
  static constexpr int kDqTileBytes = kBlockM * kHeadDim * 4;  // float32, the dq_accum tile layout
  static constexpr int kSmemBytes = 2 * KVTile::kBytes + DsTile::kBytes + kStages * kStageBytes + kDqTileBytes;
  // The epilogue stages dK and dV row-major (padded) in the space of K, V and dS^T.
  static constexpr int kEpilogueStride = padded_stride<kHeadDim>();
  static_assert(2 * kBlockN * kEpilogueStride * 2 <= 2 * KVTile::kBytes + DsTile::kBytes, "epilogue fits");
};

// One stage of per-query-block inputs in shared memory.
template <typename Cfg>
struct QueryStageSm90 {
  char* q;      // QTile
  char* dout;   // QTile
  float* lse;   // (kBlockM)
  float* dsum;  // (kBlockM)

  __device__ __forceinline__ static QueryStageSm90 at(unsigned char* base) {
    QueryStageSm90 s;
    s.q = reinterpret_cast<char*>(base);
    s.dout = s.q + Cfg::QTile::kBytes;
    s.lse = reinterpret_cast<float*>(s.dout + Cfg::QTile::kBytes);
    s.dsum = s.lse + Cfg::kBlockM;
    return s;
  }
};

// Issues copies of query block m0's lse and dsum entries into the stage, zero past the sequence's
// end (their rows then give probability 0 and dS 0); `threads` threads from index `tid`.
template <typename Cfg, int kThreads, typename KeyBlock>
__device__ __forceinline__ void load_query_vectors_async(const QueryStageSm90<Cfg>& stage, const BwdParams& p,
                                                         const KeyBlock& kb, int m0, int tid) {
  const int rows = min(Cfg::kBlockM, kb.seq.seqlen_q - m0);
  const int64_t vector_offset = kb.query_vector_offset(p, m0);
  load_vector_async<Cfg::kBlockM, kThreads>(stage.lse, p.fwd.lse + vector_offset, rows, tid);
  load_vector_async<Cfg::kBlockM, kThreads>(stage.dsum, p.dsum + vector_offset, rows, tid);
}

// Phase 1 for one warpgroup: issues S^T and dP^T of its 64 keys (from key0) against the query
// block as two wgmma groups, S^T first; the caller waits for each when it needs it.
template <typename T, typename Cfg>
__device__ __forceinline__ void issue_scores_and_dprobs_sm90(float (&scores_t)[1][Cfg::kBlockM / 8][4],
                                                             float (&dprobs_t)[1][Cfg::kBlockM / 8][4], const char* sK,
                                                             const char* sV, const QueryStageSm90<Cfg>& stage,
                                                             int key0) {
  using Mma = arch::Wgmma<T, Cfg::kBlockM>;
  arch::wgmma_fence_operand(scores_t[0]);
  arch::wgmma_fence_operand(dprobs_t[0]);
  arch::wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < Cfg::kHeadDim / 16; ++ks)
    Mma::template ss<false, false>(scores_t[0], Cfg::KVTile::k_major(sK, key0, ks), Cfg::QTile::k_major(stage.q, 0, ks),
                                   ks > 0);
  arch::wgmma_commit();
#pragma unroll
  for (int ks = 0; ks < Cfg::kHeadDim / 16; ++ks)
    Mma::template ss<false, false>(dprobs_t[0], Cfg::KVTile::k_major(sV, key0, ks),
                                   Cfg::QTile::k_major(stage.dout, 0, ks), ks > 0);
  arch::wgmma_commit();
}

// acc += A (registers, 64 x kBlockM) . B (a QTile read MN-major: kBlockM queries x head dim), issued
// as one wgmma group: dV += P^T.dO and dK += dS^T.Q.
template <typename T, typename Cfg>
__device__ __forceinline__ void issue_kv_gradient_sm90(float (&acc)[1][Cfg::kHeadDim / 8][4],
                                                       const uint32_t (&a)[1][Cfg::kBlockM / 16][4],
                                                       const char* query_tile) {
  arch::wgmma_fence_operand(acc[0]);
  arch::wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < Cfg::kBlockM / 16; ++ks)
    arch::Wgmma<T, Cfg::kHeadDim>::template rs<true>(acc[0], a[0][ks], Cfg::QTile::mn_major(query_tile, 0, ks), true);
  arch::wgmma_commit();
}

// Writes a warp's dQ fragment (rows row0.., columns col0.. of the query block) into the shared
// copy of the dq_accum tile, in dq_accum's layout. Rows 8 apart share their swizzle, and 32 columns
// further is 8 whole units further (the swizzle only permutes a row's units within groups of 8), so
// a lane needs 4 addresses (nt % 4) plus compile-time steps, not 2 x NT (per-fragment addresses
// were hoisted out of the query walk by ptxas and spilled: benchmarks/NOTES.md v23).
template <typename Cfg, int NT>
__device__ __forceinline__ void store_dq_sm90(float* sdQ, const float (&dq)[1][NT][4], int row0, int col0, int lane) {
  using Accum = DqAccum<Cfg::kHeadDim>;
  constexpr int kGroups = NT < 4 ? NT : 4;  // 8-column tiles within 32 columns
  static_assert(NT % kGroups == 0, "whole groups of 32 columns");
  const int row = row0 + arch::acc_row(lane, 0), col = col0 + arch::acc_col(lane, 0);
  float* group_base[kGroups];
#pragma unroll
  for (int g = 0; g < kGroups; ++g) group_base[g] = sdQ + row * Cfg::kHeadDim + Accum::col_offset(row, col + 8 * g);
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      *reinterpret_cast<float2*>(group_base[nt % kGroups] + h * 8 * Cfg::kHeadDim + (nt / kGroups) * 32) =
          float2{dq[0][nt][2 * h], dq[0][nt][2 * h + 1]};
}

// Deterministic: waits until the add of `turn` (this thread's latest bulk group) is complete and
// visible, then lets the next key block add; no-op otherwise.
template <typename Turn>
__device__ __forceinline__ void release_dq_tile(const Turn& turn) {
  if (turn.counter == nullptr) return;
  arch::bulk_wait_complete<0>();
  arch::fence_proxy_async_global();
  turn.release();
}

// dq_accum tile of the query block at m0 += sdQ: one bulk reduction by one thread. Deterministic
// (turn.counter set): into the turn's slice (its first turn writes the tile), after the earlier
// key blocks' adds; the caller releases it (release_dq_tile) once the add is complete.
template <typename Cfg, typename Turn>
__device__ __forceinline__ void reduce_dq_tile(const BwdParams& p, const float* sdQ, const SequenceView& seq, int head,
                                               int m0, const Turn& turn) {
  turn.wait();
  float* tile = turn.accum(p) + DqAccum<Cfg::kHeadDim>::row_offset(p, seq, head, m0);
  if (turn.writes())
    arch::bulk_store(tile, sdQ, Cfg::kDqTileBytes);
  else
    arch::bulk_reduce_add_f32(tile, sdQ, Cfg::kDqTileBytes);
  arch::bulk_commit();
}

// Where one warpgroup's warp sits in the CTA's key block, and the per-(batch, head) pieces of the
// score stage, fixed for the whole walk.
struct BwdSm90Lanes {
  int warpgroup;      // among the math warpgroups
  int warp_in_group;  // 0..3
  int lane;
  int group_key0;     // this warpgroup's first key in the block
  int warp_key0;      // this warp's first accumulator row (key) in the block
};

template <typename Cfg>
__device__ __forceinline__ BwdSm90Lanes bwd_sm90_lanes(int math_tid) {
  BwdSm90Lanes l;
  l.warpgroup = arch::warp_uniform(math_tid / arch::kWarpgroupThreads);
  l.warp_in_group = arch::warp_uniform((math_tid / arch::kWarpSize) % 4);
  l.lane = math_tid % arch::kWarpSize;
  l.group_key0 = l.warpgroup * 64;
  l.warp_key0 = l.group_key0 + l.warp_in_group * 16;
  return l;
}

// This warp's dK and dV accumulators (16 keys x head dim each) across the query walk.
template <typename Cfg>
struct BwdSm90Gradients {
  float dk[1][Cfg::kHeadDim / 8][4];
  float dv[1][Cfg::kHeadDim / 8][4];
};

// Phases 1 and 2 of one query block (m0) for one warpgroup, up to dS^T: in sdS and in dscores_a, the
// A operand of dK += dS^T.Q, which phase 3 issues after dQ's MMAs. The caller has ordered the sdS
// store after every warpgroup's reads of the previous block's (the cp.async kernel's step-start
// __syncthreads, the warp-specialized kernel's dQ-empty sync). dV's MMAs are in flight on return.
// after_issue() runs right after the S^T / dP^T MMAs are issued (under them).
template <typename T, typename Cfg, bool kScoreExtras, typename KeyBlock, typename AfterIssue>
__device__ __forceinline__ void kv_gradients_sm90(BwdSm90Gradients<Cfg>& grads, const BwdParams& p, const KeyBlock& kb,
                                                  const ScoreMod& mod, const Dropout& dropout, const char* sK,
                                                  const char* sV, char* sdS, const QueryStageSm90<Cfg>& stage, int m0,
                                                  const BwdSm90Lanes& at, uint32_t (&dscores_a)[1][Cfg::kBlockM / 16][4],
                                                  AfterIssue&& after_issue) {
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kScoreNT = kBlockM / 8;
  const int n0 = kb.n0, lane = at.lane;
  const AttentionMask& mask = kb.mask;
  // Phases 1 and 2 overlapped: exp(S^T) runs under the dP^T wgmmas and dS^T under the dV ones.
  float scores_t[1][kScoreNT][4];  // S^T, then P^T: this warp's 16 keys x kBlockM queries
  float dprobs_t[1][kScoreNT][4];  // dP^T, then dS^T
  issue_scores_and_dprobs_sm90<T, Cfg>(scores_t, dprobs_t, sK, sV, stage, at.group_key0);
  after_issue();
  // Dropout's random bytes do not depend on S^T: drawn here, while the S^T and dP^T MMAs run.
  BwdDropTests<1, kScoreNT> drop_tests;
  if (dropout.enabled) drop_tests = drop_tests_bwd<1, kScoreNT>(dropout, n0 + at.warp_key0, m0, lane);
  arch::wgmma_wait<1>();  // S^T is done; dP^T may still run
  arch::wgmma_fence_operand(scores_t[0]);
  scores_to_logits</*kRowsAreKeys=*/true>(scores_t, mask, mod, !mask.block_fully_visible(m0, kBlockM, n0, kBlockN),
                                          n0 + at.warp_key0, m0, lane);
  probs_from_logits(scores_t, stage.lse, 0, p.fwd, lane);
  uint32_t probs_a[1][kBlockM / 16][4];  // P^T * Z, the A operand of dV (1 / keep_prob: at the end)
  arch::accumulators_to_a_fragments<T>(probs_a, scores_t);
  if (dropout.enabled) drop_packed_probs(probs_a, drop_tests);
  if constexpr (!Cfg::kDvAfterDs) issue_kv_gradient_sm90<T, Cfg>(grads.dv, probs_a, stage.dout);  // dV += P^T.dO

  arch::wgmma_wait<Cfg::kDvAfterDs ? 0 : 1>();  // dP^T is done; dV may still run
  arch::wgmma_fence_operand(dprobs_t[0]);
  const DscoreContext<1, kScoreNT> ctx{mod, dropout.enabled ? &drop_tests : nullptr, dropout.keep_scale,
                                       n0 + at.warp_key0, m0};
  dscores_from_dprobs(dprobs_t, scores_t, stage.dsum, stage.lse, 0, p.fwd, ctx, lane);
  if constexpr (Cfg::kDvAfterDs) issue_kv_gradient_sm90<T, Cfg>(grads.dv, probs_a, stage.dout);  // dV += P^T.dO
  arch::accumulators_to_a_fragments<T>(dscores_a, dprobs_t);
  arch::store_a_fragments<typename Cfg::DsTile>(sdS, at.warp_key0, 0, dscores_a, lane);
  arch::fence_proxy_async();
}

// Phase 3 for one warpgroup, once every warpgroup's dS^T is in sdS: its part of dQ = dS.K over all
// kBlockN keys, then dK += dS^T.Q (FlashAttention 3's order: dQ's result is needed first), and dQ
// written into the shared dq_accum tile sdQ once before_dq_store() returns. under_mmas() runs while
// the MMAs do. kDkInFlight: dK's MMAs may still run on return (they read dscores_a and the stage's
// Q: the caller waits for them, wait_for_dk, before it touches either); else every MMA of the step
// is done, so the stage's Q and dO are free.
template <typename T, typename Cfg, bool kDkInFlight, typename UnderMmas, typename BeforeDqStore>
__device__ __forceinline__ void dq_part_sm90(BwdSm90Gradients<Cfg>& grads,
                                             const uint32_t (&dscores_a)[1][Cfg::kBlockM / 16][4],
                                             const QueryStageSm90<Cfg>& stage, const char* sdS, const char* sK,
                                             float* sdQ, const BwdSm90Lanes& at, UnderMmas&& under_mmas,
                                             BeforeDqStore&& before_dq_store) {
  const int dq_row0 = Cfg::kDqSplitByQuery ? at.warpgroup * 64 : 0;
  const int dq_col0 = Cfg::kDqSplitByQuery ? 0 : at.warpgroup * Cfg::kDqCols;
  float dq[1][Cfg::kDqCols / 8][4];
  arch::wgmma_fence_operand(dq[0]);
  arch::wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < Cfg::kBlockN / 16; ++ks)
    arch::Wgmma<T, Cfg::kDqCols>::template ss<true, true>(
        dq[0], Cfg::DsTile::mn_major(sdS, dq_row0, ks), Cfg::KVTile::mn_major(sK, dq_col0, ks), ks > 0);
  arch::wgmma_commit();
  issue_kv_gradient_sm90<T, Cfg>(grads.dk, dscores_a, stage.q);  // dK += dS^T.Q
  under_mmas();
  arch::wgmma_wait<kDkInFlight ? 1 : 0>();  // dQ (and dV) done
  arch::wgmma_fence_operand(dq[0]);
  arch::wgmma_fence_operand(grads.dv[0]);
  if constexpr (!kDkInFlight) arch::wgmma_fence_operand(grads.dk[0]);
  before_dq_store();
  store_dq_sm90<Cfg>(sdQ, dq, dq_row0 + at.warp_in_group * 16, dq_col0, at.lane);
  arch::fence_proxy_async();
}

// The wait dq_part_sm90<kDkInFlight = true> leaves to its caller: every MMA issued so far is done
// (dK's too), so dK, its A fragments and the stage's Q may be used again.
template <typename Cfg>
__device__ __forceinline__ void wait_for_dk(BwdSm90Gradients<Cfg>& grads) {
  arch::wgmma_wait<0>();
  arch::wgmma_fence_operand(grads.dk[0]);
}

// Epilogue: dK and dV (scale_dk_and_dv) through shared memory at `smem`
// (row-major, padded; the space of K, V and dS^T, which the caller has made free) for coalesced
// stores. sync() is the caller's barrier over the kThreads math threads.
template <typename T, typename Cfg, int kThreads, typename KeyBlock, typename Sync>
__device__ __forceinline__ void store_kv_gradients_sm90(BwdSm90Gradients<Cfg>& grads, const BwdParams& p,
                                                        const KeyBlock& kb, const Dropout& dropout,
                                                        unsigned char* smem, const BwdSm90Lanes& at, int math_tid,
                                                        Sync&& sync) {
  constexpr int kBlockN = Cfg::kBlockN, kHeadDim = Cfg::kHeadDim, kHeadNT = kHeadDim / 8;
  scale_dk_and_dv(grads.dk, grads.dv, p.fwd, dropout);
  T* sdK = reinterpret_cast<T*>(smem);
  T* sdV = sdK + kBlockN * Cfg::kEpilogueStride;
  arch::store_accumulators<1, kHeadNT, T>(sdK, Cfg::kEpilogueStride, at.warp_key0, 0, grads.dk, at.lane);
  arch::store_accumulators<1, kHeadNT, T>(sdV, Cfg::kEpilogueStride, at.warp_key0, 0, grads.dv, at.lane);
  sync();
  const int headdim = p.fwd.shape.headdim;
  store_tile<kBlockN, kHeadDim, kThreads>(kb.template key_rows<T>(p.dk, kb.head), p.dk.row_stride, sdK, kb.rows_k,
                                          headdim, math_tid);
  store_tile<kBlockN, kHeadDim, kThreads>(kb.template key_rows<T>(p.dv, kb.head), p.dv.row_stride, sdV, kb.rows_k,
                                          headdim, math_tid);
}

}  // namespace flash
