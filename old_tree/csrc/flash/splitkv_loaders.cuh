// How a split-KV warp fills its ring of K/V steps (splitkv_kernel.cuh). Both loaders put step i's
// K and V rows (keys [n0, n0 + kWarpKeys) of the attended range, through the cache view) into ring
// slot i % kStages, padded rows as tile_io.cuh lays them out, with zeros where a key lies past the
// range. A warp calls issue(i, n0) for its steps in order, kStages - 1 ahead of wait(i), and
// reads a slot only between wait(i) and the warp_sync after it.
//   CpAsyncKvLoader: per-lane 16-byte cp.async copies (sm80 and later).
//   BulkKvLoader: one bulk copy per K or V row, completing on a per-slot mbarrier (Hopper). A row
//     costs one address computation (one block-table lookup when paged) instead of one per 16
//     bytes: measured on H100 (benchmarks/NOTES.md v6), pages of 16 rows went from 0.66-0.84x to
//     0.90-1.04x of the contiguous cache's speed, which itself did not change.
#pragma once

#include <cstdint>

#include "arch/arch.cuh"
#include "arch/sm90_bulk.cuh"
#include "kvcache_view.cuh"
#include "params.h"
#include "tile_io.cuh"

namespace flash {

template <typename T, typename Cfg, bool kPaged>
struct KvStepSource {
  const FwdParams& f;
  const KvCacheView& cache;
  int head_k;

  // K and V rows of attended key `key` (< cache.seqlen_k).
  __device__ __forceinline__ void rows(int key, const T*& k_row, const T*& v_row) const {
    int64_t slab;
    int cache_row;
    cache.locate_as<kPaged>(cache.first + key, slab, cache_row);
    k_row = KvCacheView::at<T>(f.k, slab, cache_row, head_k);
    v_row = KvCacheView::at<T>(f.v, slab, cache_row, head_k);
  }
};

template <typename T, typename Cfg, bool kPaged>
struct CpAsyncKvLoader {
  KvStepSource<T, Cfg, kPaged> src;
  T* ring;
  int lane;

  __device__ __forceinline__ T* slot(int i) const { return ring + (i % Cfg::kStages) * Cfg::kStageElems; }

  __device__ __forceinline__ void issue(int i, int n0) const {
    constexpr int kPieces = Cfg::kHeadDim / kElementsPer16B;
    T* sK = slot(i);
    T* sV = sK + Cfg::kWarpKeys * Cfg::kStride;
#pragma unroll
    for (int j = 0; j < Cfg::kWarpKeys * kPieces / arch::kWarpSize; ++j) {
      const int item = lane + j * arch::kWarpSize;
      const int row = item / kPieces, col = item % kPieces * kElementsPer16B;
      const bool valid = n0 + row < src.cache.seqlen_k && col < src.f.shape.headdim;
      const T* k_row = static_cast<const T*>(src.f.k.ptr);
      const T* v_row = static_cast<const T*>(src.f.v.ptr);
      if (valid) src.rows(n0 + row, k_row, v_row);
      arch::cp_async_16(sK + row * Cfg::kStride + col, valid ? k_row + col : k_row, valid);
      arch::cp_async_16(sV + row * Cfg::kStride + col, valid ? v_row + col : v_row, valid);
    }
  }

  __device__ __forceinline__ void commit() const { arch::cp_async_commit(); }

  __device__ __forceinline__ void wait(int) const {
    arch::cp_async_wait<Cfg::kStages - 1>();
    arch::warp_sync();
  }
};

template <typename T, typename Cfg, bool kPaged>
struct BulkKvLoader {
  KvStepSource<T, Cfg, kPaged> src;
  T* ring;
  uint64_t* barriers;  // this warp's kStages mbarriers
  int lane;

  __device__ __forceinline__ T* slot(int i) const { return ring + (i % Cfg::kStages) * Cfg::kStageElems; }

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
          *reinterpret_cast<uint4*>(ring + r * Cfg::kStride + c) = uint4{0, 0, 0, 0};
    }
    arch::warp_sync();
  }

  __device__ __forceinline__ void issue(int i, int n0) const {
    T* sK = slot(i);
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

  __device__ __forceinline__ void wait(int i) const {
    arch::mbarrier_wait_parity(barriers + i % Cfg::kStages, (i / Cfg::kStages) & 1);
    arch::warp_sync();
  }
};

}  // namespace flash
