// First step of the backward, one warp per query row (batch, head, row < seqlen_q of the grid; rows
// past a sequence's own length skipped): dsum[b, h, i] = sum_d dout[b, i, h, d] * out[b, i, h, d]
// (float32), the row term of dS = P * (dP - dsum), laid out like lse. It also clears what the
// main kernel adds into: the row's dq_accum row, or with deterministic=True the dQ counters
// (dq_order.cuh). A cudaMemsetAsync did that before, one more launch and ~8 µs of host time per
// backward on the GPU machine (benchmarks/NOTES.md v11).
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
static_assert(kMaxDqSlices <= arch::kWarpSize, "one lane clears each slice's counter");

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(kPreprocessWarps* arch::kWarpSize) bwd_preprocess_kernel(const BwdParams p) {
  const AttentionShape& shape = p.fwd.shape;
  const int lane = threadIdx.x % arch::kWarpSize;
  const int64_t row_id = static_cast<int64_t>(blockIdx.x) * kPreprocessWarps + threadIdx.x / arch::kWarpSize;
  if (row_id >= static_cast<int64_t>(shape.batch) * shape.heads * shape.seqlen_q) return;
  const int row = static_cast<int>(row_id % shape.seqlen_q);
  const int head = static_cast<int>((row_id / shape.seqlen_q) % shape.heads);
  const int batch = static_cast<int>(row_id / (static_cast<int64_t>(shape.seqlen_q) * shape.heads));
  if (p.dq_semaphore != nullptr && row % kMinBwdBlockM == 0 && lane < p.dq_slices)
    p.dq_semaphore[dq_counter_index(shape, lane, batch, head, row / kMinBwdBlockM)] = 0;
  const SequenceView seq = SequenceView::of(p.fwd, batch);
  if (row >= seq.seqlen_q) return;
  if (p.dq_semaphore == nullptr) {  // deterministic: a slice's first add writes its tile instead
    float* dq_row = p.dq_accum + DqAccum<kHeadDim>::row_offset(p, seq, head, row);
    for (int col = lane * 4; col < kHeadDim; col += arch::kWarpSize * 4)
      *reinterpret_cast<float4*>(dq_row + col) = make_float4(0.f, 0.f, 0.f, 0.f);
  }

  const T* dout = seq.q_side<const T>(p.dout, row, head);
  const T* out = seq.q_side<const T>(p.fwd.out, row, head);
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
  if (lane == 0) p.dsum[seq.row_vector_offset(p.fwd, head, row)] = total;
}

template <typename T, int kHeadDim>
cudaError_t run_bwd_preprocess(const BwdParams& params, cudaStream_t stream) {
  const AttentionShape& s = params.fwd.shape;
  const int64_t rows = static_cast<int64_t>(s.batch) * s.heads * s.seqlen_q;
  const unsigned blocks = static_cast<unsigned>((rows + kPreprocessWarps - 1) / kPreprocessWarps);
  bwd_preprocess_kernel<T, kHeadDim><<<blocks, kPreprocessWarps * arch::kWarpSize, 0, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace flash
