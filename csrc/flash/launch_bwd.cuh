// Backward launch: the wgmma kernel on Hopper where it exists (launch_bwd_sm90.cuh), else the sm80
// kernel with its tile configuration per head dim, grid, and the number of Q/dO stages that fit
// the device's shared memory.
#pragma once

#include <cstdlib>
#include <cstring>

#include "bwd_kernel.cuh"
#include "bwd_preprocess_kernel.cuh"
#include "dq_accum.cuh"
#include "features.h"
#include "launch_api.h"
#include "launch_attributes.h"
#include "launch_bwd_sm90.cuh"

namespace flash {

// BwdConfig<hd, kBlockM (queries per step), kBlockN (keys per CTA), warps, score-phase warps
// along keys, dK/dV-phase warps along keys, dQ-phase warps along queries>.
// The dK + dV accumulators cost 2 x kBlockN x hd / (32 x 8 warps) fp32 per thread whatever the
// layout (128 at hd 128), so the layouts are chosen for shared-memory reads per MMA: a warp tile
// of m x n reads (m + n) rows per k-step, and the backward is bound by those reads and by issue.
// Measured on H200 (benchmarks/NOTES.md, sweeps v1 and v2): at hd 128, 4 x 2 score and dK/dV grids
// (32 x 32 and 32 x 64 warp tiles) with a 2 x 4 dQ grid beat 8 x 1 grids by 17%; at hd 64 a
// 128-query step with 4 x 2 grids beat 64 x 128 with 8 x 1 by 16%. These are FlashAttention 2's
// sm80 tiles. From hd 192 the key block is 64 so that two Q/dO stages still fit in 227 KB.
template <int kHeadDim>
struct BwdTile;
template <> struct BwdTile<32> { using type = BwdConfig<32, 128, 128, 8, 4, 4, 4>; };
template <> struct BwdTile<64> { using type = BwdConfig<64, 128, 128, 8, 4, 4, 4>; };
template <> struct BwdTile<96> { using type = BwdConfig<96, 64, 128, 8, 4, 4, 4>; };
template <> struct BwdTile<128> { using type = BwdConfig<128, 64, 128, 8, 4, 4, 2>; };
template <> struct BwdTile<192> { using type = BwdConfig<192, 64, 64, 8, 4, 2, 2>; };
template <> struct BwdTile<256> { using type = BwdConfig<256, 64, 64, 8, 4, 2, 2>; };

// The sm80 kernel, on any sm80+ GPU.
template <typename T, int kHeadDim, bool kScoreExtras>
cudaError_t run_bwd_sm80(const BwdParams& params, cudaStream_t stream, int device) {
  using Cfg = typename BwdTile<kHeadDim>::type;
  auto kernel = bwd_kernel<T, Cfg, kScoreExtras>;
  int smem_optin = 0;
  cudaError_t err = cached_device_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>(device, smem_optin);
  if (err != cudaSuccess) return err;
  // Two stages overlap the next query block's loads with this one's math. They fit H100's 227 KB
  // at every head dim; on A100-class shared memory (163 KB) the larger tiles fall back to one stage.
  // FLASH_ATTN_BWD_STAGES=1 forces that fallback, so the tests run it on an H100 too.
  const char* forced = std::getenv("FLASH_ATTN_BWD_STAGES");
  const bool force_one_stage = forced != nullptr && std::strcmp(forced, "1") == 0;
  const int stages = !force_one_stage && Cfg::smem_bytes(2) <= smem_optin ? 2 : 1;
  return launch_over_key_blocks<Cfg>(kernel, params, stages, stream);
}

// The preprocess (dsum; it also clears dq_accum, or the deterministic counters), the main kernel,
// then dq from dq_accum.
template <typename T, int kHeadDim>
cudaError_t run_bwd(const BwdParams& params, cudaStream_t stream) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = run_bwd_preprocess<T, kHeadDim>(params, stream);
  bool launched = false;
  if (needs_score_extras(params.fwd)) {  // the score-extras variant (features.h)
    if (err == cudaSuccess) err = try_run_bwd_sm90<T, kHeadDim, true>(params, stream, device, launched);
    if (err == cudaSuccess && !launched) err = run_bwd_sm80<T, kHeadDim, true>(params, stream, device);
    launched = true;
  }
  if (err == cudaSuccess && !launched) err = try_run_bwd_sm90<T, kHeadDim, false>(params, stream, device, launched);
  if (err == cudaSuccess && !launched) err = run_bwd_sm80<T, kHeadDim, false>(params, stream, device);
  if (err == cudaSuccess) err = run_convert_dq<T, kHeadDim>(params, stream);
  return err;
}

}  // namespace flash
