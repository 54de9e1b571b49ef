// Selects the arch layer. Kernels include this and call only `arch::` functions, so a port is a
// new arch file (AMD CDNA: MFMA, wave64, LDS) rather than a rewrite of the kernels.
#pragma once

#if defined(__HIP_PLATFORM_AMD__)
#include "cdna.cuh"
#include "cdna_gemm.cuh"
#include "cdna_mfma.cuh"
#else
#include "sm80.cuh"
#include "sm80_gemm.cuh"
#include "sm90_grid_dependency.cuh"
#endif

#include <cstdint>

namespace flash {
namespace arch {

// Integer helpers whose intrinsics CUDA and HIP spell alike (IMAD.HI / PRMT on NVIDIA,
// v_mul_hi_u32 / v_perm_b32 on CDNA).

// The high and low 32 bits of a * b (Philox's round function).
__device__ __forceinline__ uint32_t mul_hi_lo(uint32_t a, uint32_t b, uint32_t& lo) {
  lo = a * b;
  return __umulhi(a, b);
}

// Byte k of the result is byte (selector >> 4k) & 7 of the 8 bytes {low, high}.
__device__ __forceinline__ uint32_t byte_perm(uint32_t low, uint32_t high, uint32_t selector) {
  return __byte_perm(low, high, selector);
}

}  // namespace arch
}  // namespace flash
