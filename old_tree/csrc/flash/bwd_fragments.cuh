// Element-wise backward work on fp32 accumulator fragments (a warp's kAtomM*MT x kAtomN*NT tile of
// S^T: rows are keys, columns queries), shared by the sm80 and sm90 backward kernels and, through
// the CDNA arch layer, their AMD build. The arch layer says which element each register holds
// (acc_row, acc_col) and how they group: kAccRows row slots of kAccValuesPerRow values
// (acc_value(h, j)), where value j of every row slot lies in one column, so a per-query value
// (lse, dsum) is read once per j: 2 columns per atom and lane on sm80, 16 on CDNA.
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
__device__ __forceinline__ void probs_from_logits(float (&scores_t)[MT][NT][arch::kAccRegs], const float* lse,
                                                  int col0, const FwdParams& fwd, int lane) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int j = 0; j < arch::kAccValuesPerRow; ++j) {
      const float lse_log2 = lse[col0 + nt * arch::kAtomN + arch::acc_col(lane, arch::acc_value(0, j))] * kLog2e;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < arch::kAccRows; ++h) {
          float& x = scores_t[mt][nt][arch::acc_value(h, j)];
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
__device__ __forceinline__ void dscores_from_dprobs_with(float (&dprobs_t)[MT][NT][arch::kAccRegs],
                                                         const float (&probs_t)[MT][NT][arch::kAccRegs],
                                                         const float* dsum, const float* lse, int col0,
                                                         const FwdParams& fwd, const DscoreContext<MT, NT>& ctx,
                                                         int lane) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    int local_query[arch::kAccValuesPerRow];
    float query_dsum[arch::kAccValuesPerRow], lse_log2[arch::kAccValuesPerRow];
#pragma unroll
    for (int j = 0; j < arch::kAccValuesPerRow; ++j) {
      local_query[j] = col0 + nt * arch::kAtomN + arch::acc_col(lane, arch::acc_value(0, j));
      query_dsum[j] = dsum[local_query[j]];
      lse_log2[j] = kSoftcap ? lse[local_query[j]] * kLog2e : 0.f;
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < arch::kAccRows; ++h)
#pragma unroll
        for (int j = 0; j < arch::kAccValuesPerRow; ++j) {
          const int r = arch::acc_value(h, j);  // row slot h, column j
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

// In place: dP^T -> dS^T = P^T * (dP^T * Z / keep_prob - dsum) * d(capped)/d(scaled), with Z the
// keep mask (FlashAttention 2's dropout backward) and dsum = rowsum(dO * O) indexed like lse above.
// probs_t is P^T before dropout. Without softmax_scale, as FlashAttention 2 does: the kernels scale
// dK's accumulators once in their epilogue (scale_dk_and_dv) and convert_dq_kernel scales dQ, one
// multiply per gradient element instead of one per score.
template <int MT, int NT>
__device__ __forceinline__ void dscores_from_dprobs(float (&dprobs_t)[MT][NT][arch::kAccRegs],
                                                    const float (&probs_t)[MT][NT][arch::kAccRegs],
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

// dscores_from_dprobs for a kernel that keeps its drop tests in a local, valid when dropout is
// enabled (key0, query0 as in DscoreContext). On CDNA the context's pointer is formed on each side
// of that test: as a select between the local and null, LLVM kept the tests in scratch. The m16n8
// layers keep the select, so the NVIDIA build stays what was measured (its PTX has the same
// 64-byte local copy of the tests; whether ptxas keeps it was not looked at in this port).
template <int MT, int NT>
__device__ __forceinline__ void dscores_from_dprobs(float (&dprobs_t)[MT][NT][arch::kAccRegs],
                                                    const float (&probs_t)[MT][NT][arch::kAccRegs],
                                                    const float* dsum, const float* lse, int col0, const FwdParams& fwd,
                                                    const ScoreMod& mod, const Dropout& dropout,
                                                    const BwdDropTests<MT, NT>& drop_tests, int key0, int query0,
                                                    int lane) {
  if constexpr (arch::kAccLayoutIsM16N8) {
    const DscoreContext<MT, NT> ctx{mod, dropout.enabled ? &drop_tests : nullptr, dropout.keep_scale, key0, query0};
    dscores_from_dprobs(dprobs_t, probs_t, dsum, lse, col0, fwd, ctx, lane);
  } else if (dropout.enabled) {
    const DscoreContext<MT, NT> ctx{mod, &drop_tests, dropout.keep_scale, key0, query0};
    dscores_from_dprobs(dprobs_t, probs_t, dsum, lse, col0, fwd, ctx, lane);
  } else {
    const DscoreContext<MT, NT> ctx{mod, nullptr, dropout.keep_scale, key0, query0};
    dscores_from_dprobs(dprobs_t, probs_t, dsum, lse, col0, fwd, ctx, lane);
  }
}

// In place: acc *= factor.
template <int MT, int NT>
__device__ __forceinline__ void scale_accumulators(float (&acc)[MT][NT][arch::kAccRegs], float factor) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int r = 0; r < arch::kAccRegs; ++r) acc[mt][nt][r] *= factor;
}

// In place, at the end of a key block's walk: dK *= softmax_scale (dS^T left it out) and, with
// dropout, dV *= 1 / keep_prob (P^T * Z left it out): dV = (P^T * Z / keep_prob).dO.
template <int MT, int NT>
__device__ __forceinline__ void scale_dk_and_dv(float (&dk)[MT][NT][arch::kAccRegs],
                                                float (&dv)[MT][NT][arch::kAccRegs], const FwdParams& fwd,
                                                const Dropout& dropout) {
  scale_accumulators(dk, fwd.softmax_scale);
  if (dropout.enabled) scale_accumulators(dv, dropout.keep_scale);
}

// Adds a warp's dQ fragment (rows row0.. of the query block at m0, head-dim columns col0..) into
// the dq_accum slice at `accum` with atomics, or stores it there (`overwrite`: the first turn of a
// deterministic slice, dq_order.cuh), two values at a time: values j, j + 1 (j even) of a row slot
// are adjacent columns (registers 2h, 2h + 1 on sm80; 4 consecutive columns per register group on
// CDNA). No bounds checks: dq_accum has whole query blocks and kHeadDim columns.
template <int kHeadDim, int MT, int NT>
__device__ __forceinline__ void add_dq_fragment(const float (&dq)[MT][NT][arch::kAccRegs], const BwdParams& p,
                                                float* accum, bool overwrite, const SequenceView& seq, int head,
                                                int m0, int row0, int col0, int lane) {
  using Layout = DqAccum<kHeadDim>;
  static_assert(arch::kAccValuesPerRow % 2 == 0, "whole pairs of adjacent columns per row slot");
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < arch::kAccRows; ++h) {
      const int row = m0 + row0 + mt * arch::kAtomM + arch::acc_row(lane, arch::acc_value(h, 0));
      float* dq_row = accum + Layout::row_offset(p, seq, head, row);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int j = 0; j < arch::kAccValuesPerRow; j += 2) {
          const int r = arch::acc_value(h, j);
          const int col = col0 + nt * arch::kAtomN + arch::acc_col(lane, r);
          float* dst = dq_row + Layout::col_offset(row, col);
          const float lo = dq[mt][nt][r], hi = dq[mt][nt][arch::acc_value(h, j + 1)];
          if (overwrite)
            *reinterpret_cast<float2*>(dst) = float2{lo, hi};
          else
            arch::atomic_add_pair(dst, lo, hi);
        }
    }
}

}  // namespace flash
