// Division by a divisor fixed at launch: n / d and n % d as a multiply-high, an add and a shift
// (Granlund and Montgomery, "Division by invariant integers using multiplication", 1994, fig. 4.1,
// for dividends below 2^31), the divisor's multiplier and shift computed once on the host. The
// warp-specialized forward's tile walk made four 32-bit divisions by runtime values per tile,
// between one tile's epilogue and the next tile's first wait; with these its sm_90a SASS is ~240
// instructions shorter and the forward 1-3% faster at 512-2k keys (H200, benchmarks/NOTES.md v26).
#pragma once

#include <cstdint>

namespace flash {

struct FastDivmod {
  uint32_t divisor = 1;
  uint32_t multiplier = 1;  // floor(2^32 (2^shift - divisor) / divisor) + 1: 1 for powers of two
  uint32_t shift = 0;       // ceil(log2(divisor))

  FastDivmod() = default;
  // 1 <= d < 2^31.
  __host__ explicit FastDivmod(int d) : divisor(static_cast<uint32_t>(d)) {
    while ((uint64_t{1} << shift) < divisor) ++shift;
    multiplier = static_cast<uint32_t>((((uint64_t{1} << shift) - divisor) << 32) / divisor + 1);
  }

  // 0 <= n < 2^31: the high word of multiplier * n is below n, so the sum cannot carry out.
  __device__ __forceinline__ int div(int n) const {
    const uint32_t u = static_cast<uint32_t>(n);
    return static_cast<int>((__umulhi(u, multiplier) + u) >> shift);
  }
  __device__ __forceinline__ void divmod(int n, int& quotient, int& remainder) const {
    quotient = div(n);
    remainder = n - quotient * static_cast<int>(divisor);
  }
};

}  // namespace flash
