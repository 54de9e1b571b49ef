// Forward: one CTA per (block of kBlockM queries, head, batch). Each warp owns kWarpRows query
// rows; the CTA walks the visible K/V blocks from the last one down (so the causal blocks that
// need masking come first), computing S = Q.K^T, the logits (score modifiers, mask), the online
// softmax, and O += P.V, with P kept in registers (dropped entries zeroed when dropout is on).
// K[n-1] loads while P.V[n] runs and V[n] loads while Q.K[n]^T runs (cp.async; on CDNA the
// copies are synchronous and V is stored transposed: arch/cdna.cuh, arch/cdna_gemm.cuh).
#pragma once

#include "arch/arch.cuh"
#include "common.cuh"
#include "dropout.cuh"
#include "fragment_scores.cuh"
#include "fwd_query_block.cuh"
#include "mask.cuh"
#include "params.h"
#include "softmax.cuh"
#include "tile_io.cuh"

namespace flash {

template <int kHeadDim_, int kBlockM_, int kBlockN_, int kWarps_>
struct FwdConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kWarps = kWarps_;
  static constexpr int kThreads = kWarps * arch::kWarpSize;
  static constexpr int kWarpRows = kBlockM / kWarps;
  static constexpr int kMT = kWarpRows / arch::kAtomM;  // row atoms per warp
  static constexpr int kNT = kBlockN / arch::kAtomN;    // score atoms per row
  static constexpr int kDT = kHeadDim / arch::kAtomN;   // output atoms per row
  static constexpr int kStride = padded_stride<kHeadDim>();
  // V, the B operand of P.V, as stored: [key][dim] where transposing loads read it so (ldmatrix
  // .trans), else [dim][key] (CDNA: MFMA operands are k-contiguous), transposed on its way in.
  static constexpr arch::BLayout kVLayout = arch::kHasTransposingLoads ? arch::BLayout::kKN : arch::BLayout::kNK;
  static constexpr int kVStride = kVLayout == arch::BLayout::kKN ? kStride : padded_stride<kBlockN>();
  static constexpr int kVElements = kVLayout == arch::BLayout::kKN ? kBlockN * kStride : kHeadDim * kVStride;
  static constexpr int kSmemBytes = ((kBlockM + kBlockN) * kStride + kVElements) * 2;  // Q (then O), K, V
  static_assert(kWarpRows % arch::kAtomM == 0, "each warp owns whole row atoms");
  static_assert(kHeadDim % arch::kAtomK == 0 && kBlockN % arch::kAtomK == 0 && kBlockN % arch::kAtomN == 0,
                "whole k-steps of Q.K^T and P.V, whole score atoms");
};

template <typename Cfg, typename T>
__device__ __forceinline__ void load_kv_block_async(T* smem, const T* gmem, int64_t row_stride, int n_block,
                                                    int seqlen_k, int headdim, int tid) {
  const int n0 = n_block * Cfg::kBlockN;
  load_tile_async<Cfg::kBlockN, Cfg::kHeadDim, Cfg::kThreads>(smem, gmem + n0 * row_stride, row_stride,
                                                              seqlen_k - n0, headdim, tid);
}

// V block n_block into shared memory as Cfg::kVLayout stores it.
template <typename Cfg, typename T>
__device__ __forceinline__ void load_v_block_async(T* smem, const T* gmem, int64_t row_stride, int n_block,
                                                   int seqlen_k, int headdim, int tid) {
  if constexpr (Cfg::kVLayout == arch::BLayout::kKN) {
    load_kv_block_async<Cfg>(smem, gmem, row_stride, n_block, seqlen_k, headdim, tid);
  } else {
    const int n0 = n_block * Cfg::kBlockN;
    load_tile_transposed<Cfg::kBlockN, Cfg::kHeadDim, Cfg::kThreads>(smem, gmem + n0 * row_stride, row_stride,
                                                                     seqlen_k - n0, headdim, tid);
  }
}

// kScoreExtras: compiled with dropout, softcap and ALiBi (features.h says why this is a template).
template <typename T, typename Cfg, bool kScoreExtras>
__global__ void __launch_bounds__(Cfg::kThreads) fwd_kernel(const FwdParams p) {
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kStride = Cfg::kStride;
  constexpr int kMT = Cfg::kMT, kNT = Cfg::kNT, kDT = Cfg::kDT;
  extern __shared__ __align__(16) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem);  // (kBlockM, kStride); holds O at the end
  T* sK = sQ + kBlockM * kStride;      // (kBlockN, kStride)
  T* sV = sK + kBlockN * kStride;      // (kBlockN, kStride), or (kHeadDim, kVStride) when kVLayout is kNK

  const int tid = threadIdx.x, lane = tid % arch::kWarpSize, warp = tid / arch::kWarpSize;
  record_rng_state(p.dropout, tid);
  const auto qb = FwdQueryBlock<kBlockM, kBlockN>::current(p);
  if (qb.template done_without_keys<T, Cfg::kHeadDim, Cfg::kThreads>(p, tid)) return;
  const int m0 = qb.m0, rows_q = qb.rows_q, seqlen_k = qb.seq.seqlen_k, headdim = p.shape.headdim;
  const AttentionMask& mask = qb.mask;
  const ScoreMod mod = qb.template score_mod<kScoreExtras>(p);
  const Dropout dropout = qb.template dropout<kScoreExtras>(p);
  const T* q = qb.seq.template q_side<T>(p.q, m0, qb.head);
  const T* k = qb.seq.template k_side<T>(p.k, 0, qb.head_k);
  const T* v = qb.seq.template k_side<T>(p.v, 0, qb.head_k);

  load_tile_async<kBlockM, Cfg::kHeadDim, Cfg::kThreads>(sQ, q, p.q.row_stride, rows_q, headdim, tid);
  load_kv_block_async<Cfg>(sK, k, p.k.row_stride, qb.n_end - 1, seqlen_k, headdim, tid);
  arch::cp_async_commit();

  const int warp_m0 = warp * Cfg::kWarpRows;  // this warp's first row inside the block
  float acc[kMT][kDT][arch::kAccRegs];        // O rows of this warp: (kAtomM*kMT x kHeadDim)
  arch::zero_accumulators(acc);
  OnlineSoftmax<kMT> softmax;
  softmax.init();

  for (int n_block = qb.n_end - 1; n_block >= qb.n_begin; --n_block) {
    load_v_block_async<Cfg>(sV, v, p.v.row_stride, n_block, seqlen_k, headdim, tid);
    arch::cp_async_commit();
    arch::cp_async_wait<1>();  // Q and K[n_block] have landed
    __syncthreads();

    float scores[kMT][kNT][arch::kAccRegs];  // S rows of this warp: (kAtomM*kMT x kBlockN)
    arch::zero_accumulators(scores);
    arch::warp_gemm_ss<kMT, kNT, Cfg::kHeadDim / arch::kAtomK, arch::Layout::kRowMajorMK, arch::BLayout::kNK>(
        scores, sQ, kStride, warp_m0, sK, kStride, 0, lane);
    const int n0 = n_block * kBlockN;
    scores_to_logits</*kRowsAreKeys=*/false>(scores, mask, mod, !mask.block_fully_visible(m0, rows_q, n0, kBlockN),
                                             m0 + warp_m0, n0, lane);
    softmax.update(scores, acc, p.logit_scale_log2);
    if (dropout.enabled) drop_probs_fwd(scores, dropout, m0 + warp_m0, n0, lane);
    arch::AFragment<T> probs[kMT][kBlockN / arch::kAtomK];  // P as A fragments of P.V, per k-step
    arch::accumulators_to_a_fragments<T>(probs, scores);

    __syncthreads();  // every warp is done reading sK
    if (n_block > qb.n_begin) load_kv_block_async<Cfg>(sK, k, p.k.row_stride, n_block - 1, seqlen_k, headdim, tid);
    arch::cp_async_commit();
    arch::cp_async_wait<1>();  // V[n_block] has landed
    __syncthreads();

    arch::warp_gemm_rs<kMT, kDT, kBlockN / arch::kAtomK, Cfg::kVLayout>(acc, probs, sV, Cfg::kVStride, 0, lane);
    __syncthreads();  // every warp is done reading sV
  }

  float row_lse[kMT][arch::kAccRows];
  softmax.finalize(acc, p.logit_scale, dropout.keep_scale, row_lse);
  float* lse = qb.lse(p);
  if (arch::is_row_leader(lane)) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int h = 0; h < arch::kAccRows; ++h) {
        const int row = warp_m0 + mt * arch::kAtomM + arch::acc_row(lane, arch::acc_value(h, 0));
        if (row < rows_q) lse[row] = row_lse[mt][h];
      }
  }
  arch::store_accumulators<kMT, kDT, T>(sQ, kStride, warp_m0, 0, acc, lane);  // this warp's own Q rows
  __syncthreads();
  store_tile<kBlockM, Cfg::kHeadDim, Cfg::kThreads>(qb.template out<T>(p), p.out.row_stride, sQ, rows_q, headdim, tid);
}

}  // namespace flash
