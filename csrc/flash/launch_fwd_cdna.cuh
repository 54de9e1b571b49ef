// Forward launch on CDNA (MI200 gfx90a, MI300 gfx942): the sm80-family kernel (fwd_kernel.cuh)
// compiled against the CDNA arch layer, with tiles that fit the 64 KiB of LDS of a workgroup.
// Compiled for gfx90a and gfx942 by CI (hip/ci_check.sh, every tile below). A ROCm build's
// generated instantiations include this file for run_fwd (generate_instantiations.py --target
// rocm); not yet run on AMD hardware.
#pragma once

#include "features.h"
#include "fwd_kernel.cuh"
#include "fwd_query_block.cuh"
#include "launch_api.h"

namespace flash {

// Tile per head dim: the sm80 tile (launch_fwd.cuh) where its LDS fits, else fewer keys per block,
// then fewer queries. 32 query rows per wave (one 32x32 MFMA atom of queries: arch::kAtomM). LDS =
// Q (kBlockM rows) + K (kBlockN rows) + V^T (kHeadDim rows of kBlockN keys), rows padded by 16 bytes:
//   hd 32: 29184 B; hd 64: 54272 B; hd 96: 53760 B; hd 128: 53760 B with 32-key blocks (64 keys
//   would need 70656); hd 192: 53760 B with 64 queries (2 waves) of 32-key blocks (128 queries
//   would need 79360), so one workgroup per CU keeps 2 of its 4 SIMDs idle (16-row waves would
//   need the 16x16 atom); hd 256: 54272 B with 32 queries (1 wave) of 32-key blocks (64 queries
//   would need 71168), so 3 of a CU's 4 SIMDs idle.
// The LDS allows one workgroup per CU except at hd 32 (two). None of these is measured (no AMD GPU).
template <int kHeadDim>
struct FwdTileCdna {};  // no tile: run_fwd reports the head dim as not supported
template <> struct FwdTileCdna<32> { using type = FwdConfig<32, 128, 128, 4>; };
template <> struct FwdTileCdna<64> { using type = FwdConfig<64, 128, 128, 4>; };
template <> struct FwdTileCdna<96> { using type = FwdConfig<96, 128, 64, 4>; };
template <> struct FwdTileCdna<128> { using type = FwdConfig<128, 128, 32, 4>; };
template <> struct FwdTileCdna<192> { using type = FwdConfig<192, 64, 32, 2>; };
template <> struct FwdTileCdna<256> { using type = FwdConfig<256, 32, 32, 1>; };

// The plain call and the calls with options run separate instantiations (features.h says why).
template <typename T, int kHeadDim>
cudaError_t run_fwd_cdna(const FwdParams& params, cudaStream_t stream) {
  using Cfg = typename FwdTileCdna<kHeadDim>::type;
  static_assert(arch::checked_lds_bytes<Cfg::kSmemBytes>() == Cfg::kSmemBytes, "LDS budget");
  if (needs_score_extras(params)) return launch_over_query_blocks<Cfg>(fwd_kernel<T, Cfg, true>, params, stream);
  return launch_over_query_blocks<Cfg>(fwd_kernel<T, Cfg, false>, params, stream);
}

// launch_api.h's entry point in a ROCm build: cudaErrorNotSupported (hipErrorNotSupported) for a
// head dim without a CDNA tile (none today), so a build of every head dim links and the op layer
// reports it.
template <typename T, int kHeadDim>
cudaError_t run_fwd(const FwdParams& params, cudaStream_t stream) {
  if constexpr (HasTile<FwdTileCdna<kHeadDim>>::value) {
    return run_fwd_cdna<T, kHeadDim>(params, stream);
  } else {
    return cudaErrorNotSupported;
  }
}

}  // namespace flash
