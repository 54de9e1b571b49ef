// Before a kvcache attention: writes the new keys (rotated) and values into the cache at
// cache_seqlens, and the rotated queries into q_rotated. CTA (token, piece group, batch); each
// thread moves 16-byte pieces (rotary.cuh). New tokens past the cache's capacity are not written
// (the attention does not see them either: kvcache_view.cuh).
#pragma once

#include "arch/arch.cuh"
#include "common.cuh"
#include "kvcache_view.cuh"
#include "params.h"
#include "rotary.cuh"

namespace flash {

constexpr int kAppendThreads = 128;

// Rows of cos / sin at a rotary position, clamped below seqlen_ro; nulls when rotary is off.
template <typename T>
__device__ __forceinline__ void rotary_rows(const RotaryArgs& r, int position, const T*& cos_row, const T*& sin_row) {
  if (r.cos == nullptr) {
    cos_row = sin_row = nullptr;
    return;
  }
  const int64_t row = min(max(position, 0), r.seqlen_ro - 1) * static_cast<int64_t>(r.rotary_dim / 2);
  cos_row = static_cast<const T*>(r.cos) + row;
  sin_row = static_cast<const T*>(r.sin) + row;
}

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

template <typename T>
__device__ __forceinline__ void rotate_query(const KvAppendParams& p, const KvCacheView& cache, int batch, int token,
                                             int pieces) {
  if (p.rotary.cos == nullptr || token >= p.shape.seqlen_q) return;
  const T *cos_row, *sin_row;
  rotary_rows<T>(p.rotary, cache.append_at + (p.rotary.q_positions_per_token ? token : 0), cos_row, sin_row);
  for (int item = blockIdx.y * blockDim.x + threadIdx.x; item < p.shape.heads * pieces; item += gridDim.y * blockDim.x) {
    const int head = item / pieces, piece = item % pieces;
    const int64_t src = batch * p.q.batch_stride + token * p.q.row_stride + head * p.q.head_stride;
    const int64_t dst = batch * p.q_rotated.batch_stride + token * p.q_rotated.row_stride + head * p.q_rotated.head_stride;
    rotate_piece(reinterpret_cast<T*>(p.q_rotated.ptr) + dst, reinterpret_cast<const T*>(p.q.ptr) + src, piece,
                 cos_row, sin_row, p.rotary);
  }
}

// Grid: (max(seqlen_new, seqlen_q with rotary), piece groups, batch).
template <typename T>
__global__ void __launch_bounds__(kAppendThreads) kvcache_append_kernel(const KvAppendParams p) {
  arch::allow_dependent_launch();  // the split-KV kernel may start; it waits for this grid to finish
  const int batch = blockIdx.z, token = blockIdx.x;
  const KvCacheView cache = KvCacheView::of(p.cache, batch);
  const int pieces = p.shape.headdim / kRotaryPiece;
  append_token<T>(p, cache, batch, token, pieces);
  rotate_query<T>(p, cache, batch, token, pieces);
}

}  // namespace flash
