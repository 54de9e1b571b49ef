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
// along keys, dK/dV-phase waves along keys, dQ-phase waves along queries>; BwdConfigVPInRegisters<hd,
// kBlockM, kBlockN, waves, dQ-phase waves along queries> keeps V and P^T in registers (every wave on
// its own keys in the score and dK/dV phases); BwdConfigDimSplit<hd, kBlockM, kBlockN, waves, waves
// per score tile, V in registers> splits the head dim over the waves in every phase.
// 64 queries x 64 keys: the plain kernel's step (kBlockN >= kBlockM for the deterministic dQ order,
// dq_order.cuh). Its LDS with one stage, rows padded by 16 bytes: K + V, P^T + dS^T, then Q + dO +
// lse + dsum,
//   hd 32: 10240 + 18432 + 10752 = 39424 B;  hd 64: 18432 + 18432 + 18944 = 55808 B;
//   hd 96: 72192 B and hd 128: 88576 B, over the 64 KiB, so those keep V and P^T in registers:
//   K + dS^T + the stage, hd 96: 13312 + 9216 + 27136 = 49664 B; hd 128: 17408 + 9216 + 35328 =
//   61952 B.
// Waves: every warp tile is whole 32x32 atoms (arch::kAtomM, kWarpTileColStep). hd 64 runs 4
// waves on 2 x 2 grids (32 x 32 tiles in every phase). The others run 2: hd 32's dK / dV tile (64
// keys x 32 dims) is only two atoms, and V and P^T in registers want one wave per 32 keys of the
// 64. With the LDS allowing one workgroup per CU, 2 of a CU's 4 SIMDs idle there.
// hd 192 and 256: 64-query steps do not fit (K, Q and dO alone: 77312 B at hd 192), and a 32 x 32
// step on one wave spilled (hd 192 on gfx90a: 19 VGPRs of bf16, 61-64 with the score extras, ROCm
// 5.2's compiler keeping the row bounds of a 1-wave tile load live; hd 256, V in registers next to
// 256 fp32 of dK and dV per lane: 13-257 VGPRs on both targets). So 32 queries x 32 keys on 2 waves
// that split the head dim: both compute the one score tile over half the head dim each (summed
// through LDS), and each owns half of dK, dV (32 keys x hd / 2) and dQ (32 queries x hd / 2, one
// column atom at a time: the whole half spilled 23-28 VGPRs in gfx942's hd 256 extras kernel).
//   hd 192: K + V 25600, P^T + dS^T 5120, stage 25856, S^T / dP^T partials 8192 = 64768 B;
//   hd 256: K, V, Q and dO at 32 rows alone are 67584 B, so V stays in registers (each wave its
//   half of the head dim, 32 VGPRs): K 16896 + 5120 + stage 34048 + partials 8192 = 64256 B.
// The score-extras kernel runs the same tiles.
// None of this is measured (no AMD GPU).
template <int kHeadDim>
struct BwdTileCdna {};  // no tile: run_bwd reports the head dim as not supported
template <> struct BwdTileCdna<32> { using type = BwdConfig<32, 64, 64, 2, 2, 2, 2>; };
template <> struct BwdTileCdna<64> { using type = BwdConfig<64, 64, 64, 4, 2, 2, 2>; };
template <> struct BwdTileCdna<96> { using type = BwdConfigVPInRegisters<96, 64, 64, 2, 2>; };
template <> struct BwdTileCdna<128> { using type = BwdConfigVPInRegisters<128, 64, 64, 2, 2>; };
template <> struct BwdTileCdna<192> { using type = BwdConfigDimSplit<192, 32, 32, 2, 2, false>; };
template <> struct BwdTileCdna<256> { using type = BwdConfigDimSplit<256, 32, 32, 2, 2, true>; };

// The score-extras kernel (dropout's tests, softcap's and ALiBi's terms): the plain tile where it
// fits. With V, P^T and 32 keys x hd of dK and dV per wave, hd 96 and 128 fill the 512 VGPRs and
// AGPRs of a lane and their extras kernels spilled (hd 96: 2 VGPRs on gfx942; hd 128: 39-57 on
// gfx90a, 87-93 on gfx942, with scratch). A 32-query step (kMinBwdBlockM is 32 on CDNA) halves the
// score tiles and leaves room in LDS for V and P^T again:
//   hd 96: 32 queries x 32 keys on 1 wave (its dQ tile, 32 x 96, is 3 atoms: no even split over 2
//   waves), K + V 13312, P^T + dS^T 5120, stage 13568 = 31872 B, two workgroups per CU;
//   hd 128: 32 queries x 64 keys on 2 waves, K + V 34816, P^T + dS^T 10240, stage 17664 = 62720 B.
// Either way 2 waves per CU, as the plain tiles. benchmarks/NOTES.md, CDNA backward.
template <int kHeadDim>
struct BwdExtrasTileCdna : BwdTileCdna<kHeadDim> {};
template <> struct BwdExtrasTileCdna<96> { using type = BwdConfig<96, 32, 32, 1, 1, 1, 1>; };
template <> struct BwdExtrasTileCdna<128> { using type = BwdConfig<128, 32, 64, 2, 2, 2, 1>; };

template <int kHeadDim, bool kScoreExtras>
using BwdTileCdnaOf =
    typename std::conditional_t<kScoreExtras, BwdExtrasTileCdna<kHeadDim>, BwdTileCdna<kHeadDim>>::type;

// One stage of Q / dO: the CDNA copies are synchronous (arch/cdna.cuh cp_async_16), so a second
// stage would not overlap the next block's loads with this one's math, only take LDS.
constexpr int kBwdStagesCdna = 1;

template <typename T, int kHeadDim, bool kScoreExtras>
cudaError_t run_bwd_main_cdna(const BwdParams& params, cudaStream_t stream) {
  using Cfg = BwdTileCdnaOf<kHeadDim, kScoreExtras>;
  static_assert(arch::checked_lds_bytes<Cfg::smem_bytes(kBwdStagesCdna)>() == Cfg::smem_bytes(kBwdStagesCdna),
                "LDS budget");
  return launch_over_key_blocks<Cfg>(bwd_kernel<T, Cfg, kScoreExtras>, params, kBwdStagesCdna, stream);
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

// launch_api.h's entry point in a ROCm build: cudaErrorNotSupported (hipErrorNotSupported) for a
// head dim without a CDNA tile (none today), so a build of every head dim links and the op layer
// reports it (op_common.h check_launch).
template <typename T, int kHeadDim>
cudaError_t run_bwd(const BwdParams& params, cudaStream_t stream) {
  if constexpr (HasTile<BwdTileCdna<kHeadDim>>::value) {
    return run_bwd_cdna<T, kHeadDim>(params, stream);
  } else {
    return cudaErrorNotSupported;
  }
}

}  // namespace flash
