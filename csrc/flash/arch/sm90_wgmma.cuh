// NVIDIA Hopper (sm_90a) warpgroup MMA: wgmma.mma_async and its shared-memory operand layout.
//
// A warpgroup is 4 consecutive warps (128 threads). wgmma m64nNk16 computes, per warpgroup,
//   D (64 x N, fp32) = A (64 x 16) . B (16 x N) [+ D]
// and warp w of the group holds rows 16w..16w+15 of D in the mma.sync C layout (sm80.cuh), one
// 4-register fragment per 8-column block. A may come from registers, in the mma.sync A layout of
// those 16 rows (so accumulators re-pack into A fragments exactly as for mma.sync), or, like B,
// from shared memory through a 64-bit matrix descriptor.
//
// Shared-memory operands use the canonical layout without swizzle: the unit is a "core matrix" of
// 8 rows x 16 bytes (8 elements), stored as 128 contiguous bytes. A tile of (rows x cols) elements,
// cols contiguous in global memory, is stored here as core matrices ordered column-chunk major:
//   core (row group g = row / 8, column chunk c = col / 8) at byte ((c * rows / 8) + g) * 128.
// Every 16-byte global chunk lands in one 16-byte slot, so cp.async fills it directly, and wgmma
// reads whole 128-byte core matrices (no bank conflicts). The same bytes serve both operand roles:
//   K-major view (rows = M or N, cols = K): K-adjacent cores (c+1) are rows/8*128 bytes apart
//     (the descriptor's leading byte offset), M/N-adjacent cores (g+1) 128 bytes apart (stride).
//   MN-major view (rows = K, cols = M or N, "transposed" operand): K-adjacent cores (g+1) are 128
//     bytes apart (leading), M/N-adjacent cores (c+1) rows/8*128 apart (stride).
// Memory ordering: shared memory written by ordinary stores or cp.async must be made visible to
// wgmma (the async proxy) with fence_proxy_async() by the writers before the barrier that
// publishes it.
#pragma once

#include <cstdint>

#include "sm80.cuh"
#include "sm90_wgmma_ops.cuh"

namespace flash {
namespace arch {

constexpr int kWarpgroupThreads = 128;
constexpr int kMaxSmemBytesPerBlock = 227 * 1024;  // Hopper's dynamic shared memory per block (opt-in)
constexpr int kCoreRows = 8;
constexpr int kCoreBytes = 128;

// Accumulators and A fragments touched by ordinary instructions must not be moved by the compiler
// across the asynchronous MMAs that own them: an empty asm that "writes" every register.
template <int NT>
__device__ __forceinline__ void wgmma_fence_operand(float (&d)[NT][4]) {
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int r = 0; r < 4; ++r) asm volatile("" : "+f"(d[j][r])::"memory");
}

// The same for register A operands: fenced after the wait that retires their wgmma, so that the
// compiler does not move a later write of those registers above the wait.
template <int MT, int KS>
__device__ __forceinline__ void wgmma_fence_operand(uint32_t (&a)[MT][KS][4]) {
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int k = 0; k < KS; ++k)
#pragma unroll
      for (int r = 0; r < 4; ++r) asm volatile("" : "+r"(a[m][k][r])::"memory");
}

// A 16-byte global store that only `store` lanes make, without a branch: st.global under a predicate.
__device__ __forceinline__ void store_global_if(void* ptr, const uint32_t (&v)[4], bool store) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %5, 0;\n @p st.global.v4.b32 [%0], {%1, %2, %3, %4};\n}\n" ::"l"(ptr),
      "r"(v[0]), "r"(v[1]), "r"(v[2]), "r"(v[3]), "r"(static_cast<int>(store))
      : "memory");
}

// The 4 lanes of a quad (lane % 4 = q) hold v[j] = columns 8j + 2q, 8j + 2q + 1 of one row (4 of
// the row's 8-column chunks, in the accumulator layout). Afterwards lane q holds chunk q whole:
// v[i] = its columns 2i, 2i + 1, from lane i. Two exchanges: lanes q and q ^ 1 swap the chunks
// of the other's parity, then lanes q and q ^ 2 the pairs of the other's half.
__device__ __forceinline__ void quad_transpose(uint32_t (&v)[4], int q) {
  const bool odd = q & 1, upper = q & 2;
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const uint32_t got = shuffle_xor(odd ? v[2 * k] : v[2 * k + 1], 1);
    v[2 * k] = odd ? got : v[2 * k];
    v[2 * k + 1] = odd ? v[2 * k + 1] : got;
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const uint32_t got = shuffle_xor(upper ? v[i] : v[2 + i], 2);
    v[i] = upper ? got : v[i];
    v[2 + i] = upper ? v[2 + i] : got;
  }
}

// Writes a warp's fp32 accumulators (16 rows from row0 x 8*NT columns, as T) straight to global
// rows of the same index, those below rows_valid and columns below cols_valid (a multiple of 8)
// only. For kernels whose shared memory has no room to stage the tile for whole-line stores. The
// quads first trade their pairs (quad_transpose) so that each lane stores whole 16-byte chunks:
// each warp instruction 8 rows x 64 bytes. Each row's address is formed once and the stores are
// predicated: with a branch around each 4-byte store, ptxas rebuilt the whole address inside
// every branch and each store waited for the previous one to release its address registers (the
// hd 256 forward's epilogue took ~25% of its warp-stall samples at 512 keys, H200,
// benchmarks/NOTES.md v26).
template <int NT, typename T>
__device__ __forceinline__ void store_accumulator_rows(T* gmem, int64_t row_stride, int row0, const float (&c)[1][NT][4],
                                                       int lane, int rows_valid, int cols_valid) {
  static_assert(NT % 4 == 0, "whole groups of four 8-column chunks");
  const int q = lane % 4;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row0 + acc_row(lane, 2 * half);
    const bool row_valid = row < rows_valid;
    T* out = gmem + (row_valid ? row : 0) * row_stride + 8 * q;
#pragma unroll
    for (int group = 0; group < NT / 4; ++group) {
      uint32_t v[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) v[j] = pack_pair<T>(c[0][4 * group + j][2 * half], c[0][4 * group + j][2 * half + 1]);
      quad_transpose(v, q);
      store_global_if(out + 32 * group, v, row_valid && 32 * group + 8 * q < cols_valid);
    }
  }
}

// Orders this thread's earlier register writes before the next wgmma.mma_async.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Makes this thread's shared-memory writes (st.shared, cp.async) visible to later wgmma reads.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Matrix descriptor, no swizzle: start address, leading and stride byte offsets, each >> 4.
__device__ __forceinline__ uint64_t smem_descriptor(const void* start, uint32_t leading_bytes, uint32_t stride_bytes) {
  return static_cast<uint64_t>((smem_address(start) & 0x3FFFF) >> 4) |
         static_cast<uint64_t>((leading_bytes >> 4) & 0x3FFF) << 16 |
         static_cast<uint64_t>((stride_bytes >> 4) & 0x3FFF) << 32;
}

// The descriptor of the operand `byte_offset` bytes (a multiple of 16) past the start of `desc`'s,
// inside shared memory: the start-address field (bits 0-13, address / 16) advanced. The tiles'
// operand descriptors are their base's plus a constant, so that the compiler builds a tile's
// descriptor once and each k-step's with one add. (Built from the address each time, with the
// offset added before the mask and shift, each wgmma cost ~6 uniform-datapath instructions: ncu
// of the hd 128 backward read the uniform pipe at 12% of its issued instructions, cuDNN's at 1.6%,
// benchmarks/NOTES.md v25.) Shared-memory addresses are below 2^18, so the field cannot carry.
__device__ __forceinline__ uint64_t advance_descriptor(uint64_t desc, uint32_t byte_offset) {
  return (desc & 0xFFFFFFFF00000000ull) | (static_cast<uint32_t>(desc) + (byte_offset >> 4));
}

// `value`, the same in every lane of the warp, in a form the compiler knows to be so: lane 0's,
// broadcast. Operand descriptors built from it (a warpgroup's rows of a tile) can then live in
// uniform registers; built from threadIdx arithmetic they were per-thread values, moved to uniform
// registers before each wgmma (R2UR).
__device__ __forceinline__ int warp_uniform(int value) { return __shfl_sync(0xffffffffu, value, 0); }

// A (kRows x kCols) tile of 16-bit elements in the core-matrix layout described above.
template <int kRows, int kCols>
struct CoreTile {
  static_assert(kRows % kCoreRows == 0 && kCols % 8 == 0, "whole core matrices");
  static constexpr int kRowGroups = kRows / kCoreRows;
  static constexpr int kChunkBytes = kRowGroups * kCoreBytes;  // one 8-column chunk of every row
  static constexpr int kBytes = kRows * kCols * 2;

  __device__ __forceinline__ static int byte_offset(int row, int col) {
    return ((col / 8) * kRowGroups + row / kCoreRows) * kCoreBytes + (row % kCoreRows) * 16 + (col % 8) * 2;
  }

  // Operand whose rows are M (or N) and columns K: the 64 (or N) rows from row0, k-step ks.
  __device__ __forceinline__ static uint64_t k_major(const void* tile, int row0, int ks) {
    return advance_descriptor(smem_descriptor(tile, kChunkBytes, kCoreBytes),
                              (row0 / kCoreRows) * kCoreBytes + 2 * ks * kChunkBytes);
  }

  // Operand whose rows are K and columns M (or N): columns from col0, k-step ks (rows 16ks..).
  __device__ __forceinline__ static uint64_t mn_major(const void* tile, int col0, int ks) {
    return advance_descriptor(smem_descriptor(tile, kCoreBytes, kChunkBytes),
                              (col0 / 8) * kChunkBytes + 2 * ks * kCoreBytes);
  }
};

// stmatrix.x4: four 8 x 8 matrices of 16-bit elements, matrix i from each lane's register ai (lane 4g
// + t holding row g's elements 2t, 2t + 1), lane l giving the shared address of row l % 8 of matrix
// l / 8.
__device__ __forceinline__ void stmatrix_x4(uint32_t address, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(address), "r"(a0), "r"(a1),
               "r"(a2), "r"(a3)
               : "memory");
}

// A warp's 16-bit A fragments (16 rows from row0 x 16 KS columns from col0, as
// accumulators_to_a_fragments packs them) into a CoreTile Tile. Register r of k-step ks is one 8 x 8
// matrix in stmatrix's layout (lane 4g + t holds row g's elements 2t, 2t + 1): rows row0 + 8 (r % 2),
// columns col0 + 16 ks + 8 (r / 2), which is one core matrix of the tile, 8 rows of 16 contiguous
// bytes. So one stmatrix.x4 per k-step (lane l names row l % 8 of matrix l / 8), where 32-bit stores
// take four, and each matrix's 128 bytes are contiguous: no bank conflicts. The next k-step is two
// column chunks further. row0 and col0: multiples of 8. The caller fences the async proxy before a
// wgmma reads the tile.
template <typename Tile, int KS>
__device__ __forceinline__ void store_a_fragments(void* tile, int row0, int col0, const uint32_t (&a)[1][KS][4],
                                                  int lane) {
  const int matrix = lane / 8;
  const uint32_t base =
      smem_address(tile) + Tile::byte_offset(row0 + 8 * (matrix % 2) + lane % 8, col0 + 8 * (matrix / 2));
#pragma unroll
  for (int ks = 0; ks < KS; ++ks)
    stmatrix_x4(base + ks * 2 * Tile::kChunkBytes, a[0][ks][0], a[0][ks][1], a[0][ks][2], a[0][ks][3]);
}

// Issues cp.async copies of rows [0, rows_valid) x cols [0, cols_valid) of a global tile (rows
// row_stride elements apart) into a CoreTile; the rest is zero-filled. Caller commits and waits.
// Each warp fills 4 core matrices per pass (8 rows x 4 chunks): its 32 16-byte writes cover 4
// whole 128-byte cores, so shared-memory writes are conflict-free, and each row reads 64 contiguous
// bytes of global memory. A thread keeps one source and one destination pointer and walks rows.
template <int kRows, int kCols, int kThreads, typename T>
__device__ __forceinline__ void load_core_tile_async(void* tile, const T* gmem, int64_t row_stride, int rows_valid,
                                                     int cols_valid, int tid) {
  using Tile = CoreTile<kRows, kCols>;
  constexpr int kChunkQuads = kCols / 32;  // groups of 4 column chunks per row
  constexpr int kWarps = kThreads / kWarpSize;
  static_assert(kCols % 32 == 0 && kWarps % kChunkQuads == 0, "warps split the column quads evenly");
  constexpr int kGroupsPerPass = kWarps / kChunkQuads;
  static_assert(Tile::kRowGroups % kGroupsPerPass == 0, "whole passes");
  const int lane = tid % kWarpSize, warp = tid / kWarpSize;
  const int row0 = (warp / kChunkQuads) * kCoreRows + lane % kCoreRows;
  const int col = ((warp % kChunkQuads) * 4 + lane / kCoreRows) * 8;
  const bool col_valid = col < cols_valid;
  const T* src = gmem + row0 * row_stride + col;
  char* dst = static_cast<char*>(tile) + Tile::byte_offset(row0, col);
#pragma unroll
  for (int pass = 0; pass < Tile::kRowGroups / kGroupsPerPass; ++pass) {
    const bool valid = col_valid && row0 + pass * kGroupsPerPass * kCoreRows < rows_valid;
    cp_async_16(dst, valid ? src : gmem, valid);
    src += kGroupsPerPass * kCoreRows * row_stride;
    dst += kGroupsPerPass * kCoreBytes;
  }
}

}  // namespace arch
}  // namespace flash
