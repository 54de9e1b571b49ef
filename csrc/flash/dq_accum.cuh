// The float32 buffer dQ is summed in across key blocks, and the pass that converts it to dq.
//
// Layout (params.h): (heads, dq_accum_head_rows, kColumns), each sequence's rows starting at its
// SequenceView::dq_accum_row0 with kDqAccumRowMultiple spare rows after it, so the rows of one
// query block of one head form one contiguous tile: the sm90 kernel adds a whole tile with one bulk
// reduction from a shared-memory copy. Within a row, the 16-byte units (4 floats) are XOR-swizzled
// by the row within the sequence. Every row of such a tile starts at the same bank; a warp's
// accumulator-fragment store (rows g and g + 8 of 8 row groups, 2 adjacent units each, one 8-byte
// store per lane) runs as two half-warps of 4 rows x 2 units.
// kColumns is dq_accum_columns(kHeadDim): kHeadDim, except 64 at hd 32 and 128 at hd 96, whose
// Hopper backward runs the next head dim's kernel (launch_bwd_sm90.cuh); columns past the call's
// head dim then hold zeros or whatever the spare rows hold, and nothing reads them.
// - Up to 128 columns, unit v is stored at v ^ (2 * (row % 4)): the XOR by an even 0..6 puts each
//   half-warp's 8 units in 8 different bank groups, 2 wavefronts per store, the ideal. With
//   v ^ (row % 8) they fell in 4 (Nsight Compute of the hd 128 backward counted every dQ store 2-way
//   conflicted, the math warps stalling there on the memory-instruction queue); the change made the
//   hd 64 / 128 backward 2-6% faster (H200, benchmarks/NOTES.md v25).
// - Above 128 columns (the head-split backward) v ^ (row % 8) stays: there the conflict-free swizzle
//   measured 5-8% slower (H200, v25), for a reason not found.
// kColumns is a multiple of 32, so the swizzle stays inside the row, and rows 8 apart share it.
// The preprocess zeroes the rows of every sequence, except with deterministic=True (dq_order.cuh: a
// slice's first add writes its tile); the spare rows are never zeroed, as nothing reads them: a
// whole-tile add that covers them adds into whatever they hold.
#pragma once

#include "arch/arch.cuh"
#include "common.cuh"
#include "dq_order.cuh"
#include "params.h"
#include "sequence.cuh"

namespace flash {

template <int kHeadDim>
struct DqAccum {
  static constexpr int kColumns = dq_accum_columns(kHeadDim);
  static_assert(kColumns % 32 == 0 && kColumns >= kHeadDim, "8 or more whole 16-byte units per row");

  // Offset of the first element of query row `row` (within the sequence) of `head`.
  __device__ __forceinline__ static int64_t row_offset(const BwdParams& p, const SequenceView& seq, int head, int row) {
    return (head * p.dq_accum_head_rows + seq.dq_accum_row0 + row) * kColumns;
  }

  // Offset of column `col` inside row `row` (any row of the same row % 8 gives the same answer).
  __device__ __forceinline__ static int col_offset(int row, int col) {
    const int swizzle = kColumns <= 128 ? 2 * (row % 4) : row % 8;
    return (((col / 4) ^ swizzle) * 4) + col % 4;
  }
};

// The convert pass's work split: a block of kThreads converts kRowsPerBlock rows of one (head,
// batch), each thread 8 columns (two 16-byte loads, one 16-byte store) of kPasses rows, every load
// issued before the first store: 50 µs at hd 128 / 16k tokens / 16 heads (4.0 TB/s), where one
// thread per 4 columns and row, with the (batch, head, row) split from a 64-bit row index, took 77
// µs, cuDNN's convert 57 (H200, benchmarks/NOTES.md v32): one 16-byte load in flight per thread and
// 64-bit divisions per 16 bytes. (kPasses 4 is the one value measured.)
template <int kHeadDim>
struct ConvertDqRows {
  static constexpr int kThreads = 256;
  static constexpr int kLanesPerRow = kHeadDim / 8;              // call head dims are multiples of 8
  static constexpr int kRowsPerPass = kThreads / kLanesPerRow;  // hd 96 / 192 leave 4 / 16 threads idle
  static constexpr int kPasses = 4;                              // 128 bytes of loads in flight per thread
  static constexpr int kRowsPerBlock = kRowsPerPass * kPasses;
  static_assert(kHeadDim % 8 == 0 && kLanesPerRow <= kThreads, "whole 8-column lanes, a row per pass at least");
};

__device__ __forceinline__ void add_float4(float4& sum, const float4& part) {
  sum.x += part.x;
  sum.y += part.y;
  sum.z += part.z;
  sum.w += part.w;
}

// dq[b, i, h, :headdim] = softmax_scale * dq_accum row (b, h, i), converted to T; rows past a
// sequence's own length skipped. Deterministic: the sum of the slices whose counter for the row is
// not 0, in slice order (dq_order.cuh). Grid: (row blocks, heads, batch), batch strided past 65535.
template <typename T, int kHeadDim>
__global__ void __launch_bounds__(ConvertDqRows<kHeadDim>::kThreads) convert_dq_kernel(const BwdParams p) {
  using Rows = ConvertDqRows<kHeadDim>;
  using Accum = DqAccum<kHeadDim>;
  const AttentionShape& shape = p.fwd.shape;
  const int lane = threadIdx.x % Rows::kLanesPerRow, col = 8 * lane;
  const int row0 = blockIdx.x * Rows::kRowsPerBlock + threadIdx.x / Rows::kLanesPerRow;
  const int head = blockIdx.y;
  if (threadIdx.x >= Rows::kRowsPerPass * Rows::kLanesPerRow || col >= shape.headdim) return;
  for (int batch = blockIdx.z; batch < shape.batch; batch += gridDim.z) {
    const SequenceView seq = SequenceView::of(p.fwd, batch);
    float4 sum[Rows::kPasses][2];
#pragma unroll
    for (int pass = 0; pass < Rows::kPasses; ++pass) {
      const int row = row0 + pass * Rows::kRowsPerPass;
      sum[pass][0] = sum[pass][1] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (row >= seq.seqlen_q) continue;
      const float* accum_row = p.dq_accum + Accum::row_offset(p, seq, head, row);
      const int lo = Accum::col_offset(row, col), hi = Accum::col_offset(row, col + 4);
      if (p.dq_semaphore == nullptr) {  // one slice, zeroed by the preprocess: no add, so no load waits
        sum[pass][0] = *reinterpret_cast<const float4*>(accum_row + lo);
        sum[pass][1] = *reinterpret_cast<const float4*>(accum_row + hi);
        continue;
      }
      for (int slice = 0; slice < p.dq_slices; ++slice) {
        if (p.dq_semaphore[dq_counter_index(shape, slice, batch, head, row / kMinBwdBlockM)] == 0)
          continue;  // no key block added into this slice's rows
        add_float4(sum[pass][0], *reinterpret_cast<const float4*>(accum_row + slice * p.dq_slice_stride + lo));
        add_float4(sum[pass][1], *reinterpret_cast<const float4*>(accum_row + slice * p.dq_slice_stride + hi));
      }
    }
    const float scale = p.fwd.softmax_scale;  // dS left it out (dscores_from_dprobs)
#pragma unroll
    for (int pass = 0; pass < Rows::kPasses; ++pass) {
      const int row = row0 + pass * Rows::kRowsPerPass;
      if (row >= seq.seqlen_q) continue;
      const float4 a = sum[pass][0], b = sum[pass][1];
      uint4 packed;
      packed.x = arch::pack_pair<T>(a.x * scale, a.y * scale);
      packed.y = arch::pack_pair<T>(a.z * scale, a.w * scale);
      packed.z = arch::pack_pair<T>(b.x * scale, b.y * scale);
      packed.w = arch::pack_pair<T>(b.z * scale, b.w * scale);
      *reinterpret_cast<uint4*>(seq.q_side<T>(p.dq, row, head) + col) = packed;
    }
  }
}

template <typename T, int kHeadDim>
cudaError_t run_convert_dq(const BwdParams& params, cudaStream_t stream) {
  using Rows = ConvertDqRows<kHeadDim>;
  const AttentionShape& s = params.fwd.shape;
  const dim3 grid(static_cast<unsigned>((s.seqlen_q + Rows::kRowsPerBlock - 1) / Rows::kRowsPerBlock),
                  static_cast<unsigned>(s.heads), static_cast<unsigned>(s.batch < 65535 ? s.batch : 65535));
  convert_dq_kernel<T, kHeadDim><<<grid, Rows::kThreads, 0, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace flash
