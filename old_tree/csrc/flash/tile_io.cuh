// Moving (rows x cols) tiles between global memory and padded shared memory, 16 bytes per
// access. Shared tiles are row-major with a stride of cols + 8 elements: the 16 extra bytes
// shift each row by 4 banks, so the 8 rows read by one ldmatrix hit distinct banks.
#pragma once

#include <cstdint>

#include "arch/arch.cuh"
#include "common.cuh"

namespace flash {

constexpr int kElementsPer16B = 8;  // fp16 / bf16

template <int kCols>
__host__ __device__ constexpr int padded_stride() {
  return kCols + kElementsPer16B;
}

// Issues cp.async copies of rows [0, rows_valid) x cols [0, cols_valid) of a global tile into a
// (kRows x kCols) shared tile; the rest is zero-filled. Caller commits and waits.
// Each thread owns one 16-byte column chunk and walks down the rows by pointer increments: keeping
// one address per chunk instead would pin ~2 registers per chunk across the whole K/V loop.
template <int kRows, int kCols, int kThreads, typename T>
__device__ __forceinline__ void load_tile_async(T* smem, const T* gmem, int64_t row_stride, int rows_valid,
                                                int cols_valid, int tid) {
  constexpr int kChunksPerRow = kCols / kElementsPer16B;
  constexpr int kRowsPerPass = kThreads / kChunksPerRow;  // threads past kRowsPerPass rows' worth idle
  constexpr int kPasses = ceil_div(kRows, kRowsPerPass);
  const int row0 = tid / kChunksPerRow;
  const int col = (tid % kChunksPerRow) * kElementsPer16B;
  if (kThreads % kChunksPerRow != 0 && row0 >= kRowsPerPass) return;
  const bool col_valid = col < cols_valid;
  const T* src = gmem + row0 * row_stride + col;
  const int64_t pass_stride = kRowsPerPass * row_stride;
  T* dst = smem + row0 * padded_stride<kCols>() + col;
#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass) {
    const int row = row0 + pass * kRowsPerPass;
    if (kRows % kRowsPerPass == 0 || row < kRows) {
      const bool valid = col_valid && row < rows_valid;
      arch::cp_async_16(dst + pass * kRowsPerPass * padded_stride<kCols>(), valid ? src : gmem, valid);
    }
    src += pass_stride;
  }
}

// load_tile_async's transposed twin, for a tile that an arch without transposing shared-memory
// loads (CDNA) reads with k contiguous: rows [0, rows_valid) x cols [0, cols_valid) of a global
// (kRows x kCols) tile land in column `row` of a shared (kCols x kRows) tile of stride
// padded_stride<kRows>(), zeros elsewhere. Synchronous, through registers: each thread's 16-byte
// chunk goes down one shared column as 8 two-byte stores; the caller's barrier publishes them.
template <int kRows, int kCols, int kThreads, typename T>
__device__ __forceinline__ void load_tile_transposed(T* smem, const T* gmem, int64_t row_stride, int rows_valid,
                                                     int cols_valid, int tid) {
  static_assert(sizeof(T) == 2, "16-bit elements");
  constexpr int kChunksPerRow = kCols / kElementsPer16B;
  constexpr int kChunks = kRows * kChunksPerRow;
  constexpr int kStride = padded_stride<kRows>();
#pragma unroll
  for (int i = 0; i < ceil_div(kChunks, kThreads); ++i) {
    const int chunk = tid + i * kThreads;
    const int row = chunk / kChunksPerRow;
    const int col = (chunk % kChunksPerRow) * kElementsPer16B;
    if (kChunks % kThreads == 0 || chunk < kChunks) {
      const bool valid = row < rows_valid && col < cols_valid;
      const uint4 v = valid ? *reinterpret_cast<const uint4*>(gmem + row * row_stride + col) : uint4{0, 0, 0, 0};
      const uint32_t words[4] = {v.x, v.y, v.z, v.w};
      uint16_t* column = reinterpret_cast<uint16_t*>(smem + col * kStride + row);
#pragma unroll
      for (int e = 0; e < kElementsPer16B; ++e)
        column[e * kStride] = static_cast<uint16_t>(words[e / 2] >> (16 * (e % 2)));
    }
  }
}

// Copies rows [0, rows_valid) x cols [0, cols_valid) of a (kRows x kCols) shared tile to global.
template <int kRows, int kCols, int kThreads, typename T>
__device__ __forceinline__ void store_tile(T* gmem, int64_t row_stride, const T* smem, int rows_valid, int cols_valid,
                                           int tid) {
  constexpr int kChunksPerRow = kCols / kElementsPer16B;
  constexpr int kChunks = kRows * kChunksPerRow;
#pragma unroll
  for (int i = 0; i < ceil_div(kChunks, kThreads); ++i) {
    const int chunk = tid + i * kThreads;
    const int row = chunk / kChunksPerRow;
    const int col = (chunk % kChunksPerRow) * kElementsPer16B;
    if ((kChunks % kThreads == 0 || chunk < kChunks) && row < rows_valid && col < cols_valid) {
      *reinterpret_cast<uint4*>(gmem + row * row_stride + col) =
          *reinterpret_cast<const uint4*>(smem + row * padded_stride<kCols>() + col);
    }
  }
}

// Writes zeros to rows [0, rows_valid) x cols [0, cols_valid) of a global tile.
template <int kRows, int kCols, int kThreads, typename T>
__device__ __forceinline__ void zero_tile(T* gmem, int64_t row_stride, int rows_valid, int cols_valid, int tid) {
  constexpr int kChunksPerRow = kCols / kElementsPer16B;
  constexpr int kChunks = kRows * kChunksPerRow;
  for (int chunk = tid; chunk < kChunks; chunk += kThreads) {
    const int row = chunk / kChunksPerRow;
    const int col = (chunk % kChunksPerRow) * kElementsPer16B;
    if (row < rows_valid && col < cols_valid) *reinterpret_cast<uint4*>(gmem + row * row_stride + col) = uint4{0, 0, 0, 0};
  }
}

// Issues 4-byte cp.async copies of a float vector's entries [0, valid) into smem[0, kLength),
// zero-filling the rest (lse and dsum rows are not 16-byte aligned).
template <int kLength, int kThreads>
__device__ __forceinline__ void load_vector_async(float* smem, const float* gmem, int valid, int tid) {
  for (int i = tid; i < kLength; i += kThreads) arch::cp_async_4(smem + i, i < valid ? gmem + i : gmem, i < valid);
}

// Writes 4 fp32 values as T to dst (8-byte aligned).
template <typename T>
__device__ __forceinline__ void store_float4_as(T* dst, float4 o) {
  uint2 bits;
  bits.x = arch::pack_pair<T>(o.x, o.y);
  bits.y = arch::pack_pair<T>(o.z, o.w);
  *reinterpret_cast<uint2*>(dst) = bits;
}

}  // namespace flash
