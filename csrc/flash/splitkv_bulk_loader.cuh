// The split-KV kernel's Hopper loader for head dims that are not whole 64-column blocks
// (splitkv_loaders.cuh describes the loader interface; whole blocks take splitkv_tma_loader.cuh):
// one bulk copy per K or V row, completing on a per-slot mbarrier. A row costs one address
// computation (one block-table lookup when paged) instead of one per 16 bytes: measured on H100
// (benchmarks/NOTES.md v6), pages of 16 rows went from 0.66-0.84x to 0.90-1.04x of the contiguous
// cache's speed, which itself did not change. NVIDIA only: launch_kvcache.cuh includes it.
#pragma once

#include <cstdint>

#include "arch/arch.cuh"
#include "arch/sm90_bulk.cuh"
#include "splitkv_loaders.cuh"
#include "tile_io.cuh"

namespace flash {

template <typename T, typename Cfg, bool kPaged_>
struct BulkKvLoader : PaddedKvRing<T, Cfg> {
  using Maps = NoTensorMaps;
  static constexpr bool kPaged = kPaged_;
  KvStepSource<T, Cfg, kPaged> src;
  uint64_t* barriers;  // this warp's kStages mbarriers
  int lane;

  __device__ __forceinline__ static BulkKvLoader make(const KvStepSource<T, Cfg, kPaged>& src, const Maps&,
                                                      unsigned char* ring, uint64_t* barriers, int lane) {
    return {{reinterpret_cast<T*>(ring)}, src, barriers, lane};
  }
  __device__ __forceinline__ static constexpr bool runs_here() { return arch::has_bulk_copies(); }

  // Lane 0 initializes the warp's barriers; columns past headdim are zeroed once (bulk copies write
  // headdim columns only, and Q.K^T reads the padded ones).
  __device__ __forceinline__ void init() const {
    if (lane == 0) {
      for (int s = 0; s < Cfg::kStages; ++s) arch::mbarrier_init(barriers + s, 1);
      arch::fence_mbarrier_init();
    }
    const int headdim = src.f.shape.headdim;
    if (headdim < Cfg::kHeadDim) {
      for (int r = lane; r < Cfg::kStages * 2 * Cfg::kWarpKeys; r += arch::kWarpSize)
        for (int c = headdim; c < Cfg::kHeadDim; c += kElementsPer16B)
          *reinterpret_cast<uint4*>(this->ring + r * Cfg::kStride + c) = uint4{0, 0, 0, 0};
    }
    arch::warp_sync();
  }

  __device__ __forceinline__ void issue(int i, int n0) const {
    T* sK = this->slot(i);
    T* sV = sK + Cfg::kWarpKeys * Cfg::kStride;
    uint64_t* bar = barriers + i % Cfg::kStages;
    const int valid_rows = max(0, min(Cfg::kWarpKeys, src.cache.seqlen_k - n0));
    const uint32_t row_bytes = src.f.shape.headdim * sizeof(T);
    if (lane == 0) arch::mbarrier_arrive_expect_bytes(bar, 2 * valid_rows * row_bytes);
    arch::warp_sync();  // the expected bytes are posted before any copy can complete
    for (int row = lane; row < Cfg::kWarpKeys; row += arch::kWarpSize) {
      if (row < valid_rows) {
        const T *k_row, *v_row;
        src.rows(n0 + row, k_row, v_row);
        arch::bulk_load(sK + row * Cfg::kStride, k_row, row_bytes, bar);
        arch::bulk_load(sV + row * Cfg::kStride, v_row, row_bytes, bar);
      } else {  // keys past the range: zeros, so that P = 0 meets finite V
        for (int c = 0; c < Cfg::kHeadDim; c += kElementsPer16B) {
          *reinterpret_cast<uint4*>(sK + row * Cfg::kStride + c) = uint4{0, 0, 0, 0};
          *reinterpret_cast<uint4*>(sV + row * Cfg::kStride + c) = uint4{0, 0, 0, 0};
        }
      }
    }
  }

  __device__ __forceinline__ void commit() const {}

  __device__ __forceinline__ void wait(int i, int) const {
    arch::mbarrier_wait_parity(barriers + i % Cfg::kStages, (i / Cfg::kStages) & 1);
    arch::warp_sync();
  }
};

}  // namespace flash
