// First step of the backward, one warp per row (batch, head, query row) of dq_accum, padded rows
// included: zeroes the row of dq_accum, and for real rows computes
// dsum[b, h, i] = sum_d dout[b, i, h, d] * out[b, i, h, d] (float32), the row term of
// dS = P * (dP - dsum).
#pragma once

#include "arch/arch.cuh"
#include "common.cuh"
#include "dq_accum.cuh"
#include "params.h"
#include "tile_io.cuh"

namespace flash {

constexpr int kPreprocessWarps = 8;

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(kPreprocessWarps* arch::kWarpSize) bwd_preprocess_kernel(const BwdParams p) {
  const AttentionShape& shape = p.fwd.shape;
  const int lane = threadIdx.x % arch::kWarpSize;
  const int64_t padded_rows = dq_accum_rows(shape.seqlen_q);
  const int64_t row_id = static_cast<int64_t>(blockIdx.x) * kPreprocessWarps + threadIdx.x / arch::kWarpSize;
  if (row_id >= static_cast<int64_t>(shape.batch) * shape.heads * padded_rows) return;
  const int row = static_cast<int>(row_id % padded_rows);
  const int head = static_cast<int>((row_id / padded_rows) % shape.heads);
  const int batch = static_cast<int>(row_id / (padded_rows * shape.heads));

  float* dq_row = p.dq_accum + DqAccum<kHeadDim>::row_offset(shape, batch, head, row);
  for (int col = lane * 4; col < kHeadDim; col += arch::kWarpSize * 4)
    *reinterpret_cast<float4*>(dq_row + col) = float4{0.f, 0.f, 0.f, 0.f};
  if (row >= shape.seqlen_q) return;

  const T* dout = element_ptr<const T>(p.dout, batch, row, head);
  const T* out = element_ptr<const T>(p.fwd.out, batch, row, head);
  float partial = 0.f;
  for (int col = lane * kElementsPer16B; col < shape.headdim; col += arch::kWarpSize * kElementsPer16B) {
    const uint4 dout_chunk = *reinterpret_cast<const uint4*>(dout + col);
    const uint4 out_chunk = *reinterpret_cast<const uint4*>(out + col);
    const T* d = reinterpret_cast<const T*>(&dout_chunk);
    const T* o = reinterpret_cast<const T*>(&out_chunk);
#pragma unroll
    for (int i = 0; i < kElementsPer16B; ++i) partial += arch::to_float(d[i]) * arch::to_float(o[i]);
  }
  const float total = arch::warp_sum(partial);
  if (lane == 0) p.dsum[row_vector_offset(shape, batch, head, row)] = total;
}

template <typename T, int kHeadDim>
cudaError_t run_bwd_preprocess(const BwdParams& params, cudaStream_t stream) {
  const AttentionShape& s = params.fwd.shape;
  const int64_t rows = static_cast<int64_t>(s.batch) * s.heads * dq_accum_rows(s.seqlen_q);
  const unsigned blocks = static_cast<unsigned>((rows + kPreprocessWarps - 1) / kPreprocessWarps);
  bwd_preprocess_kernel<T, kHeadDim><<<blocks, kPreprocessWarps * arch::kWarpSize, 0, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace flash
