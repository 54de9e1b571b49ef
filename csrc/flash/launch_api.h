// Host-side entry points of the kernels, free of torch: the op layer (csrc/torch/ops.cpp) fills
// the params and calls these; csrc/instantiations/*.cu define one (dtype, head dim) each.
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

#include "fp8_v_order.h"
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
// as fp8_v_order.h says; bf16 out. can_run_fwd_fp8 says whether this binary's kernel runs on
// `device` (sm_90a image, no FLASH_ATTN_DISABLE_SM90); run_fwd_fp8 returns cudaErrorNotSupported
// where it cannot.
template <int kHeadDim>
cudaError_t run_fwd_fp8(const FwdParams& params, const Fp8Descales& descales, cudaStream_t stream);
template <int kHeadDim>
cudaError_t can_run_fwd_fp8(int device, bool& usable);

// Builds that V (fp8_v_order.h) from v (batch, seqlen_k, heads_k, headdim) e4m3 bytes with the given
// byte strides (16-byte aligned, as are v and out) into out, contiguous. cudaErrorInvalidValue for a
// head dim that is not a multiple of 16 up to 256.
cudaError_t run_fp8_transposed_v(const uint8_t* v, int64_t batch_stride, int64_t key_stride, int64_t head_stride,
                                 int batch, int seqlen_k, int heads_k, int headdim, uint8_t* out,
                                 cudaStream_t stream);

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
