// Small helpers shared by the kernels: integer math (tensor addressing is sequence.cuh's).
#pragma once

#include <cstdint>

#include "params.h"

namespace flash {

__host__ __device__ constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }
__host__ __device__ constexpr int64_t ceil_div64(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace flash
