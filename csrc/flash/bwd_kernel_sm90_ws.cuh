// Backward on Hopper (sm_90a), warp-specialized (issues #13 and #8; FlashAttention 3's split of
// the work, written here): one CTA per (block of 128 keys, head, batch), as the cp.async kernel
// (bwd_kernel_sm90.cuh), with a producer warpgroup beside its two math warpgroups.
//   Loader warp: K and V once, then each query block's Q and dO with TMA (sm90_tma.cuh) into a
//     kStages-slot ring, and its lse and dsum with its lanes' cp.async; each slot has a "full"
//     mbarrier (bytes landed, lanes' copies done) and an "empty" one (both math warpgroups' MMAs
//     are done with it).
//   dQ-writer warp: adds each query block's dQ tile from shared memory into dq_accum with one bulk
//     reduction. With deterministic=True it also waits for the key block's turn (dq_order.cuh)
//     and for the add's completion before it lets the next key block add: the waits that stalled
//     the math warps of the cp.async kernel (benchmarks/NOTES.md v8, v13). kDqBuffers shared dQ
//     tiles let the math warpgroups run that many blocks ahead of the writer.
//   Math warpgroups: bwd_sm90_step.cuh's phases, synchronized with each other once a block, by a
//     named barrier (dS^T written), and with the dQ writer by a full barrier per dQ tile (both
//     warpgroups arrive, the writer waits) and an empty one per dQ tile and warpgroup (the writer
//     arrives, that warpgroup waits), so that neither warpgroup waits for the other at its dQ
//     store (FlashAttention 4's hand-off; a shared empty barrier made them meet twice a block).
//     dS^T has two buffers, alternating by block: block i + 2 writes block i's after every warp
//     passed block i + 1's dS^T barrier, which each reaches only once its block-i dQ MMAs, the
//     buffer's readers, are done. A block's dK MMAs run under its dQ store; its stage is released
//     once they are done. The producer warpgroup hands its registers to them (setmaxnreg).
// Varlen: a TMA box cannot stop at a sequence's end, so Q / dO rows past it are the next
// sequence's (or zeros past the tensor) and so are K / V rows; the mask gives those pairs
// probability 0 (lse and dsum arrive as 0 there), so they add nothing to dK, dV or dQ.
#pragma once

#include "arch/sm90_tma.cuh"
#include "bwd_sm90_step.cuh"
#include "ring_position.cuh"
#include "tile_io.cuh"

namespace flash {

template <int kHeadDim_, int kBlockM_, int kStages_, int kDqBuffers_, bool kDvAfterDs_>
struct BwdWsConfig : BwdSm90Config<kHeadDim_, kBlockM_, kStages_, 2, kDvAfterDs_> {
  using Base = BwdSm90Config<kHeadDim_, kBlockM_, kStages_, 2, kDvAfterDs_>;
  static constexpr int kMathThreads = Base::kThreads;  // two warpgroups, 64 keys each
  static constexpr int kThreads = kMathThreads + arch::kWarpgroupThreads;
  // Registers per thread after the reallocation: FlashAttention 3's split for two math warpgroups,
  // which fills the 64K register file (24 x 128 + 240 x 256 <= 65536).
  static constexpr int kProducerRegs = 24;
  static constexpr int kMathRegs = 240;
  static_assert(kProducerRegs * arch::kWarpgroupThreads + kMathRegs * kMathThreads <= 65536, "register file");
  static constexpr int kDqBuffers = kDqBuffers_;
  static_assert(kDqBuffers == 1 || kDqBuffers == 2, "one or two shared dQ tiles");
  static_assert(Base::kBlockN <= 256 && kBlockM_ <= 256 && kHeadDim_ % 64 == 0, "TMA boxes: <= 256 rows, 64 columns");
  // K, V, two dS^T tiles, the stages, the dQ tiles (all 1024-byte aligned), then the mbarriers.
  static constexpr int kDsBuffers = 2;
  static constexpr int kStageOffset = 2 * Base::KVTile::kBytes + kDsBuffers * Base::DsTile::kBytes;
  static constexpr int kDqOffset = kStageOffset + kStages_ * Base::kStageBytes;
  static constexpr int kBarrierOffset = kDqOffset + kDqBuffers * Base::kDqTileBytes;
  static constexpr int kBarriers = 1 + 2 * kStages_;  // K/V full; per stage full, empty
  static constexpr int kSmemBytes = kBarrierOffset + kBarriers * 8;
  static_assert(kSmemBytes <= arch::kMaxSmemBytesPerBlock, "Hopper's shared memory per block");
};

// Named barriers (0 is __syncthreads'): among the math warpgroups, and per dQ tile between them
// and the dQ-writer warp.
struct BwdWsBarriers {
  static constexpr int kDsFree = 1;     // every math warp is done with dS^T (the epilogue's)
  static constexpr int kDsWritten = 2;  // every math warp has written this block's dS^T
  static constexpr int kDqFull = 3;     // + buffer: the math warps wrote the dQ tile
  static constexpr int kDqEmpty = 5;    // + 2 buffer + warpgroup: the writer has read the tile out
  static constexpr int kDqEmptyThreads = arch::kWarpgroupThreads + arch::kWarpSize;
};

// What both warp-specialized backward kernels keep at the same places of their shared memory: K and
// V first, the Q / dO / lse / dsum stages at Cfg::kStageOffset, the mbarriers at Cfg::kBarrierOffset
// (K/V full; per stage full, empty).
template <typename Cfg>
struct BwdRingSmem {
  unsigned char* base;

  __device__ __forceinline__ char* k() const { return reinterpret_cast<char*>(base); }
  __device__ __forceinline__ char* v() const { return k() + Cfg::KVTile::kBytes; }
  __device__ __forceinline__ QueryStageSm90<Cfg> stage(int slot) const {
    return QueryStageSm90<Cfg>::at(base + Cfg::kStageOffset + slot * Cfg::kStageBytes);
  }
  __device__ __forceinline__ uint64_t* barrier(int index) const {
    return reinterpret_cast<uint64_t*>(base + Cfg::kBarrierOffset) + index;
  }
  __device__ __forceinline__ uint64_t* kv_full() const { return barrier(0); }
  __device__ __forceinline__ uint64_t* stage_full(int slot) const { return barrier(1 + slot); }
  __device__ __forceinline__ uint64_t* stage_empty(int slot) const { return barrier(1 + Cfg::kStages + slot); }

  // One thread, before any other touches them. A stage is full after the loader thread's TMA
  // bytes and its warp's 32 cp.async arrivals, empty after `empty_arrivals` arrivals.
  __device__ __forceinline__ void init_ring_barriers(int empty_arrivals) const {
    arch::mbarrier_init(kv_full(), 1);
    for (int slot = 0; slot < Cfg::kStages; ++slot) {
      arch::mbarrier_init(stage_full(slot), 1 + arch::kWarpSize);
      arch::mbarrier_init(stage_empty(slot), empty_arrivals);
    }
    arch::fence_mbarrier_init();
  }
};

template <typename Cfg>
struct BwdWsSmem : BwdRingSmem<Cfg> {
  using BwdRingSmem<Cfg>::base;
  __device__ __forceinline__ char* ds(int buffer) const {
    return this->v() + Cfg::KVTile::kBytes + buffer * Cfg::DsTile::kBytes;
  }
  __device__ __forceinline__ float* dq(int buffer) const {
    return reinterpret_cast<float*>(base + Cfg::kDqOffset + buffer * Cfg::kDqTileBytes);
  }
  // A stage is empty once both math warpgroups are done with it.
  __device__ __forceinline__ void init_barriers() const { this->init_ring_barriers(2); }
};

// The tensor maps of q, dout, k and v (host: make_bwd_tensor_maps in launch_bwd_sm90.cuh).
struct BwdTensorMaps {
  arch::TensorMap q, dout, k, v;
};

// The loader warp: K and V, then per query block of the walk (once its slot is free) Q and dO by
// lane 0's TMA, lse and dsum by every lane's cp.async.
// Smem: the kernel's shared-memory map (BwdWsSmem, or the head-split kernel's), with its K, V,
// stages and their barriers.
template <typename Cfg, typename Smem, typename KeyBlock>
__device__ __forceinline__ void load_bwd_walk(const Smem& s, const BwdParams& p, const BwdTensorMaps& maps,
                                              const KeyBlock& kb, int lane) {
  const int batch = kb.seq.batch_index;
  if (lane == 0) {
    const int k_row = static_cast<int>(kb.seq.k_row0) + kb.n0;
    arch::mbarrier_arrive_expect_bytes(s.kv_full(), 2 * Cfg::KVTile::kBytes);
    arch::tma_load_swizzled_tile<Cfg::kBlockN, Cfg::kHeadDim>(s.k(), &maps.k, k_row, kb.head_k, batch, s.kv_full());
    arch::tma_load_swizzled_tile<Cfg::kBlockN, Cfg::kHeadDim>(s.v(), &maps.v, k_row, kb.head_k, batch, s.kv_full());
  }
  int m_block = kb.m_start;
  for (int step = 0; step < kb.query_blocks(); ++step, m_block = kb.query_block_after(m_block, 1)) {
    const RingPosition<Cfg::kStages> at(step);
    const QueryStageSm90<Cfg> stage = s.stage(at.slot);
    const int m0 = m_block * Cfg::kBlockM;
    arch::mbarrier_wait_parity(s.stage_empty(at.slot), at.parity ^ 1);  // a fresh barrier passes at once
    if (lane == 0) {
      const int q_row = static_cast<int>(kb.seq.q_row0) + m0;
      arch::mbarrier_arrive_expect_bytes(s.stage_full(at.slot), 2 * Cfg::QTile::kBytes);
      arch::tma_load_swizzled_tile<Cfg::kBlockM, Cfg::kHeadDim>(stage.q, &maps.q, q_row, kb.head, batch,
                                                                s.stage_full(at.slot));
      arch::tma_load_swizzled_tile<Cfg::kBlockM, Cfg::kHeadDim>(stage.dout, &maps.dout, q_row, kb.head, batch,
                                                                s.stage_full(at.slot));
    }
    load_query_vectors_async<Cfg, arch::kWarpSize>(stage, p, kb, m0, lane);
    arch::cp_async_mbarrier_arrive(s.stage_full(at.slot));
  }
}

// The dQ-writer warp: per query block of the walk, once the math warps have written its dQ tile,
// lane 0 adds it into dq_accum (in the key block's turn when deterministic) and the warp hands the
// tile back as soon as the bulk copy has read it. Every arrive on a dQ-empty barrier meets one
// wait of the math warps: one before each tile's first use, one after each add but the last.
template <typename Cfg>
__device__ __forceinline__ void hand_back_dq_tile(int buffer) {
  constexpr int kWarpgroups = Cfg::kMathThreads / arch::kWarpgroupThreads;
  static_assert(kWarpgroups == 2, "BwdWsBarriers::kDqEmpty numbers two warpgroups' barriers per buffer");
#pragma unroll
  for (int warpgroup = 0; warpgroup < kWarpgroups; ++warpgroup)
    arch::named_barrier_arrive(BwdWsBarriers::kDqEmpty + 2 * buffer + warpgroup, BwdWsBarriers::kDqEmptyThreads);
}

template <typename Cfg, typename KeyBlock>
__device__ __forceinline__ void write_bwd_dq(const BwdWsSmem<Cfg>& s, const BwdParams& p, const KeyBlock& kb,
                                             int lane) {
  constexpr int kSyncThreads = Cfg::kMathThreads + arch::kWarpSize;
  const int steps = kb.query_blocks();
  for (int buffer = 0; buffer < Cfg::kDqBuffers && buffer < steps; ++buffer) hand_back_dq_tile<Cfg>(buffer);
  int m_block = kb.m_start;
  for (int step = 0; step < steps; ++step, m_block = kb.query_block_after(m_block, 1)) {
    const int buffer = step % Cfg::kDqBuffers;
    arch::named_barrier_sync(BwdWsBarriers::kDqFull + buffer, kSyncThreads);
    const auto turn = kb.template dq_turn</*kDeterministic=*/true>(p, m_block);
    if (lane == 0) {
      reduce_dq_tile<Cfg>(p, s.dq(buffer), kb.seq, kb.head, m_block * Cfg::kBlockM, turn);
      arch::bulk_wait_source_read<0>();
    }
    arch::warp_sync();
    if (step + Cfg::kDqBuffers < steps) hand_back_dq_tile<Cfg>(buffer);
    if (lane == 0) release_dq_tile(turn);  // deterministic: once the add is complete
  }
  if (lane == 0) arch::bulk_wait_complete<0>();
}

// The two math warpgroups over the whole walk, then the dK / dV epilogue. math_tid: 0..255.
template <typename T, typename Cfg, bool kScoreExtras, typename KeyBlock>
__device__ __forceinline__ void compute_bwd_walk(const BwdWsSmem<Cfg>& s, const BwdParams& p, const KeyBlock& kb,
                                                 int math_tid) {
  constexpr int kMath = Cfg::kMathThreads, kSyncThreads = kMath + arch::kWarpSize;
  const BwdSm90Lanes at = bwd_sm90_lanes<Cfg>(math_tid);
  const ScoreMod mod = kScoreExtras ? kb.score_mod(p) : ScoreMod::none();
  const Dropout dropout = kScoreExtras ? kb.dropout(p) : Dropout::none();
  BwdSm90Gradients<Cfg> grads;
  arch::zero_accumulators(grads.dk);
  arch::zero_accumulators(grads.dv);
  arch::mbarrier_wait_parity(s.kv_full(), 0);
  const bool stage_releaser = math_tid % arch::kWarpgroupThreads == 0;
  int m_block = kb.m_start;
  for (int step = 0; step < kb.query_blocks(); ++step, m_block = kb.query_block_after(m_block, 1)) {
    const RingPosition<Cfg::kStages> slot(step);
    const int buffer = step % Cfg::kDqBuffers;
    const QueryStageSm90<Cfg> stage = s.stage(slot.slot);
    arch::mbarrier_wait_parity(s.stage_full(slot.slot), slot.parity);
    char* sdS = s.ds(step % Cfg::kDsBuffers);
    uint32_t dscores_a[1][Cfg::kBlockM / 16][4];  // dS^T, the A operand of dK's MMAs
    // No barrier before the dS^T store: this buffer's readers, two blocks back, were done before
    // their warps reached the last block's dS^T barrier (the header says why).
    kv_gradients_sm90<T, Cfg, kScoreExtras>(grads, p, kb, mod, dropout, s.k(), s.v(), sdS, stage,
                                            m_block * Cfg::kBlockM, at, dscores_a, [] {});
    arch::named_barrier_sync(BwdWsBarriers::kDsWritten, kMath);
    dq_part_sm90<T, Cfg, /*kDkInFlight=*/true>(grads, dscores_a, stage, sdS, s.k(), s.dq(buffer), at, [] {}, [&] {
      arch::named_barrier_sync(BwdWsBarriers::kDqEmpty + 2 * buffer + at.warpgroup, BwdWsBarriers::kDqEmptyThreads);
    });
    arch::named_barrier_arrive(BwdWsBarriers::kDqFull + buffer, kSyncThreads);
    wait_for_dk(grads);  // dK's MMAs ran under the dQ store; then the stage is free
    if (stage_releaser) arch::mbarrier_arrive(s.stage_empty(slot.slot));
  }
  arch::named_barrier_sync(BwdWsBarriers::kDsFree, kMath);  // every math warp is done reading K, V and dS^T
  store_kv_gradients_sm90<T, Cfg, kMath>(grads, p, kb, dropout, s.base, at, math_tid,
                                         [] { arch::named_barrier_sync(BwdWsBarriers::kDsFree, kMath); });
}

// The frame both warp-specialized backward kernels share: the CTA's key block (zero gradients and
// out when no query sees it), the barriers and tensor maps, then the roles: the loader warp, the
// dQ-writer warp (write_dq(kb, lane)) and, after the register reallocation, the math warpgroups
// (compute(kb, math_tid), math_tid 0..kMathThreads-1).
template <typename T, typename Cfg, typename Smem, typename WriteDq, typename Compute>
__device__ __forceinline__ void run_bwd_ws_roles(const Smem& s, const BwdParams& p, const BwdTensorMaps& maps,
                                                 WriteDq&& write_dq, Compute&& compute) {
  const int tid = threadIdx.x, warpgroup = arch::warp_uniform(tid / arch::kWarpgroupThreads);
  const auto kb = BwdKeyBlock<Cfg::kBlockM, Cfg::kBlockN>::current(p);
  if (kb.template done_without_queries<T, Cfg::kHeadDim, Cfg::kThreads>(p, tid)) return;
  if (tid == 0) {
    arch::prefetch_tensor_map(&maps.q);
    arch::prefetch_tensor_map(&maps.dout);
    arch::prefetch_tensor_map(&maps.k);
    arch::prefetch_tensor_map(&maps.v);
    s.init_barriers();
  }
  __syncthreads();  // the barriers are initialized; the last CTA-wide barrier
  if (warpgroup == 0) {
    arch::release_registers_to<Cfg::kProducerRegs>();
    const int warp = tid / arch::kWarpSize, lane = tid % arch::kWarpSize;
    if (warp == 0) load_bwd_walk<Cfg>(s, p, maps, kb, lane);
    if (warp == 1) write_dq(kb, lane);
    return;
  }
  arch::claim_registers_to<Cfg::kMathRegs>();
  compute(kb, tid - arch::kWarpgroupThreads);
}

// kScoreExtras: compiled with dropout, softcap and ALiBi (features.h says why this is a template).
template <typename T, typename Cfg, bool kScoreExtras>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    bwd_kernel_sm90_ws(const __grid_constant__ BwdParams p, const __grid_constant__ BwdTensorMaps maps) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  const BwdWsSmem<Cfg> s{{arch::swizzle_aligned_dynamic_smem()}};
  run_bwd_ws_roles<T, Cfg>(
      s, p, maps, [&](const auto& kb, int lane) { write_bwd_dq<Cfg>(s, p, kb, lane); },
      [&](const auto& kb, int math_tid) { compute_bwd_walk<T, Cfg, kScoreExtras>(s, p, kb, math_tid); });
#else
  __trap();  // the launcher selects this kernel only where the sm_90a image is loaded
#endif
}

}  // namespace flash
