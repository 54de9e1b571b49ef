// Wave-level GEMM on LDS tiles with the CDNA MFMA atoms (lane layouts: cdna_layout.h).
//
// A wave computes C (kM*MT x kN*NT, fp32 registers) += A (kM*MT x kK*KS) . B (kK*KS x kN*NT).
// Both operands want k contiguous: A stored [m][k] (K for S^T = K.Q^T, V^T for O^T = V^T.P^T) and
// B stored [n][k] (Q for S^T); each operand is then one 8-byte LDS read per lane (there is no
// ldmatrix). A tile stored the other way round is written transposed into LDS first
// (store_lds_transposed_16).
//
// Why the register operand is B: the accumulator of S^T = K.Q^T (keys on rows, queries on
// columns, one query per lane) is, 4 registers at a time, the B operand of O^T = V^T.P^T
// (accumulators_to_b_operands). The sm80 kernels keep P as the A operand of O = P.V instead.
#pragma once

#include "cdna.cuh"

namespace flash {
namespace arch {

using cdna::Mfma16x16x16;
using cdna::Mfma32x32x8;

// The builtins' operand vectors: 4 16-bit values in one 8-byte register pair.
using HalfOperand = _Float16 __attribute__((ext_vector_type(4)));
using Bf16Operand = short __attribute__((ext_vector_type(4)));

template <typename T>
struct OperandOf;

template <>
struct OperandOf<half_t> {
  using type = HalfOperand;
  __device__ __forceinline__ static _Float16 element(float x) { return static_cast<_Float16>(x); }
};

template <>
struct OperandOf<bfloat16_t> {
  using type = Bf16Operand;
  __device__ __forceinline__ static short element(float x) { return static_cast<short>(float_to_bits<bfloat16_t>(x)); }
};

template <typename T>
using Operand = typename OperandOf<T>::type;

// One atom's accumulators: Shape::kAccRegs fp32 per lane (16 for 32x32, 4 for 16x16).
template <typename Shape>
using Accumulator = float __attribute__((ext_vector_type(Shape::kAccRegs)));

template <typename T, typename Shape>
struct Mfma;

// gfx90a: v_mfma_f32_32x32x8f16; gfx942: v_mfma_f32_32x32x8_f16
template <>
struct Mfma<half_t, Mfma32x32x8> {
  __device__ __forceinline__ static void run(Accumulator<Mfma32x32x8>& c, HalfOperand a, HalfOperand b) {
    c = __builtin_amdgcn_mfma_f32_32x32x8f16(a, b, c, 0, 0, 0);
  }
};

// gfx90a: v_mfma_f32_32x32x8bf16_1k; gfx942: v_mfma_f32_32x32x8_bf16
template <>
struct Mfma<bfloat16_t, Mfma32x32x8> {
  __device__ __forceinline__ static void run(Accumulator<Mfma32x32x8>& c, Bf16Operand a, Bf16Operand b) {
    c = __builtin_amdgcn_mfma_f32_32x32x8bf16_1k(a, b, c, 0, 0, 0);
  }
};

// gfx90a: v_mfma_f32_16x16x16f16; gfx942: v_mfma_f32_16x16x16_f16
template <>
struct Mfma<half_t, Mfma16x16x16> {
  __device__ __forceinline__ static void run(Accumulator<Mfma16x16x16>& c, HalfOperand a, HalfOperand b) {
    c = __builtin_amdgcn_mfma_f32_16x16x16f16(a, b, c, 0, 0, 0);
  }
};

// gfx90a: v_mfma_f32_16x16x16bf16_1k; gfx942: v_mfma_f32_16x16x16_bf16
template <>
struct Mfma<bfloat16_t, Mfma16x16x16> {
  __device__ __forceinline__ static void run(Accumulator<Mfma16x16x16>& c, Bf16Operand a, Bf16Operand b) {
    c = __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(a, b, c, 0, 0, 0);
  }
};

template <typename T, typename Shape>
__device__ __forceinline__ void mfma(Accumulator<Shape>& c, Operand<T> a, Operand<T> b) {
  Mfma<T, Shape>::run(c, a, b);
}

// 4 consecutive 16-bit values at `p` (8-byte aligned): one ds_read_b64 from LDS (one
// global_load_dwordx2 from global memory).
template <typename T>
__device__ __forceinline__ Operand<T> load_operand(const T* p) {
  return *reinterpret_cast<const Operand<T>*>(p);
}

// A operand of the atom at rows m0.., k-step starting at k0, from a tile stored [m][k].
template <typename Shape, typename T>
__device__ __forceinline__ Operand<T> load_a_operand(const T* tile, int stride, int m0, int k0, int lane) {
  return load_operand(tile + (m0 + Shape::a_row(lane, 0)) * stride + k0 + Shape::a_col(lane, 0));
}

// B operand of the atom at columns n0.., k-step starting at k0, from a tile stored [n][k].
template <typename Shape, typename T>
__device__ __forceinline__ Operand<T> load_b_operand(const T* tile, int stride, int n0, int k0, int lane) {
  return load_operand(tile + (n0 + Shape::b_col(lane, 0)) * stride + k0 + Shape::b_row(lane, 0));
}

// 4 16-bit values p[0], p[stride], p[2 stride], p[3 stride]: an operand whose k runs down the
// columns of a tile, four 2-byte LDS reads (there is no transposing LDS read).
template <typename T>
__device__ __forceinline__ Operand<T> load_operand_strided(const T* p, int stride) {
  using Bits = uint16_t __attribute__((ext_vector_type(4)));
  const uint16_t* e = reinterpret_cast<const uint16_t*>(p);
  return __builtin_bit_cast(Operand<T>, Bits{e[0], e[stride], e[2 * stride], e[3 * stride]});
}

// A operand of the atom at rows m0.., k-step starting at k0, from a tile stored [k][m].
template <typename Shape, typename T>
__device__ __forceinline__ Operand<T> load_a_operand_k_major(const T* tile, int stride, int m0, int k0, int lane) {
  return load_operand_strided(tile + (k0 + Shape::a_col(lane, 0)) * stride + m0 + Shape::a_row(lane, 0), stride);
}

// B operand of the atom at columns n0.., k-step starting at k0, from a tile stored [k][n].
template <typename Shape, typename T>
__device__ __forceinline__ Operand<T> load_b_operand_k_major(const T* tile, int stride, int n0, int k0, int lane) {
  return load_operand_strided(tile + (k0 + Shape::b_row(lane, 0)) * stride + n0 + Shape::b_col(lane, 0), stride);
}

// Four fp32 values -> one operand (value j = x[j]).
template <typename T>
__device__ __forceinline__ Operand<T> pack_operand(float x0, float x1, float x2, float x3) {
  using Op = OperandOf<T>;
  return Operand<T>{Op::element(x0), Op::element(x1), Op::element(x2), Op::element(x3)};
}

template <typename Acc, int MT, int NT>
__device__ __forceinline__ void zero_accumulators(Acc (&c)[MT][NT]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) c[mt][nt] = Acc{};
}

// B operands of NT column atoms x KS k-steps from a tile stored [n][k] in LDS or global memory,
// kept in registers across many products (Q^T for every K block of a query block).
template <typename Shape, int NT, int KS, typename T>
__device__ __forceinline__ void load_b_operands(Operand<T> (&b)[NT][KS], const T* tile, int stride, int n0, int lane) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int ks = 0; ks < KS; ++ks)
      b[nt][ks] = load_b_operand<Shape>(tile, stride, n0 + nt * Shape::kN, ks * Shape::kK, lane);
}

// c (kM*MT x kN*NT) += A[m0.., 0..kK*KS) . B, A from an LDS tile stored [m][k], B from registers.
template <typename Shape, int MT, int NT, int KS, typename T>
__device__ __forceinline__ void wave_gemm_sr(Accumulator<Shape> (&c)[MT][NT], const T* a_tile, int a_stride, int a_m0,
                                             const Operand<T> (&b)[NT][KS], int lane) {
#pragma unroll
  for (int ks = 0; ks < KS; ++ks)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const Operand<T> a = load_a_operand<Shape>(a_tile, a_stride, a_m0 + mt * Shape::kM, ks * Shape::kK, lane);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) mfma<T, Shape>(c[mt][nt], a, b[nt][ks]);
    }
}

// c (kM*MT x kN*NT) += A[m0.., 0..kK*KS) . B[0..kK*KS, n0..), A stored [m][k], B stored [n][k].
template <typename Shape, int MT, int NT, int KS, typename T>
__device__ __forceinline__ void wave_gemm_ss(Accumulator<Shape> (&c)[MT][NT], const T* a_tile, int a_stride, int a_m0,
                                             const T* b_tile, int b_stride, int b_n0, int lane) {
#pragma unroll
  for (int ks = 0; ks < KS; ++ks) {
    Operand<T> b[NT];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
      b[nt] = load_b_operand<Shape>(b_tile, b_stride, b_n0 + nt * Shape::kN, ks * Shape::kK, lane);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const Operand<T> a = load_a_operand<Shape>(a_tile, a_stride, a_m0 + mt * Shape::kM, ks * Shape::kK, lane);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) mfma<T, Shape>(c[mt][nt], a, b[nt]);
    }
  }
}

// The accumulators of a (kM*MT x kN*NT) product whose rows are the k index of the next product
// (P^T of S^T = K.Q^T), as that product's B operands (for O^T += V^T.P^T): row atom mt, register
// group t is k-step mt * kAccGroups + t. Same lane, no data movement but the conversion to T.
template <typename T, typename Shape, int MT, int NT>
__device__ __forceinline__ void accumulators_to_b_operands(Operand<T> (&b)[NT][MT * Shape::kAccGroups],
                                                           const Accumulator<Shape> (&c)[MT][NT]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int t = 0; t < Shape::kAccGroups; ++t)
        b[nt][mt * Shape::kAccGroups + t] =
            pack_operand<T>(c[mt][nt][4 * t], c[mt][nt][4 * t + 1], c[mt][nt][4 * t + 2], c[mt][nt][4 * t + 3]);
}

// Max / sum over the lanes holding the same accumulator column (2 lanes for 32x32, 4 for 16x16):
// with S^T in registers, the row max / sum of S for one query.
template <typename Shape>
__device__ __forceinline__ float column_max(float v) {
  return lane_group_max<Shape::kN>(v);
}

template <typename Shape>
__device__ __forceinline__ float column_sum(float v) {
  return lane_group_sum<Shape::kN>(v);
}

// out[col][row] = C[row][col] as T for the (kM*MT x kN*NT) accumulators at (m0, n0) of C (O^T ->
// O[query][dim]). A register group is 4 consecutive rows of one column: one 8-byte store.
template <typename Shape, int MT, int NT, typename T>
__device__ __forceinline__ void store_accumulators_transposed(T* out, int64_t out_stride, int m0, int n0,
                                                              const Accumulator<Shape> (&c)[MT][NT], int lane) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int t = 0; t < Shape::kAccGroups; ++t) {
        const int row = m0 + mt * Shape::kM + Shape::acc_row(lane, 4 * t);
        const int col = n0 + nt * Shape::kN + Shape::acc_col(lane, 4 * t);
        *reinterpret_cast<Chunk8*>(out + col * out_stride + row) =
            Chunk8{pack_pair<T>(c[mt][nt][4 * t], c[mt][nt][4 * t + 1]),
                   pack_pair<T>(c[mt][nt][4 * t + 2], c[mt][nt][4 * t + 3])};
      }
}

}  // namespace arch
}  // namespace flash
