// One forward attention block on the CDNA arch layer (csrc/flash/arch/cdna*.cuh), torch-free: what
// CI compiles for gfx90a and gfx942 (hip/ci_check.sh) to show the layer produces MFMA code that
// fits in registers and LDS. Not yet run on AMD hardware.
//
// A workgroup of 4 waves (one per SIMD) owns 128 queries (32 per wave) of one head, hd 128, and
// walks the keys in blocks of 64 (seqlen_q a multiple of 128, seqlen_k of 64, no mask):
//   S^T = K.Q^T          A = K from LDS [key][dim], B = Q^T in registers, loaded once from global
//                        memory (a Q tile in LDS too would not fit: 128 x 128 + K + V^T > 64 KiB)
//   column softmax       a lane holds one query per column atom with its keys in registers:
//                        running max / sum per lane, reduced over the 2 (32x32) or 4 (16x16)
//                        lanes of the column with xor-shuffles
//   O^T += V^T.P^T       A = V^T from LDS [dim][key] (transposed on the way in), B = P^T straight
//                        from the S^T accumulators (4 registers = one k-step)
//   O[query][dim]        written from O^T, 4 dims per lane per 8-byte store; lse per query.
// Instantiated for fp16 and bf16, with the 32x32x8 and the 16x16x16 atoms.
#include <hip/hip_runtime.h>

#include "flash/arch/arch.cuh"

namespace probe {

namespace arch = flash::arch;

constexpr int kHeadDim = 128;
constexpr int kBlockQ = 128;      // queries per workgroup
constexpr int kBlockK = 64;       // keys per K/V tile
constexpr int kWaveQueries = 32;  // queries per wave: the S^T and O^T columns of one wave
constexpr int kWaves = kBlockQ / kWaveQueries;
constexpr int kThreads = kWaves * arch::kWarpSize;
constexpr int kElementsPer16B = 8;
// LDS rows padded by 4 elements (8 bytes = 2 banks): the 16 lanes served together by an 8-byte
// ds_read read 16 consecutive rows at one column, which then fall on 32 distinct banks (by the
// bank arithmetic; not measured on hardware).
constexpr int kPad = 4;
constexpr int kRowStride = kHeadDim + kPad;  // sK: [key][dim]
constexpr int kVtStride = kBlockK + kPad;    // sVt: [dim][key]
constexpr int kLdsBytes = arch::checked_lds_bytes<(kBlockK * kRowStride + kHeadDim * kVtStride) * 2>();
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kLog2e = 1.4426950408889634f;

// Rows [0, kRows) of a row-major (kHeadDim per row) global tile into LDS [row][kRowStride], or,
// transposed, into LDS [dim][kVtStride]: global -> register -> LDS, 16 bytes per thread and step.
template <int kRows, bool kTransposed, typename T>
__device__ __forceinline__ void copy_tile_to_lds(T* lds, const T* global, int tid) {
  constexpr int kChunksPerRow = kHeadDim / kElementsPer16B;
  constexpr int kChunks = kRows * kChunksPerRow;
  static_assert(kChunks % kThreads == 0, "every thread copies the same number of chunks");
#pragma unroll
  for (int i = 0; i < kChunks / kThreads; ++i) {
    const int chunk = tid + i * kThreads;
    const int row = chunk / kChunksPerRow, dim = chunk % kChunksPerRow * kElementsPer16B;
    const arch::Chunk16 values = arch::load_global_16(global + row * kHeadDim + dim);
    if constexpr (kTransposed) {
      arch::store_lds_transposed_16(lds + dim * kVtStride + row, kVtStride, values);
    } else {
      arch::store_lds_16(lds + row * kRowStride + dim, values);
    }
  }
}

// Online softmax over the columns of S^T (one query per lane and column atom). The scale is folded
// into one FMA per score: p = exp2(s * scale_log2 - m * scale_log2).
template <typename Shape, int kQT>
struct ColumnSoftmax {
  float col_max[kQT];  // running max of the raw scores of this lane's query of column atom qt
  float col_sum[kQT];  // this lane's share of the running sum: its keys only, until finalize

  __device__ __forceinline__ void init() {
#pragma unroll
    for (int qt = 0; qt < kQT; ++qt) {
      col_max[qt] = -INFINITY;
      col_sum[qt] = 0.f;
    }
  }

  // s_t (kM*kKT keys x kN*kQT queries) becomes P^T in place; o_t (kM*kDT dims x the same queries)
  // is rescaled by exp2((m_old - m_new) * scale_log2), one factor per lane and column atom.
  template <int kKT, int kDT>
  __device__ __forceinline__ void update(arch::Accumulator<Shape> (&s_t)[kKT][kQT],
                                         arch::Accumulator<Shape> (&o_t)[kDT][kQT], float scale_log2) {
#pragma unroll
    for (int qt = 0; qt < kQT; ++qt) {
      float block_max = col_max[qt];
#pragma unroll
      for (int kt = 0; kt < kKT; ++kt)
#pragma unroll
        for (int r = 0; r < Shape::kAccRegs; ++r) block_max = fmaxf(block_max, s_t[kt][qt][r]);
      block_max = arch::column_max<Shape>(block_max);
      const float max_scaled = block_max == -INFINITY ? 0.f : block_max * scale_log2;
      const float rescale = col_max[qt] == -INFINITY ? 0.f : arch::exp2_approx(col_max[qt] * scale_log2 - max_scaled);
      col_max[qt] = block_max;
      float sum = col_sum[qt] * rescale;
#pragma unroll
      for (int kt = 0; kt < kKT; ++kt)
#pragma unroll
        for (int r = 0; r < Shape::kAccRegs; ++r) {
          const float p = arch::exp2_approx(fmaf(s_t[kt][qt][r], scale_log2, -max_scaled));
          s_t[kt][qt][r] = p;
          sum += p;
        }
      col_sum[qt] = sum;
#pragma unroll
      for (int dt = 0; dt < kDT; ++dt) o_t[dt][qt] *= rescale;
    }
  }

  // Divides o_t by the column sums and returns each query's log-sum-exp (natural log); a query
  // that saw no key gets o = 0 and lse = +inf.
  template <int kDT>
  __device__ __forceinline__ void finalize(arch::Accumulator<Shape> (&o_t)[kDT][kQT], float scale,
                                           float (&lse)[kQT]) {
#pragma unroll
    for (int qt = 0; qt < kQT; ++qt) {
      const float sum = arch::column_sum<Shape>(col_sum[qt]);
      const bool empty = sum == 0.f;
      const float inv_sum = empty ? 0.f : arch::reciprocal_approx(sum);
      lse[qt] = empty ? INFINITY : col_max[qt] * scale + arch::log2_approx(sum) * kLn2;
#pragma unroll
      for (int dt = 0; dt < kDT; ++dt) o_t[dt][qt] *= inv_sum;
    }
  }
};

template <typename T, typename Shape>
__device__ __forceinline__ void attention_block(const T* q, const T* k, const T* v, T* out, float* lse, int seqlen_k,
                                                float softmax_scale) {
  constexpr int kQT = kWaveQueries / Shape::kN;  // query (column) atoms of a wave
  constexpr int kKT = kBlockK / Shape::kM;       // key (row) atoms of S^T
  constexpr int kDT = kHeadDim / Shape::kM;      // dim (row) atoms of O^T
  constexpr int kQSteps = kHeadDim / Shape::kK;  // k-steps of K.Q^T
  constexpr int kPSteps = kBlockK / Shape::kK;   // k-steps of V^T.P^T
  __shared__ __attribute__((aligned(16))) unsigned char lds[kLdsBytes];
  T* sK = reinterpret_cast<T*>(lds);   // (kBlockK, kRowStride)
  T* sVt = sK + kBlockK * kRowStride;  // (kHeadDim, kVtStride)

  const int tid = threadIdx.x, lane = tid % arch::kWarpSize, wave = tid / arch::kWarpSize;
  const int q0 = blockIdx.x * kBlockQ, wave_q0 = wave * kWaveQueries;
  const float scale_log2 = softmax_scale * kLog2e;
  arch::Operand<T> q_t[kQT][kQSteps];  // Q^T as B operands: (kHeadDim x kWaveQueries), for every key block
  arch::load_b_operands<Shape>(q_t, q + q0 * kHeadDim, kHeadDim, wave_q0, lane);

  arch::Accumulator<Shape> o_t[kDT][kQT];  // O^T of this wave: (kHeadDim x kWaveQueries)
  arch::zero_accumulators(o_t);
  ColumnSoftmax<Shape, kQT> softmax;
  softmax.init();

  for (int k0 = 0; k0 < seqlen_k; k0 += kBlockK) {
    __syncthreads();  // every wave is done reading the previous sK and sVt
    copy_tile_to_lds<kBlockK, false>(sK, k + k0 * kHeadDim, tid);
    copy_tile_to_lds<kBlockK, true>(sVt, v + k0 * kHeadDim, tid);
    __syncthreads();

    arch::Accumulator<Shape> s_t[kKT][kQT];  // S^T: (kBlockK keys x kWaveQueries)
    arch::zero_accumulators(s_t);
    arch::wave_gemm_sr<Shape>(s_t, sK, kRowStride, 0, q_t, lane);
    softmax.update(s_t, o_t, scale_log2);
    arch::Operand<T> p_t[kQT][kPSteps];  // P^T as B operands: (kBlockK x kWaveQueries)
    arch::accumulators_to_b_operands<T, Shape>(p_t, s_t);
    arch::wave_gemm_sr<Shape>(o_t, sVt, kVtStride, 0, p_t, lane);
  }

  float query_lse[kQT];
  softmax.finalize(o_t, softmax_scale, query_lse);
  arch::store_accumulators_transposed<Shape>(out + q0 * kHeadDim, kHeadDim, 0, wave_q0, o_t, lane);
  if (lane < Shape::kN) {  // lane group 0 holds every column once
#pragma unroll
    for (int qt = 0; qt < kQT; ++qt) lse[q0 + wave_q0 + qt * Shape::kN + Shape::acc_col(lane, 0)] = query_lse[qt];
  }
}

}  // namespace probe

using flash::arch::bfloat16_t;
using flash::arch::half_t;
using flash::arch::Mfma16x16x16;
using flash::arch::Mfma32x32x8;

// q, k, v, out: (seqlen, 128) row-major, one head; lse: (seqlen_q). Grid: seqlen_q / 128 workgroups.
#define PROBE_KERNEL(name, T, Shape)                                                                          \
  extern "C" __global__ void __launch_bounds__(probe::kThreads)                                               \
      name(const T* q, const T* k, const T* v, T* out, float* lse, int seqlen_k, float softmax_scale) {       \
    probe::attention_block<T, Shape>(q, k, v, out, lse, seqlen_k, softmax_scale);                            \
  }

PROBE_KERNEL(probe_attention_fp16_32x32x8, half_t, Mfma32x32x8)
PROBE_KERNEL(probe_attention_bf16_32x32x8, bfloat16_t, Mfma32x32x8)
PROBE_KERNEL(probe_attention_fp16_16x16x16, half_t, Mfma16x16x16)
PROBE_KERNEL(probe_attention_bf16_16x16x16, bfloat16_t, Mfma16x16x16)

// Host entry for a first run on an MI200 / MI300 (for example through ctypes against a CPU
// reference): is_bf16 picks the element type, atom (32 or 16) the MFMA shape.
extern "C" hipError_t probe_attention_launch(bool is_bf16, int atom, const void* q, const void* k, const void* v,
                                             void* out, float* lse, int seqlen_q, int seqlen_k, float softmax_scale,
                                             hipStream_t stream) {
  if (seqlen_q % probe::kBlockQ != 0 || seqlen_k % probe::kBlockK != 0 || (atom != 32 && atom != 16))
    return hipErrorInvalidValue;
  const dim3 grid(seqlen_q / probe::kBlockQ), block(probe::kThreads);
  if (is_bf16) {
    const auto kernel = atom == 32 ? probe_attention_bf16_32x32x8 : probe_attention_bf16_16x16x16;
    hipLaunchKernelGGL(kernel, grid, block, 0, stream, static_cast<const bfloat16_t*>(q),
                       static_cast<const bfloat16_t*>(k), static_cast<const bfloat16_t*>(v),
                       static_cast<bfloat16_t*>(out), lse, seqlen_k, softmax_scale);
  } else {
    const auto kernel = atom == 32 ? probe_attention_fp16_32x32x8 : probe_attention_fp16_16x16x16;
    hipLaunchKernelGGL(kernel, grid, block, 0, stream, static_cast<const half_t*>(q), static_cast<const half_t*>(k),
                       static_cast<const half_t*>(v), static_cast<half_t*>(out), lse, seqlen_k, softmax_scale);
  }
  return hipGetLastError();
}
