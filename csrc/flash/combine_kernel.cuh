// Merges the split-KV kernel's partial results: for each (batch, head, token) row, the splits'
// fp32 outputs o_s (each normalized over its own keys) and lse_s give
//   lse = log(sum_s exp(lse_s)),   out = sum_s exp(lse_s - lse) * o_s.
// One warp per row; a row that no split saw a key for gets out 0 and lse +inf.
#pragma once

#include <cmath>

#include "arch/arch.cuh"
#include "common.cuh"
#include "params.h"
#include "splitkv_heuristic.h"
#include "tile_io.cuh"

namespace flash {

constexpr int kCombineWarps = 4;
// Just enough lse registers per lane for kMaxSplits splits: 4 in a 32-lane warp, 2 in a wave64
// (where 4 would hold and guard-test splits that cannot exist).
constexpr int kCombineSplitsPerLane = ceil_div(kMaxSplits, arch::kWarpSize);

// Each lane holds the lse of splits lane, lane + kWarpSize, ...; the weights exp(lse_s - lse) stay
// in those registers and reach the other lanes by shuffles, so the loads of the splits' outputs do
// not wait on one another (the first version re-read lse_s per split and column: 6.4 µs for 32
// rows, benchmarks/NOTES.md v6).
template <typename T>
__global__ void __launch_bounds__(kCombineWarps * arch::kWarpSize) splitkv_combine_kernel(const SplitKvParams p) {
  arch::wait_for_prior_grid();  // launched as dependent after the split-KV kernel, whose partials it reads
  const FwdParams& f = p.fwd;
  const int lane = threadIdx.x % arch::kWarpSize;
  const int64_t rows = static_cast<int64_t>(f.shape.batch) * f.shape.heads * f.shape.seqlen_q;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kCombineWarps + threadIdx.x / arch::kWarpSize;
  if (row >= rows) return;
  float weight[kCombineSplitsPerLane];
  float lse_max = -INFINITY;
#pragma unroll
  for (int c = 0; c < kCombineSplitsPerLane; ++c) {
    const int s = c * arch::kWarpSize + lane;
    weight[c] = s < p.num_splits ? p.lse_accum[s * rows + row] : -INFINITY;
    lse_max = fmaxf(lse_max, weight[c]);
  }
  lse_max = arch::warp_max(lse_max);
  const bool empty = lse_max == -INFINITY;
  float total = 0.f;
#pragma unroll
  for (int c = 0; c < kCombineSplitsPerLane; ++c) {
    weight[c] = empty || weight[c] == -INFINITY ? 0.f : expf(weight[c] - lse_max);
    total += weight[c];
  }
  total = arch::warp_sum(total);
  if (lane == 0) f.lse[row] = empty ? INFINITY : lse_max + logf(total);
  const float inv_total = empty ? 0.f : 1.f / total;

  const int token = static_cast<int>(row % f.shape.seqlen_q);
  const int64_t batch_head = row / f.shape.seqlen_q;
  const int head = static_cast<int>(batch_head % f.shape.heads), batch = static_cast<int>(batch_head / f.shape.heads);
  T* out = static_cast<T*>(f.out.ptr) + batch * f.out.batch_stride + token * f.out.row_stride + head * f.out.head_stride;
  // Every lane runs every pass, past the head dim too (hd 64 leaves half the lanes without a
  // column): the shuffles read other lanes' weights and need the whole warp (lanes that skipped
  // them once returned garbage weights, benchmarks/NOTES.md v20).
  for (int col0 = 0; col0 < f.shape.headdim; col0 += arch::kWarpSize * 4) {
    const int col = col0 + lane * 4;
    const bool has_column = col < f.shape.headdim;
    float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int c = 0; c < kCombineSplitsPerLane; ++c) {
      const int splits = min(arch::kWarpSize, p.num_splits - c * arch::kWarpSize);
#pragma unroll 8
      for (int l = 0; l < splits; ++l) {
        const float w = arch::shuffle(weight[c], l) * inv_total;
        if (!has_column) continue;
        const int s = c * arch::kWarpSize + l;
        const float4 x = *reinterpret_cast<const float4*>(p.out_accum + (s * rows + row) * p.headdim_accum + col);
        o.x += w * x.x;
        o.y += w * x.y;
        o.z += w * x.z;
        o.w += w * x.w;
      }
    }
    if (has_column) store_float4_as(out + col, o);
  }
}

}  // namespace flash
