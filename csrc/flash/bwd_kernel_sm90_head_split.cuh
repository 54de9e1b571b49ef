// Backward on Hopper (sm_90a), warp-specialized, for head dims whose dK and dV are split between
// the two math warpgroups by head dim (bwd_sm90_head_split_step.cuh: hd 256). One CTA per (block
// of 64 keys, head, batch):
//   Loader warp: bwd_kernel_sm90_ws.cuh's (K and V once, then each query block's Q, dO, lse and
//     dsum into a kStages-slot ring with full / empty mbarriers).
//   dQ-writer warp: per step, once both math warpgroups have written the step's dQ tile over its
//     stage's Q and dO, adds it into dq_accum with one bulk reduction (in the key block's turn when
//     deterministic) and, once the copy has read it, marks the stage empty: the writer, not the math
//     warps, hands stages back to the loader.
//   Math warpgroups: the step, then the dQ tile into the stage; dK and dV at the end.
// Varlen as in bwd_kernel_sm90_ws.cuh: rows past a sequence's end get probability 0 from the mask.
#pragma once

#include "arch/sm90_tma.cuh"
#include "bwd_kernel_sm90_ws.cuh"
#include "bwd_sm90_head_split_step.cuh"
#include "ring_position.cuh"
#include "tile_io.cuh"

namespace flash {

template <typename Cfg>
struct BwdHeadSplitSmem : BwdRingSmem<Cfg> {
  using BwdRingSmem<Cfg>::base;
  __device__ __forceinline__ char* probs() const { return reinterpret_cast<char*>(base + Cfg::kProbsOffset); }
  __device__ __forceinline__ char* ds() const { return reinterpret_cast<char*>(base + Cfg::kDsOffset); }
  // The step's dQ tile, over its stage's Q and dO once the step's MMAs are done with them.
  __device__ __forceinline__ float* dq(int slot) const { return reinterpret_cast<float*>(this->stage(slot).q); }
  // A stage is empty after the dQ writer's one arrival.
  __device__ __forceinline__ void init_barriers() const { this->init_ring_barriers(1); }
};

// The dQ-writer warp. A stage's dQ barrier is reused only after the writer has freed that stage
// and the loader has refilled it, so the math warps never arrive on it twice ahead of the writer.
template <typename Cfg, typename KeyBlock>
__device__ __forceinline__ void write_head_split_dq(const BwdHeadSplitSmem<Cfg>& s, const BwdParams& p,
                                                    const KeyBlock& kb, int lane) {
  constexpr int kSyncThreads = Cfg::kMathThreads + arch::kWarpSize;
  int m_block = kb.m_start;
  for (int step = 0; step < kb.query_blocks(); ++step, m_block = kb.query_block_after(m_block, 1)) {
    const RingPosition<Cfg::kStages> at(step);
    arch::named_barrier_sync(BwdHeadSplitBarriers::kDqFull + at.slot, kSyncThreads);
    const auto turn = kb.template dq_turn</*kDeterministic=*/true>(p, m_block);
    if (lane == 0) {
      reduce_dq_tile<Cfg>(p, s.dq(at.slot), kb.seq, kb.head, m_block * Cfg::kBlockM, turn);
      arch::bulk_wait_source_read<0>();
      arch::mbarrier_arrive(s.stage_empty(at.slot));
      release_dq_tile(turn);  // deterministic: once the add is complete
    }
    arch::warp_sync();
  }
  if (lane == 0) arch::bulk_wait_complete<0>();
}

// A math warpgroup of kCols head-dim columns over the whole walk, then its part of the dK / dV
// epilogue. math_tid: 0..255.
template <typename T, typename Cfg, bool kScoreExtras, int kCols, typename KeyBlock>
__device__ __forceinline__ void compute_head_split_walk(const BwdHeadSplitSmem<Cfg>& s, const BwdParams& p,
                                                        const KeyBlock& kb, int math_tid) {
  constexpr int kMath = Cfg::kMathThreads, kSyncThreads = kMath + arch::kWarpSize;
  const BwdHeadSplitLanes at = bwd_head_split_lanes<Cfg>(math_tid);
  const ScoreMod mod = kScoreExtras ? kb.score_mod(p) : ScoreMod::none();
  const Dropout dropout = kScoreExtras ? kb.dropout(p) : Dropout::none();
  BwdHeadSplitGradients<kCols> grads;
  arch::zero_accumulators(grads.dk);
  arch::zero_accumulators(grads.dv);
  arch::mbarrier_wait_parity(s.kv_full(), 0);
  int m_block = kb.m_start;
  for (int step = 0; step < kb.query_blocks(); ++step, m_block = kb.query_block_after(m_block, 1)) {
    const RingPosition<Cfg::kStages> slot(step);
    arch::mbarrier_wait_parity(s.stage_full(slot.slot), slot.parity);
    float dq[1][kCols / 8][4];
    head_split_step<T, Cfg, kScoreExtras, kCols>(grads, dq, p, kb, mod, dropout, s.k(), s.v(), s.probs(), s.ds(),
                                          s.stage(slot.slot), m_block * Cfg::kBlockM, at);
    store_dq_sm90<Cfg>(s.dq(slot.slot), dq, at.warp_in_group * 16, at.col0, at.lane);
    arch::fence_proxy_async();
    arch::named_barrier_arrive(BwdHeadSplitBarriers::kDqFull + slot.slot, kSyncThreads);
  }
  // Every step ended with every math warp's MMAs retired (kMmasDone): K, V, P^T and dS^T are free.
  constexpr int kHeadNT = kCols / 8;
  scale_dk_and_dv(grads.dk, grads.dv, p.fwd, dropout);
  T* sdK = reinterpret_cast<T*>(s.base);
  T* sdV = sdK + Cfg::kBlockN * Cfg::kEpilogueStride;
  arch::store_accumulators<1, kHeadNT, T>(sdK, Cfg::kEpilogueStride, at.key0, at.col0, grads.dk, at.lane);
  arch::store_accumulators<1, kHeadNT, T>(sdV, Cfg::kEpilogueStride, at.key0, at.col0, grads.dv, at.lane);
  arch::named_barrier_sync(BwdHeadSplitBarriers::kMmasDone, kMath);
  const int headdim = p.fwd.shape.headdim;
  store_tile<Cfg::kBlockN, Cfg::kHeadDim, kMath>(kb.template key_rows<T>(p.dk, kb.head), p.dk.row_stride, sdK,
                                                 kb.rows_k, headdim, math_tid);
  store_tile<Cfg::kBlockN, Cfg::kHeadDim, kMath>(kb.template key_rows<T>(p.dv, kb.head), p.dv.row_stride, sdV,
                                                 kb.rows_k, headdim, math_tid);
}

// kScoreExtras: compiled with dropout, softcap and ALiBi (features.h says why this is a template).
template <typename T, typename Cfg, bool kScoreExtras>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    bwd_kernel_sm90_head_split(const __grid_constant__ BwdParams p, const __grid_constant__ BwdTensorMaps maps) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  const BwdHeadSplitSmem<Cfg> s{{arch::swizzle_aligned_dynamic_smem()}};
  constexpr int kFirst = Cfg::template kGroupCols<0>, kSecond = Cfg::template kGroupCols<1>;
  run_bwd_ws_roles<T, Cfg>(
      s, p, maps, [&](const auto& kb, int lane) { write_head_split_dq<Cfg>(s, p, kb, lane); },
      [&](const auto& kb, int math_tid) {
        // The branch on a warp-uniform value: with math_tid itself in the condition ptxas built both
        // paths' wgmma descriptors in per-thread registers and moved them to uniform ones before
        // every wgmma (hd 192: 70 R2UR a step; benchmarks/NOTES.md v42 item 4).
        if (kFirst == kSecond || arch::warp_uniform(math_tid / arch::kWarpgroupThreads) == 0)
          compute_head_split_walk<T, Cfg, kScoreExtras, kFirst>(s, p, kb, math_tid);
        else
          compute_head_split_walk<T, Cfg, kScoreExtras, kSecond>(s, p, kb, math_tid);
      });
#else
  __trap();  // the launcher selects this kernel only where the sm_90a image is loaded
#endif
}

}  // namespace flash
