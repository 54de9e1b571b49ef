// First step of the backward: dsum[b, h, i] = sum_d dout[b, i, h, d] * out[b, i, h, d] (float32),
// the row term of dS = P * (dP - dsum). One warp per (batch, query row, head).
#pragma once

#include "arch/arch.cuh"
#include "common.cuh"
#include "params.h"
#include "tile_io.cuh"

namespace flash {

constexpr int kPreprocessWarps = 8;

template <typename T>
__global__ void __launch_bounds__(kPreprocessWarps* arch::kWarpSize) bwd_preprocess_kernel(const BwdParams p) {
  const AttentionShape& shape = p.fwd.shape;
  const int lane = threadIdx.x % arch::kWarpSize;
  const int64_t row_id = static_cast<int64_t>(blockIdx.x) * kPreprocessWarps + threadIdx.x / arch::kWarpSize;
  if (row_id >= static_cast<int64_t>(shape.batch) * shape.seqlen_q * shape.heads) return;
  const int head = static_cast<int>(row_id % shape.heads);
  const int row = static_cast<int>((row_id / shape.heads) % shape.seqlen_q);
  const int batch = static_cast<int>(row_id / (static_cast<int64_t>(shape.heads) * shape.seqlen_q));
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

template <typename T>
cudaError_t run_bwd_preprocess(const BwdParams& params, cudaStream_t stream) {
  const int64_t rows = static_cast<int64_t>(params.fwd.shape.batch) * params.fwd.shape.seqlen_q * params.fwd.shape.heads;
  const unsigned blocks = static_cast<unsigned>((rows + kPreprocessWarps - 1) / kPreprocessWarps);
  bwd_preprocess_kernel<T><<<blocks, kPreprocessWarps * arch::kWarpSize, 0, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace flash
