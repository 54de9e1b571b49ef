// Backward launch: the tile configuration per head dim, the grid, and the number of Q/dO stages
// that fit the device's shared memory.
#pragma once

#include "bwd_kernel.cuh"
#include "bwd_preprocess_kernel.cuh"
#include "launch_api.h"

namespace flash {

// BwdConfig<hd, kBlockM (queries per step), kBlockN (keys per CTA), warps, score-phase warps
// along keys, dK/dV-phase warps along keys, dQ-phase warps along queries>.
// 64 x 128 with 8 warps up to hd 128: each warp owns 16 keys in every phase, so the dK + dV
// accumulators are 2 x 16 x hd / 32 fp32 per thread (128 at hd 128). From hd 192 the key block
// is 64 and warps split the head dim in two so those accumulators stay at or under 128.
template <int kHeadDim>
struct BwdTile;
template <> struct BwdTile<32> { using type = BwdConfig<32, 64, 128, 8, 8, 8, 4>; };
template <> struct BwdTile<64> { using type = BwdConfig<64, 64, 128, 8, 8, 8, 4>; };
template <> struct BwdTile<96> { using type = BwdConfig<96, 64, 128, 8, 8, 8, 4>; };
template <> struct BwdTile<128> { using type = BwdConfig<128, 64, 128, 8, 8, 8, 4>; };
template <> struct BwdTile<192> { using type = BwdConfig<192, 64, 64, 8, 4, 4, 4>; };
template <> struct BwdTile<256> { using type = BwdConfig<256, 64, 64, 8, 4, 4, 4>; };

template <typename T, int kHeadDim>
cudaError_t run_bwd(const BwdParams& params, cudaStream_t stream) {
  using Cfg = typename BwdTile<kHeadDim>::type;
  auto kernel = bwd_kernel<T, Cfg>;
  int device = 0, smem_optin = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (err != cudaSuccess) return err;
  // Two stages overlap the next query block's loads with this one's math; A100-class shared
  // memory (163 KB) fits them only up to hd 64, H100 (227 KB) at every head dim.
  const int stages = Cfg::smem_bytes(2) <= smem_optin ? 2 : 1;
  const int smem = Cfg::smem_bytes(stages);
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  err = run_bwd_preprocess<T>(params, stream);
  if (err != cudaSuccess) return err;
  const dim3 grid(ceil_div(params.fwd.shape.seqlen_k, Cfg::kBlockN), params.fwd.shape.heads, params.fwd.shape.batch);
  kernel<<<grid, Cfg::kThreads, smem, stream>>>(params, stages);
  return cudaGetLastError();
}

}  // namespace flash
