// The kernels' warp-GEMM interface on CDNA (MI200 gfx90a, MI300 gfx942): sm80_gemm.cuh's names
// with sm80's meaning, so that fwd_kernel.cuh compiles unchanged against either layer.
//
// The kernel view: a warp (here a wavefront) computes C (kAtomM*MT x kAtomN*NT, fp32) += A . B,
// owning float[kAccRegs] per atom as sm80 owns float[4], and reading which element is which from
// acc_row / acc_col and the softmax's row maps (kAccRows, acc_value, row_max, ...). Every product
// is computed transposed, C^T = B^T . A^T, on the 32x32x8 MFMA atom (FragmentAtom):
//   * a row of C (a query of S = Q.K^T) is one accumulator column: one lane per lane group holds
//     all of its values, so the softmax's row reduction is one xor-shuffle between the two 32-lane
//     halves (row_max / row_sum), and the lse writer is lane < 32;
//   * accumulator group t of an S^T atom is already the B operand of k-step t of
//     O^T = V^T . P^T (cdna_layout.h acc_b_step): P is converted, never moved
//     (accumulators_to_a_fragments; "A fragment" in the kernel's view of O = P.V);
//   * MFMA operands are 4 consecutive k per lane: one 8-byte LDS read from a k-contiguous tile
//     (A "mk", B "nk"), four 2-byte reads from the other forms (A "km", B "kn": there is no
//     ldmatrix.trans, kHasTransposingLoads = false). A kernel that can store such a tile
//     transposed does (the forward's V as [dim][key], tile_io.cuh load_tile_transposed); the
//     backward reads Q, dO, K and dS^T both ways, and 64 KiB of LDS has no room for second copies.
// The 32x32 atom rather than 16x16: one shuffle per row reduction instead of two, and 16
// accumulators per MFMA (the probe compiles both; not measured on hardware).
// Fragments stay plain float arrays, as on sm80, so that the arch-neutral code indexes them alike;
// each MFMA reads its atom into the builtin's vector operand and writes it back (register moves
// at most: hip/check_isa.py finds no scratch in the forward).
#pragma once

#include "cdna_layout.h"
#include "cdna_mfma.cuh"
#include "tile_view.cuh"

namespace flash {
namespace arch {

using FragmentAtom = Mfma32x32x8;
using FragmentView = cdna::TransposedView<FragmentAtom>;

constexpr int kAtomM = FragmentView::kAtomM;
constexpr int kAtomN = FragmentView::kAtomN;
constexpr int kAtomK = FragmentView::kAtomK;

// A warp tile's columns come in whole atoms (no pairing of B operands as on sm80).
constexpr int kWarpTileColStep = kAtomN;

// The accumulator layout (sm80.cuh's names): not the m16n8 one; one row per lane and atom.
constexpr bool kAccLayoutIsM16N8 = false;
constexpr int kAccRegs = FragmentView::kAccRegs;
constexpr int kAccRows = FragmentView::kAccRows;
constexpr int kAccValuesPerRow = FragmentView::kAccValuesPerRow;

__device__ __forceinline__ int acc_row(int lane, int r) { return FragmentView::acc_row(lane, r); }
__device__ __forceinline__ int acc_col(int lane, int r) { return FragmentView::acc_col(lane, r); }
__device__ __forceinline__ int acc_col_lane_part(int lane) { return FragmentView::acc_col_lane_part(lane); }
__host__ __device__ constexpr int acc_col_register_part(int r) { return FragmentView::acc_col_register_part(r); }
__device__ __forceinline__ constexpr int acc_value(int row_slot, int j) { return FragmentView::acc_value(row_slot, j); }
__device__ __forceinline__ constexpr int acc_row_slot(int) { return 0; }
__device__ __forceinline__ float row_max(float v) { return column_max<FragmentAtom>(v); }
__device__ __forceinline__ float row_sum(float v) { return column_sum<FragmentAtom>(v); }
__device__ __forceinline__ bool is_row_leader(int lane) { return FragmentView::is_row_leader(lane); }

enum class Layout { kRowMajorMK, kColMajorKM };  // A operand storage
enum class BLayout { kNK, kKN };                 // B operand storage

// No transposing LDS loads: "km" / "kn" tiles cost four 2-byte reads per operand (kernels that
// can, store them the other way round, "mk" / "nk").
constexpr bool kHasTransposingLoads = false;

// A register operand for one k-step of kAtomK: an MFMA B operand of the transposed product.
template <typename T>
using AFragment = Operand<T>;

template <int MT, int NT>
__device__ __forceinline__ void zero_accumulators(float (&c)[MT][NT][kAccRegs]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int r = 0; r < kAccRegs; ++r) c[mt][nt][r] = 0.f;
}

// c (one atom of C, as C^T's accumulators) += A . B of the MFMA (A: a C^T row operand, B: a C^T
// column operand).
template <typename T>
__device__ __forceinline__ void mfma_atom(float (&c)[kAccRegs], Operand<T> a, Operand<T> b) {
  Accumulator<FragmentAtom> acc;
#pragma unroll
  for (int r = 0; r < kAccRegs; ++r) acc[r] = c[r];
  mfma<T, FragmentAtom>(acc, a, b);
#pragma unroll
  for (int r = 0; r < kAccRegs; ++r) c[r] = acc[r];
}

// Row atom m0.. of the kernel's A at k-step k0, as the MFMA B operand of C^T: one 8-byte read from
// A stored [m][k], four 2-byte reads from A stored [k][m].
template <Layout kALayout, typename T>
__device__ __forceinline__ Operand<T> load_a_rows(const T* tile, int stride, int m0, int k0, int lane) {
  if constexpr (kALayout == Layout::kRowMajorMK) return load_b_operand<FragmentAtom>(tile, stride, m0, k0, lane);
  return load_b_operand_k_major<FragmentAtom>(tile, stride, m0, k0, lane);
}

// Column atom n0.. of the kernel's B at k-step k0, as the MFMA A operand of C^T: one 8-byte read
// from B stored [n][k], four 2-byte reads from B stored [k][n].
template <BLayout kBLayout, typename T>
__device__ __forceinline__ Operand<T> load_b_columns(const T* tile, int stride, int n0, int k0, int lane) {
  if constexpr (kBLayout == BLayout::kNK) return load_a_operand<FragmentAtom>(tile, stride, n0, k0, lane);
  return load_a_operand_k_major<FragmentAtom>(tile, stride, n0, k0, lane);
}

// One register A operand (sm80_gemm.cuh's name): rows m0.. of A at k-step k0, from LDS.
template <Layout kLayout, typename T>
__device__ __forceinline__ void load_a_fragment(Operand<T>& a, const T* tile, int stride, int m0, int k0, int lane) {
  a = load_a_rows<kLayout>(tile, stride, m0, k0, lane);
}

// c (kAtomM*MT x kAtomN*NT) += A[m0.., 0..kAtomK*KS) . B[0..kAtomK*KS, n0..), both from LDS in
// any storage form (the k-contiguous ones, A "mk" and B "nk", read fastest).
template <int MT, int NT, int KS, Layout kALayout, BLayout kBLayout, typename T>
__device__ __forceinline__ void warp_gemm_ss(float (&c)[MT][NT][kAccRegs], const T* a_tile, int a_stride, int a_m0,
                                             const T* b_tile, int b_stride, int b_n0, int lane) {
#pragma unroll
  for (int ks = 0; ks < KS; ++ks) {
    Operand<T> rows[MT];  // C^T's column operands: rows of A
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
      rows[mt] = load_a_rows<kALayout>(a_tile, a_stride, a_m0 + mt * kAtomM, ks * kAtomK, lane);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const Operand<T> cols = load_b_columns<kBLayout>(b_tile, b_stride, b_n0 + nt * kAtomN, ks * kAtomK, lane);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) mfma_atom<T>(c[mt][nt], cols, rows[mt]);
    }
  }
}

// The same with B as a view (tile_view.cuh): CDNA tiles are padded row-major only.
template <int MT, int NT, int KS, Layout kALayout, BLayout kBLayout, typename T>
__device__ __forceinline__ void warp_gemm_ss(float (&c)[MT][NT][kAccRegs], const T* a_tile, int a_stride, int a_m0,
                                             const PaddedTile<T>& b_tile, int b_n0, int lane) {
  warp_gemm_ss<MT, NT, KS, kALayout, kBLayout>(c, a_tile, a_stride, a_m0, b_tile.ptr, b_tile.stride, b_n0, lane);
}

// The accumulators of C (kAtomM*MT x kAtomN*NT) as the register A operand of the next product,
// whose k index is C's column (P = softmax(S) feeding P.V): k-step nt * kAccGroups + t is register
// group t of atom (mt, nt), the same lane, converted to T.
template <typename T, int MT, int NT, int KS>
__device__ __forceinline__ void accumulators_to_a_fragments(Operand<T> (&a)[MT][KS],
                                                            const float (&c)[MT][NT][kAccRegs]) {
  static_assert(KS == NT * FragmentAtom::kAccGroups, "one k-step per accumulator group");
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int t = 0; t < FragmentAtom::kAccGroups; ++t) {
        const float(&x)[kAccRegs] = c[mt][nt];
        a[mt][nt * FragmentAtom::kAccGroups + t] = pack_operand<T>(x[4 * t], x[4 * t + 1], x[4 * t + 2], x[4 * t + 3]);
      }
}

// c (kAtomM*MT x kAtomN*NT) += A (registers, kAtomM*MT x kAtomK*KS) . B[0..kAtomK*KS, n0..), B
// from LDS in either storage form ("nk" reads fastest).
template <int MT, int NT, int KS, BLayout kBLayout, typename T>
__device__ __forceinline__ void warp_gemm_rs(float (&c)[MT][NT][kAccRegs], const Operand<T> (&a)[MT][KS],
                                             const T* b_tile, int b_stride, int b_n0, int lane) {
#pragma unroll
  for (int ks = 0; ks < KS; ++ks)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const Operand<T> cols = load_b_columns<kBLayout>(b_tile, b_stride, b_n0 + nt * kAtomN, ks * kAtomK, lane);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) mfma_atom<T>(c[mt][nt], cols, a[mt][ks]);
    }
}

template <int MT, int NT, int KS, BLayout kBLayout, typename T>
__device__ __forceinline__ void warp_gemm_rs(float (&c)[MT][NT][kAccRegs], const Operand<T> (&a)[MT][KS],
                                             const PaddedTile<T>& b_tile, int b_n0, int lane) {
  warp_gemm_rs<MT, NT, KS, kBLayout>(c, a, b_tile.ptr, b_tile.stride, b_n0, lane);
}

// Writes a warp's fp32 accumulators (kAtomM*MT x kAtomN*NT, at (m0, n0)) into a shared tile as T
// (row stride a multiple of 4 elements): a register group is 4 consecutive columns of one row, one
// 8-byte store.
template <int MT, int NT, typename T>
__device__ __forceinline__ void store_accumulators(T* tile, int stride, int m0, int n0,
                                                   const float (&c)[MT][NT][kAccRegs], int lane) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int t = 0; t < FragmentAtom::kAccGroups; ++t) {
        const float(&x)[kAccRegs] = c[mt][nt];
        const int row = m0 + mt * kAtomM + acc_row(lane, 4 * t);
        const int col = n0 + nt * kAtomN + acc_col(lane, 4 * t);
        *reinterpret_cast<Chunk8*>(tile + row * stride + col) =
            Chunk8{pack_pair<T>(x[4 * t], x[4 * t + 1]), pack_pair<T>(x[4 * t + 2], x[4 * t + 3])};
      }
}

}  // namespace arch
}  // namespace flash
