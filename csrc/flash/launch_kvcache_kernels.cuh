// The kernel launches of one kvcache call that every arch shares, in stream order: the append
// kernel (new tokens into the cache, keys rotated), one split-KV kernel variant and, when the keys are
// split, the combine kernel. The arch launchers (launch_kvcache.cuh for NVIDIA,
// launch_kvcache_cdna.cuh for CDNA) choose the tile and the variant and call these in that order.
#pragma once

#include <cstdint>

#include "combine_kernel.cuh"
#include "kvcache_append_kernel.cuh"
#include "launch_attributes.h"
#include "launch_dependent.h"
#include "splitkv_kernel.cuh"

namespace flash {

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

// Loader: the split-KV kernel's loader (splitkv_loaders.cuh); maps: its kernel parameter.
template <typename T, typename Cfg, typename Loader>
cudaError_t launch_splitkv(const SplitKvParams& p, const typename Loader::Maps& maps, cudaStream_t stream,
                           bool after_append, bool& launched) {
  auto kernel = splitkv_kernel<T, Cfg, Loader>;
  cudaError_t err = allow_dynamic_smem(kernel, Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  const int m_blocks = ceil_div(p.fwd.shape.seqlen_q * (p.fwd.shape.heads / p.fwd.shape.heads_k), Cfg::kRows);
  const dim3 grid(m_blocks * p.num_splits, p.fwd.shape.heads_k, p.fwd.shape.batch);
  launched = m_blocks > 0;  // no query: the append alone
  if (!launched) return cudaSuccess;
  return launch_kernel(kernel, grid, Cfg::kThreads, Cfg::kSmemBytes, stream, after_append, p, maps);
}

// After a split-KV kernel that went out: merges its partial results when the keys were split.
template <typename T>
cudaError_t launch_splitkv_combine(const SplitKvParams& params, cudaStream_t stream) {
  const AttentionShape& shape = params.fwd.shape;
  const int64_t rows = static_cast<int64_t>(shape.batch) * shape.heads * shape.seqlen_q;
  if (params.num_splits == 1 || rows == 0) return cudaSuccess;
  return launch_kernel(splitkv_combine_kernel<T>, dim3(static_cast<unsigned>(ceil_div64(rows, kCombineWarps))),
                       dim3(kCombineWarps * arch::kWarpSize), 0, stream, true, params);
}

}  // namespace flash
