// Hopper backward launch: which head dims have a wgmma kernel, with which tile, and its launch
// where launch_sm90.cuh says it can run.
#pragma once

#include "bwd_kernel_sm90.cuh"
#include "launch_sm90.cuh"

namespace flash {

// Head dims with a wgmma backward; the others run the sm80 kernel on Hopper too. 64-query steps:
// the dQ wgmma is m64, and S^T / dP^T (64 keys x 64 queries per warpgroup) stay at 32 registers
// each next to the 2 x hd/2 dK and dV accumulators. Measured on H200 (sweep, benchmarks/NOTES.md):
// three query stages 0.5% ahead of two; two warpgroups per CTA 32% ahead of one at hd 64 (one
// warpgroup, two CTAs per SM); 128-query steps at hd 64 1% behind (they spill).
template <int kHeadDim>
struct BwdSm90Tile {
  static constexpr bool kAvailable = false;
};
template <>
struct BwdSm90Tile<64> {
  static constexpr bool kAvailable = true;
  using type = BwdSm90Config<64, 64, 3, 2>;
};
template <>
struct BwdSm90Tile<128> {
  static constexpr bool kAvailable = true;
  using type = BwdSm90Config<128, 64, 3, 2>;
};

// Launches the wgmma backward kernel when possible; `launched` says whether it did.
template <typename T, int kHeadDim>
cudaError_t try_run_bwd_sm90(const BwdParams& params, cudaStream_t stream, int device, bool& launched) {
  launched = false;
  if constexpr (BwdSm90Tile<kHeadDim>::kAvailable) {
    using Cfg = typename BwdSm90Tile<kHeadDim>::type;
    auto kernel = bwd_kernel_sm90<T, Cfg>;
    bool usable = false;
    cudaError_t err = can_run_sm90(kernel, device, usable);
    if (err != cudaSuccess || !usable) return err;
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
    if (err != cudaSuccess) return err;
    const dim3 grid(ceil_div(params.fwd.shape.seqlen_k, Cfg::kBlockN), params.fwd.shape.heads,
                    params.fwd.shape.batch);
    kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(params);
    launched = true;
    return cudaGetLastError();
  }
  return cudaSuccess;
}

}  // namespace flash
