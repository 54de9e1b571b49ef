// Small helpers shared by the kernels: integer math and tensor addressing.
#pragma once

#include <cstdint>

#include "params.h"

namespace flash {

__host__ __device__ constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

// Address of element (batch, row, head, 0) of a strided (batch, seqlen, heads, headdim) tensor.
template <typename T>
__device__ __forceinline__ T* element_ptr(const Strided4d& t, int batch, int row, int head) {
  return reinterpret_cast<T*>(t.ptr) + batch * t.batch_stride + static_cast<int64_t>(row) * t.row_stride +
         head * t.head_stride;
}

// Offset of row `row` of (batch, head) in a contiguous (batch, heads, seqlen) float vector (lse, dsum).
__device__ __forceinline__ int64_t row_vector_offset(const AttentionShape& s, int batch, int head, int row) {
  return (static_cast<int64_t>(batch) * s.heads + head) * s.seqlen_q + row;
}

}  // namespace flash
