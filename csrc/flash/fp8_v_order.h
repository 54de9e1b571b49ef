// The layout of the fp8 forward's V operand, shared by the kernel that builds it (fp8_v_layout.cu),
// the forward that reads it (arch/sm90_fp8.cuh says why the keys are permuted) and the op layer:
// V transposed, (batch, heads_k, headdim, fp8_transposed_v_keys(seqlen_k)), the keys past seqlen_k
// zero and the keys of every 32-key group stored in the order of fp8_v_key_at.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace flash {

constexpr int kFp8KeyGroup = 32;  // keys per 8-bit k-step, the period of the V key permutation

// Keys per row of the transposed V: whole 32-key groups.
constexpr int64_t fp8_transposed_v_keys(int64_t seqlen_k) {
  return (seqlen_k + kFp8KeyGroup - 1) / kFp8KeyGroup * kFp8KeyGroup;
}

// The key stored at position k (0..31) of a 32-key group:
//   position 16 h + 4 t + 2 i + j holds key 16 h + 8 i + 2 t + j   (h, i, j in {0, 1}, t in 0..3).
__host__ __device__ constexpr int fp8_v_key_at(int k) { return (k & 16) | ((k & 2) << 2) | ((k >> 1) & 6) | (k & 1); }

}  // namespace flash
