// Hopper backward launch: which head dims have a wgmma kernel, and whether this device and this
// binary can run it.
#pragma once

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "bwd_kernel_sm90.cuh"

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

// True on a compute-capability 9.0 device when the kernel's loaded image was built for sm_90a
// (not JIT-compiled from older PTX). The image of a kernel does not change within a process, so
// the answer is kept per device (0 unknown, 1 yes, 2 no) and the CUDA queries run once.
template <typename Kernel>
cudaError_t loaded_image_is_sm90a(Kernel kernel, int device, bool& result) {
  constexpr int kCachedDevices = 64;
  static std::atomic<int> known[kCachedDevices];
  if (device < kCachedDevices && known[device] != 0) {
    result = known[device] == 1;
    return cudaSuccess;
  }
  result = false;
  int major = 0;
  cudaError_t err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (err != cudaSuccess) return err;
  if (major == 9) {
    cudaFuncAttributes attributes;
    err = cudaFuncGetAttributes(&attributes, kernel);
    if (err != cudaSuccess) return err;
    result = attributes.binaryVersion == 90 && attributes.ptxVersion == 90;
  }
  if (device < kCachedDevices) known[device] = result ? 1 : 2;
  return cudaSuccess;
}

// The sm90 kernel can run, unless FLASH_ATTN_DISABLE_SM90=1 asks for the sm80 one (read per call:
// the tests switch it).
template <typename Kernel>
cudaError_t can_run_sm90(Kernel kernel, int device, bool& result) {
  result = false;
  const char* disabled = std::getenv("FLASH_ATTN_DISABLE_SM90");
  if (disabled != nullptr && std::strcmp(disabled, "1") == 0) return cudaSuccess;
  return loaded_image_is_sm90a(kernel, device, result);
}

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
