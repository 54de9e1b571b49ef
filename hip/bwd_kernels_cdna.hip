// The sm80-family backward (csrc/flash/bwd_kernel.cuh, with its preprocess and dQ convert kernels)
// built for CDNA from the hipified tree, as CI's hip/ci_check.sh compiles it for gfx90a and gfx942:
// run_bwd_cdna (launch_bwd_cdna.cuh) for fp16 and bf16 at every head dim (32, 64, 96, 128, 192,
// 256), each with the plain kernel and the score-extras one (dropout, softcap, ALiBi; at 96 and 128
// on its own 32-query tile; at 192 and 256 on the plain kernel's tile, which splits the head dim over
// its 2 waves). The deterministic order is a run-time flag of both.
// hip/check_isa.py then checks every backward kernel in the ISA.
#include <hip/hip_runtime.h>

#include "flash/launch_bwd_cdna.cuh"

using flash::arch::bfloat16_t;
using flash::arch::half_t;

template hipError_t flash::run_bwd_cdna<half_t, 32>(const flash::BwdParams&, hipStream_t);
template hipError_t flash::run_bwd_cdna<half_t, 64>(const flash::BwdParams&, hipStream_t);
template hipError_t flash::run_bwd_cdna<half_t, 96>(const flash::BwdParams&, hipStream_t);
template hipError_t flash::run_bwd_cdna<half_t, 128>(const flash::BwdParams&, hipStream_t);
template hipError_t flash::run_bwd_cdna<half_t, 192>(const flash::BwdParams&, hipStream_t);
template hipError_t flash::run_bwd_cdna<half_t, 256>(const flash::BwdParams&, hipStream_t);
template hipError_t flash::run_bwd_cdna<bfloat16_t, 32>(const flash::BwdParams&, hipStream_t);
template hipError_t flash::run_bwd_cdna<bfloat16_t, 64>(const flash::BwdParams&, hipStream_t);
template hipError_t flash::run_bwd_cdna<bfloat16_t, 96>(const flash::BwdParams&, hipStream_t);
template hipError_t flash::run_bwd_cdna<bfloat16_t, 128>(const flash::BwdParams&, hipStream_t);
template hipError_t flash::run_bwd_cdna<bfloat16_t, 192>(const flash::BwdParams&, hipStream_t);
template hipError_t flash::run_bwd_cdna<bfloat16_t, 256>(const flash::BwdParams&, hipStream_t);

// Each tile's dynamic LDS (Cfg::smem_bytes of the stages it launches with, which the resource
// report does not count) as a device constant bwd_lds_<head dim>_<block m>_<block n>_<waves>, which
// hip/check_isa.py reads from the ISA.
template <typename Cfg, int kHeadDim, int kBlockM, int kBlockN, int kWaves>
constexpr int lds_bytes_of() {
  static_assert(Cfg::kHeadDim == kHeadDim && Cfg::kBlockM == kBlockM && Cfg::kBlockN == kBlockN &&
                    Cfg::kWarps == kWaves,
                "name the constant after the tile");
  return Cfg::smem_bytes(flash::kBwdStagesCdna);
}

template <int kHeadDim>
using ExtrasTile = flash::BwdTileCdnaOf<kHeadDim, /*kScoreExtras=*/true>;

extern "C" __device__ const int bwd_lds_32_64_64_2 = lds_bytes_of<flash::BwdTileCdna<32>::type, 32, 64, 64, 2>();
extern "C" __device__ const int bwd_lds_64_64_64_4 = lds_bytes_of<flash::BwdTileCdna<64>::type, 64, 64, 64, 4>();
extern "C" __device__ const int bwd_lds_96_64_64_2 = lds_bytes_of<flash::BwdTileCdna<96>::type, 96, 64, 64, 2>();
extern "C" __device__ const int bwd_lds_128_64_64_2 = lds_bytes_of<flash::BwdTileCdna<128>::type, 128, 64, 64, 2>();
extern "C" __device__ const int bwd_lds_96_32_32_1 = lds_bytes_of<ExtrasTile<96>, 96, 32, 32, 1>();
extern "C" __device__ const int bwd_lds_128_32_64_2 = lds_bytes_of<ExtrasTile<128>, 128, 32, 64, 2>();
extern "C" __device__ const int bwd_lds_192_32_32_2 = lds_bytes_of<flash::BwdTileCdna<192>::type, 192, 32, 32, 2>();
extern "C" __device__ const int bwd_lds_256_32_32_2 = lds_bytes_of<flash::BwdTileCdna<256>::type, 256, 32, 32, 2>();
