// How a split-KV warp fills its ring of K/V steps (splitkv_kernel.cuh). Every loader puts step i's
// K and V rows (keys [n0, n0 + kWarpKeys) of the attended range, through the cache view) into ring
// slot i % kStages, with zeros where a key lies past the range. A warp calls issue(i, n0) for its
// steps in order, kStages - 1 ahead of wait(i, n0), and reads slot i only between wait(i, n0) and
// the warp_sync after it, through k_tile(i) and v_tile(i) (arch/tile_view.cuh views). The loader
// interface:
//   Maps: what the kernel takes besides SplitKvParams (the tensor maps of the TMA loader, else
//     nothing); kStageBytes: one slot (K then V); make(...): the warp's loader over its ring;
//   runs_here(): false in device code that lacks the loader's copies (the kernel returns at once);
//   init(), issue(i, n0), commit(), wait(i, n0), k_tile(i), v_tile(i).
// The loaders:
//   CpAsyncKvLoader: per-lane 16-byte cp.async copies into padded rows (sm80 and later; on CDNA
//     the arch layer's synchronous copies through registers, arch/cdna.cuh).
//   BulkKvLoader: one bulk copy per K or V row into padded rows, completing on a per-slot mbarrier
//     (Hopper, head dims that are not whole 64-column blocks): splitkv_bulk_loader.cuh.
//   TmaKvLoader: one TMA box per 64 columns of a step's K or V rows, 128-byte swizzled (Hopper,
//     head dims of whole 64-column blocks): splitkv_tma_loader.cuh.
#pragma once

#include <cstdint>

#include "arch/arch.cuh"
#include "kvcache_view.cuh"
#include "params.h"
#include "tile_io.cuh"

namespace flash {

// The kernel parameter of loaders that need none besides SplitKvParams.
struct NoTensorMaps {};

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

// Slots of padded rows (tile_io.cuh's layout), as the sm80-family kernels keep their tiles.
template <typename T, typename Cfg>
struct PaddedKvRing {
  static constexpr int kStageBytes = Cfg::kStageElems * static_cast<int>(sizeof(T));
  T* ring;  // this warp's kStages slots

  __device__ __forceinline__ T* slot(int i) const { return ring + (i % Cfg::kStages) * Cfg::kStageElems; }
  __device__ __forceinline__ arch::PaddedTile<T> k_tile(int i) const { return {slot(i), Cfg::kStride}; }
  __device__ __forceinline__ arch::PaddedTile<T> v_tile(int i) const {
    return {slot(i) + Cfg::kWarpKeys * Cfg::kStride, Cfg::kStride};
  }
};

template <typename T, typename Cfg, bool kPaged_>
struct CpAsyncKvLoader : PaddedKvRing<T, Cfg> {
  using Maps = NoTensorMaps;
  static constexpr bool kPaged = kPaged_;
  KvStepSource<T, Cfg, kPaged> src;
  int lane;

  __device__ __forceinline__ static CpAsyncKvLoader make(const KvStepSource<T, Cfg, kPaged>& src, const Maps&,
                                                         unsigned char* ring, uint64_t*, int lane) {
    return {{reinterpret_cast<T*>(ring)}, src, lane};
  }
  __device__ __forceinline__ static constexpr bool runs_here() { return true; }
  __device__ __forceinline__ void init() const {}

  __device__ __forceinline__ void issue(int i, int n0) const {
    constexpr int kPieces = Cfg::kHeadDim / kElementsPer16B;
    T* sK = this->slot(i);
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

  __device__ __forceinline__ void wait(int, int) const {
    arch::cp_async_wait<Cfg::kStages - 1>();
    arch::warp_sync();
  }
};

// Hopper's loaders, defined in splitkv_bulk_loader.cuh and splitkv_tma_loader.cuh: only the NVIDIA
// launcher (launch_kvcache.cuh) includes them and instantiates the kernels that use them, so a CDNA
// build needs no bulk-copy or tensor-map names.
template <typename T, typename Cfg, bool kPaged>
struct BulkKvLoader;
template <typename T, typename Cfg, bool kPaged>
struct TmaKvLoader;

}  // namespace flash
