// The sm80-family forward (csrc/flash/fwd_kernel.cuh) built for CDNA from the hipified tree, as
// CI's hip/ci_check.sh compiles it for gfx90a and gfx942: run_fwd_cdna (launch_fwd_cdna.cuh) for
// fp16 and bf16 at every head dim with a CDNA tile (32, 64, 96, 128, 192, 256), each instantiating the
// plain kernel and the score-extras one (dropout, softcap, ALiBi). hip/check_isa.py then checks
// every fwd_kernel in the ISA.
#include <type_traits>

#include <hip/hip_runtime.h>

#include "flash/launch_fwd_cdna.cuh"

using flash::arch::bfloat16_t;
using flash::arch::half_t;

template hipError_t flash::run_fwd_cdna<half_t, 32>(const flash::FwdParams&, hipStream_t);
template hipError_t flash::run_fwd_cdna<half_t, 64>(const flash::FwdParams&, hipStream_t);
template hipError_t flash::run_fwd_cdna<half_t, 96>(const flash::FwdParams&, hipStream_t);
template hipError_t flash::run_fwd_cdna<half_t, 128>(const flash::FwdParams&, hipStream_t);
template hipError_t flash::run_fwd_cdna<half_t, 192>(const flash::FwdParams&, hipStream_t);
template hipError_t flash::run_fwd_cdna<half_t, 256>(const flash::FwdParams&, hipStream_t);
template hipError_t flash::run_fwd_cdna<bfloat16_t, 32>(const flash::FwdParams&, hipStream_t);
template hipError_t flash::run_fwd_cdna<bfloat16_t, 64>(const flash::FwdParams&, hipStream_t);
template hipError_t flash::run_fwd_cdna<bfloat16_t, 96>(const flash::FwdParams&, hipStream_t);
template hipError_t flash::run_fwd_cdna<bfloat16_t, 128>(const flash::FwdParams&, hipStream_t);
template hipError_t flash::run_fwd_cdna<bfloat16_t, 192>(const flash::FwdParams&, hipStream_t);
template hipError_t flash::run_fwd_cdna<bfloat16_t, 256>(const flash::FwdParams&, hipStream_t);

// Each tile's dynamic LDS (Cfg::kSmemBytes, which the resource report does not count) as a device
// constant fwd_lds_<head dim>_<block m>_<block n>_<warps>, which hip/check_isa.py reads from the ISA.
template <typename Cfg, int kHeadDim, int kBlockM, int kBlockN, int kWarps>
constexpr int lds_bytes_of() {
  static_assert(std::is_same_v<Cfg, flash::FwdConfig<kHeadDim, kBlockM, kBlockN, kWarps>>,
                "name the constant after the tile");
  return Cfg::kSmemBytes;
}

extern "C" __device__ const int fwd_lds_32_128_128_4 = lds_bytes_of<flash::FwdTileCdna<32>::type, 32, 128, 128, 4>();
extern "C" __device__ const int fwd_lds_64_128_128_4 = lds_bytes_of<flash::FwdTileCdna<64>::type, 64, 128, 128, 4>();
extern "C" __device__ const int fwd_lds_96_128_64_4 = lds_bytes_of<flash::FwdTileCdna<96>::type, 96, 128, 64, 4>();
extern "C" __device__ const int fwd_lds_128_128_32_4 = lds_bytes_of<flash::FwdTileCdna<128>::type, 128, 128, 32, 4>();
extern "C" __device__ const int fwd_lds_192_64_32_2 = lds_bytes_of<flash::FwdTileCdna<192>::type, 192, 64, 32, 2>();
extern "C" __device__ const int fwd_lds_256_32_32_1 = lds_bytes_of<flash::FwdTileCdna<256>::type, 256, 32, 32, 1>();
