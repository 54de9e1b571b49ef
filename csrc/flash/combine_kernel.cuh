// Merges the split-KV kernel's partial results: for each (batch, head, token) row, the splits'
// fp32 outputs o_s (each normalized over its own keys) and lse_s give
//   lse = log(sum_s exp(lse_s)),   out = sum_s exp(lse_s - lse) * o_s.
// One warp per row; a row that no split saw a key for gets out 0 and lse +inf.
#pragma once

#include <cmath>

#include "arch/arch.cuh"
#include "params.h"
#include "tile_io.cuh"

namespace flash {

constexpr int kCombineWarps = 4;

template <typename T>
__global__ void __launch_bounds__(kCombineWarps * arch::kWarpSize) splitkv_combine_kernel(const SplitKvParams p) {
  const FwdParams& f = p.fwd;
  const int lane = threadIdx.x % arch::kWarpSize;
  const int64_t rows = static_cast<int64_t>(f.shape.batch) * f.shape.heads * f.shape.seqlen_q;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kCombineWarps + threadIdx.x / arch::kWarpSize;
  if (row >= rows) return;
  float lse_max = -INFINITY;
  for (int s = lane; s < p.num_splits; s += arch::kWarpSize) lse_max = fmaxf(lse_max, p.lse_accum[s * rows + row]);
  lse_max = arch::warp_max(lse_max);
  float total = 0.f;
  if (lse_max != -INFINITY)
    for (int s = lane; s < p.num_splits; s += arch::kWarpSize) total += expf(p.lse_accum[s * rows + row] - lse_max);
  total = arch::warp_sum(total);
  const bool empty = lse_max == -INFINITY;
  const float lse = empty ? INFINITY : lse_max + logf(total);
  if (lane == 0) f.lse[row] = lse;

  const int token = static_cast<int>(row % f.shape.seqlen_q);
  const int64_t batch_head = row / f.shape.seqlen_q;
  const int head = static_cast<int>(batch_head % f.shape.heads), batch = static_cast<int>(batch_head / f.shape.heads);
  T* out = static_cast<T*>(f.out.ptr) + batch * f.out.batch_stride + token * f.out.row_stride + head * f.out.head_stride;
  for (int col = lane * 4; col < f.shape.headdim; col += arch::kWarpSize * 4) {
    float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int s = 0; s < p.num_splits && !empty; ++s) {
      const float lse_s = p.lse_accum[s * rows + row];
      if (lse_s == -INFINITY) continue;
      const float w = expf(lse_s - lse);
      const float4 x = *reinterpret_cast<const float4*>(p.out_accum + (s * rows + row) * p.headdim_accum + col);
      o.x += w * x.x;
      o.y += w * x.y;
      o.z += w * x.z;
      o.w += w * x.w;
    }
    store_float4_as(out + col, o);
  }
}

}  // namespace flash
