// The keys one backward CTA owns (kBlockN keys from blockIdx.x, query head blockIdx.y, batch
// blockIdx.z), the query blocks that can see them, and the per-(batch, head) pieces the kernels
// apply (sequence view, mask, score modifiers, dropout); shared by the sm80 and sm90 kernels.
#pragma once

#include "common.cuh"
#include "dq_order.cuh"
#include "dropout.cuh"
#include "mask.cuh"
#include "params.h"
#include "score_mod.cuh"
#include "sequence.cuh"
#include "tile_io.cuh"

namespace flash {

template <int kBlockM, int kBlockN>
struct BwdKeyBlock {
  SequenceView seq;
  int head;
  int head_k;  // the K/V head this query head reads (MQA / GQA)
  int n_block;  // the key block (of kBlockN): blockIdx.x, in the order DqOrder launches them
  int n0;       // first key
  int rows_k;  // keys of the block inside the sequence; <= 0 when the block lies past its end
  AttentionMask mask;
  int m_first, m_last;  // query blocks (of kBlockM) that see at least one of these keys
  int m_start;          // the walk over them starts here and wraps from m_last to m_first (dq_order.cuh)

  __device__ __forceinline__ static BwdKeyBlock current(const BwdParams& p) {
    BwdKeyBlock b;
    b.seq = SequenceView::of(p.fwd, blockIdx.z);
    b.head = blockIdx.y;
    b.head_k = b.head / (p.fwd.shape.heads / p.fwd.shape.heads_k);
    b.n_block = DqOrder::of(p.fwd).key_block(p);
    b.n0 = b.n_block * kBlockN;
    b.rows_k = min(kBlockN, b.seq.seqlen_k - b.n0);
    b.mask = AttentionMask::of(b.seq.seqlen_q, b.seq.seqlen_k, p.fwd.window);
    b.m_first = 0;
    b.m_last = -1;
    if (b.rows_k > 0) {
      b.m_first = b.mask.query_begin(b.n0) / kBlockM;
      b.m_last = ceil_div(b.mask.query_end(b.n0, b.rows_k), kBlockM) - 1;
    }
    b.m_start = b.m_first + DqOrder::of(p.fwd).walk_rotation(p, b.n_block, b.query_blocks());
    return b;
  }

  __device__ __forceinline__ int query_blocks() const { return m_last - m_first + 1; }

  // The query block `ahead` steps after m_block in the walk (0 <= ahead < query_blocks()).
  __device__ __forceinline__ int query_block_after(int m_block, int ahead) const {
    const int m = m_block + ahead;
    return m > m_last ? m - query_blocks() : m;
  }
  // The query block one step before m_block in the walk.
  __device__ __forceinline__ int query_block_before(int m_block) const {
    return m_block == m_first ? m_last : m_block - 1;
  }

  __device__ __forceinline__ ScoreMod score_mod(const BwdParams& p) const {
    return ScoreMod::of(p.fwd, seq.batch, head, mask.diagonal_offset());
  }
  __device__ __forceinline__ Dropout dropout(const BwdParams& p) const {
    return Dropout::of(p.fwd.dropout, seq.batch, p.fwd.shape.heads, head);
  }

  // Deterministic backward: this key block's turn at adding into query block m_block's dQ tile.
  // kDeterministic false (the plain kernels) compiles the turn out: no turn, at compile time.
  template <bool kDeterministic>
  __device__ __forceinline__ DqTurn<kBlockM, kBlockN> dq_turn(const BwdParams& p, int m_block) const {
    if constexpr (!kDeterministic) return DqTurn<kBlockM, kBlockN>{nullptr, 0};
    return DqTurn<kBlockM, kBlockN>::of(p, DqOrder::of(p.fwd), mask, seq.batch, head, m_block, n_block);
  }

  // This block's rows of a key-side tensor: K / V (head_k) or dK / dV (one slice per query head).
  template <typename T>
  __device__ __forceinline__ T* key_rows(const Strided4d& t, int tensor_head) const {
    return seq.k_side<T>(t, n0, tensor_head);
  }

  // Offset of query row m0 of this head in lse / dsum.
  __device__ __forceinline__ int64_t query_vector_offset(const BwdParams& p, int m0) const {
    return seq.row_vector_offset(p.fwd, head, m0);
  }

  // True when the CTA has nothing to compute: its keys lie past the sequence's end (nothing to
  // write), or no query sees them (zero gradients, written here).
  template <typename T, int kHeadDim, int kThreads>
  __device__ __forceinline__ bool done_without_queries(const BwdParams& p, int tid) const {
    if (rows_k <= 0) return true;
    if (m_first <= m_last) return false;
    zero_tile<kBlockN, kHeadDim, kThreads>(key_rows<T>(p.dk, head), p.dk.row_stride, rows_k, p.fwd.shape.headdim, tid);
    zero_tile<kBlockN, kHeadDim, kThreads>(key_rows<T>(p.dv, head), p.dv.row_stride, rows_k, p.fwd.shape.headdim, tid);
    return true;
  }
};

}  // namespace flash
