// Hopper (sm_90a) e4m3 pieces of the fp8 forward: P from the fp32 S accumulators into wgmma's
// 8-bit A fragments, and the key order the transposed V operand is stored in so that this needs no
// exchange between lanes.
//
// wgmma m64nNk32's 8-bit A fragment (per warp, its 16 rows; g = lane / 4, t = lane % 4): register
// r holds the four consecutive k of row g + 8 (r % 2) from column 16 (r / 2) + 4t, the lowest k in
// the lowest byte (the 16-bit fragment's pairs, doubled). S's accumulators of 8-key block j hold
// keys 8j + 2t and 8j + 2t + 1 of rows g (registers 0, 1) and g + 8 (2, 3). Within a 32-key k-step
// a lane therefore holds keys {2t, 2t + 1, 8 + 2t, 9 + 2t} and the same plus 16, where its A
// fragment wants k {4t .. 4t + 3} and the same plus 16. Rather than exchanging values, the forward
// stores V transposed with the keys of every 32-key group permuted (fp8_v_layout.cu builds it),
//   position k = 16 h + 4 t + 2 i + j  holds key  16 h + 8 i + 2 t + j   (h, i, j in {0, 1}),
// so that each lane's own probabilities are its A fragment: a sum over keys does not depend on
// their order as long as P and V agree on it.
#pragma once

#include <cstdint>

#include <cuda_fp8.h>

#include "../fp8_v_order.h"
#include "sm90_swizzled_tile.cuh"

namespace flash {
namespace arch {

using Fp8E4m3 = __nv_fp8_e4m3;  // the fp8 forward's element type (wgmma .e4m3)

using flash::fp8_v_key_at;  // the transposed V's key order (fp8_v_order.h)
using flash::kFp8KeyGroup;

// Four fp32 -> four e4m3 bytes, x0 in the lowest byte; round to nearest even, saturating at +-448.
__device__ __forceinline__ uint32_t pack_e4m3x4(float x0, float x1, float x2, float x3) {
  uint16_t low, high;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(low) : "f"(x1), "f"(x0));
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(high) : "f"(x3), "f"(x2));
  return static_cast<uint32_t>(low) | (static_cast<uint32_t>(high) << 16);
}

// A warp's S accumulators (16 rows x 32 KS keys) -> the 8-bit A fragments of P.V's KS k-steps,
// keys in the order of fp8_v_key_at.
template <int KS>
__device__ __forceinline__ void accumulators_to_e4m3_a_fragments(uint32_t (&a)[1][KS][4],
                                                                 const float (&c)[1][4 * KS][4]) {
#pragma unroll
  for (int ks = 0; ks < KS; ++ks) {
    const float(&low0)[4] = c[0][4 * ks];  // keys 2t, 2t + 1 of the group (rows g, g + 8)
    const float(&low1)[4] = c[0][4 * ks + 1];  // keys 8 + 2t, 9 + 2t
    const float(&high0)[4] = c[0][4 * ks + 2];  // the same plus 16
    const float(&high1)[4] = c[0][4 * ks + 3];
    a[0][ks][0] = pack_e4m3x4(low0[0], low0[1], low1[0], low1[1]);
    a[0][ks][1] = pack_e4m3x4(low0[2], low0[3], low1[2], low1[3]);
    a[0][ks][2] = pack_e4m3x4(high0[0], high0[1], high1[0], high1[1]);
    a[0][ks][3] = pack_e4m3x4(high0[2], high0[3], high1[2], high1[3]);
  }
}

// A warp's 8-bit A fragments (16 rows from row0 x 32 KS k, as accumulators_to_e4m3_a_fragments
// leaves them) into the rows of a K-major SwizzledTile Tile (128-byte rows of k), where an SS
// wgmma reads them as its A operand. Register r of a k-step is an 8 x 16-byte matrix in stmatrix's
// b16 layout (lane g t holds row g's bytes 4t .. 4t + 3, i.e. b16 elements 2t, 2t + 1): rows
// row0 + 8 (r % 2), bytes 32 ks + 16 (r / 2), so k-step ks is the tile's 32-byte column step ks
// (swizzled_stmatrix_address). The caller fences the async proxy before the wgmma that reads them.
template <typename Tile, int KS>
__device__ __forceinline__ void store_e4m3_a_fragments_swizzled(void* tile, int row0, const uint32_t (&a)[1][KS][4],
                                                                int lane) {
#pragma unroll
  for (int ks = 0; ks < KS; ++ks)
    stmatrix_x4(swizzled_stmatrix_address<Tile>(tile, row0, ks, lane), a[0][ks][0], a[0][ks][1], a[0][ks][2],
                a[0][ks][3]);
}

}  // namespace arch
}  // namespace flash
