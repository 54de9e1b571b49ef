// kvcache launch on NVIDIA: the split-KV tile per head dim and its variant (Hopper bulk copies or
// cp.async, paged or contiguous); the append, split-KV and combine launches themselves are
// launch_kvcache_kernels.cuh's.
#pragma once

#include "launch_api.h"
#include "launch_kvcache_kernels.cuh"
#include "launch_sm90.cuh"
#include "splitkv_bulk_loader.cuh"
#include "splitkv_kernel.cuh"

namespace flash {

// SplitKvConfig<hd, keys per warp step, ring stages, warps> per head dim. A warp's step is a chain
// of dependent ldmatrix / mma.sync / softmax instructions that one warp per SM sub-partition cannot
// hide: measured on H100 (benchmarks/NOTES.md v6), 4 warps of 32-key steps (hd 128) read ~20 GB/s
// per SM, whatever the loader, and 8 warps of 16-key steps raised (1, 128k) from 2180 to 2500 GB/s;
// so head dims up to 128 run 8 warps of half the keys (timed at hd 128 only), two warps per
// sub-partition, in the same ~210 KB of rings (3 stages: 2 steps in flight while one is read).
// hd 192 / 256 keep 4 warps: 8 rings of even 16-key steps would not fit.
template <int kHeadDim>
struct SplitKvTile;
template <> struct SplitKvTile<32> { using type = SplitKvConfig<32, 32, 3, 8>; };
template <> struct SplitKvTile<64> { using type = SplitKvConfig<64, 32, 3, 8>; };
template <> struct SplitKvTile<96> { using type = SplitKvConfig<96, 16, 3, 8>; };
template <> struct SplitKvTile<128> { using type = SplitKvConfig<128, 16, 3, 8>; };
template <> struct SplitKvTile<192> { using type = SplitKvConfig<192, 16, 3, 4>; };
template <> struct SplitKvTile<256> { using type = SplitKvConfig<256, 16, 3, 4>; };

// Paged or contiguous; bulk copies on Hopper (unless FLASH_ATTN_DISABLE_SM90=1), cp.async elsewhere.
template <typename T, typename Cfg>
cudaError_t launch_splitkv_variant(const SplitKvParams& params, cudaStream_t stream, bool after_append,
                                   bool& launched) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  bool bulk = false;
  if (err == cudaSuccess) err = can_run_sm90(splitkv_kernel<T, Cfg, false, true>, device, bulk);
  if (err != cudaSuccess) return err;
  const bool paged = params.cache.block_table != nullptr;
  if (bulk) {
    return paged ? launch_splitkv<T, Cfg, true, true>(params, stream, after_append, launched)
                 : launch_splitkv<T, Cfg, false, true>(params, stream, after_append, launched);
  }
  return paged ? launch_splitkv<T, Cfg, true, false>(params, stream, after_append, launched)
               : launch_splitkv<T, Cfg, false, false>(params, stream, after_append, launched);
}

template <typename T, int kHeadDim>
cudaError_t run_fwd_kvcache(const KvAppendParams& append, const SplitKvParams& params, cudaStream_t stream) {
  using Cfg = typename SplitKvTile<kHeadDim>::type;
  bool appended = false, attended = false;
  cudaError_t err = launch_kvcache_append<T>(append, stream, appended);
  if (err != cudaSuccess) return err;
  err = launch_splitkv_variant<T, Cfg>(params, stream, appended, attended);
  if (err != cudaSuccess || !attended) return err;
  return launch_splitkv_combine<T>(params, stream);
}

}  // namespace flash
