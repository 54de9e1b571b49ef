// Backward by recomputation: one CTA per (block of kBlockN keys, head, batch). K and V stay in
// shared memory; the CTA walks the query blocks that can see its keys and, per block:
//   1. S^T = K.Q^T and dP^T = V.dO^T                         (kBlockN x kBlockM, warps on a grid)
//      P^T = exp(logits^T - lse), dS^T = P^T * (dP^T - dsum) * scale   -> shared memory
//      (logits with the score modifiers and mask; dropout's keep bits on dP^T and P^T)
//   2. dV += P^T.dO,  dK += dS^T.Q                            (kBlockN x kHeadDim, registers)
//   3. dQ += dS.K, added into dq_accum (dq_accum.cuh) with atomics  (kBlockM x kHeadDim), in a
//      fixed order of key blocks when deterministic (dq_order.cuh)
// Each phase has its own warp layout, so every head dim gets a register-sized warp tile.
// With two stages, the next query block's Q, dO, lse and dsum load during the current one.
// On CDNA (launch_bwd_cdna.cuh) the copies are synchronous, and the products whose operands are
// not stored k-contiguous (dO and Q in phase 2, dS^T and K in phase 3) read them with 2-byte LDS
// reads (arch/cdna_gemm.cuh). Where 64 KiB of LDS cannot hold V and P^T as well, the CDNA tiles
// keep them in registers (BwdConfigVPInRegisters: the A operands of dP^T and dV); at hd 192 and 256
// the waves split the head dim in every phase instead, the score tile's k included, and sum its
// partial products through shared memory (BwdConfigDimSplit, bwd_score_split.cuh).
#pragma once

#include "arch/arch.cuh"
#include "bwd_fragments.cuh"
#include "bwd_key_block.cuh"
#include "bwd_register_operands.cuh"
#include "bwd_score_split.cuh"
#include "common.cuh"
#include "dropout.cuh"
#include "fragment_scores.cuh"
#include "launch_attributes.h"
#include "score_mod.cuh"
#include "sequence.cuh"
#include "mask.cuh"
#include "params.h"
#include "tile_io.cuh"

namespace flash {

// A warp layout of a (kRows x kCols) product over kWarps warps: kWarpsAlongRows x (the rest).
template <int kRows, int kCols, int kWarps, int kWarpsAlongRows>
struct WarpGrid {
  static constexpr int kWarpRows = kRows / kWarpsAlongRows;
  static constexpr int kWarpCols = kCols / (kWarps / kWarpsAlongRows);
  static constexpr int kMT = kWarpRows / arch::kAtomM;
  static constexpr int kNT = kWarpCols / arch::kAtomN;
  static_assert(kWarps % kWarpsAlongRows == 0, "warps split evenly");
  static_assert(kWarpRows % arch::kAtomM == 0 && kWarpCols % arch::kWarpTileColStep == 0, "whole atoms per warp");

  __device__ __forceinline__ static int row0(int warp) { return (warp % kWarpsAlongRows) * kWarpRows; }
  __device__ __forceinline__ static int col0(int warp) { return (warp / kWarpsAlongRows) * kWarpCols; }
};

template <int kHeadDim_, int kBlockM_, int kBlockN_, int kWarps_, int kScoreWarpsAlongKeys, int kKVWarpsAlongKeys,
          int kDqWarpsAlongQueries>
struct BwdConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;  // queries per step
  static constexpr int kBlockN = kBlockN_;  // keys per CTA
  static constexpr int kWarps = kWarps_;
  static constexpr int kThreads = kWarps * arch::kWarpSize;
  using ScoreGrid = WarpGrid<kBlockN, kBlockM, kWarps, kScoreWarpsAlongKeys>;  // S^T, dP^T
  using ScoreSplit = ScoreDimSplit<kHeadDim, 1>;  // one wave per score tile: no partial products
  using KVGrid = WarpGrid<kBlockN, kHeadDim, kWarps, kKVWarpsAlongKeys>;       // dK, dV
  using DqGrid = WarpGrid<kBlockM, kHeadDim, kWarps, kDqWarpsAlongQueries>;    // dQ
  static constexpr int kStride = padded_stride<kHeadDim>();
  static constexpr int kScoreStride = padded_stride<kBlockM>();
  // Shared memory, in bytes: K, V, P^T, dS^T once, then Q, dO, lse, dsum per stage.
  static constexpr int kKVBytes = kBlockN * kStride * 2;
  static constexpr int kScoreBytes = kBlockN * kScoreStride * 2;
  static constexpr int kStageBytes = 2 * kBlockM * kStride * 2 + 2 * kBlockM * 4;
  static constexpr int smem_bytes(int stages) { return 2 * kKVBytes + 2 * kScoreBytes + stages * kStageBytes; }
  // V and P^T in shared memory, elements of each (BwdConfigVPInRegisters keeps them in registers).
  static constexpr bool kVInRegisters = false;
  static constexpr bool kPtInRegisters = false;
  static constexpr int kVElements = kBlockN * kStride;
  static constexpr int kPtElements = kBlockN * kScoreStride;
  static constexpr int kScorePartialBytes = 0;  // after the stages (BwdConfigDimSplit)
  static constexpr int kDqColumnPasses = 1;      // dQ's warp tile in one pass (accumulate_dq)
  static_assert(kBlockM >= kMinBwdBlockM, "the deterministic counters are sized for kMinBwdBlockM");
  static_assert(kHeadDim % arch::kAtomK == 0 && kBlockM % arch::kAtomK == 0 && kBlockN % arch::kAtomK == 0,
                "whole k-steps");
};

// A BwdConfig that keeps V and P^T in registers (bwd_register_operands.cuh), for a shared memory
// that cannot hold them next to K, dS^T and Q / dO (CDNA). Every warp owns kBlockN / kWarps keys with
// all kBlockM queries in the score phase and the same keys in the dK / dV phase, so its P^T
// accumulators are the A operand of its dV rows. Shared memory: K, dS^T, then the stages; V passes
// through the first stage's place on its way into registers, and dV leaves through the place after
// K at the end.
template <int kHeadDim, int kBlockM, int kBlockN, int kWarps, int kDqWarpsAlongQueries>
struct BwdConfigVPInRegisters : BwdConfig<kHeadDim, kBlockM, kBlockN, kWarps, kWarps, kWarps, kDqWarpsAlongQueries> {
  using Base = BwdConfig<kHeadDim, kBlockM, kBlockN, kWarps, kWarps, kWarps, kDqWarpsAlongQueries>;
  static constexpr bool kVInRegisters = true;
  static constexpr bool kPtInRegisters = true;
  static constexpr int kVElements = 0;
  static constexpr int kPtElements = 0;
  static constexpr int smem_bytes(int stages) {
    return Base::kKVBytes + Base::kScoreBytes + stages * Base::kStageBytes;
  }
  static_assert(Base::kStageBytes >= Base::kKVBytes, "V passes through a stage's place");
  static_assert(Base::kScoreBytes + Base::kStageBytes >= Base::kKVBytes, "dV leaves through the place after K");
};

// A BwdConfig that splits the head dim over waves in every phase, for head dims where one wave
// cannot hold a key block's dK and dV and the step has fewer score atoms than waves (CDNA at hd
// 192 and 256, where 64 KiB of LDS holds one 32 x 32 score tile per step). kScoreWarpsAlongDims
// waves share each score tile, each over its slice of the head dim (bwd_score_split.cuh: slice 0
// sums the partial S^T and dP^T through shared memory and alone writes P^T and dS^T there); dK /
// dV and dQ are split by head-dim columns, every wave on all kBlockN keys and all kBlockM queries.
// kVInRegisters keeps V in registers, each wave its slice of the head dim (V passes through the
// first stage's place and dV leaves through the place after K, as in BwdConfigVPInRegisters).
// Shared memory: K, V unless in registers, P^T, dS^T, the stages, then the partial products.
template <int kHeadDim, int kBlockM, int kBlockN, int kWarps, int kScoreWarpsAlongDims, bool kVInRegisters_>
struct BwdConfigDimSplit : BwdConfig<kHeadDim, kBlockM, kBlockN, kWarps, kWarps, 1, 1> {
  using Base = BwdConfig<kHeadDim, kBlockM, kBlockN, kWarps, kWarps, 1, 1>;
  static constexpr int kScoreTiles = kWarps / kScoreWarpsAlongDims;
  using ScoreGrid = WarpGrid<kBlockN, kBlockM, kScoreTiles, kScoreTiles>;  // S^T, dP^T: its waves are the tiles
  using ScoreSplit = ScoreDimSplit<kHeadDim, kScoreWarpsAlongDims>;
  static constexpr bool kVInRegisters = kVInRegisters_;
  // dQ one column atom at a time: a whole 32 x 128 tile (64 fp32 per lane at hd 256) next to dK, dV
  // and V spilled 23-28 VGPRs in gfx942's score-extras kernel (benchmarks/NOTES.md).
  static constexpr int kDqColumnPasses = Base::DqGrid::kNT;
  static constexpr int kVElements = kVInRegisters ? 0 : Base::kVElements;
  static constexpr int kScorePartialBytes =
      ScoreSplit::template partial_bytes<ScoreGrid::kMT, ScoreGrid::kNT>(kScoreTiles);
  static constexpr int smem_bytes(int stages) {
    return (kVInRegisters ? 1 : 2) * Base::kKVBytes + 2 * Base::kScoreBytes + stages * Base::kStageBytes +
           kScorePartialBytes;
  }
  static_assert(kWarps % kScoreWarpsAlongDims == 0, "whole score tiles");
  static_assert(!kVInRegisters || Base::kStageBytes >= Base::kKVBytes, "V passes through a stage's place");
  static_assert(!kVInRegisters || Base::kScoreBytes + Base::kStageBytes >= Base::kKVBytes,
                "dV leaves through the place after K");
};

// One stage of per-query-block inputs in shared memory.
template <typename T, typename Cfg>
struct QueryStage {
  T* q;      // (kBlockM, kStride)
  T* dout;   // (kBlockM, kStride)
  float* lse;   // (kBlockM)
  float* dsum;  // (kBlockM)

  __device__ __forceinline__ static QueryStage at(unsigned char* base) {
    QueryStage s;
    s.q = reinterpret_cast<T*>(base);
    s.dout = s.q + Cfg::kBlockM * Cfg::kStride;
    s.lse = reinterpret_cast<float*>(s.dout + Cfg::kBlockM * Cfg::kStride);
    s.dsum = s.lse + Cfg::kBlockM;
    return s;
  }
};

template <typename T, typename Cfg, typename KeyBlock>
__device__ __forceinline__ void load_query_stage_async(const QueryStage<T, Cfg>& stage, const BwdParams& p,
                                                       const KeyBlock& kb, int m0, int tid) {
  const int rows = min(Cfg::kBlockM, kb.seq.seqlen_q - m0), headdim = p.fwd.shape.headdim;
  load_tile_async<Cfg::kBlockM, Cfg::kHeadDim, Cfg::kThreads>(
      stage.q, kb.seq.template q_side<T>(p.fwd.q, m0, kb.head), p.fwd.q.row_stride, rows, headdim, tid);
  load_tile_async<Cfg::kBlockM, Cfg::kHeadDim, Cfg::kThreads>(
      stage.dout, kb.seq.template q_side<T>(p.dout, m0, kb.head), p.dout.row_stride, rows, headdim, tid);
  const int64_t vector_offset = kb.query_vector_offset(p, m0);
  load_vector_async<Cfg::kBlockM, Cfg::kThreads>(stage.lse, p.fwd.lse + vector_offset, rows, tid);
  load_vector_async<Cfg::kBlockM, Cfg::kThreads>(stage.dsum, p.dsum + vector_offset, rows, tid);
}

// V, when the config keeps it in registers: through the first stage's place in shared memory (free
// until the first query block loads), into this warp's score-phase rows and head-dim slice.
template <typename T, typename Cfg, typename KeyBlock>
__device__ __forceinline__ void load_v_operands(VOperands<T, Cfg>& v_ops, unsigned char* stage_base,
                                                const BwdParams& p, const KeyBlock& kb, int warp, int lane, int tid) {
  T* staging = reinterpret_cast<T*>(stage_base);
  load_tile_async<Cfg::kBlockN, Cfg::kHeadDim, Cfg::kThreads>(staging, kb.template key_rows<T>(p.fwd.v, kb.head_k),
                                                              p.fwd.v.row_stride, kb.rows_k, p.fwd.shape.headdim, tid);
  arch::cp_async_commit();
  arch::cp_async_wait<0>();
  __syncthreads();
  using Split = typename Cfg::ScoreSplit;
  v_ops.load(staging, Cfg::ScoreGrid::row0(Split::tile_warp(warp)), Split::dim0(warp), lane);
  __syncthreads();  // every warp holds its V before the first stage overwrites it
}

// Phase 1: this warp's tile of P^T (dropped entries zeroed) and dS^T (keys x queries), written to
// shared memory as T (P^T into pt_ops instead when the config keeps it in registers). Where waves
// share a tile (Cfg::ScoreSplit), each computes S^T and dP^T over its head-dim slice, and the wave
// that sums them (through score_partials) writes P^T and dS^T.
template <typename T, typename Cfg>
__device__ __forceinline__ void compute_probs_and_dscores(T* sPt, T* sdSt, const T* sK, const T* sV,
                                                          float* score_partials, const VOperands<T, Cfg>& v_ops,
                                                          PtOperands<T, Cfg>& pt_ops, const QueryStage<T, Cfg>& stage,
                                                          const BwdParams& p, const AttentionMask& mask,
                                                          const ScoreMod& mod, const Dropout& dropout, bool needs_mask,
                                                          int m0, int n0, int warp, int lane) {
  using Grid = typename Cfg::ScoreGrid;
  using Split = typename Cfg::ScoreSplit;
  constexpr int kMT = Grid::kMT, kNT = Grid::kNT, kKSteps = Split::kKSteps;
  const int key0 = Grid::row0(Split::tile_warp(warp)), query0 = Grid::col0(Split::tile_warp(warp));
  const int dim0 = Split::dim0(warp);
  float scores_t[kMT][kNT][arch::kAccRegs];  // S^T: (kAtomM*kMT keys x kAtomN*kNT queries)
  float dprobs_t[kMT][kNT][arch::kAccRegs];  // dP^T
  arch::zero_accumulators(scores_t);
  arch::zero_accumulators(dprobs_t);
  arch::warp_gemm_ss<kMT, kNT, kKSteps, arch::Layout::kRowMajorMK, arch::BLayout::kNK>(
      scores_t, sK + dim0, Cfg::kStride, key0, stage.q + dim0, Cfg::kStride, query0, lane);
  if constexpr (Cfg::kVInRegisters) {
    arch::warp_gemm_rs<kMT, kNT, kKSteps, arch::BLayout::kNK>(dprobs_t, v_ops.a, stage.dout + dim0, Cfg::kStride,
                                                              query0, lane);
  } else {
    arch::warp_gemm_ss<kMT, kNT, kKSteps, arch::Layout::kRowMajorMK, arch::BLayout::kNK>(
        dprobs_t, sV + dim0, Cfg::kStride, key0, stage.dout + dim0, Cfg::kStride, query0, lane);
  }
  if constexpr (Split::kWarpsAlongDims > 1) {
    sum_score_partials<Split>(scores_t, dprobs_t, score_partials, warp, lane);
    if (!Split::finishes(warp)) return;
  }

  scores_to_logits</*kRowsAreKeys=*/true>(scores_t, mask, mod, needs_mask, n0 + key0, m0 + query0, lane);
  probs_from_logits(scores_t, stage.lse, query0, p.fwd, lane);
  BwdDropTests<kMT, kNT> drop_tests;
  if (dropout.enabled) drop_tests = drop_tests_bwd<kMT, kNT>(dropout, n0 + key0, m0 + query0, lane);
  dscores_from_dprobs(dprobs_t, scores_t, stage.dsum, stage.lse, query0, p.fwd, mod, dropout, drop_tests, n0 + key0,
                      m0, lane);
  if (dropout.enabled) drop_accumulators(scores_t, drop_tests);  // 1 / keep_prob: on dV, at the end
  if constexpr (Cfg::kPtInRegisters) {
    arch::accumulators_to_a_fragments<T>(pt_ops.a, scores_t);
  } else {
    arch::store_accumulators<kMT, kNT, T>(sPt, Cfg::kScoreStride, key0, query0, scores_t, lane);
  }
  arch::store_accumulators<kMT, kNT, T>(sdSt, Cfg::kScoreStride, key0, query0, dprobs_t, lane);
}

// Phase 3: dQ (queries x head dim) of this warp's tile, added into the float32 buffer in
// Cfg::kDqColumnPasses passes over its columns (fewer accumulators live at once).
template <typename T, typename Cfg>
__device__ __forceinline__ void accumulate_dq(const T* sdSt, const T* sK, const BwdParams& p, float* accum,
                                              bool overwrite, const SequenceView& seq, int head, int m0, int warp,
                                              int lane) {
  using Grid = typename Cfg::DqGrid;
  constexpr int kMT = Grid::kMT, kNT = Grid::kNT / Cfg::kDqColumnPasses;
  const int query0 = Grid::row0(warp);
#pragma unroll
  for (int pass = 0; pass < Cfg::kDqColumnPasses; ++pass) {
    const int dim0 = Grid::col0(warp) + pass * kNT * arch::kAtomN;
    float dq[kMT][kNT][arch::kAccRegs];  // (kAtomM*kMT queries x kAtomN*kNT head dims)
    arch::zero_accumulators(dq);
    arch::warp_gemm_ss<kMT, kNT, Cfg::kBlockN / arch::kAtomK, arch::Layout::kColMajorKM, arch::BLayout::kKN>(
        dq, sdSt, Cfg::kScoreStride, query0, sK, Cfg::kStride, dim0, lane);
    add_dq_fragment<Cfg::kHeadDim>(dq, p, accum, overwrite, seq, head, m0, query0, dim0, lane);
  }
}

// kScoreExtras: compiled with dropout, softcap and ALiBi (features.h says why this is a template).
template <typename T, typename Cfg, bool kScoreExtras>
__global__ void __launch_bounds__(Cfg::kThreads) bwd_kernel(const BwdParams p, int stages) {
  using KVGrid = typename Cfg::KVGrid;
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN;
  extern __shared__ __align__(16) unsigned char smem[];
  T* sK = reinterpret_cast<T*>(smem);                    // (kBlockN, kStride); holds dK at the end
  T* sV = sK + kBlockN * Cfg::kStride;                   // (kBlockN, kStride) unless in registers; dV at the end
  T* sPt = sV + Cfg::kVElements;                         // (kBlockN, kScoreStride) unless in registers
  T* sdSt = sPt + Cfg::kPtElements;                      // (kBlockN, kScoreStride)
  unsigned char* stage_base = reinterpret_cast<unsigned char*>(sdSt + kBlockN * Cfg::kScoreStride);
  float* score_partials = reinterpret_cast<float*>(stage_base + stages * Cfg::kStageBytes);  // kScorePartialBytes

  const int tid = threadIdx.x, lane = tid % arch::kWarpSize, warp = tid / arch::kWarpSize;
  const auto kb = BwdKeyBlock<kBlockM, kBlockN>::current(p);
  if (kb.template done_without_queries<T, Cfg::kHeadDim, Cfg::kThreads>(p, tid)) return;
  const int head = kb.head, n0 = kb.n0, steps = kb.query_blocks(), headdim = p.fwd.shape.headdim;
  const AttentionMask& mask = kb.mask;
  const ScoreMod mod = kScoreExtras ? kb.score_mod(p) : ScoreMod::none();
  const Dropout dropout = kScoreExtras ? kb.dropout(p) : Dropout::none();

  load_tile_async<kBlockN, Cfg::kHeadDim, Cfg::kThreads>(sK, kb.template key_rows<T>(p.fwd.k, kb.head_k),
                                                         p.fwd.k.row_stride, kb.rows_k, headdim, tid);
  VOperands<T, Cfg> v_ops;
  if constexpr (Cfg::kVInRegisters) {
    load_v_operands(v_ops, stage_base, p, kb, warp, lane, tid);
  } else {
    load_tile_async<kBlockN, Cfg::kHeadDim, Cfg::kThreads>(sV, kb.template key_rows<T>(p.fwd.v, kb.head_k),
                                                           p.fwd.v.row_stride, kb.rows_k, headdim, tid);
  }
  load_query_stage_async(QueryStage<T, Cfg>::at(stage_base), p, kb, kb.m_start * kBlockM, tid);
  arch::cp_async_commit();

  float dk_acc[KVGrid::kMT][KVGrid::kNT][arch::kAccRegs];  // this warp's (keys x head dim) tile of dK
  float dv_acc[KVGrid::kMT][KVGrid::kNT][arch::kAccRegs];
  arch::zero_accumulators(dk_acc);
  arch::zero_accumulators(dv_acc);
  const int kv_key0 = KVGrid::row0(warp), kv_dim0 = KVGrid::col0(warp);

  int m_block = kb.m_start;  // the query blocks, in the order of the walk (dq_order.cuh)
  for (int step = 0; step < steps; ++step, m_block = kb.query_block_after(m_block, 1)) {
    const int m0 = m_block * kBlockM;
    const bool more = step + 1 < steps;
    const int next_m0 = kb.query_block_after(m_block, more ? 1 : 0) * kBlockM;
    const int stage_index = stages == 2 ? step % 2 : 0;
    const QueryStage<T, Cfg> stage = QueryStage<T, Cfg>::at(stage_base + stage_index * Cfg::kStageBytes);
    arch::cp_async_wait<0>();
    __syncthreads();  // this block's inputs landed; the previous block's phases are done everywhere
    if (stages == 2 && more) {
      load_query_stage_async(QueryStage<T, Cfg>::at(stage_base + (1 - stage_index) * Cfg::kStageBytes), p, kb,
                             next_m0, tid);
      arch::cp_async_commit();
    }

    const bool needs_mask = !mask.block_fully_visible(m0, kBlockM, n0, kBlockN);
    PtOperands<T, Cfg> pt_ops;
    compute_probs_and_dscores<T, Cfg>(sPt, sdSt, sK, sV, score_partials, v_ops, pt_ops, stage, p, mask, mod, dropout,
                                      needs_mask, m0, n0, warp, lane);
    __syncthreads();

    constexpr int kKSteps = kBlockM / arch::kAtomK;
    if constexpr (Cfg::kPtInRegisters) {
      arch::warp_gemm_rs<KVGrid::kMT, KVGrid::kNT, kKSteps, arch::BLayout::kKN>(dv_acc, pt_ops.a, stage.dout,
                                                                                Cfg::kStride, kv_dim0, lane);
    } else {
      arch::warp_gemm_ss<KVGrid::kMT, KVGrid::kNT, kKSteps, arch::Layout::kRowMajorMK, arch::BLayout::kKN>(
          dv_acc, sPt, Cfg::kScoreStride, kv_key0, stage.dout, Cfg::kStride, kv_dim0, lane);
    }
    arch::warp_gemm_ss<KVGrid::kMT, KVGrid::kNT, kKSteps, arch::Layout::kRowMajorMK, arch::BLayout::kKN>(
        dk_acc, sdSt, Cfg::kScoreStride, kv_key0, stage.q, Cfg::kStride, kv_dim0, lane);
    const auto turn = kb.template dq_turn</*kDeterministic=*/true>(p, m_block);  // deterministic: add after the earlier key blocks
    if (turn.counter != nullptr) {
      if (tid == 0) turn.wait();
      __syncthreads();
    }
    accumulate_dq<T, Cfg>(sdSt, sK, p, turn.accum(p), turn.writes(), kb.seq, head, m0, warp, lane);
    if (turn.counter != nullptr) {
      __threadfence();
      __syncthreads();
      if (tid == 0) turn.release();
    }

    if (stages == 1 && more) {
      __syncthreads();  // every warp is done with this block's Q and dO
      load_query_stage_async(stage, p, kb, next_m0, tid);
      arch::cp_async_commit();
    }
  }

  scale_dk_and_dv(dk_acc, dv_acc, p.fwd, dropout);
  __syncthreads();  // every warp is done reading sK and sV
  arch::store_accumulators<KVGrid::kMT, KVGrid::kNT, T>(sK, Cfg::kStride, kv_key0, kv_dim0, dk_acc, lane);
  arch::store_accumulators<KVGrid::kMT, KVGrid::kNT, T>(sV, Cfg::kStride, kv_key0, kv_dim0, dv_acc, lane);
  __syncthreads();
  store_tile<kBlockN, Cfg::kHeadDim, Cfg::kThreads>(kb.template key_rows<T>(p.dk, head), p.dk.row_stride, sK,
                                                    kb.rows_k, headdim, tid);
  store_tile<kBlockN, Cfg::kHeadDim, Cfg::kThreads>(kb.template key_rows<T>(p.dv, head), p.dv.row_stride, sV,
                                                    kb.rows_k, headdim, tid);
}

// Launches bwd_kernel over the grid it reads: one CTA per key block, head and batch, with `smem`
// bytes of dynamic shared memory (Cfg::smem_bytes(stages)) opted in.
template <typename Cfg, typename Kernel>
cudaError_t launch_over_key_blocks(Kernel kernel, const BwdParams& params, int stages, cudaStream_t stream) {
  const int smem = Cfg::smem_bytes(stages);
  cudaError_t err = allow_dynamic_smem(kernel, smem);
  if (err != cudaSuccess) return err;
  const dim3 grid(ceil_div(params.fwd.shape.seqlen_k, Cfg::kBlockN), params.fwd.shape.heads, params.fwd.shape.batch);
  kernel<<<grid, Cfg::kThreads, smem, stream>>>(params, stages);
  return cudaGetLastError();
}

}  // namespace flash
