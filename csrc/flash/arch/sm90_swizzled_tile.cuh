// Hopper (sm_90a) wgmma shared-memory operands in the 128-byte swizzled layout, and the cp.async
// loader that fills them.
//
// Why a second layout (the no-swizzle CoreTile of sm90_wgmma.cuh is simpler): filling a CoreTile
// without shared-memory bank conflicts needs each warp's 16-byte copies to cover whole core
// matrices (8 rows x 16 bytes), so a warp reads only 64 bytes per global row, half a 128-byte L2
// line, and a tile costs twice the L2 tag lookups. ncu of the forward showed L2 tag requests at 76%
// of peak with the tensor pipe at 29%. In this layout each row of 64 elements (128 bytes) is one
// shared-memory row whose 16-byte chunks are permuted by XOR with (row % 8): eight threads copying
// one global line land in eight different bank groups.
//
// Layout of a (kRows x kCols) tile of 16-bit elements, kCols a multiple of 64, base 1024-byte
// aligned: column block b = col / 64 holds rows [0, kRows) at 128 bytes each, blocks kRows * 128
// bytes apart; element (row, col) sits in 16-byte chunk ((col % 64) / 8) ^ (row % 8) of its row.
// wgmma reads it with swizzle mode 1 (128 B): the hardware applies the same XOR to address bits
// [4, 7) from bits [7, 10), which is why the base must be 1024-byte aligned.
//   K-major view (rows = M or N, cols = K): 8-row groups 1024 bytes apart (stride offset); a k-step
//     (16 columns, 32 bytes) advances the start address inside the 128-byte row; the leading
//     offset is unused.
//   MN-major view (rows = K, cols = M or N): 8-row (K) groups 1024 bytes apart (stride offset),
//     64-column blocks kRows * 128 bytes apart (leading offset); an operand may start inside a
//     block (the backward's dQ splits K's head dim 64 in two halves of 32).
#pragma once

#include <cstdint>

#include "sm80.cuh"
#include "sm90_wgmma.cuh"

namespace flash {
namespace arch {

constexpr int kSwizzleRowBytes = 128;
constexpr int kSwizzleAtomBytes = 1024;  // 8 rows of 128 bytes: the period of the XOR pattern

// Matrix descriptor with the 128-byte swizzle (layout type 1 in bits 62-63).
__device__ __forceinline__ uint64_t smem_descriptor_swizzle128(const void* start, uint32_t leading_bytes,
                                                               uint32_t stride_bytes) {
  return smem_descriptor(start, leading_bytes, stride_bytes) | (uint64_t{1} << 62);
}

// The kernel's dynamic shared memory, checked to start 1024-byte aligned as the swizzle needs (it
// has a name of its own: the sm80 kernels declare theirs with alignment 16, and one name may not
// carry two alignments in a translation unit).
__device__ __forceinline__ unsigned char* swizzle_aligned_dynamic_smem() {
  extern __shared__ __align__(1024) unsigned char smem_aligned_1024[];
  if (smem_address(smem_aligned_1024) % kSwizzleAtomBytes != 0) __trap();
  return smem_aligned_1024;
}

template <int kRows, int kCols>
struct SwizzledTile {
  static_assert(kRows % 8 == 0 && kCols % 64 == 0, "whole 8-row atoms and 64-column blocks");
  static constexpr int kBlockBytes = kRows * kSwizzleRowBytes;  // one 64-column block of every row
  static constexpr int kBytes = kRows * kCols * 2;
  static constexpr int kKSteps = kCols / 16;  // K-major k-steps of 32 bytes (16-bit k16, 8-bit k32)

  __device__ __forceinline__ static int byte_offset(int row, int col) {
    return (col / 64) * kBlockBytes + row * kSwizzleRowBytes + ((((col % 64) / 8) ^ (row % 8)) * 16) + (col % 8) * 2;
  }

  // Operand whose rows are M (or N) and columns K: the rows from row0 (a multiple of 8), k-step ks.
  __device__ __forceinline__ static uint64_t k_major(const void* tile, int row0, int ks) {
    return advance_descriptor(smem_descriptor_swizzle128(tile, 16, kSwizzleAtomBytes),
                              (ks / 4) * kBlockBytes + (row0 / 8) * kSwizzleAtomBytes + (ks % 4) * 32);
  }

  // Operand whose rows are K and columns M (or N): columns from col0 (a multiple of 8), k-step ks.
  // Inside a 64-column block the start moves by whole 16-byte chunks, as a k-step does in the
  // K-major view: the hardware swizzles the final address.
  __device__ __forceinline__ static uint64_t mn_major(const void* tile, int col0, int ks) {
    return advance_descriptor(smem_descriptor_swizzle128(tile, kBlockBytes, kSwizzleAtomBytes),
                              (col0 / 64) * kBlockBytes + ((col0 % 64) / 8) * 16 + ks * 2 * kSwizzleAtomBytes);
  }
};

// A SwizzledTile<kRows, kCols> as an ldmatrix operand of the sm80 warp GEMMs (tile_view.cuh): the
// Hopper decode reads its TMA-filled K and V slots so. The 8 rows one ldmatrix matrix reads share
// a chunk index and differ in row % 8, so the XOR puts them in 8 different bank groups.
template <typename T, int kRows>
struct SwizzledTileView {
  using Element = T;
  const T* ptr;

  __device__ __forceinline__ const T* chunk(int row, int col) const {
    return ptr + (col / 64) * (kRows * 64) + row * 64 + ((((col % 64) / 8) ^ (row % 8)) * 8);
  }
};

// Issues cp.async copies of rows [0, rows_valid) x cols [0, cols_valid) of a global tile (rows
// row_stride elements apart) into a SwizzledTile; the rest is zero-filled. Caller commits and
// waits. Consecutive threads take consecutive 16-byte chunks of a row, so every eight threads read
// one whole 128-byte line and write one 128-byte shared row (all bank groups). A pass covers a
// multiple of 8 rows, so each thread's XOR term is fixed and it walks rows by pointer increments.
template <int kRows, int kCols, int kThreads, typename T>
__device__ __forceinline__ void load_swizzled_tile_async(void* tile, const T* gmem, int64_t row_stride, int rows_valid,
                                                         int cols_valid, int tid) {
  constexpr int kChunksPerRow = kCols / 8;
  static_assert(kThreads % kChunksPerRow == 0, "threads cover whole rows");
  constexpr int kRowsPerPass = kThreads / kChunksPerRow;
  static_assert(kRowsPerPass % 8 == 0 && kRows % kRowsPerPass == 0, "whole 8-row atoms per pass, whole passes");
  const int row0 = tid / kChunksPerRow;
  const int col = (tid % kChunksPerRow) * 8;
  const bool col_valid = col < cols_valid;
  const T* src = gmem + row0 * row_stride + col;
  char* dst = static_cast<char*>(tile) + SwizzledTile<kRows, kCols>::byte_offset(row0, col);
#pragma unroll
  for (int pass = 0; pass < kRows / kRowsPerPass; ++pass) {
    const bool valid = col_valid && row0 + pass * kRowsPerPass < rows_valid;
    cp_async_16(dst, valid ? src : gmem, valid);
    src += kRowsPerPass * row_stride;
    dst += kRowsPerPass * kSwizzleRowBytes;
  }
}

// The address lane `lane` gives stmatrix.x4 (stmatrix_x4) to store a warp's 16 rows from row0 (a
// multiple of 8) at 32-byte column step `step` of a SwizzledTile Tile (16 16-bit columns; 4 steps a
// 128-byte row, step / 4 the 64-column block): matrix m is rows row0 + 8 (m % 2) at 16-byte chunk
// 2 (step % 4) + m / 2, lane l names row l % 8 of matrix l / 8, and that chunk sits at
// (chunk ^ row % 8) of its swizzled row, so the 8 rows of a matrix hit 8 different bank groups.
template <typename Tile>
__device__ __forceinline__ uint32_t swizzled_stmatrix_address(const void* tile, int row0, int step, int lane) {
  const int matrix = lane / 8, row_in_atom = lane % 8;
  const int chunk = 2 * (step % 4) + matrix / 2;
  return smem_address(tile) + (step / 4) * Tile::kBlockBytes +
         (row0 + row_in_atom + 8 * (matrix % 2)) * kSwizzleRowBytes + ((chunk ^ row_in_atom) * 16);
}

// Writes a warp's fp32 accumulators (16 rows from row0 x 8*NT columns, as T) into a SwizzledTile
// Tile, one stmatrix.x4 per 16 columns j (register r: rows row0 + 8 (r % 2) of 8-column atom
// 2j + r / 2, the lane's pair as the accumulators hold it). Per thread only 4 addresses (j % 4;
// the blocks are immediate offsets), where one 32-bit store per pair needed 8 and four times the
// stores: ptxas hoisted those out of the tile loop and spilled them, and the fp8 hd 256 epilogue
// waited on their reloads (5% of the kernel's stall samples at 4k causal, ncu, benchmarks/NOTES.md
// v43). row0: a multiple of 8.
template <typename Tile, int NT, typename T>
__device__ __forceinline__ void store_accumulators_swizzled(void* tile, int row0, const float (&c)[1][NT][4], int lane) {
  static_assert(NT % 2 == 0, "whole 16-column steps");
#pragma unroll
  for (int j = 0; j < NT / 2; ++j)
    stmatrix_x4(swizzled_stmatrix_address<Tile>(tile, row0, j, lane), pack_pair<T>(c[0][2 * j][0], c[0][2 * j][1]),
                pack_pair<T>(c[0][2 * j][2], c[0][2 * j][3]), pack_pair<T>(c[0][2 * j + 1][0], c[0][2 * j + 1][1]),
                pack_pair<T>(c[0][2 * j + 1][2], c[0][2 * j + 1][3]));
}

// Copies rows [row0, row0 + kRows) of a SwizzledTile Tile (kCols columns) to global rows of the
// same index, those below rows_valid and columns below cols_valid only, in 16-byte pieces:
// consecutive threads take consecutive chunks of a row (whole 128-byte global lines; the eight
// chunks of a shared row sit in eight different bank groups).
template <typename Tile, int kRows, int kCols, int kThreads, typename T>
__device__ __forceinline__ void copy_swizzled_rows_to_global(T* gmem, int64_t row_stride, const void* tile, int row0,
                                                             int rows_valid, int cols_valid, int tid) {
  constexpr int kChunksPerRow = kCols / 8;
  static_assert((kRows * kChunksPerRow) % kThreads == 0, "whole passes");
#pragma unroll
  for (int i = 0; i < kRows * kChunksPerRow / kThreads; ++i) {
    const int chunk = tid + i * kThreads;
    const int row = row0 + chunk / kChunksPerRow, col = (chunk % kChunksPerRow) * 8;
    if (row < rows_valid && col < cols_valid)
      *reinterpret_cast<uint4*>(gmem + row * row_stride + col) =
          *reinterpret_cast<const uint4*>(static_cast<const char*>(tile) + Tile::byte_offset(row, col));
  }
}

}  // namespace arch
}  // namespace flash
