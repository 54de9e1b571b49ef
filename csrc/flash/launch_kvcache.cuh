// kvcache launch: the append kernel (new tokens into the cache, rotary), the split-KV kernel with
// its tile per head dim, and the combine kernel when the keys are split.
#pragma once

#include <algorithm>

#include "combine_kernel.cuh"
#include "kvcache_append_kernel.cuh"
#include "launch_api.h"
#include "launch_attributes.h"
#include "launch_dependent.h"
#include "launch_sm90.cuh"
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

// The kernels of one call follow each other as dependent launches (launch_dependent.h): each may
// start while the one before it runs, and waits for it before touching what it wrote (the split-KV
// kernel only before its steps that reach the new tokens, and before it exits). `launched`
// says whether a kernel went out, so that the next one knows whether its predecessor is ours.
template <typename T>
cudaError_t launch_kvcache_append(const KvAppendParams& p, cudaStream_t stream, bool& launched) {
  launched = p.cache.seqlen_new > 0 && p.shape.batch > 0;
  if (!launched) return cudaSuccess;
  const int items = p.shape.heads_k * (p.shape.headdim / kRotaryPiece);
  const dim3 grid(p.cache.seqlen_new, ceil_div(items, kAppendThreads), p.shape.batch);
  return launch_kernel(kvcache_append_kernel<T>, grid, kAppendThreads, 0, stream, false, p);
}

template <typename T, typename Cfg, bool kPaged, bool kBulk>
cudaError_t launch_splitkv(const SplitKvParams& p, cudaStream_t stream, bool after_append, bool& launched) {
  auto kernel = splitkv_kernel<T, Cfg, kPaged, kBulk>;
  cudaError_t err = allow_dynamic_smem(kernel, Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  const int m_blocks = ceil_div(p.fwd.shape.seqlen_q * (p.fwd.shape.heads / p.fwd.shape.heads_k), Cfg::kRows);
  const dim3 grid(m_blocks * p.num_splits, p.fwd.shape.heads_k, p.fwd.shape.batch);
  launched = m_blocks > 0;  // no query: the append alone
  if (!launched) return cudaSuccess;
  return launch_kernel(kernel, grid, Cfg::kThreads, Cfg::kSmemBytes, stream, after_append, p);
}

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
  const int64_t rows = static_cast<int64_t>(params.fwd.shape.batch) * params.fwd.shape.heads * params.fwd.shape.seqlen_q;
  if (err != cudaSuccess || !attended || params.num_splits == 1 || rows == 0) return err;
  return launch_kernel(splitkv_combine_kernel<T>, dim3(static_cast<unsigned>(ceil_div64(rows, kCombineWarps))),
                       dim3(kCombineWarps * arch::kWarpSize), 0, stream, true, params);
}

}  // namespace flash
