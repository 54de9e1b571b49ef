// Hopper forward launch: which head dims have a wgmma kernel, with which tile, and its launch
// where launch_sm90.cuh says it can run.
#pragma once

#include "fwd_kernel_sm90.cuh"
#include "launch_sm90.cuh"

namespace flash {

// Head dims with a wgmma forward; the others run the sm80 kernel on Hopper too.
// FwdSm90Config<hd, keys per step, warpgroups (64 queries each)>.
template <int kHeadDim>
struct FwdSm90Tile {
  static constexpr bool kAvailable = false;
};
template <>
struct FwdSm90Tile<64> {
  static constexpr bool kAvailable = true;
  using type = FwdSm90Config<64, 128, 2>;
};
template <>
struct FwdSm90Tile<128> {
  static constexpr bool kAvailable = true;
  using type = FwdSm90Config<128, 128, 2>;
};

// Launches the wgmma forward kernel when possible; `launched` says whether it did.
template <typename T, int kHeadDim>
cudaError_t try_run_fwd_sm90(const FwdParams& params, cudaStream_t stream, bool& launched) {
  launched = false;
  if constexpr (FwdSm90Tile<kHeadDim>::kAvailable) {
    using Cfg = typename FwdSm90Tile<kHeadDim>::type;
    auto kernel = fwd_kernel_sm90<T, Cfg>;
    int device = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err != cudaSuccess) return err;
    bool usable = false;
    err = can_run_sm90(kernel, device, usable);
    if (err != cudaSuccess || !usable) return err;
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
    if (err != cudaSuccess) return err;
    const dim3 grid(ceil_div(params.shape.seqlen_q, Cfg::kBlockM), params.shape.heads, params.shape.batch);
    kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(params);
    launched = true;
    return cudaGetLastError();
  }
  return cudaSuccess;
}

}  // namespace flash
