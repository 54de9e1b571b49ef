// The queries one forward CTA owns (kBlockM queries, the heaviest causal blocks first, query head
// blockIdx.y, batch blockIdx.z), the key blocks they can see, and the per-(batch, head) pieces the
// kernels apply (sequence view, mask, score modifiers, dropout); shared by the sm80 and sm90 kernels.
#pragma once

#include <cmath>

#include <cuda_runtime.h>

#include "common.cuh"
#include "dropout.cuh"
#include "launch_attributes.h"
#include "mask.cuh"
#include "params.h"
#include "score_mod.cuh"
#include "sequence.cuh"
#include "tile_io.cuh"

namespace flash {

template <int kBlockM, int kBlockN>
struct FwdQueryBlock {
  SequenceView seq;
  int head;
  int head_k;   // the K/V head this query head reads (MQA / GQA)
  int m0;         // first query; negative for a first block shifted before the sequence (at() says when)
  int rows_q;     // m0 + rows_q: the end of the block's queries inside the sequence; <= 0 past its end
  int row_begin;  // the block's first row inside the sequence: max(0, -m0)
  int n_begin;  // key blocks (of kBlockN) [n_begin, n_end) hold every key some query of the block sees
  int n_end;
  AttentionMask mask;

  __device__ __forceinline__ static FwdQueryBlock current(const FwdParams& p) {
    // heaviest causal blocks are scheduled first
    return at(p, gridDim.x - 1 - blockIdx.x, blockIdx.y, blockIdx.z);
  }

  // Rows by which end-aligned causal blocks move: whole 64-row groups (one Hopper math warpgroup's
  // rows), so that a group lies wholly before the sequence or wholly in it.
  static constexpr int kShiftRows = 64;

  // Block m_block of (head, batch). end_aligned (a causal call only): the blocks end at the
  // sequence's end and the first one starts before it (by up to kBlockM - kShiftRows rows, whole
  // kShiftRows groups), so the block that is not full is the one that sees the fewest keys
  // instead of the most; the block count stays ceil(seqlen_q / kBlockM). A kernel that takes it
  // must write no row before row_begin (rows_of).
  __device__ __forceinline__ static FwdQueryBlock at(const FwdParams& p, int m_block, int head, int batch,
                                                     bool end_aligned = false) {
    FwdQueryBlock b;
    b.seq = SequenceView::of(p, batch);
    b.head = head;
    b.head_k = b.head / (p.shape.heads / p.shape.heads_k);
    const int part_rows = b.seq.seqlen_q % kBlockM;  // of the block that is not full; 0: none is
    const int shift = end_aligned && p.causal && part_rows > 0 ? (kBlockM - part_rows) / kShiftRows * kShiftRows : 0;
    b.m0 = m_block * kBlockM - shift;
    b.rows_q = min(kBlockM, b.seq.seqlen_q - b.m0);
    b.row_begin = max(0, -b.m0);
    b.mask = AttentionMask::of(b.seq.seqlen_q, b.seq.seqlen_k, p.window);
    b.n_begin = 0;
    b.n_end = 0;
    if (b.rows_q > b.row_begin) {
      b.n_begin = b.mask.kv_begin(b.m0 + b.row_begin) / kBlockN;
      b.n_end = ceil_div(b.mask.kv_end(b.m0 + b.row_begin, b.rows_q - b.row_begin), kBlockN);
    }
    return b;
  }

  // Rows of [row0, row0 + rows) inside the sequence, with row0 a multiple of kShiftRows (a group
  // of an end-aligned block lies wholly before the sequence or wholly in it); <= 0: none.
  __device__ __forceinline__ int rows_of(int row0, int rows) const {
    return row0 < row_begin ? 0 : min(rows, rows_q - row0);
  }

  __device__ __forceinline__ int key_blocks() const { return max(0, n_end - n_begin); }

  // The steps (step i: key block n_end - 1 - i) whose key blocks hold a key that one of rows
  // [row0, row0 + rows) of the block sees; none (first == end == key_blocks()) when they lie past
  // the sequence's end or see no key. Under a causal mask a block's first rows see fewer key blocks
  // than its last.
  __device__ __forceinline__ IndexRange steps_seen_by(int row0, int rows) const {
    const int steps = key_blocks();
    if (rows <= 0) return IndexRange{steps, steps};
    const int first_block = mask.kv_begin(m0 + row0) / kBlockN;
    const int end_block = ceil_div(mask.kv_end(m0 + row0, rows), kBlockN);
    if (end_block <= first_block) return IndexRange{steps, steps};
    return IndexRange{n_end - end_block, n_end - first_block};
  }

  // The steps (step i: key block n_end - 1 - i) whose key blocks every query of rows [row0, row0 +
  // rows) of the block sees whole, so that they need no mask; rows <= 0 (rows past the sequence,
  // whose results are never written): every step.
  __device__ __forceinline__ IndexRange unmasked_steps(int row0, int rows) const {
    if (rows <= 0) return IndexRange{0, key_blocks()};
    const IndexRange blocks = mask.key_blocks_seen_whole_by(m0 + row0, rows, kBlockN);
    return IndexRange{n_end - blocks.end, n_end - blocks.first};
  }

  // The modifiers of a kernel compiled with kScoreExtras; none, at compile time, in the plain kernels.
  template <bool kScoreExtras>
  __device__ __forceinline__ ScoreMod score_mod(const FwdParams& p) const {
    return kScoreExtras ? ScoreMod::of(p, seq.batch, head, mask.diagonal_offset()) : ScoreMod::none();
  }
  template <bool kScoreExtras>
  __device__ __forceinline__ Dropout dropout(const FwdParams& p) const {
    return kScoreExtras ? Dropout::of(p.dropout, seq.batch, p.shape.heads, head) : Dropout::none();
  }

  template <typename T>
  __device__ __forceinline__ T* out(const FwdParams& p) const {
    return seq.q_side<T>(p.out, m0, head);
  }
  __device__ __forceinline__ float* lse(const FwdParams& p) const {
    return p.lse + seq.row_vector_offset(p, head, m0);
  }

  // True when the CTA has nothing to compute: its queries lie past the sequence's end (nothing
  // to write), or they see no key (output zeros and lse +inf, written here).
  template <typename T, int kHeadDim, int kThreads>
  __device__ __forceinline__ bool done_without_keys(const FwdParams& p, int tid) const {
    if (rows_q <= 0) return true;
    if (key_blocks() > 0) return false;
    write_rows_without_keys<T, kHeadDim, kThreads>(p, tid);
    return true;
  }

  // Output zeros and lse +inf for the block's queries (by kThreads threads).
  template <typename T, int kHeadDim, int kThreads>
  __device__ __forceinline__ void write_rows_without_keys(const FwdParams& p, int tid) const {
    const FwdQueryBlock inside = from_row_begin();
    zero_tile<kBlockM, kHeadDim, kThreads>(inside.out<T>(p), p.out.row_stride, inside.rows_q, p.shape.headdim, tid);
    float* row_lse = inside.lse(p);
    for (int row = tid; row < inside.rows_q; row += kThreads) row_lse[row] = INFINITY;
  }

 private:
  // The block's rows inside the sequence as a block of their own (the same block where row_begin is 0).
  __device__ __forceinline__ FwdQueryBlock from_row_begin() const {
    FwdQueryBlock b = *this;
    b.m0 += row_begin;
    b.rows_q -= row_begin;
    b.row_begin = 0;
    return b;
  }
};

// Tiles of a forward over (query blocks, heads, batch); for varlen, over max_seqlen_q: a bound.
template <int kBlockM>
__host__ __device__ inline int query_tile_count(const FwdParams& p) {
  return ceil_div(p.shape.seqlen_q, kBlockM) * p.shape.heads * p.shape.batch;
}

// Launches a forward kernel over the grid FwdQueryBlock reads: one CTA per query block, head and
// batch, with Cfg::kSmemBytes of dynamic shared memory opted in.
template <typename Cfg, typename Kernel>
cudaError_t launch_over_query_blocks(Kernel kernel, const FwdParams& params, cudaStream_t stream) {
  cudaError_t err = allow_dynamic_smem(kernel, Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  const dim3 grid(ceil_div(params.shape.seqlen_q, Cfg::kBlockM), params.shape.heads, params.shape.batch);
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace flash
