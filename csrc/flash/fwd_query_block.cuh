// The queries one forward CTA owns (kBlockM queries, the heaviest causal blocks first, query head
// blockIdx.y, batch blockIdx.z) and the key blocks they can see; shared by the sm80 and sm90
// kernels.
#pragma once

#include <cmath>

#include <cuda_runtime.h>

#include "common.cuh"
#include "mask.cuh"
#include "params.h"
#include "tile_io.cuh"

namespace flash {

template <int kBlockM, int kBlockN>
struct FwdQueryBlock {
  int batch, head;
  int head_k;    // the K/V head this query head reads (MQA / GQA)
  int m0;        // first query
  int rows_q;    // queries of the block inside seqlen_q
  int n_blocks;  // key blocks (of kBlockN) from 0 that hold a key some query of the block sees
  AttentionMask mask;

  __device__ __forceinline__ static FwdQueryBlock current(const FwdParams& p) {
    const AttentionShape& shape = p.shape;
    FwdQueryBlock b;
    b.batch = blockIdx.z;
    b.head = blockIdx.y;
    b.head_k = b.head / (shape.heads / shape.heads_k);
    b.m0 = (gridDim.x - 1 - blockIdx.x) * kBlockM;  // heaviest causal blocks are scheduled first
    b.rows_q = min(kBlockM, shape.seqlen_q - b.m0);
    b.mask = AttentionMask{shape.seqlen_q, shape.seqlen_k, p.causal};
    b.n_blocks = ceil_div(b.mask.kv_end(b.m0, b.rows_q), kBlockN);
    return b;
  }

  template <typename T>
  __device__ __forceinline__ T* out(const FwdParams& p) const {
    return element_ptr<T>(p.out, batch, m0, head);
  }
  __device__ __forceinline__ float* lse(const FwdParams& p) const {
    return p.lse + row_vector_offset(p.shape, batch, head, m0);
  }

  // A block that sees no key gets output zeros and lse +inf; returns whether it was one.
  template <typename T, int kHeadDim, int kThreads>
  __device__ __forceinline__ bool write_empty_rows_if_unseen(const FwdParams& p, int tid) const {
    if (n_blocks > 0) return false;
    zero_tile<kBlockM, kHeadDim, kThreads>(out<T>(p), p.out.row_stride, rows_q, p.shape.headdim, tid);
    float* row_lse = lse(p);
    for (int row = tid; row < rows_q; row += kThreads) row_lse[row] = INFINITY;
    return true;
  }
};

// Launches a forward kernel over the grid FwdQueryBlock reads: one CTA per query block, head and
// batch, with Cfg::kSmemBytes of dynamic shared memory opted in.
template <typename Cfg, typename Kernel>
cudaError_t launch_over_query_blocks(Kernel kernel, const FwdParams& params, cudaStream_t stream) {
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  const dim3 grid(ceil_div(params.shape.seqlen_q, Cfg::kBlockM), params.shape.heads, params.shape.batch);
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace flash
