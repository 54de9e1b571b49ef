// The split-KV kernel's Hopper loader for head dims of whole 64-column blocks (splitkv_loaders.cuh
// describes the loader interface): a step's kWarpKeys K rows, and its V rows, arrive as TMA boxes of
// 64 columns each, 128-byte swizzled (arch/sm90_swizzled_tile.cuh), completing on the slot's
// mbarrier; the warp GEMMs read the slot through arch::SwizzledTileView. Lane 0 issues the step in
// kHeadDim / 32 instructions. Why: the row-copy loader (splitkv_bulk_loader.cuh) issues 2 x
// kWarpKeys bulk copies per step, each with warp-uniform operands, so the compiler serializes the
// lanes' copies; on an H200 (benchmarks/NOTES.md v20) that loop was about half of a warp's 690
// instructions per 16-key step, the warps issued once per 6 cycles on dependent chains, and DRAM ran
// at 73% of its peak.
//
// A step that is not one box per 64 columns: the last, partial step of a sequence (keys past the
// range must arrive as zeros) or, in a paged cache, a step that crosses a page (a leftpad that is
// not a multiple of 16). The lanes copy it with cp.async into the same swizzled layout (zeros past
// the range), and the same mbarrier phase waits for those copies
// (arch::cp_async_mbarrier_arrive_pending).
#pragma once

#include <cstdint>

#include "arch/arch.cuh"
#include "arch/sm90_bulk.cuh"
#include "arch/sm90_swizzled_tile.cuh"
#include "arch/sm90_tma.cuh"
#include "splitkv_loaders.cuh"
#include "tile_io.cuh"

namespace flash {

// The kernel's second parameter with this loader: k_cache and v_cache as (slabs, rows, heads_k,
// headdim), slabs being cache entries (rows = capacity) or pages (rows = page size), boxes of 64
// columns x kWarpKeys rows (host: make_kv_tensor_maps in launch_kvcache.cuh).
struct KvTensorMaps {
  arch::TensorMap k, v;
};

template <typename T, typename Cfg, bool kPaged_>
struct TmaKvLoader {
  static_assert(Cfg::kHeadDim % 64 == 0, "whole 64-column boxes");
  using Maps = KvTensorMaps;
  using Tile = arch::SwizzledTile<Cfg::kWarpKeys, Cfg::kHeadDim>;
  using View = arch::SwizzledTileView<T, Cfg::kWarpKeys>;
  static constexpr bool kPaged = kPaged_;
  static constexpr int kStageBytes = 2 * Tile::kBytes;  // K, then V: each a multiple of 1024 bytes
  static_assert(Tile::kBytes % arch::kSwizzleAtomBytes == 0, "every slot starts 1024-byte aligned");

  KvStepSource<T, Cfg, kPaged> src;
  const KvTensorMaps& maps;
  unsigned char* ring;  // this warp's kStages slots, 1024-byte aligned
  uint64_t* barriers;   // this warp's kStages mbarriers
  int lane;

  __device__ __forceinline__ static TmaKvLoader make(const KvStepSource<T, Cfg, kPaged>& src, const Maps& maps,
                                                     unsigned char* ring, uint64_t* barriers, int lane) {
    return {src, maps, ring, barriers, lane};
  }
  __device__ __forceinline__ static constexpr bool runs_here() { return arch::has_bulk_copies(); }

  __device__ __forceinline__ unsigned char* slot(int i) const { return ring + (i % Cfg::kStages) * kStageBytes; }
  __device__ __forceinline__ View k_tile(int i) const { return {reinterpret_cast<const T*>(slot(i))}; }
  __device__ __forceinline__ View v_tile(int i) const {
    return {reinterpret_cast<const T*>(slot(i) + Tile::kBytes)};
  }

  __device__ __forceinline__ void init() const {
    if (arch::smem_address(ring) % arch::kSwizzleAtomBytes != 0) __trap();  // the swizzle needs it
    if (lane == 0) {
      for (int s = 0; s < Cfg::kStages; ++s) arch::mbarrier_init(barriers + s, 1);
      arch::fence_mbarrier_init();
    }
    arch::warp_sync();
  }

  // Whether the step at key n0 is one box per 64 columns: all its keys attended, in one cache entry
  // or one page.
  __device__ __forceinline__ bool is_box(int n0) const {
    if (src.cache.seqlen_k - n0 < Cfg::kWarpKeys) return false;
    return !kPaged || src.cache.page_row(src.cache.first + n0) + Cfg::kWarpKeys <= src.cache.page_size;
  }

  __device__ __forceinline__ void issue(int i, int n0) const {
    uint64_t* bar = barriers + i % Cfg::kStages;
    if (is_box(n0)) {
      if (lane == 0) {
        int64_t slab;
        int row;
        src.cache.template locate_as<kPaged>(src.cache.first + n0, slab, row);
        arch::mbarrier_arrive_expect_bytes(bar, kStageBytes);  // boxes count whole, zero-filled columns too
        arch::tma_load_swizzled_tile<Cfg::kWarpKeys, Cfg::kHeadDim>(slot(i), &maps.k, row, src.head_k,
                                                                   static_cast<int>(slab), bar);
        arch::tma_load_swizzled_tile<Cfg::kWarpKeys, Cfg::kHeadDim>(slot(i) + Tile::kBytes, &maps.v, row,
                                                                   src.head_k, static_cast<int>(slab), bar);
      }
      return;
    }
    copy_rows(i, n0);
    arch::cp_async_mbarrier_arrive_pending(bar);
    arch::warp_sync();  // every lane's pending arrival is posted before lane 0's arrival can end the phase
    if (lane == 0) arch::mbarrier_arrive(bar);
  }

  __device__ __forceinline__ void commit() const {}

  __device__ __forceinline__ void wait(int i, int n0) const {
    arch::mbarrier_wait_parity(barriers + i % Cfg::kStages, (i / Cfg::kStages) & 1);
    arch::warp_sync();
    // The slot's cp.async writes (generic proxy) come before the TMA writes that refill it.
    if (!is_box(n0)) arch::fence_proxy_async();
  }

 private:
  // The fallback: 16-byte cp.async pieces into the swizzled layout, zeros past the range.
  __device__ __forceinline__ void copy_rows(int i, int n0) const {
    constexpr int kPieces = Cfg::kHeadDim / kElementsPer16B;
    unsigned char* k_slot = slot(i);
    unsigned char* v_slot = k_slot + Tile::kBytes;
    for (int item = lane; item < Cfg::kWarpKeys * kPieces; item += arch::kWarpSize) {
      const int row = item / kPieces, col = item % kPieces * kElementsPer16B;
      const bool key_valid = n0 + row < src.cache.seqlen_k;
      const bool valid = key_valid && col < src.f.shape.headdim;
      const T* k_row = static_cast<const T*>(src.f.k.ptr);
      const T* v_row = static_cast<const T*>(src.f.v.ptr);
      if (key_valid) src.rows(n0 + row, k_row, v_row);
      const int offset = Tile::byte_offset(row, col);
      arch::cp_async_16(k_slot + offset, valid ? k_row + col : k_row, valid);
      arch::cp_async_16(v_slot + offset, valid ? v_row + col : v_row, valid);
    }
  }
};

}  // namespace flash
