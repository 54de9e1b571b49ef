// Which (query, key) pairs attend: sequence bounds and the local window, bottom-right aligned
// (FlashAttention 2): with d = seqlen_k - seqlen_q, query i sees key j iff j < seqlen_k and
// (left < 0 or j >= i + d - left) and (right < 0 or j <= i + d + right); causal is right = 0.
// Pure predicates on absolute (within-sequence) indices and on blocks of them: the kernels take
// their loop bounds from the block ranges and mask only the blocks that are not fully visible.
// The forward's key range of a query block and the backward's query range of a key block are
// exact inverses (both "the block rectangle meets the visible band"), which the deterministic
// backward relies on.
#pragma once

#include "features.h"
#include "params.h"

namespace flash {

// Indices [first, end); empty when first >= end.
struct IndexRange {
  int first, end;
  __device__ __forceinline__ bool contains(int i) const { return i >= first && i < end; }
  __device__ __forceinline__ IndexRange shifted(int by) const { return IndexRange{first + by, end + by}; }
};

struct AttentionMask {
  int seqlen_q;
  int seqlen_k;
  int left;   // -1: unbounded
  int right;  // -1: unbounded

  // A build without local attention (FLASH_ATTN_DISABLE_LOCAL) knows only causal or nothing.
  __device__ __forceinline__ static AttentionMask of(int seqlen_q, int seqlen_k, const WindowArgs& w) {
    if (!kLocalCompiled) return AttentionMask{seqlen_q, seqlen_k, -1, w.right == 0 ? 0 : -1};  // causal only
    return AttentionMask{seqlen_q, seqlen_k, w.left, w.right};
  }

  __device__ __forceinline__ int diagonal_offset() const { return seqlen_k - seqlen_q; }

  __device__ __forceinline__ bool visible(int query, int key) const {
    return keys_seen_by(query).contains(key);
  }

  // The keys query `query` sees, and (its inverse) the queries that see key `key`, for indices
  // >= 0: visible(i, j) == keys_seen_by(i).contains(j) == queries_seeing(j).contains(i). The
  // kernels compute a fragment row's range once, so that each score pays two compares.
  __device__ __forceinline__ IndexRange keys_seen_by(int query) const {
    const int diagonal = query + diagonal_offset();
    const int end = right < 0 ? seqlen_k : min(seqlen_k, diagonal + right + 1);
    return IndexRange{left < 0 ? 0 : diagonal - left, query < seqlen_q ? end : 0};  // selects, no branch
  }
  __device__ __forceinline__ IndexRange queries_seeing(int key) const {
    const int diagonal = key - diagonal_offset();  // the query on this key's diagonal
    const int end = left < 0 ? seqlen_q : min(seqlen_q, diagonal + left + 1);
    return IndexRange{right < 0 ? 0 : diagonal - right, key < seqlen_k ? end : 0};
  }

  // Keys [kv_begin, kv_end) hold every key that queries [m0, m0 + rows) can see (rows >= 1,
  // m0 + rows <= seqlen_q); empty when kv_begin >= kv_end.
  __device__ __forceinline__ int kv_begin(int m0) const {
    return left < 0 ? 0 : max(0, m0 + diagonal_offset() - left);
  }
  __device__ __forceinline__ int kv_end(int m0, int rows) const {
    return right < 0 ? seqlen_k : max(0, min(seqlen_k, m0 + rows - 1 + diagonal_offset() + right + 1));
  }

  // Keys [first, end) that every query of [m0, m0 + rows) sees (rows >= 1, m0 + rows <=
  // seqlen_q): a key block inside it needs no mask for those rows (block_fully_visible); empty when
  // first >= end.
  __device__ __forceinline__ IndexRange keys_seen_by_all(int m0, int rows) const {
    const int first_diagonal = m0 + diagonal_offset(), last_diagonal = m0 + rows - 1 + diagonal_offset();
    return IndexRange{left < 0 ? 0 : max(0, last_diagonal - left),
                      right < 0 ? seqlen_k : min(seqlen_k, first_diagonal + right + 1)};
  }
  // The key blocks of block_n keys [first, end) inside keys_seen_by_all: those no query of the rows
  // needs masked (block_fully_visible(m0, rows, n * block_n, block_n) exactly for n in the range).
  __device__ __forceinline__ IndexRange key_blocks_seen_whole_by(int m0, int rows, int block_n) const {
    const IndexRange keys = keys_seen_by_all(m0, rows);
    return IndexRange{(keys.first + block_n - 1) / block_n, max(0, keys.end) / block_n};
  }

  // Queries [query_begin, query_end) hold every query that sees one of keys [n0, n0 + cols)
  // (cols >= 1, n0 + cols <= seqlen_k).
  __device__ __forceinline__ int query_begin(int n0) const {
    return right < 0 ? 0 : max(0, n0 - diagonal_offset() - right);
  }
  __device__ __forceinline__ int query_end(int n0, int cols) const {
    return left < 0 ? seqlen_q : max(0, min(seqlen_q, n0 + cols - 1 - diagonal_offset() + left + 1));
  }

  // True when every pair of queries [m0, m0 + rows) x keys [n0, n0 + cols) is visible, so the
  // block needs no masking at all.
  __device__ __forceinline__ bool block_fully_visible(int m0, int rows, int n0, int cols) const {
    const int first_diagonal = m0 + diagonal_offset(), last_diagonal = m0 + rows - 1 + diagonal_offset();
    return m0 + rows <= seqlen_q && n0 + cols <= seqlen_k && (right < 0 || n0 + cols - 1 <= first_diagonal + right) &&
           (left < 0 || n0 >= last_diagonal - left);
  }
};

}  // namespace flash
