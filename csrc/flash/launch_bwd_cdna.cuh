// Backward launch on CDNA (MI200 gfx90a, MI300 gfx942): the sm80-family kernels (the preprocess,
// bwd_kernel.cuh, dq_accum.cuh's convert) compiled against the CDNA arch layer, with tiles that fit
// the 64 KiB of LDS of a workgroup. Compiled for gfx90a and gfx942 by CI (hip/ci_check.sh, every
// tile below). A ROCm build's generated instantiations include this file for run_bwd
// (generate_instantiations.py --target rocm); not yet run on AMD hardware.
#pragma once

#include <type_traits>

#include "bwd_kernel.cuh"
#include "bwd_preprocess_kernel.cuh"
#include "dq_accum.cuh"
#include "features.h"
#include "launch_api.h"
#include "launch_attributes.h"

namespace flash {

// BwdConfig<hd, kBlockM (queries per step), kBlockN (keys per workgroup), waves, score-phase waves
// along keys, dK/dV-phase waves along keys, dQ-phase waves along queries>.
// 64 queries x 64 keys is the smallest step the deterministic dQ order allows (kBlockM >=
// kMinBwdBlockM, kBlockN >= kBlockM: dq_order.cuh). Its LDS with one stage, rows padded by 16
// bytes: K + V, P^T + dS^T, then Q + dO + lse + dsum,
//   hd 32: 10240 + 18432 + 10752 = 39424 B;  hd 64: 18432 + 18432 + 18944 = 55808 B;
//   hd 96: 72192 B, hd 128: 88576 B, hd 192: 121344 B, over the 64 KiB: those head dims have no
//   CDNA tile. They need a kernel that keeps less in LDS (V in registers, as FlashAttention 2's
//   Is_V_in_regs, with P^T and dS^T in V's place fits hd 96 in 58880 B, not hd 128) or a smaller
//   query step than the deterministic counters allow today.
// Waves: every warp tile is whole 32x32 atoms (arch::kAtomM, kWarpTileColStep). hd 64 runs 4
// waves on 2 x 2 grids (32 x 32 tiles in every phase). hd 32 runs 2: its dK / dV tile (64 keys x 32
// dims) is only two atoms, so with the LDS allowing one workgroup per CU, 2 of a CU's 4 SIMDs idle.
// None of this is measured (no AMD GPU).
template <int kHeadDim>
struct BwdTileCdna {};  // no tile: run_bwd reports the head dim as not supported
template <> struct BwdTileCdna<32> { using type = BwdConfig<32, 64, 64, 2, 2, 2, 2>; };
template <> struct BwdTileCdna<64> { using type = BwdConfig<64, 64, 64, 4, 2, 2, 2>; };

// One stage of Q / dO: the CDNA copies are synchronous (arch/cdna.cuh cp_async_16), so a second
// stage would not overlap the next block's loads with this one's math, only take LDS.
constexpr int kBwdStagesCdna = 1;

template <typename T, int kHeadDim, bool kScoreExtras>
cudaError_t run_bwd_main_cdna(const BwdParams& params, cudaStream_t stream) {
  using Cfg = typename BwdTileCdna<kHeadDim>::type;
  constexpr int kSmem = arch::checked_lds_bytes<Cfg::smem_bytes(kBwdStagesCdna)>();
  auto kernel = bwd_kernel<T, Cfg, kScoreExtras>;
  const cudaError_t err = allow_dynamic_smem(kernel, kSmem);
  if (err != cudaSuccess) return err;
  const dim3 grid(ceil_div(params.fwd.shape.seqlen_k, Cfg::kBlockN), params.fwd.shape.heads, params.fwd.shape.batch);
  kernel<<<grid, Cfg::kThreads, kSmem, stream>>>(params, kBwdStagesCdna);
  return cudaGetLastError();
}

// The preprocess (dsum; it also clears dq_accum, or the deterministic counters), the main kernel
// (the plain call and the calls with options run separate instantiations: features.h), then dq
// from dq_accum.
template <typename T, int kHeadDim>
cudaError_t run_bwd_cdna(const BwdParams& params, cudaStream_t stream) {
  cudaError_t err = run_bwd_preprocess<T, kHeadDim>(params, stream);
  if (err == cudaSuccess) {
    err = needs_score_extras(params.fwd) ? run_bwd_main_cdna<T, kHeadDim, true>(params, stream)
                                         : run_bwd_main_cdna<T, kHeadDim, false>(params, stream);
  }
  if (err == cudaSuccess) err = run_convert_dq<T, kHeadDim>(params, stream);
  return err;
}

template <int kHeadDim, typename = void>
struct HasBwdTileCdna : std::false_type {};
template <int kHeadDim>
struct HasBwdTileCdna<kHeadDim, std::void_t<typename BwdTileCdna<kHeadDim>::type>> : std::true_type {};

// launch_api.h's entry point in a ROCm build: cudaErrorNotSupported (hipErrorNotSupported) for a
// head dim without a CDNA tile, so a build of every head dim links and the op layer reports it.
template <typename T, int kHeadDim>
cudaError_t run_bwd(const BwdParams& params, cudaStream_t stream) {
  if constexpr (HasBwdTileCdna<kHeadDim>::value) {
    return run_bwd_cdna<T, kHeadDim>(params, stream);
  } else {
    return cudaErrorNotSupported;
  }
}

}  // namespace flash
