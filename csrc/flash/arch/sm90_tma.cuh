// NVIDIA Hopper (sm_90a) pieces of a warp-specialized kernel: tensor-map (TMA) tile loads that
// complete on an mbarrier and tile stores from shared memory, consumer releases of a ring slot,
// named barriers between warpgroups and register reallocation between the producer and the
// consumer warpgroups.
//
// A tensor map (sm90_tensor_map.h builds it on the host) describes a (batches, rows, heads,
// headdim) tensor as TMA's 4-d view {headdim, rows, heads, batches} with a box of 64 columns x
// kRows rows in the 128-byte swizzle: exactly one 64-column block of a SwizzledTile
// (sm90_swizzled_tile.cuh), so a tile of kCols columns is kCols / 64 loads. Rows and columns past
// the tensor's extent arrive as zeros and still count their bytes on the mbarrier.
#pragma once

#include <cstdint>

#include <cuda.h>

#include "sm90_bulk.cuh"
#include "sm90_swizzled_tile.cuh"

namespace flash {
namespace arch {

using TensorMap = CUtensorMap;

// Loads box (col, row, head, batch) of `map` into shared memory at `smem` (1024-byte aligned);
// completion counts against bar's transaction count.
__device__ __forceinline__ void tma_load_4d(void* smem, const TensorMap* map, int col, int row, int head, int batch,
                                            uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(smem_address(smem)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(row), "r"(head), "r"(batch), "r"(smem_address(bar))
      : "memory");
#endif
}

// Loads rows [row, row + kRows) x all kCols columns of (head, batch) into a SwizzledTile<kRows,
// kCols>: one TMA per 64-column block.
template <int kRows, int kCols>
__device__ __forceinline__ void tma_load_swizzled_tile(void* tile, const TensorMap* map, int row, int head, int batch,
                                                       uint64_t* bar) {
#pragma unroll
  for (int block = 0; block < kCols / 64; ++block)
    tma_load_4d(static_cast<char*>(tile) + block * SwizzledTile<kRows, kCols>::kBlockBytes, map, block * 64, row, head,
                batch, bar);
}

// The same from 16-bit column col0 of the tensor on (a multiple of 64): the fp8 forward's transposed
// V, whose columns are keys (two e4m3 per 16-bit column).
template <int kRows, int kCols>
__device__ __forceinline__ void tma_load_swizzled_tile_from(void* tile, const TensorMap* map, int col0, int row,
                                                            int head, int batch, uint64_t* bar) {
#pragma unroll
  for (int block = 0; block < kCols / 64; ++block)
    tma_load_4d(static_cast<char*>(tile) + block * SwizzledTile<kRows, kCols>::kBlockBytes, map, col0 + block * 64, row,
                head, batch, bar);
}

// Stores shared memory at `smem` (1024-byte aligned, the 128-byte swizzle) into box (col, row,
// head, batch) of `map`: one bulk group op of the issuing thread (bulk_commit, then
// bulk_wait_source_read before the shared memory is written again). Rows and columns past the
// tensor's extent are not written. The threads that wrote `smem` must have made it visible to the
// async proxy (fence_proxy_async) and synchronized with the issuing thread first.
__device__ __forceinline__ void tma_store_4d(const TensorMap* map, int col, int row, int head, int batch,
                                             const void* smem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%1, %2, %3, %4}], [%5];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(col), "r"(row), "r"(head), "r"(batch), "r"(smem_address(smem))
               : "memory");
#endif
}

// Stores rows [tile_row0, tile_row0 + kRows) of a SwizzledTile<kTileRows, kCols> (tile_row0 a
// multiple of 8: whole swizzle atoms) to rows [row, row + kRows) of (head, batch), one TMA per
// 64-column block; `map`'s box is 64 columns x kRows rows.
template <int kTileRows, int kCols, int kRows>
__device__ __forceinline__ void tma_store_swizzled_rows(const TensorMap* map, const void* tile, int tile_row0, int row,
                                                        int head, int batch) {
  using Tile = SwizzledTile<kTileRows, kCols>;
#pragma unroll
  for (int block = 0; block < kCols / 64; ++block)
    tma_store_4d(map, block * 64, row, head, batch,
                 static_cast<const char*>(tile) + block * Tile::kBlockBytes + tile_row0 * kSwizzleRowBytes);
}

// Fetches the tensor map's descriptor ahead of its first use.
__device__ __forceinline__ void prefetch_tensor_map(const TensorMap* map) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
#endif
}

// One arrival on `bar` (a consumer handing a ring slot back to the producer).
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_address(bar)) : "memory");
#endif
}

// One arrival on `bar` once every cp.async this thread issued before it has landed; the barrier's
// expected arrival count includes it (.noinc), so a warp's 4-byte copies (lse, dsum) and a TMA
// load can complete the same phase.
__device__ __forceinline__ void cp_async_mbarrier_arrive(uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_address(bar)) : "memory");
#endif
}

// One arrival on `bar` that stays pending until every cp.async this thread issued before it has
// landed. Unlike cp_async_mbarrier_arrive it raises the barrier's pending count as it is issued, so
// a phase whose mbarrier_init count does not include these threads still waits for their copies
// (the decode's fallback steps: splitkv_tma_loader.cuh).
__device__ __forceinline__ void cp_async_mbarrier_arrive_pending(uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.mbarrier.arrive.shared::cta.b64 [%0];\n" ::"r"(smem_address(bar)) : "memory");
#endif
}

// Named barrier `id` (1..15; 0 is __syncthreads') of `threads` threads, a multiple of 32: sync waits
// for the count, arrive counts this warp without waiting.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Register reallocation: the warpgroup gives back registers down to kRegs per thread, or waits
// until the pool has enough to raise it to kRegs. Every warp of the warpgroup executes it.
template <int kRegs>
__device__ __forceinline__ void release_registers_to() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}
template <int kRegs>
__device__ __forceinline__ void claim_registers_to() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}

}  // namespace arch
}  // namespace flash
