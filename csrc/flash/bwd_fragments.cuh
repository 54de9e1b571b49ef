// Element-wise backward work on fp32 accumulator fragments in the mma.sync C layout (a warp's
// 16*MT x 8*NT tile of S^T: rows are keys, columns queries), shared by the sm80 and sm90 backward
// kernels.
#pragma once

#include "arch/arch.cuh"
#include "common.cuh"
#include "dq_accum.cuh"
#include "dropout.cuh"
#include "params.h"
#include "score_mod.cuh"
#include "sequence.cuh"

namespace flash {

constexpr float kLog2e = 1.4426950408889634f;

// In place: logits x^T -> P^T = exp(x^T * logit_scale - lse). lse is indexed by the tile's local
// query column (col0 + ...), where col0 is the fragment's first column.
template <int MT, int NT>
__device__ __forceinline__ void probs_from_logits(float (&scores_t)[MT][NT][4], const float* lse, int col0,
                                                  const FwdParams& fwd, int lane) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const float lse_log2 = lse[col0 + nt * arch::kAtomN + arch::acc_col(lane, j)] * kLog2e;  // r = j and j + 2
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float& x = scores_t[mt][nt][2 * h + j];
          x = arch::exp2_approx(fmaf(x, fwd.logit_scale_log2, -lse_log2));
        }
    }
}

// The element pieces dS needs besides P and dP: the score modifiers, dropout's drop tests (null
// without dropout) and 1 / keep_prob, and where the fragment sits: key0 the absolute key of its row 0,
// query0 the absolute query of local query column 0 (the query block's first query).
template <int MT, int NT>
struct DscoreContext {
  const ScoreMod& mod;
  const BwdDropTests<MT, NT>* drop_tests;
  float keep_scale;
  int key0, query0;
};

// dscores_from_dprobs for one combination of dropout and softcap, known at compile time: no branch
// per element.
template <bool kDropout, bool kSoftcap, int MT, int NT>
__device__ __forceinline__ void dscores_from_dprobs_with(float (&dprobs_t)[MT][NT][4],
                                                         const float (&probs_t)[MT][NT][4], const float* dsum,
                                                         const float* lse, int col0, const FwdParams& fwd,
                                                         const DscoreContext<MT, NT>& ctx, int lane) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    int local_query[2];
    float query_dsum[2], lse_log2[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      local_query[j] = col0 + nt * arch::kAtomN + arch::acc_col(lane, j);
      query_dsum[j] = dsum[local_query[j]];
      lse_log2[j] = kSoftcap ? lse[local_query[j]] * kLog2e : 0.f;
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int j = r % 2;  // accumulator register r = 2 h + j: row slot h, column j
        const float dp = dprobs_t[mt][nt][r];
        const float p = probs_t[mt][nt][r];
        float ds;
        if constexpr (kDropout) {  // dP * Z / keep_prob - dsum as one multiply-add, Z by clearing dropped dP
          ds = p * fmaf(clear_if(dp, ctx.drop_tests->element_mask(mt, nt, r)), ctx.keep_scale, -query_dsum[j]);
        } else {
          ds = p * (dp - query_dsum[j]);
        }
        if constexpr (kSoftcap) {
          const int key = ctx.key0 + mt * arch::kAtomM + arch::acc_row(lane, r);
          ds *= ctx.mod.capped_derivative(p, lse_log2[j], ctx.query0 + local_query[j], key);
        }
        dprobs_t[mt][nt][r] = ds;
      }
    }
  }
}

// In place: dP^T -> dS^T = P^T * (dP^T * Z / keep_prob - dsum) * d(capped)/d(scaled), with Z the
// keep mask (FlashAttention 2's dropout backward) and dsum = rowsum(dO * O) indexed like lse above.
// probs_t is P^T before dropout. Without softmax_scale, as FlashAttention 2 does: the kernels scale
// dK's accumulators once in their epilogue (scale_dk_and_dv) and convert_dq_kernel scales dQ, one
// multiply per gradient element instead of one per score.
template <int MT, int NT>
__device__ __forceinline__ void dscores_from_dprobs(float (&dprobs_t)[MT][NT][4], const float (&probs_t)[MT][NT][4],
                                                    const float* dsum, const float* lse, int col0, const FwdParams& fwd,
                                                    const DscoreContext<MT, NT>& ctx, int lane) {
  if (ctx.drop_tests != nullptr) {
    if (ctx.mod.has_softcap()) {
      dscores_from_dprobs_with<true, true>(dprobs_t, probs_t, dsum, lse, col0, fwd, ctx, lane);
    } else {
      dscores_from_dprobs_with<true, false>(dprobs_t, probs_t, dsum, lse, col0, fwd, ctx, lane);
    }
  } else if (ctx.mod.has_softcap()) {
    dscores_from_dprobs_with<false, true>(dprobs_t, probs_t, dsum, lse, col0, fwd, ctx, lane);
  } else {
    dscores_from_dprobs_with<false, false>(dprobs_t, probs_t, dsum, lse, col0, fwd, ctx, lane);
  }
}

// In place: acc *= factor.
template <int MT, int NT>
__device__ __forceinline__ void scale_accumulators(float (&acc)[MT][NT][4], float factor) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[mt][nt][r] *= factor;
}

// In place, at the end of a key block's walk: dK *= softmax_scale (dS^T left it out) and, with
// dropout, dV *= 1 / keep_prob (P^T * Z left it out): dV = (P^T * Z / keep_prob).dO.
template <int MT, int NT>
__device__ __forceinline__ void scale_dk_and_dv(float (&dk)[MT][NT][4], float (&dv)[MT][NT][4], const FwdParams& fwd,
                                                const Dropout& dropout) {
  scale_accumulators(dk, fwd.softmax_scale);
  if (dropout.enabled) scale_accumulators(dv, dropout.keep_scale);
}

// Adds a warp's dQ fragment (rows row0.. of the query block at m0, head-dim columns col0..) into
// the dq_accum slice at `accum` with atomics, or stores it there (`overwrite`: the first turn of a
// deterministic slice, dq_order.cuh). No bounds checks: dq_accum has whole query blocks and
// kHeadDim columns.
template <int kHeadDim, int MT, int NT>
__device__ __forceinline__ void add_dq_fragment(const float (&dq)[MT][NT][4], const BwdParams& p, float* accum,
                                                bool overwrite, const SequenceView& seq, int head, int m0, int row0,
                                                int col0, int lane) {
  using Layout = DqAccum<kHeadDim>;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = m0 + row0 + mt * arch::kAtomM + arch::acc_row(lane, 2 * h);
      float* dq_row = accum + Layout::row_offset(p, seq, head, row);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        float* dst = dq_row + Layout::col_offset(row, col0 + nt * arch::kAtomN + arch::acc_col(lane, 0));
        if (overwrite)
          *reinterpret_cast<float2*>(dst) = float2{dq[mt][nt][2 * h], dq[mt][nt][2 * h + 1]};
        else
          arch::atomic_add_pair(dst, dq[mt][nt][2 * h], dq[mt][nt][2 * h + 1]);
      }
    }
}

}  // namespace flash
