// Backward by recomputation on Hopper (sm_90a), with warpgroup MMAs (wgmma). Same algorithm and
// arguments as bwd_kernel.cuh; one CTA per (block of 64 or 128 keys, head, batch), one or two
// warpgroups, each owning 64 of the keys. Per block of kBlockM queries, each warpgroup:
//   1. S^T = K.Q^T, dP^T = V.dO^T        (64 keys x kBlockM, A and B from shared memory)
//      P^T = exp(logits^T - lse), dS^T = P^T * (dP^T - dsum) * scale, in registers (logits with
//      the score modifiers and mask; dropout's keep bits, drawn while the MMAs run, on the dV
//      operand P^T and on dP^T)
//   2. dV += P^T.dO, dK += dS^T.Q        (64 keys x hd; A = P^T / dS^T straight from registers,
//                                         which is what the sm80 kernel cannot do with its grids)
//      issued so that the exponentials run under the dP^T wgmmas and dS^T under the dV ones
//   3. its part of dQ = dS.K             (kBlockM x hd, split between two warpgroups by head dim
//                                         or, with 128-query steps, by query; dS^T of all
//                                         warpgroups through shared memory), written to a shared
//                                         copy of the dq_accum tile
// One thread then adds the whole dQ tile into dq_accum with a single bulk reduction (TMA engine;
// in a fixed order of key blocks when deterministic, dq_order.cuh), overlapped with the next query
// block: per-element atomics from every thread kept L2 two-thirds
// busy and stalled the warps that issued them (ncu, benchmarks/NOTES.md).
// K, V, Q and dO use the 128-byte swizzled layout of arch/sm90_swizzled_tile.cuh (whole-line global
// reads), dS^T the core-matrix layout of arch/sm90_wgmma.cuh (written from registers); the next
// kStages - 1 query blocks' Q, dO, lse and dsum load (cp.async) during the current one.
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
#include "score_mod.cuh"
#include "sequence.cuh"
#include "mask.cuh"
#include "params.h"
#include "tile_io.cuh"

namespace flash {

template <int kHeadDim_, int kBlockM_, int kStages_, int kWarpgroups_>
struct BwdSm90Config {
  static constexpr int kHeadDim = kHeadDim_;
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

template <typename T, typename Cfg, typename KeyBlock>
__device__ __forceinline__ void load_query_stage_sm90(const QueryStageSm90<Cfg>& stage, const BwdParams& p,
                                                      const KeyBlock& kb, int m0, int tid) {
  const int rows = min(Cfg::kBlockM, kb.seq.seqlen_q - m0), headdim = p.fwd.shape.headdim;
  arch::load_swizzled_tile_async<Cfg::kBlockM, Cfg::kHeadDim, Cfg::kThreads>(
      stage.q, kb.seq.template q_side<T>(p.fwd.q, m0, kb.head), p.fwd.q.row_stride, rows, headdim, tid);
  arch::load_swizzled_tile_async<Cfg::kBlockM, Cfg::kHeadDim, Cfg::kThreads>(
      stage.dout, kb.seq.template q_side<T>(p.dout, m0, kb.head), p.dout.row_stride, rows, headdim, tid);
  const int64_t vector_offset = kb.query_vector_offset(p, m0);
  load_vector_async<Cfg::kBlockM, Cfg::kThreads>(stage.lse, p.fwd.lse + vector_offset, rows, tid);
  load_vector_async<Cfg::kBlockM, Cfg::kThreads>(stage.dsum, p.dsum + vector_offset, rows, tid);
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

// Writes a warp's dS^T fragment (16 keys from key0 x kBlockM queries) into the DsTile as T.
template <typename T, typename Cfg>
__device__ __forceinline__ void store_dscores_sm90(char* sdS, const float (&dscores_t)[1][Cfg::kBlockM / 8][4],
                                                   int key0, int lane) {
#pragma unroll
  for (int nt = 0; nt < Cfg::kBlockM / 8; ++nt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int key = key0 + arch::acc_row(lane, 2 * h), query = nt * 8 + arch::acc_col(lane, 0);
      *reinterpret_cast<uint32_t*>(sdS + Cfg::DsTile::byte_offset(key, query)) =
          arch::pack_pair<T>(dscores_t[0][nt][2 * h], dscores_t[0][nt][2 * h + 1]);
    }
}

// Writes a warp's dQ fragment (rows row0.., columns col0.. of the query block) into the shared
// copy of the dq_accum tile, in dq_accum's layout.
template <typename Cfg, int NT>
__device__ __forceinline__ void store_dq_sm90(float* sdQ, const float (&dq)[1][NT][4], int row0, int col0, int lane) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row0 + arch::acc_row(lane, 2 * h), col = col0 + nt * 8 + arch::acc_col(lane, 0);
      *reinterpret_cast<float2*>(sdQ + row * Cfg::kHeadDim + DqAccum<Cfg::kHeadDim>::col_offset(row, col)) =
          float2{dq[0][nt][2 * h], dq[0][nt][2 * h + 1]};
    }
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

// dq_accum tile of the query block at m0 += sdQ: one bulk reduction, issued by one thread under the
// next block's S^T / dP^T MMAs. Deterministic (turn.counter set): into the turn's slice (its first
// turn writes the tile), after the earlier key blocks' adds; the kernel releases it
// (release_dq_tile) under that block's dQ MMAs, half a block later. Waiting for its completion
// right away stalled warpgroup 0's MMA issue on every block (benchmarks/NOTES.md v8).
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

// kScoreExtras: compiled with dropout, softcap and ALiBi (features.h says why this is a template).
template <typename T, typename Cfg, bool kScoreExtras>
__global__ void __launch_bounds__(Cfg::kThreads) bwd_kernel_sm90(const BwdParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kHeadDim = Cfg::kHeadDim;
  constexpr int kScoreNT = kBlockM / 8, kHeadNT = kHeadDim / 8, kDqNT = Cfg::kDqCols / 8;
  unsigned char* smem = arch::swizzle_aligned_dynamic_smem();
  char* sK = reinterpret_cast<char*>(smem);  // KVTile
  char* sV = sK + Cfg::KVTile::kBytes;       // KVTile
  char* sdS = sV + Cfg::KVTile::kBytes;      // DsTile
  unsigned char* stage_base = reinterpret_cast<unsigned char*>(sdS + Cfg::DsTile::kBytes);
  float* sdQ = reinterpret_cast<float*>(stage_base + Cfg::kStages * Cfg::kStageBytes);  // (kBlockM, kHeadDim)

  const int tid = threadIdx.x, lane = tid % arch::kWarpSize;
  const int warpgroup = tid / arch::kWarpgroupThreads, warp_in_group = (tid / arch::kWarpSize) % 4;
  const int group_key0 = warpgroup * 64;                  // this warpgroup's keys in the block
  const int warp_key0 = group_key0 + warp_in_group * 16;  // this warp's accumulator rows
  const auto kb = BwdKeyBlock<kBlockM, kBlockN>::current(p);
  if (kb.template done_without_queries<T, kHeadDim, Cfg::kThreads>(p, tid)) return;
  const int head = kb.head, n0 = kb.n0, steps = kb.query_blocks(), headdim = p.fwd.shape.headdim;
  const AttentionMask& mask = kb.mask;
  const ScoreMod mod = kScoreExtras ? kb.score_mod(p) : ScoreMod::none();
  const Dropout dropout = kScoreExtras ? kb.dropout(p) : Dropout::none();

  arch::load_swizzled_tile_async<kBlockN, kHeadDim, Cfg::kThreads>(
      sK, kb.template key_rows<T>(p.fwd.k, kb.head_k), p.fwd.k.row_stride, kb.rows_k, headdim, tid);
  arch::load_swizzled_tile_async<kBlockN, kHeadDim, Cfg::kThreads>(
      sV, kb.template key_rows<T>(p.fwd.v, kb.head_k), p.fwd.v.row_stride, kb.rows_k, headdim, tid);
  // One commit group per query block, empty past the last one, so that "all but the newest
  // kStages - 2 groups" is always "up to the current block".
#pragma unroll
  for (int ahead = 0; ahead < Cfg::kStages - 1; ++ahead) {
    if (ahead < steps)
      load_query_stage_sm90<T, Cfg>(QueryStageSm90<Cfg>::at(stage_base + ahead * Cfg::kStageBytes), p, kb,
                                    kb.query_block_after(kb.m_start, ahead) * kBlockM, tid);
    arch::cp_async_commit();
  }

  float dk_acc[1][kHeadNT][4];  // this warp's 16 keys x head dim of dK
  float dv_acc[1][kHeadNT][4];
  arch::zero_accumulators(dk_acc);
  arch::zero_accumulators(dv_acc);

  int m_block = kb.m_start;  // the query blocks, in the order of the walk (dq_order.cuh)
  for (int step = 0; step < steps; ++step, m_block = kb.query_block_after(m_block, 1)) {
    const int m0 = m_block * kBlockM;
    const int stage_index = step % Cfg::kStages;
    const QueryStageSm90<Cfg> stage = QueryStageSm90<Cfg>::at(stage_base + stage_index * Cfg::kStageBytes);
    arch::cp_async_wait<Cfg::kStages - 2>();
    arch::fence_proxy_async();
    __syncthreads();  // this block's inputs landed; the previous block's phases are done everywhere
    {  // the stage of the previous block, which every warp is done with, loads block m + kStages - 1
      const int next = step + Cfg::kStages - 1;
      if (next < steps)
        load_query_stage_sm90<T, Cfg>(QueryStageSm90<Cfg>::at(stage_base + (next % Cfg::kStages) * Cfg::kStageBytes),
                                      p, kb, kb.query_block_after(m_block, Cfg::kStages - 1) * kBlockM, tid);
      arch::cp_async_commit();
    }

    // Phases 1 and 2 overlapped: exp(S^T) runs under the dP^T wgmmas and dS^T under the dV ones.
    // (Issuing the loads above after the S^T / dP^T wgmmas instead measured 4-7% slower: more
    // registers live across them, benchmarks/NOTES.md.)
    float scores_t[1][kScoreNT][4];  // S^T, then P^T: this warp's 16 keys x kBlockM queries
    float dprobs_t[1][kScoreNT][4];  // dP^T, then dS^T
    issue_scores_and_dprobs_sm90<T, Cfg>(scores_t, dprobs_t, sK, sV, stage, group_key0);
    // The previous block's dQ tile goes out while these MMAs run: with deterministic=True the
    // wait for this key block's turn and for the add's completion then stalls warpgroup 0 only
    // where it would wait for its S^T anyway (issued before the MMAs, it stalled their issue).
    if (tid == 0 && step > 0) {
      const int previous = kb.query_block_before(m_block);
      reduce_dq_tile<Cfg>(p, sdQ, kb.seq, head, previous * kBlockM,
                          kb.template dq_turn</*kDeterministic=*/true>(p, previous));
    }
    // Dropout's keep bits do not depend on S^T: drawn here, while the S^T and dP^T MMAs run.
    KeepBits<1, kScoreNT> keep;
    if (dropout.enabled) keep = keep_bits_bwd<1, kScoreNT>(dropout, n0 + warp_key0, m0, lane);
    arch::wgmma_wait<1>();  // S^T is done; dP^T may still run
    arch::wgmma_fence_operand(scores_t[0]);
    scores_to_logits</*kRowsAreKeys=*/true>(scores_t, mask, mod, !mask.block_fully_visible(m0, kBlockM, n0, kBlockN),
                                            n0 + warp_key0, m0, lane);
    probs_from_logits(scores_t, stage.lse, 0, p.fwd, lane);
    uint32_t probs_a[1][kBlockM / 16][4];  // P^T * Z, the A operand of dV (1 / keep_prob: at the end)
    if (dropout.enabled) {
      arch::accumulators_to_a_fragments<T>(probs_a, scores_t, [&](float prob, int mt, int nt, int r) {
        return keep.kept(mt, nt, r) ? prob : 0.f;
      });
    } else {
      arch::accumulators_to_a_fragments<T>(probs_a, scores_t);
    }
    issue_kv_gradient_sm90<T, Cfg>(dv_acc, probs_a, stage.dout);  // dV += P^T.dO

    arch::wgmma_wait<1>();  // dP^T is done; dV may still run
    arch::wgmma_fence_operand(dprobs_t[0]);
    const DscoreContext<1, kScoreNT> ctx{mod, dropout.enabled ? &keep : nullptr, dropout.keep_scale, n0 + warp_key0, m0};
    dscores_from_dprobs(dprobs_t, scores_t, stage.dsum, stage.lse, 0, p.fwd, ctx, lane);
    store_dscores_sm90<T, Cfg>(sdS, dprobs_t, warp_key0, lane);
    arch::fence_proxy_async();
    uint32_t dscores_a[1][kBlockM / 16][4];
    arch::accumulators_to_a_fragments<T>(dscores_a, dprobs_t);
    issue_kv_gradient_sm90<T, Cfg>(dk_acc, dscores_a, stage.q);  // dK += dS^T.Q

    // Phase 3: this warpgroup's part of dQ (kBlockM x kHeadDim) = dS.K over all kBlockN keys.
    if (tid == 0) arch::bulk_wait_source_read<0>();
    __syncthreads();  // dS^T of both warpgroups is in shared memory; sdQ has been read out
    const int dq_row0 = Cfg::kDqSplitByQuery ? warpgroup * 64 : 0;
    const int dq_col0 = Cfg::kDqSplitByQuery ? 0 : warpgroup * Cfg::kDqCols;
    float dq[1][kDqNT][4];
    arch::wgmma_fence_operand(dq[0]);
    arch::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kBlockN / 16; ++ks)
      arch::Wgmma<T, Cfg::kDqCols>::template ss<true, true>(
          dq[0], Cfg::DsTile::mn_major(sdS, dq_row0, ks), Cfg::KVTile::mn_major(sK, dq_col0, ks), ks > 0);
    arch::wgmma_commit();
    // Deterministic: the previous block's add, issued under phase 1, is released under these MMAs.
    if (tid == 0 && step > 0)
      release_dq_tile(kb.template dq_turn</*kDeterministic=*/true>(p, kb.query_block_before(m_block)));
    arch::wgmma_wait<0>();
    arch::wgmma_fence_operand(dq[0]);
    arch::wgmma_fence_operand(dv_acc[0]);
    arch::wgmma_fence_operand(dk_acc[0]);
    store_dq_sm90<Cfg>(sdQ, dq, dq_row0 + warp_in_group * 16, dq_col0, lane);
    arch::fence_proxy_async();
  }
  __syncthreads();  // the last block's dQ tile is complete
  if (tid == 0) {
    const int last = kb.query_block_before(m_block);  // the loop left m_block one step past the last
    reduce_dq_tile<Cfg>(p, sdQ, kb.seq, head, last * kBlockM, kb.template dq_turn</*kDeterministic=*/true>(p, last));
    release_dq_tile(kb.template dq_turn</*kDeterministic=*/true>(p, last));
    arch::bulk_wait_complete<0>();
  }

  if (dropout.enabled) scale_accumulators(dv_acc, dropout.keep_scale);  // dV = (P^T * Z / keep_prob).dO

  // Epilogue: dK and dV through shared memory (row-major, padded) for coalesced stores.
  T* sdK = reinterpret_cast<T*>(smem);
  T* sdV = sdK + kBlockN * Cfg::kEpilogueStride;
  __syncthreads();  // every warpgroup is done reading K, V and dS^T
  arch::store_accumulators<1, kHeadNT, T>(sdK, Cfg::kEpilogueStride, warp_key0, 0, dk_acc, lane);
  arch::store_accumulators<1, kHeadNT, T>(sdV, Cfg::kEpilogueStride, warp_key0, 0, dv_acc, lane);
  __syncthreads();
  store_tile<kBlockN, kHeadDim, Cfg::kThreads>(kb.template key_rows<T>(p.dk, head), p.dk.row_stride, sdK, kb.rows_k,
                                               headdim, tid);
  store_tile<kBlockN, kHeadDim, Cfg::kThreads>(kb.template key_rows<T>(p.dv, head), p.dv.row_stride, sdV, kb.rows_k,
                                               headdim, tid);
#else
  __trap();  // the launcher selects this kernel only where the sm_90a image is loaded
#endif
}

}  // namespace flash
