// The sequence view: where batch entry b's queries and keys live and how long they are, for dense
// tensors and packed variable-length batches alike. Every kernel addresses q/k/v/out/lse/dq_accum
// through it, so varlen is one piece rather than a branch in each kernel.
//
// Varlen metadata is untrusted: each cu_seqlens entry is clamped to [0, total] and each length to
// [0, max seqlen], so the rows a kernel touches stay inside the packed tensors whatever the
// metadata holds (a bad entry gives wrong numbers for that sequence, never an out-of-bounds access).
#pragma once

#include <cstdint>

#include "features.h"
#include "params.h"

namespace flash {

struct SequenceView {
  int batch;
  int batch_index;  // multiplies the tensors' batch strides: the batch (dense) or 0 (varlen)
  int seqlen_q, seqlen_k;
  int64_t q_row0, k_row0;  // this sequence's first row in the (packed) q-side / k-side rows
  int64_t dq_accum_row0;   // its first row in each head's slice of dq_accum

  __device__ __forceinline__ static SequenceView of(const FwdParams& p, int batch) {
    SequenceView s;
    s.batch = batch;
    const AttentionShape& shape = p.shape;
    if (!kVarlenCompiled || p.varlen.cu_seqlens_q == nullptr) {
      s.batch_index = batch;
      s.seqlen_q = shape.seqlen_q;
      s.seqlen_k = shape.seqlen_k;
      s.q_row0 = 0;
      s.k_row0 = 0;
      s.dq_accum_row0 = batch * dq_accum_rows(shape.seqlen_q);
      return s;
    }
    s.batch_index = 0;
    int length = 0;
    s.q_row0 = clamped_range(p.varlen.cu_seqlens_q, batch, p.varlen.total_q, shape.seqlen_q, length);
    s.seqlen_q = length;
    s.k_row0 = clamped_range(p.varlen.cu_seqlens_k, batch, p.varlen.total_k, shape.seqlen_k, length);
    s.seqlen_k = length;
    s.dq_accum_row0 = s.q_row0 + static_cast<int64_t>(kDqAccumRowMultiple) * batch;
    return s;
  }

  // Sequence `batch`'s query count as `of` computes it (clamped), without the rest of the view:
  // what a scheduler needs to count a varlen batch's query tiles.
  __device__ __forceinline__ static int query_length(const FwdParams& p, int batch) {
    if (!kVarlenCompiled || p.varlen.cu_seqlens_q == nullptr) return p.shape.seqlen_q;
    int length = 0;
    clamped_range(p.varlen.cu_seqlens_q, batch, p.varlen.total_q, p.shape.seqlen_q, length);
    return length;
  }

  // Element (row, head, 0) of a query-side tensor (q, out, dout, dq) / key-side one (k, v, dk, dv).
  template <typename T>
  __device__ __forceinline__ T* q_side(const Strided4d& t, int row, int head) const {
    return at<T>(t, q_row0 + row, head);
  }
  template <typename T>
  __device__ __forceinline__ T* k_side(const Strided4d& t, int row, int head) const {
    return at<T>(t, k_row0 + row, head);
  }

  // Offset of (head, query row) in lse and dsum: (batch, heads, seqlen_q) dense, (heads, total_q) varlen.
  __device__ __forceinline__ int64_t row_vector_offset(const FwdParams& p, int head, int row) const {
    return static_cast<int64_t>(batch_index) * p.shape.heads * p.lse_head_stride + head * p.lse_head_stride +
           q_row0 + row;
  }

 private:
  template <typename T>
  __device__ __forceinline__ T* at(const Strided4d& t, int64_t row, int head) const {
    return reinterpret_cast<T*>(t.ptr) + batch_index * t.batch_stride + row * t.row_stride + head * t.head_stride;
  }

  // [cu[b], cu[b+1]) clamped into [0, total], its length capped at max_len; returns the start.
  __device__ __forceinline__ static int64_t clamped_range(const int* cu, int batch, int total, int max_len, int& len) {
    const int begin = min(max(cu[batch], 0), total);
    const int end = min(max(cu[batch + 1], begin), total);
    len = min(end - begin, max_len);
    return begin;
  }
};

}  // namespace flash
