// Hopper forward launch: which head dims have a wgmma kernel, with which tile, and its launch
// where launch_sm90.cuh says it can run.
#pragma once

#include "fwd_kernel_sm90.cuh"
#include "launch_sm90.cuh"

namespace flash {

// Head dims with a wgmma forward; the others run the sm80 kernel on Hopper too.
// FwdSm90Config<hd, keys per step, warpgroups (64 queries each), CTAs per SM>; `causal_type`
// replaces `type` for causal attention. Measured on H200 (sweep, benchmarks/NOTES.md, TFLOP/s):
//   hd 64: one CTA of two warpgroups per SM left the SM idle through every CTA's loads, barriers
//     and epilogue (243 at 2k causal, below the sm80 kernel's 247). Several CTAs per SM, at the
//     price of 64-key steps to fit their registers: two CTAs of two warpgroups 390 at 8k and 304 at
//     512 (non-causal); three CTAs of one warpgroup 206 at 512 causal and 308 at 2k causal (two
//     CTAs: 175 and 291), the finer grid balancing the uneven causal rows.
//   hd 128: 128-key steps, two warpgroups, one CTA per SM: 471 at 8k, 358 at 2k causal, 340 at 512
//     (64-key steps 417 / 327 / 301).
template <int kHeadDim>
struct FwdSm90Tile {
  static constexpr bool kAvailable = false;
};
template <>
struct FwdSm90Tile<64> {
  static constexpr bool kAvailable = true;
  using type = FwdSm90Config<64, 64, 2, 2>;
  using causal_type = FwdSm90Config<64, 64, 1, 3>;
};
template <>
struct FwdSm90Tile<128> {
  static constexpr bool kAvailable = true;
  using type = FwdSm90Config<128, 128, 2>;
  using causal_type = type;
};

// Launches the wgmma forward kernel when possible; `launched` says whether it did.
template <typename T, int kHeadDim, bool kExtras>
cudaError_t try_run_fwd_sm90(const FwdParams& params, cudaStream_t stream, bool& launched) {
  launched = false;
  if constexpr (FwdSm90Tile<kHeadDim>::kAvailable) {
    using Tile = FwdSm90Tile<kHeadDim>;
    int device = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err != cudaSuccess) return err;
    bool usable = false;
    err = can_run_sm90(fwd_kernel_sm90<T, typename Tile::type, kExtras>, device, usable);
    if (err != cudaSuccess || !usable) return err;
    launched = true;
    using CausalCfg = typename Tile::causal_type;
    using Cfg = typename Tile::type;
    if (params.causal) {
      return launch_over_query_blocks<CausalCfg>(fwd_kernel_sm90<T, CausalCfg, kExtras>, params, stream);
    }
    return launch_over_query_blocks<Cfg>(fwd_kernel_sm90<T, Cfg, kExtras>, params, stream);
  }
  return cudaSuccess;
}

}  // namespace flash
