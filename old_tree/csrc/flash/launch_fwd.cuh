// Forward launch: the wgmma kernel on Hopper where it exists (launch_fwd_sm90.cuh), else the sm80
// kernel with its tile configuration per head dim, grid and shared-memory opt-in.
#pragma once

#include "fwd_kernel.cuh"
#include "fwd_query_block.cuh"
#include "launch_api.h"
#include "launch_fwd_sm90.cuh"

namespace flash {

// Tile per head dim (sm80 atom). 4 warps x 32 query rows keeps the K/V shared-memory reads per MMA
// at half of what 16 rows per warp need: measured on H200 (benchmarks/NOTES.md), 4 warps beat 8 by
// 30-50% at hd 64 and 128; key blocks of 128 beat 64 by 6% at hd 64, and 64 beat 32 and 128 at
// hd 128. From hd 192 the O accumulator (32 rows x hd / 32 lanes fp32) would overflow the
// register file, so those use 8 warps x 16 rows.
template <int kHeadDim>
struct FwdTile;
template <> struct FwdTile<32> { using type = FwdConfig<32, 128, 128, 4>; };
template <> struct FwdTile<64> { using type = FwdConfig<64, 128, 128, 4>; };
template <> struct FwdTile<96> { using type = FwdConfig<96, 128, 64, 4>; };
template <> struct FwdTile<128> { using type = FwdConfig<128, 128, 64, 4>; };
template <> struct FwdTile<192> { using type = FwdConfig<192, 128, 64, 8>; };
template <> struct FwdTile<256> { using type = FwdConfig<256, 128, 64, 8>; };

// The sm80 kernel, on any sm80+ GPU.
template <typename T, int kHeadDim, bool kScoreExtras>
cudaError_t run_fwd_sm80(const FwdParams& params, cudaStream_t stream) {
  using Cfg = typename FwdTile<kHeadDim>::type;
  return launch_over_query_blocks<Cfg>(fwd_kernel<T, Cfg, kScoreExtras>, params, stream);
}

template <typename T, int kHeadDim, bool kScoreExtras>
cudaError_t run_fwd_variant(const FwdParams& params, cudaStream_t stream) {
  bool launched = false;
  cudaError_t err = try_run_fwd_sm90<T, kHeadDim, kScoreExtras>(params, stream, launched);
  if (err == cudaSuccess && !launched) err = run_fwd_sm80<T, kHeadDim, kScoreExtras>(params, stream);
  return err;
}

// The plain call and the calls with options run separate instantiations (features.h says why).
template <typename T, int kHeadDim>
cudaError_t run_fwd(const FwdParams& params, cudaStream_t stream) {
  if (needs_score_extras(params)) return run_fwd_variant<T, kHeadDim, true>(params, stream);
  return run_fwd_variant<T, kHeadDim, false>(params, stream);
}

}  // namespace flash
