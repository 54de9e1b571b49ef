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

// dq[b, i, h, :headdim] = softmax_scale * dq_accum row (b, h, i), converted to T. One thread per 4 columns; rows
// (b, h, i < seqlen_q of the grid), those past a sequence's own length skipped. Deterministic: the
// sum of the slices whose counter for the row is not 0, in slice order (dq_order.cuh).
template <typename T, int kHeadDim>
__global__ void __launch_bounds__(256) convert_dq_kernel(const BwdParams p) {
  constexpr int kUnits = kHeadDim / 4;
  constexpr int kRowsPerBlock = 256 / kUnits;
  const AttentionShape& shape = p.fwd.shape;
  const int unit = threadIdx.x % kUnits;
  const int64_t row_id = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kUnits;
  if (row_id >= static_cast<int64_t>(shape.batch) * shape.heads * shape.seqlen_q || 4 * unit >= shape.headdim) return;
  const int row = static_cast<int>(row_id % shape.seqlen_q);
  const int head = static_cast<int>((row_id / shape.seqlen_q) % shape.heads);
  const int batch = static_cast<int>(row_id / (static_cast<int64_t>(shape.seqlen_q) * shape.heads));
  const SequenceView seq = SequenceView::of(p.fwd, batch);
  if (row >= seq.seqlen_q) return;
  const int64_t offset = DqAccum<kHeadDim>::row_offset(p, seq, head, row) + DqAccum<kHeadDim>::col_offset(row, 4 * unit);
  float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int slice = 0; slice < p.dq_slices; ++slice) {
    if (p.dq_semaphore != nullptr &&
        p.dq_semaphore[dq_counter_index(shape, slice, batch, head, row / kMinBwdBlockM)] == 0)
      continue;  // no key block added into this slice's rows
    const float4 part = *reinterpret_cast<const float4*>(p.dq_accum + slice * p.dq_slice_stride + offset);
    v.x += part.x;
    v.y += part.y;
    v.z += part.z;
    v.w += part.w;
  }
  const float scale = p.fwd.softmax_scale;  // dS left it out (dscores_from_dprobs)
  uint2 packed;
  packed.x = arch::pack_pair<T>(v.x * scale, v.y * scale);
  packed.y = arch::pack_pair<T>(v.z * scale, v.w * scale);
  *reinterpret_cast<uint2*>(seq.q_side<T>(p.dq, row, head) + 4 * unit) = packed;
}

template <typename T, int kHeadDim>
cudaError_t run_convert_dq(const BwdParams& params, cudaStream_t stream) {
  constexpr int kRowsPerBlock = 256 / (kHeadDim / 4);
  const AttentionShape& s = params.fwd.shape;
  const int64_t rows = static_cast<int64_t>(s.batch) * s.heads * s.seqlen_q;
  convert_dq_kernel<T, kHeadDim><<<static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock), 256, 0, stream>>>(
      params);
  return cudaGetLastError();
}

}  // namespace flash
