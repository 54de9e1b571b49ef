// The keys one backward CTA owns (kBlockN keys from blockIdx.x, query head blockIdx.y, batch
// blockIdx.z) and the query blocks that can see them; shared by the sm80 and sm90 kernels.
#pragma once

#include "common.cuh"
#include "mask.cuh"
#include "params.h"
#include "tile_io.cuh"

namespace flash {

template <int kBlockM, int kBlockN>
struct BwdKeyBlock {
  int batch, head;
  int head_k;  // the K/V head this query head reads (MQA / GQA)
  int n0;      // first key
  int rows_k;  // keys of the block inside seqlen_k
  AttentionMask mask;
  int m_first, m_last;  // query blocks (of kBlockM) that see at least one of these keys

  __device__ __forceinline__ static BwdKeyBlock current(const BwdParams& p) {
    const AttentionShape& shape = p.fwd.shape;
    BwdKeyBlock b;
    b.batch = blockIdx.z;
    b.head = blockIdx.y;
    b.head_k = b.head / (shape.heads / shape.heads_k);
    b.n0 = blockIdx.x * kBlockN;
    b.rows_k = min(kBlockN, shape.seqlen_k - b.n0);
    b.mask = AttentionMask{shape.seqlen_q, shape.seqlen_k, p.fwd.causal};
    b.m_first = b.mask.first_query(b.n0) / kBlockM;
    b.m_last = ceil_div(shape.seqlen_q, kBlockM) - 1;
    return b;
  }

  // This block's rows of dK / dV (one slice per query head).
  template <typename T>
  __device__ __forceinline__ T* rows_of(const Strided4d& grad) const {
    return element_ptr<T>(grad, batch, n0, head);
  }

  // Keys no query sees get zero gradients; true when that is all there is to do.
  template <typename T, int kHeadDim, int kThreads>
  __device__ __forceinline__ bool zero_gradients_if_unseen(const BwdParams& p, int tid) const {
    if (m_first <= m_last) return false;
    zero_tile<kBlockN, kHeadDim, kThreads>(rows_of<T>(p.dk), p.dk.row_stride, rows_k, p.fwd.shape.headdim, tid);
    zero_tile<kBlockN, kHeadDim, kThreads>(rows_of<T>(p.dv), p.dv.row_stride, rows_k, p.fwd.shape.headdim, tid);
    return true;
  }
};

}  // namespace flash
