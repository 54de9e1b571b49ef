// Hopper backward launch: which head dims have a wgmma kernel, with which tile, and its launch
// where launch_sm90.cuh says it can run.
#pragma once

#include "bwd_kernel_sm90.cuh"
#include "launch_attributes.h"
#include "launch_sm90.cuh"

namespace flash {

// Head dims with a wgmma backward; the others run the sm80 kernel on Hopper too. Measured on H200
// (sweep, benchmarks/NOTES.md): three query stages 0.5% ahead of two; two warpgroups per CTA ahead
// of one (hd 128: 452 vs 258 TFLOP/s at 8k). At hd 64, 128-query steps (dQ split by query) beat
// 64-query steps by 7% at 8k and 1.5% at 2k causal once the tiles were swizzled (they were 1%
// behind before); at hd 128 they were not tried: by count, S^T and dP^T of 128 queries are 64
// registers each next to 128 of dK and dV, over the 255 a thread has.
// `type` serves every shape; `short_causal_type` replaces it for causal attention over at most
// kShortCausalKeys keys, where the grid is short and the key blocks' work uneven, so smaller CTAs
// (one warpgroup, 64 keys) balance better: at hd 64, causal, 512 keys 160 vs 139 TFLOP/s; at 2k
// it is 2% behind (not measured between).
template <int kHeadDim>
struct BwdSm90Tile {
  static constexpr bool kAvailable = false;
};
template <>
struct BwdSm90Tile<64> {
  static constexpr bool kAvailable = true;
  using type = BwdSm90Config<64, 128, 3, 2>;
  using short_causal_type = BwdSm90Config<64, 64, 3, 1>;
};
template <>
struct BwdSm90Tile<128> {
  static constexpr bool kAvailable = true;
  using type = BwdSm90Config<128, 64, 3, 2>;
  using short_causal_type = type;  // one warpgroup measured 23% behind at 512 causal
};
constexpr int kShortCausalKeys = 1024;

template <typename T, typename Cfg, bool kScoreExtras>
cudaError_t launch_bwd_sm90(const BwdParams& params, cudaStream_t stream) {
  auto kernel = bwd_kernel_sm90<T, Cfg, kScoreExtras>;
  cudaError_t err = allow_dynamic_smem(kernel, Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  const dim3 grid(ceil_div(params.fwd.shape.seqlen_k, Cfg::kBlockN), params.fwd.shape.heads, params.fwd.shape.batch);
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(params);
  return cudaGetLastError();
}

// Launches the wgmma backward kernel when possible; `launched` says whether it did.
template <typename T, int kHeadDim, bool kScoreExtras>
cudaError_t try_run_bwd_sm90(const BwdParams& params, cudaStream_t stream, int device, bool& launched) {
  launched = false;
  if constexpr (BwdSm90Tile<kHeadDim>::kAvailable) {
    using Tile = BwdSm90Tile<kHeadDim>;
    bool usable = false;
    cudaError_t err = can_run_sm90(bwd_kernel_sm90<T, typename Tile::type, kScoreExtras>, device, usable);
    if (err != cudaSuccess || !usable) return err;
    launched = true;
    if (params.fwd.causal && params.fwd.shape.seqlen_k <= kShortCausalKeys)
      return launch_bwd_sm90<T, typename Tile::short_causal_type, kScoreExtras>(params, stream);
    return launch_bwd_sm90<T, typename Tile::type, kScoreExtras>(params, stream);
  }
  return cudaSuccess;
}

}  // namespace flash
