// kvcache launch on NVIDIA: the split-KV tile per head dim and its variant (its loader: Hopper TMA
// boxes or row copies, or cp.async; paged or contiguous); the append, split-KV and combine launches
// themselves are launch_kvcache_kernels.cuh's.
#pragma once

#include <type_traits>

#include "arch/sm90_tensor_map.h"
#include "launch_api.h"
#include "launch_kvcache_kernels.cuh"
#include "launch_sm90.cuh"
#include "splitkv_bulk_loader.cuh"
#include "splitkv_kernel.cuh"
#include "splitkv_tma_loader.cuh"

namespace flash {

// SplitKvConfig<hd, keys per warp step, ring stages, warps, CTAs per SM> per head dim. A warp's step
// is a chain of dependent ldmatrix / mma.sync / softmax instructions that one warp per SM
// sub-partition cannot hide: measured on H100 (benchmarks/NOTES.md v6), 4 warps of 32-key steps (hd
// 128) read ~20 GB/s per SM, whatever the loader, and 8 warps of 16-key steps raised (1, 128k) from
// 2180 to 2500 GB/s; so head dims up to 128 run 8 warps of half the keys (timed at hd 128 only),
// two per sub-partition, in ~210 KB of rings (3 stages: 2 steps in flight while one is read), one
// CTA per SM. Two CTAs of 4 warps per SM (v20: one wave holds twice the CTAs, as cuDNN's decode
// runs) measured the same at (32, 4k) and (1, 128k) and 3% slower at (1, 8k) on an H200, kernel
// time. hd 192 / 256 keep 4 warps: 8 rings of even 16-key steps would not fit.
template <int kHeadDim>
struct SplitKvTile;
template <> struct SplitKvTile<32> { using type = SplitKvConfig<32, 32, 3, 8, 1>; };
template <> struct SplitKvTile<64> { using type = SplitKvConfig<64, 32, 3, 8, 1>; };
template <> struct SplitKvTile<96> { using type = SplitKvConfig<96, 16, 3, 8, 1>; };
template <> struct SplitKvTile<128> { using type = SplitKvConfig<128, 16, 3, 8, 1>; };
template <> struct SplitKvTile<192> { using type = SplitKvConfig<192, 16, 3, 4, 1>; };
template <> struct SplitKvTile<256> { using type = SplitKvConfig<256, 16, 3, 4, 1>; };

// Hopper's loader for a tile: TMA boxes where the head dim is whole 64-column blocks, else one bulk
// copy per row (splitkv_loaders.cuh).
template <typename T, typename Cfg, bool kPaged>
using HopperKvLoader = std::conditional_t<Cfg::kHeadDim % 64 == 0, TmaKvLoader<T, Cfg, kPaged>,
                                          BulkKvLoader<T, Cfg, kPaged>>;

// k_cache and v_cache as the TMA loader's boxes see them (KvTensorMaps). False where the driver
// cannot describe them or a slab has fewer rows than a box; the caller then runs the cp.async loader.
inline bool make_kv_tensor_maps(const SplitKvParams& p, int box_rows, KvTensorMaps& maps) {
  const KvCacheArgs& c = p.cache;
  const int64_t rows = c.block_table != nullptr ? c.page_size : c.capacity;
  if (rows < box_rows) return false;
  auto view = [&](const Strided4d& t) {
    return arch::RowTensor{t.ptr, p.fwd.shape.headdim, rows, p.fwd.shape.heads_k, c.entries,
                           t.row_stride, t.head_stride, t.batch_stride};
  };
  return arch::encode_swizzled_row_map(&maps.k, view(p.fwd.k), box_rows) &&
         arch::encode_swizzled_row_map(&maps.v, view(p.fwd.v), box_rows);
}

// On Hopper (unless FLASH_ATTN_DISABLE_SM90=1): HopperKvLoader; elsewhere, or where the tensor maps
// cannot be built, cp.async.
template <typename T, typename Cfg, bool kPaged>
cudaError_t launch_splitkv_variant(const SplitKvParams& params, cudaStream_t stream, bool after_append,
                                   bool& launched) {
  using Hopper = HopperKvLoader<T, Cfg, kPaged>;
  using CpAsync = CpAsyncKvLoader<T, Cfg, kPaged>;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  bool hopper = false;
  if (err == cudaSuccess) err = can_run_sm90(splitkv_kernel<T, Cfg, Hopper>, device, hopper);
  if (err != cudaSuccess) return err;
  if (hopper) {
    if constexpr (std::is_same_v<typename Hopper::Maps, KvTensorMaps>) {
      KvTensorMaps maps;
      if (make_kv_tensor_maps(params, Cfg::kWarpKeys, maps))
        return launch_splitkv<T, Cfg, Hopper>(params, maps, stream, after_append, launched);
    } else {
      return launch_splitkv<T, Cfg, Hopper>(params, {}, stream, after_append, launched);
    }
  }
  return launch_splitkv<T, Cfg, CpAsync>(params, {}, stream, after_append, launched);
}

template <typename T, int kHeadDim>
cudaError_t run_fwd_kvcache(const KvAppendParams& append, const SplitKvParams& params, cudaStream_t stream) {
  using Cfg = typename SplitKvTile<kHeadDim>::type;
  static_assert(Cfg::kCtasPerSm == splitkv_ctas_per_sm(kHeadDim), "the op's split heuristic sizes this tile");
  static_assert(Cfg::kCtasPerSm * Cfg::kSmemBytes <= 227 * 1024, "the CTAs fit an SM's shared memory");
  bool appended = false, attended = false;
  cudaError_t err = launch_kvcache_append<T>(append, stream, appended);
  if (err != cudaSuccess) return err;
  err = params.cache.block_table != nullptr
            ? launch_splitkv_variant<T, Cfg, true>(params, stream, appended, attended)
            : launch_splitkv_variant<T, Cfg, false>(params, stream, appended, attended);
  if (err != cudaSuccess || !attended) return err;
  return launch_splitkv_combine<T>(params, stream);
}

}  // namespace flash
