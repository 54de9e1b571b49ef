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

// The fp8 (e4m3) forward on Hopper (launch_fwd_fp8.cuh): dense q, k (batch, seqlen, heads, headdim)
// and V transposed, (batch, heads_k, headdim, fp8_transposed_v_keys(seqlen_k)) with its keys permuted
// as arch/sm90_fp8.cuh says; bf16 out. can_run_fwd_fp8 says whether this binary's kernel runs on
// `device` (sm_90a image, no FLASH_ATTN_DISABLE_SM90); run_fwd_fp8 returns cudaErrorNotSupported
// where it cannot.
template <int kHeadDim>
cudaError_t run_fwd_fp8(const FwdParams& params, const Fp8Descales& descales, cudaStream_t stream);
template <int kHeadDim>
cudaError_t can_run_fwd_fp8(int device, bool& usable);

// Keys per row of the fp8 forward's transposed V: whole 32-key groups of its key permutation.
constexpr int64_t fp8_transposed_v_keys(int64_t seqlen_k) { return (seqlen_k + 31) / 32 * 32; }

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
