// The key side of flash_attn_with_kvcache (params.h, KvCacheArgs): which cache positions batch entry
// b attends to and where each position's row lives, in a contiguous or a paged cache. The split-KV
// kernel reads keys through it and the append kernel writes the new tokens through it.
//
// The metadata is untrusted: cache_seqlens and leftpad are clamped into [0, capacity], cache
// entries and pages into [0, entries), so every row this view names lies inside the cache.
#pragma once

#include <cstdint>

#include "arch/arch.cuh"
#include "params.h"

namespace flash {

struct KvCacheView {
  int append_at;   // cache position of the first new token: cache_seqlens[b] clamped to the capacity
  int first;       // cache position of key 0 (leftpad)
  int seqlen_k;    // keys attended: positions [first, first + seqlen_k)
  int64_t entry;   // contiguous: the cache entry of this batch entry
  const int* pages;  // paged: this batch entry's row of block_table; null when contiguous
  int page_size, page_shift, entries, max_pages;

  __device__ __forceinline__ static KvCacheView of(const KvCacheArgs& c, int batch) {
    KvCacheView v;
    v.append_at = clamp(c.cache_seqlens[batch], 0, c.capacity);
    const int end = min(v.append_at + c.seqlen_new, c.capacity);  // new tokens past the capacity are dropped
    v.first = c.leftpad == nullptr ? 0 : clamp(c.leftpad[batch], 0, end);
    v.seqlen_k = end - v.first;
    v.entry = c.cache_batch_idx == nullptr ? batch : clamp(c.cache_batch_idx[batch], 0, c.entries - 1);
    v.pages = c.block_table == nullptr ? nullptr : c.block_table + batch * c.block_table_stride;
    v.page_size = c.page_size;
    v.page_shift = c.page_shift;
    v.entries = c.entries;
    v.max_pages = c.max_pages;
    return v;
  }

  // Where cache position `pos` (in [0, capacity)) lives: the entry or page, and the row inside it.
  // kPaged: whether the cache is paged, known at compile time (the attention kernels' variants).
  template <bool kPaged>
  __device__ __forceinline__ void locate_as(int pos, int64_t& slab, int& row) const {
    if (!kPaged) {
      slab = entry;
      row = pos;
      return;
    }
    const int page_index = page_shift >= 0 ? pos >> page_shift : pos / page_size;
    row = page_row(pos);
    slab = clamp(arch::load_global(pages + min(page_index, max_pages - 1)), 0, entries - 1);
  }

  // The row of cache position `pos` inside its page (paged caches), without the block-table read.
  __device__ __forceinline__ int page_row(int pos) const {
    return page_shift >= 0 ? pos & (page_size - 1) : pos % page_size;
  }

  __device__ __forceinline__ void locate(int pos, int64_t& slab, int& row) const {
    if (pages != nullptr) {
      locate_as<true>(pos, slab, row);
    } else {
      locate_as<false>(pos, slab, row);
    }
  }

  // Element (slab, row, head, 0) of a cache tensor.
  template <typename T>
  __device__ __forceinline__ static T* at(const Strided4d& t, int64_t slab, int row, int head) {
    return reinterpret_cast<T*>(t.ptr) + slab * t.batch_stride + row * t.row_stride + head * t.head_stride;
  }

 private:
  __device__ __forceinline__ static int clamp(int x, int lo, int hi) { return min(max(x, lo), hi); }
};

}  // namespace flash
