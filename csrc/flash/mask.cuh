// Which (query, key) pairs attend: sequence bounds and the causal mask, bottom-right aligned
// (query i sees key j iff j <= i + seqlen_k - seqlen_q, FlashAttention >= 2.1). Pure predicates on
// absolute indices and on blocks of them; the kernels apply them to their own fragments.
#pragma once

namespace flash {

struct AttentionMask {
  int seqlen_q;
  int seqlen_k;
  bool causal;

  __device__ __forceinline__ int diagonal_offset() const { return seqlen_k - seqlen_q; }

  __device__ __forceinline__ bool visible(int query, int key) const {
    return query < seqlen_q && key < seqlen_k && (!causal || key <= query + diagonal_offset());
  }

  // Keys [0, kv_end) are the only ones that queries [m0, m0 + rows) can see.
  __device__ __forceinline__ int kv_end(int m0, int rows) const {
    if (!causal) return seqlen_k;
    return max(0, min(seqlen_k, m0 + rows + diagonal_offset()));
  }

  // The first query that can see key n0.
  __device__ __forceinline__ int first_query(int n0) const { return causal ? max(0, n0 - diagonal_offset()) : 0; }

  // True when every pair of queries [m0, m0 + rows) x keys [n0, n0 + cols) is visible, so the
  // block needs no masking at all.
  __device__ __forceinline__ bool block_fully_visible(int m0, int rows, int n0, int cols) const {
    return m0 + rows <= seqlen_q && n0 + cols <= seqlen_k && (!causal || n0 + cols - 1 <= m0 + diagonal_offset());
  }
};

}  // namespace flash
