// Before a kvcache attention: writes the new keys (rotated) and values into the cache at
// cache_seqlens. CTA (token, piece group, batch); each thread moves 16-byte pieces (rotary.cuh).
// New tokens past the cache's capacity are not written (the attention does not see them either:
// kvcache_view.cuh). The queries are rotated by the split-KV kernel as it loads them, so that it
// need not wait for this kernel until it reaches the new tokens.
#pragma once

#include "arch/arch.cuh"
#include "common.cuh"
#include "kvcache_view.cuh"
#include "params.h"
#include "rotary.cuh"

namespace flash {

constexpr int kAppendThreads = 128;

template <typename T>
__device__ __forceinline__ void append_token(const KvAppendParams& p, const KvCacheView& cache, int batch, int token,
                                             int pieces) {
  const int pos = cache.append_at + token;
  if (token >= p.cache.seqlen_new || pos >= p.cache.capacity) return;
  const T *cos_row, *sin_row;
  rotary_rows<T>(p.rotary, pos, cos_row, sin_row);
  int64_t slab;
  int row;
  cache.locate(pos, slab, row);
  for (int item = blockIdx.y * blockDim.x + threadIdx.x; item < p.shape.heads_k * pieces; item += gridDim.y * blockDim.x) {
    const int head = item / pieces, piece = item % pieces;
    const T* k_src = reinterpret_cast<const T*>(p.k_new.ptr) + batch * p.k_new.batch_stride +
                     token * p.k_new.row_stride + head * p.k_new.head_stride;
    const T* v_src = reinterpret_cast<const T*>(p.v_new.ptr) + batch * p.v_new.batch_stride +
                     token * p.v_new.row_stride + head * p.v_new.head_stride;
    rotate_piece(KvCacheView::at<T>(p.k_cache, slab, row, head), k_src, piece, cos_row, sin_row, p.rotary);
    store_piece(KvCacheView::at<T>(p.v_cache, slab, row, head) + piece * kRotaryPiece,
                load_piece(v_src + piece * kRotaryPiece));
  }
}

// Grid: (seqlen_new, piece groups, batch).
template <typename T>
__global__ void __launch_bounds__(kAppendThreads) kvcache_append_kernel(const KvAppendParams p) {
  arch::allow_dependent_launch();  // the split-KV kernel may start; it waits for this grid before the new rows
  const int batch = blockIdx.z, token = blockIdx.x;
  append_token<T>(p, KvCacheView::of(p.cache, batch), batch, token, p.shape.headdim / kRotaryPiece);
}

}  // namespace flash
