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
template <int kRows, int kCols, int kThreads, typename T>
__device__ __forceinline__ void load_tile_async(T* smem, const T* gmem, int64_t row_stride, int rows_valid,
                                                int cols_valid, int tid) {
  constexpr int kChunksPerRow = kCols / kElementsPer16B;
  constexpr int kChunks = kRows * kChunksPerRow;
#pragma unroll
  for (int i = 0; i < ceil_div(kChunks, kThreads); ++i) {
    const int chunk = tid + i * kThreads;
    if (kChunks % kThreads == 0 || chunk < kChunks) {
      const int row = chunk / kChunksPerRow;
      const int col = (chunk % kChunksPerRow) * kElementsPer16B;
      const bool valid = row < rows_valid && col < cols_valid;
      const T* src = valid ? gmem + row * row_stride + col : gmem;
      arch::cp_async_16(smem + row * padded_stride<kCols>() + col, src, valid);
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

}  // namespace flash
