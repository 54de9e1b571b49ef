// Host-side entry points of the kernels, free of torch: the op layer (csrc/torch/ops.cpp) fills
// the params and calls these; csrc/instantiations/*.cu define one (dtype, head dim) each.
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

#include "params.h"

namespace flash {

// Whether a per-head-dim tile choice (a struct with a `type` member where that head dim has a tile)
// has one: the ROCm launchers' run_* return cudaErrorNotSupported for head dims without.
template <typename Tile, typename = void>
struct HasTile : std::false_type {};
template <typename Tile>
struct HasTile<Tile, std::void_t<typename Tile::type>> : std::true_type {};

// Each returns the first CUDA error of the launch (attribute setup included), cudaSuccess otherwise.
template <typename T, int kHeadDim>
cudaError_t run_fwd(const FwdParams& params, cudaStream_t stream);

template <typename T, int kHeadDim>
cudaError_t run_bwd(const BwdParams& params, cudaStream_t stream);

// flash_attn_with_kvcache: appends the new tokens to the cache (keys rotated), then attends (queries
// rotated as they are loaded);
// params.num_splits > 1 needs out_accum / lse_accum (params.h).
template <typename T, int kHeadDim>
cudaError_t run_fwd_kvcache(const KvAppendParams& append, const SplitKvParams& params, cudaStream_t stream);

// Writes keep[b, h, i, j] (bool, contiguous (batch, heads, seqlen_q, seqlen_k)): whether the dropout
// of dropout.cuh keeps element (i, j) of (b, h). For return_attn_probs and the tests.
cudaError_t run_dropout_keep_mask(const DropoutArgs& args, int batch, int heads, int seqlen_q, int seqlen_k, bool* keep,
                                  cudaStream_t stream);

}  // namespace flash
