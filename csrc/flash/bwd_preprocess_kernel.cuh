// First step of the backward, a group of lanes per query row (batch, head, row < seqlen_q of the
// grid; rows past a sequence's own length skipped): dsum[b, h, i] = sum_d dout[b, i, h, d] *
// out[b, i, h, d] (float32), the row term of dS = P * (dP - dsum), laid out like lse. It also clears
// what the main kernel adds into: the row's dq_accum row, or with deterministic=True the dQ counters
// (dq_order.cuh). A cudaMemsetAsync did that before, one more launch and ~8 µs of host time per
// backward on the GPU machine (benchmarks/NOTES.md v11).
// Each lane reads 16 bytes of dout and of out, so a row takes kHeadDim / 8 lanes and a warp holds
// several rows; the grid is (row blocks, heads, batch). With a whole warp per row and the
// (batch, head, row) split from one 64-bit row index, hd 64 left 24 of 32 lanes idle and the
// divisions made the pass instruction-bound: 182 µs at b=8 s=2k h=32 hd 64 (ncu, H100, NOTES v13).
#pragma once

#include "arch/arch.cuh"
#include "common.cuh"
#include "dq_accum.cuh"
#include "dq_order.cuh"
#include "params.h"
#include "sequence.cuh"
#include "tile_io.cuh"

namespace flash {

constexpr int kPreprocessWarps = 8;

constexpr int power_of_two_at_least(int n) { return n <= 1 ? 1 : 2 * power_of_two_at_least((n + 1) / 2); }

template <int kHeadDim>
struct PreprocessRows {
  // 16 bytes of dout and of out per lane; a power of two of lanes per row, so rows tile the warp
  // (hd 96 and 192 leave a quarter of their row's lanes idle)
  static constexpr int kLanesPerRow = power_of_two_at_least(kHeadDim / kElementsPer16B);
  static constexpr int kRowsPerWarp = arch::kWarpSize / kLanesPerRow;
  static constexpr int kRowsPerBlock = kPreprocessWarps * kRowsPerWarp;
  static_assert(kHeadDim % kElementsPer16B == 0 && kLanesPerRow <= arch::kWarpSize, "whole rows per warp");
  static_assert(kMaxDqSlices <= kLanesPerRow, "one lane of a row clears each slice's counter");

  // Sum over the kLanesPerRow lanes of this lane's row (aligned groups of consecutive lanes).
  __device__ __forceinline__ static float row_sum(float v) {
#pragma unroll
    for (int mask = kLanesPerRow / 2; mask > 0; mask /= 2) v += arch::shuffle_xor(v, mask);
    return v;
  }
};

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(kPreprocessWarps* arch::kWarpSize) bwd_preprocess_kernel(const BwdParams p) {
  using Rows = PreprocessRows<kHeadDim>;
  const AttentionShape& shape = p.fwd.shape;
  const int lane_in_row = threadIdx.x % Rows::kLanesPerRow;
  const int row = blockIdx.x * Rows::kRowsPerBlock + threadIdx.x / Rows::kLanesPerRow;
  const int head = blockIdx.y;
  const int col = lane_in_row * kElementsPer16B;
  // Every lane runs every step (no early exit): the row sum shuffles over the whole warp.
  for (int batch = blockIdx.z; batch < shape.batch; batch += gridDim.z) {  // gridDim.z <= 65535
    if (row < shape.seqlen_q && p.dq_semaphore != nullptr && row % kMinBwdBlockM == 0 && lane_in_row < p.dq_slices)
      p.dq_semaphore[dq_counter_index(shape, lane_in_row, batch, head, row / kMinBwdBlockM)] = 0;
    const SequenceView seq = SequenceView::of(p.fwd, batch);
    const bool live = row < seq.seqlen_q;  // seq.seqlen_q <= shape.seqlen_q
    if (live && p.dq_semaphore == nullptr) {  // deterministic: a slice's first add writes its tile instead
      float* dq_row = p.dq_accum + DqAccum<kHeadDim>::row_offset(p, seq, head, row);
      for (int c = lane_in_row * 4; c < DqAccum<kHeadDim>::kColumns; c += Rows::kLanesPerRow * 4)
        *reinterpret_cast<float4*>(dq_row + c) = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    float partial = 0.f;
    if (live && col < shape.headdim) {  // kHeadDim is the kernel's: the call's head dim may be smaller
      const uint4 dout_chunk = *reinterpret_cast<const uint4*>(seq.q_side<const T>(p.dout, row, head) + col);
      const uint4 out_chunk = *reinterpret_cast<const uint4*>(seq.q_side<const T>(p.fwd.out, row, head) + col);
      const T* d = reinterpret_cast<const T*>(&dout_chunk);
      const T* o = reinterpret_cast<const T*>(&out_chunk);
#pragma unroll
      for (int i = 0; i < kElementsPer16B; ++i) partial += arch::to_float(d[i]) * arch::to_float(o[i]);
    }
    const float total = Rows::row_sum(partial);
    if (live && lane_in_row == 0) p.dsum[seq.row_vector_offset(p.fwd, head, row)] = total;
  }
}

template <typename T, int kHeadDim>
cudaError_t run_bwd_preprocess(const BwdParams& params, cudaStream_t stream) {
  const AttentionShape& s = params.fwd.shape;
  constexpr int kRows = PreprocessRows<kHeadDim>::kRowsPerBlock;
  const dim3 grid(static_cast<unsigned>((s.seqlen_q + kRows - 1) / kRows), static_cast<unsigned>(s.heads),
                  static_cast<unsigned>(s.batch < 65535 ? s.batch : 65535));
  bwd_preprocess_kernel<T, kHeadDim><<<grid, kPreprocessWarps * arch::kWarpSize, 0, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace flash
