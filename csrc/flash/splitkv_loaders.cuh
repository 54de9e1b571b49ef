// How a split-KV warp fills its ring of K/V steps (splitkv_kernel.cuh). Both loaders put step i's
// K and V rows (keys [n0, n0 + kWarpKeys) of the attended range, through the cache view) into ring
// slot i % kStages, padded rows as tile_io.cuh lays them out, with zeros where a key lies past the
// range. A warp calls issue(i, n0) for its steps in order, kStages - 1 ahead of wait(i), and
// reads a slot only between wait(i) and the warp_sync after it.
//   CpAsyncKvLoader: per-lane 16-byte cp.async copies (sm80 and later; on CDNA the arch layer's
//     synchronous copies through registers, arch/cdna.cuh).
//   BulkKvLoader: one bulk copy per K or V row, completing on a per-slot mbarrier (Hopper):
//     splitkv_bulk_loader.cuh.
#pragma once

#include <cstdint>

#include "arch/arch.cuh"
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

// Hopper's loader (kBulk), defined in splitkv_bulk_loader.cuh: only the NVIDIA launcher
// (launch_kvcache.cuh) includes it and instantiates the kernels that use it, so a CDNA build needs
// no bulk-copy names.
template <typename T, typename Cfg, bool kPaged>
struct BulkKvLoader;

}  // namespace flash
