// The split-KV decode (csrc/flash/launch_kvcache_cdna.cuh: the append / rotary kernel, the
// split-KV kernel for a contiguous and a paged cache, and the combine kernel) built for CDNA from
// the hipified tree, as CI's hip/ci_check.sh compiles it for gfx90a and gfx942:
// run_fwd_kvcache_cdna for fp16 and bf16 at every head dim (32, 64, 96, 128, 192, 256).
// hip/check_isa.py then checks every kernel in the ISA.
#include <type_traits>

#include <hip/hip_runtime.h>

#include "flash/launch_kvcache_cdna.cuh"

using flash::arch::bfloat16_t;
using flash::arch::half_t;

template hipError_t flash::run_fwd_kvcache_cdna<half_t, 32>(const flash::KvAppendParams&,
                                                          const flash::SplitKvParams&, hipStream_t);
template hipError_t flash::run_fwd_kvcache_cdna<half_t, 64>(const flash::KvAppendParams&,
                                                          const flash::SplitKvParams&, hipStream_t);
template hipError_t flash::run_fwd_kvcache_cdna<half_t, 96>(const flash::KvAppendParams&,
                                                          const flash::SplitKvParams&, hipStream_t);
template hipError_t flash::run_fwd_kvcache_cdna<half_t, 128>(const flash::KvAppendParams&,
                                                          const flash::SplitKvParams&, hipStream_t);
template hipError_t flash::run_fwd_kvcache_cdna<half_t, 192>(const flash::KvAppendParams&,
                                                          const flash::SplitKvParams&, hipStream_t);
template hipError_t flash::run_fwd_kvcache_cdna<half_t, 256>(const flash::KvAppendParams&,
                                                          const flash::SplitKvParams&, hipStream_t);
template hipError_t flash::run_fwd_kvcache_cdna<bfloat16_t, 32>(const flash::KvAppendParams&,
                                                          const flash::SplitKvParams&, hipStream_t);
template hipError_t flash::run_fwd_kvcache_cdna<bfloat16_t, 64>(const flash::KvAppendParams&,
                                                          const flash::SplitKvParams&, hipStream_t);
template hipError_t flash::run_fwd_kvcache_cdna<bfloat16_t, 96>(const flash::KvAppendParams&,
                                                          const flash::SplitKvParams&, hipStream_t);
template hipError_t flash::run_fwd_kvcache_cdna<bfloat16_t, 128>(const flash::KvAppendParams&,
                                                          const flash::SplitKvParams&, hipStream_t);
template hipError_t flash::run_fwd_kvcache_cdna<bfloat16_t, 192>(const flash::KvAppendParams&,
                                                          const flash::SplitKvParams&, hipStream_t);
template hipError_t flash::run_fwd_kvcache_cdna<bfloat16_t, 256>(const flash::KvAppendParams&,
                                                          const flash::SplitKvParams&, hipStream_t);

// Each split-KV tile's dynamic LDS (Cfg::kSmemBytes, which the resource report does not count) as a
// device constant splitkv_lds_<head dim>_<keys per step>_<stages>_<waves>, which hip/check_isa.py
// reads from the ISA.
template <typename Cfg, int kHeadDim, int kWarpKeys, int kStages, int kWaves>
constexpr int lds_bytes_of() {
  static_assert(std::is_same_v<Cfg, flash::SplitKvConfig<kHeadDim, kWarpKeys, kStages, kWaves, Cfg::kCtasPerSm>>,
                "name the constant after the tile");
  return Cfg::kSmemBytes;
}

extern "C" __device__ const int splitkv_lds_32_32_1_4 =
    lds_bytes_of<flash::SplitKvTileCdna<32>::type, 32, 32, 1, 4>();
extern "C" __device__ const int splitkv_lds_64_32_1_3 =
    lds_bytes_of<flash::SplitKvTileCdna<64>::type, 64, 32, 1, 3>();
extern "C" __device__ const int splitkv_lds_96_32_1_4 =
    lds_bytes_of<flash::SplitKvTileCdna<96>::type, 96, 32, 1, 4>();
extern "C" __device__ const int splitkv_lds_128_32_1_3 =
    lds_bytes_of<flash::SplitKvTileCdna<128>::type, 128, 32, 1, 3>();
extern "C" __device__ const int splitkv_lds_192_32_1_2 =
    lds_bytes_of<flash::SplitKvTileCdna<192>::type, 192, 32, 1, 2>();
extern "C" __device__ const int splitkv_lds_256_32_1_1 =
    lds_bytes_of<flash::SplitKvTileCdna<256>::type, 256, 32, 1, 1>();
