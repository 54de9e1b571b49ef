// Warp-level GEMM on shared-memory tiles with the m16n8k16 atom (see sm80.cuh for the layouts).
//
// A warp computes C (16*MT x 8*NT, fp32 registers) += A (16*MT x 16*KS) * B (16*KS x 8*NT).
// Tiles are row-major in shared memory with a padded row stride (elements); each operand can be
// stored either way round:
//   A "mk": tile[m][k] (e.g. Q for Q.K^T)      A "km": tile[k][m] (e.g. dS^T for dS.K)
//   B "nk": tile[n][k] (e.g. K for Q.K^T)      B "kn": tile[k][n] (e.g. V for P.V)
// The padded stride (row bytes = 16 * odd) keeps the 8 rows of each ldmatrix in distinct banks.
// A B operand may also come as a view (tile_view.cuh): the (tile, stride) forms are PaddedTile.
#pragma once

#include <type_traits>

#include "sm80.cuh"
#include "tile_view.cuh"

namespace flash {
namespace arch {

constexpr int kAtomM = 16;
constexpr int kAtomN = 8;
constexpr int kAtomK = 16;

// A warp tile's columns come in multiples of this: warp_gemm_* load B fragments two atoms at a time.
constexpr int kWarpTileColStep = 2 * kAtomN;

enum class Layout { kRowMajorMK, kColMajorKM };  // A operand storage
enum class BLayout { kNK, kKN };                 // B operand storage

// ldmatrix.trans reads a "km" / "kn" tile as it is stored; an arch without transposing loads
// (CDNA) wants such a tile stored the other way round.
constexpr bool kHasTransposingLoads = true;

// An A operand held in registers for one k-step of kAtomK (P of P.V: accumulators_to_a_fragments).
template <typename T>
using AFragment = uint32_t[4];

template <Layout kLayout, typename T>
__device__ __forceinline__ void load_a_fragment(uint32_t (&a)[4], const T* tile, int stride, int m0, int k0, int lane) {
  if constexpr (kLayout == Layout::kRowMajorMK) {
    // matrices: (m0-7, k0-7), (m8-15, k0-7), (m0-7, k8-15), (m8-15, k8-15)
    const int m = m0 + (lane % 8) + 8 * ((lane / 8) % 2);
    const int k = k0 + 8 * (lane / 16);
    ldmatrix_x4(a, tile + m * stride + k);
  } else {
    // the same four matrices read transposed out of tile[k][m]
    const int k = k0 + (lane % 8) + 8 * (lane / 16);
    const int m = m0 + 8 * ((lane / 8) % 2);
    ldmatrix_x4_trans(a, tile + k * stride + m);
  }
}

// B fragments of two adjacent 8-column atoms: columns n0..n0+7 -> b[0], n0+8..n0+15 -> b[1].
template <BLayout kLayout, typename View>
__device__ __forceinline__ void load_b_fragment_pair(uint32_t (&b)[2][2], const View& tile, int n0, int k0, int lane) {
  uint32_t r[4];
  if constexpr (kLayout == BLayout::kNK) {
    // matrices: (n0-7, k0-7), (n0-7, k8-15), (n8-15, k0-7), (n8-15, k8-15)
    const int n = n0 + (lane % 8) + 8 * (lane / 16);
    const int k = k0 + 8 * ((lane / 8) % 2);
    ldmatrix_x4(r, tile.chunk(n, k));
  } else {
    // matrices: (k0-7, n0-7), (k8-15, n0-7), (k0-7, n8-15), (k8-15, n8-15), transposed
    const int k = k0 + (lane % 8) + 8 * ((lane / 8) % 2);
    const int n = n0 + 8 * (lane / 16);
    ldmatrix_x4_trans(r, tile.chunk(k, n));
  }
  b[0][0] = r[0];
  b[0][1] = r[1];
  b[1][0] = r[2];
  b[1][1] = r[3];
}

template <BLayout kLayout, typename T>
__device__ __forceinline__ void load_b_fragment_pair(uint32_t (&b)[2][2], const T* tile, int stride, int n0, int k0,
                                                     int lane) {
  load_b_fragment_pair<kLayout>(b, PaddedTile<T>{tile, stride}, n0, k0, lane);
}

template <int MT, int NT>
__device__ __forceinline__ void zero_accumulators(float (&c)[MT][NT][4]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int r = 0; r < 4; ++r) c[mt][nt][r] = 0.f;
}

// c (16*MT x 8*NT) += A[m0.., 0..16*KS) * B[0..16*KS, n0..), both operands in shared memory.
template <int MT, int NT, int KS, Layout kALayout, BLayout kBLayout, typename T, typename BView>
__device__ __forceinline__ void warp_gemm_ss(float (&c)[MT][NT][4], const T* a_tile, int a_stride, int a_m0,
                                             const BView& b_tile, int b_n0, int lane) {
  static_assert(NT % 2 == 0, "B fragments are loaded two atoms at a time");
  static_assert(std::is_same_v<T, typename BView::Element>, "A and B of one element type");
#pragma unroll
  for (int ks = 0; ks < KS; ++ks) {
    uint32_t a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
      load_a_fragment<kALayout>(a[mt], a_tile, a_stride, a_m0 + mt * kAtomM, ks * kAtomK, lane);
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      uint32_t b[2][2];
      load_b_fragment_pair<kBLayout>(b, b_tile, b_n0 + np * 2 * kAtomN, ks * kAtomK, lane);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma_16816<T>(c[mt][2 * np], a[mt], b[0]);
        mma_16816<T>(c[mt][2 * np + 1], a[mt], b[1]);
      }
    }
  }
}

template <int MT, int NT, int KS, Layout kALayout, BLayout kBLayout, typename T>
__device__ __forceinline__ void warp_gemm_ss(float (&c)[MT][NT][4], const T* a_tile, int a_stride, int a_m0,
                                             const T* b_tile, int b_stride, int b_n0, int lane) {
  warp_gemm_ss<MT, NT, KS, kALayout, kBLayout>(c, a_tile, a_stride, a_m0, PaddedTile<T>{b_tile, b_stride}, b_n0,
                                               lane);
}

// Accumulators of a 16 x 16*KS product, re-packed as A fragments of the next product
// (P = softmax(S) feeding P.V): atoms 2ks and 2ks+1 of c form k-step ks of A.
template <typename T, int MT, int KS>
__device__ __forceinline__ void accumulators_to_a_fragments(uint32_t (&a)[MT][KS][4], const float (&c)[MT][2 * KS][4]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int ks = 0; ks < KS; ++ks)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int nt = 2 * ks + half;
        a[mt][ks][2 * half] = pack_pair<T>(c[mt][nt][0], c[mt][nt][1]);
        a[mt][ks][2 * half + 1] = pack_pair<T>(c[mt][nt][2], c[mt][nt][3]);
      }
}

// c (16*MT x 8*NT) += A (registers, 16*MT x 16*KS) * B[0..16*KS, n0..) from shared memory.
template <int MT, int NT, int KS, BLayout kBLayout, typename BView>
__device__ __forceinline__ void warp_gemm_rs(float (&c)[MT][NT][4], const uint32_t (&a)[MT][KS][4],
                                             const BView& b_tile, int b_n0, int lane) {
  static_assert(NT % 2 == 0, "B fragments are loaded two atoms at a time");
  using T = typename BView::Element;
#pragma unroll
  for (int ks = 0; ks < KS; ++ks)
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      uint32_t b[2][2];
      load_b_fragment_pair<kBLayout>(b, b_tile, b_n0 + np * 2 * kAtomN, ks * kAtomK, lane);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma_16816<T>(c[mt][2 * np], a[mt][ks], b[0]);
        mma_16816<T>(c[mt][2 * np + 1], a[mt][ks], b[1]);
      }
    }
}

template <int MT, int NT, int KS, BLayout kBLayout, typename T>
__device__ __forceinline__ void warp_gemm_rs(float (&c)[MT][NT][4], const uint32_t (&a)[MT][KS][4], const T* b_tile,
                                             int b_stride, int b_n0, int lane) {
  warp_gemm_rs<MT, NT, KS, kBLayout>(c, a, PaddedTile<T>{b_tile, b_stride}, b_n0, lane);
}

}  // namespace arch
}  // namespace flash

namespace flash {
namespace arch {

// Writes a warp's fp32 accumulators (16*MT x 8*NT, at (m0, n0)) into a shared tile as T.
template <int MT, int NT, typename T>
__device__ __forceinline__ void store_accumulators(T* tile, int stride, int m0, int n0, const float (&c)[MT][NT][4],
                                                   int lane) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = m0 + mt * kAtomM + acc_row(lane, 2 * half);
        const int col = n0 + nt * kAtomN + acc_col(lane, 0);
        *reinterpret_cast<uint32_t*>(tile + row * stride + col) =
            pack_pair<T>(c[mt][nt][2 * half], c[mt][nt][2 * half + 1]);
      }
}

}  // namespace arch
}  // namespace flash
