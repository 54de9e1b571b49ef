// AMD CDNA primitives (MI200 gfx90a, MI300 gfx942): the counterpart of sm80.cuh, selected by
// arch.cuh under __HIP_PLATFORM_AMD__. The MFMA atoms, operand loads and wave GEMMs are in
// cdna_mfma.cuh; the kernels' warp-GEMM interface (sm80_gemm.cuh's names, computed transposed) in
// cdna_gemm.cuh; the lane -> element maps in cdna_layout.h (plain C++, host-tested). Status: the
// probe, the sm80-family forward (fwd_kernel.cuh: hd 32 to 256) and backward (bwd_kernel.cuh: hd
// 32 to 256) and the split-KV decode (kvcache_append_kernel.cuh, splitkv_kernel.cuh with the
// cp.async loader, combine_kernel.cuh: hd 32 to 256) compile for gfx90a and gfx942 with
// matrix-core instructions (hip/ci_check.sh); not yet run on AMD hardware.
//
// What differs from sm80.cuh and sm80_gemm.cuh, name by name (the sm90 files' wgmma, TMA and
// mbarrier names have no counterpart: the sm90 kernels are not built for ROCm):
//   kWarpSize           64 (a wavefront). Not `warpSize`: ROCm 7 makes it a run-time value.
//   cp_async_16 / _4,   no cp.async on gfx90a: global -> register -> LDS, synchronous. The names are
//   cp_async_commit,    kept with the same results (zero fill when !valid) so tile_io.cuh compiles;
//   cp_async_wait<N>    commit and wait are no-ops (the copy is complete when it returns; the
//                       __syncthreads after the wait still publishes it). Overlapping the next tile's
//                       load with MMAs needs an explicit register prefetch in the kernel.
//   ldmatrix_x4(_trans) none. An MFMA operand is 4 consecutive k of one row or column per lane, so
//                       a k-contiguous LDS tile gives each operand with one 8-byte ds_read_b64
//                       (load_a_operand / load_b_operand); a tile that is contiguous along m or n
//                       ("km" / "kn") must be stored transposed when written to LDS
//                       (kHasTransposingLoads = false; tile_io.cuh load_tile_transposed, which the
//                       forward uses for V) or read with four 2-byte reads.
//   Mma16816 / mma_16816  Mfma<T, Shape> / mfma<T, Shape> for Mfma32x32x8 and Mfma16x16x16.
//   pack_pair, unpack_pair, to_float, from_float   same names and meaning for half_t and bfloat16_t.
//   shuffle, shuffle_xor, warp_sum, warp_max   same meaning over 64 lanes (__shfl / __shfl_xor with
//                       width 64: no *_sync, no 32-bit lane masks).
//   quad_max, quad_sum  not provided: they encode the mma.sync row-over-4-lanes layout. The CDNA
//                       counterpart is column_max / column_sum<Shape> (cdna_mfma.cuh): the lanes
//                       that hold one accumulator column, 2 of them (32x32) or 4 (16x16); the
//                       softmax reaches it as row_max / row_sum (cdna_gemm.cuh).
//   acc_row, acc_col,   cdna_gemm.cuh, for the kernels' transposed view of the 32x32x8 atom
//   kAccRegs, kAccRows, (FragmentAtom): one row per lane and atom, 16 values; kAccLayoutIsM16N8 is
//   acc_value, ...      false. Per atom, Shape::acc_row / acc_col (cdna_layout.h) as before.
//   warp_sync           wave barrier with LDS fences.
//   exp2_approx, log2_approx, reciprocal_approx   v_exp_f32, v_log_f32, v_rcp_f32.
//   byte_sign_masks, atomic_add_pair, wait_until_equal, release_store   same meaning (no vector fp32
//                       atomic: two atomicAdd; agent-scope acquire / release atomics);
//                       mul_hi_lo and byte_perm are arch.cuh's, shared by both layers.
//   smem_address        not needed: LDS pointers are 32-bit address space 3 pointers.
//   warp_gemm_ss / _rs, accumulators_to_a_fragments, store_accumulators, Layout, BLayout,
//   kAtomM/N/K, AFragment  cdna_gemm.cuh: the same names and meaning in the kernel's view (C = A.B),
//                       computed as C^T = B^T.A^T on MFMA; the k-contiguous forms (A "mk", B "nk")
//                       read an operand with one 8-byte read, the others ("km", "kn") with four
//                       2-byte reads; the register "A fragment" is an MFMA B operand. cdna_mfma.cuh's
//                       wave_gemm_ss / wave_gemm_sr, accumulators_to_b_operands and
//                       store_accumulators_transposed are the same products in MFMA terms (probe).
//   FLASH_LOAD_IF_SET, load_global   read the pointer in the global address space (see there).
//
// Port plan: what the sm80 kernels assume about fragments, and what must move into the arch layer
// before fwd_kernel / bwd_kernel / splitkv_kernel compile against CDNA. DONE for fwd_kernel (it
// compiles against cdna_gemm.cuh: items 1-3, V in 4, its loops in 5, the forward's dropout in 6,
// launch_fwd_cdna.cuh's tiles in 7, synchronous copies in 8) and for bwd_kernel (bwd_fragments.cuh
// loops over row slots in 2 and 5, 2-byte reads for Q, dO, K and dS^T in 4, the backward's dropout
// in 6, launch_bwd_cdna.cuh's tiles in 7, with V and P^T in registers at hd 96 and 128 for the
// LDS budget: bwd_register_operands.cuh; at hd 192 and 256 the head dim split over waves in every
// phase: bwd_score_split.cuh) and for splitkv_kernel (kAccRegs and AFragment in 1
// and 3, its loops in 5, V read with 2-byte reads in 4, launch_kvcache_cdna.cuh's tiles in 7, one
// ring stage in 8). The items, as they were:
//   1. Fragment shape. Accumulators are `float[MT][NT][4]` of 16x8 atoms (softmax.cuh,
//      fragment_scores.cuh, bwd_fragments.cuh, dropout.cuh, splitkv_kernel.cuh, the kernels).
//      MFMA accumulators are Shape::kAccRegs (16 or 4) fp32 per lane per square atom
//      (Accumulator<Shape>). The kernels need the fragment type and the atom extents from arch
//      (kAtomM = kAtomN = 32 or 16, kAtomK = 8 or 16), not the literals 4 / 16 / 8 / 16.
//   2. Rows per thread. OnlineSoftmax kept row_max / row_sum[MT][2] because a thread owns 2 rows
//      per atom (acc_row(lane, 2h), registers 2h and 2h+1) and reduces them over a quad (quad_max,
//      quad_sum; `lane % 4 == 0` writes lse; splitkv's merge_warps the same). On CDNA the forward
//      computes S^T = K.Q^T, as the backward already does: the query is the accumulator column, one
//      per lane (L % kN) with all its keys in that lane's registers, so the per-row state becomes
//      [NT] (per column atom), the reduction column_max / column_sum (1 xor-shuffle for 32x32, 2 for
//      16x16), the lse writer `lane < kN`, and the O rescale one factor per lane and column atom.
//      Done on the NVIDIA side: softmax.cuh, the sm80 forward's epilogue and the split-KV kernel now
//      read the "owned rows" map from the arch layer (kAccRows, kAccValuesPerRow, acc_value,
//      acc_row_slot, row_max, row_sum, is_row_leader in sm80.cuh, PTX unchanged); the CDNA layer
//      defines the same names for its layout (cdna_gemm.cuh; the probe's ColumnSoftmax is the same
//      computation written in MFMA terms).
//      The sm90 kernels still spell acc_row(lane, 2 * h).
//   3. P as the next operand. accumulators_to_a_fragments re-packs S (two 16x8 C atoms) as the A
//      operand of P.V. With MFMA, register group t (4 registers) of an S^T atom is exactly the B
//      operand of k-step t of O^T = V^T.P^T (acc_b_step / acc_b_value, host-tested), so the second
//      GEMM becomes O^T += V^T.P^T with A = V^T from LDS and B = P^T from registers (wave_gemm_sr),
//      and O is written from O^T (store_accumulators_transposed: 4 consecutive dims per lane, one
//      8-byte store). The kernels must stop assuming that the register operand is A.
//   4. Operand storage forms. warp_gemm_ss / _rs read Layout::kColMajorKM / BLayout::kKN tiles
//      through ldmatrix.trans: V in P.V, dO and Q in dV += P^T.dO and dK += dS^T.Q, dS^T and K in
//      dQ += dS.K. MFMA wants k contiguous for both operands, so those tiles are written to LDS
//      transposed by the global -> register -> LDS copy (V^T, dO^T, Q^T, K^T; dS as [query][key]) or
//      read with a 2-byte ds_read per value. The backward needs Q and K both ways (Q for S^T, Q^T for
//      dK; K for S^T, K^T for dQ): two LDS copies or 2-byte reads for one form, which the 64 KiB LDS
//      budget (checked_lds_bytes) decides. This is a tile_io.cuh change (a transposed tile load).
//   5. Element loops. scores_to_logits, probs_from_logits, dscores_from_dprobs,
//      packed_scores_to_logits and merge_warps loop over r < 4 or over r = 2h + j, reading
//      acc_col(lane, j) once per j because on sm80 the column depends on r % 2 only. Written as loops
//      over r < Shape::kAccRegs with Shape::acc_row / acc_col they carry no layout; on MFMA the
//      column does not depend on r (one per lane), so per-query values (lse, dsum) load once per
//      column atom. Pair stores assume registers (r, r+1) are adjacent columns of one row
//      (store_accumulators' pack_pair, add_dq_fragment's atomic_add_pair); on MFMA consecutive
//      registers are consecutive rows of one column. So: P^T / dS^T written as [key][query] take 2-byte
//      LDS stores (or the consumer reads them transposed), and dQ is best computed as
//      dQ^T = K^T.dS^T, whose register groups are 4 consecutive dims of one dq row: pair atomics.
//   6. Dropout. The Philox byte assignment (dropout.cuh: 16x16 tiles of 16 calls
//      v = 4 ((i % 8) / 2) + (j % 8) / 2; drop_tests_fwd / _bwd draw it in m16n8 lane
//      arithmetic with a pair exchange between lanes L and L ^ 4) must give the same bits for
//      (batch, head, row, col) on AMD: keep the element -> (tile, call, word, byte) map and
//      evaluate it per element from the Shape maps (one Philox call per tile and call that the
//      lane's elements need: draw_mapped_drop_tests), instead of the sm80 lane arithmetic.
//   7. Tile configs. kWarpSize-derived sizes follow (64), but FwdConfig / BwdConfig / the splitkv
//      config were tuned for 32-lane warps with 16-row atoms: a CDNA config per head dim (the probe:
//      128 queries x 4 waves, 32 queries per wave, 64-key K/V tiles, Q in registers, 34 KB of LDS
//      for hd 128), checked with checked_lds_bytes. combine_kernel.cuh's lse registers per lane
//      follow kWarpSize (2 per lane here), and the host chooses the split count for the 32 rows
//      of a split-KV workgroup (splitkv_heuristic.h kSplitKvRows).
//   8. Pipelining. cp.async stages (fwd K/V, bwd two query stages, splitkv ring) become synchronous
//      copies here; a CDNA kernel issues the next tile's global loads into registers before the
//      current MFMAs and writes them to LDS after them.
//   9. Launch and selection. launch_*.cuh's hipFuncSetAttribute (smem > 48 KiB) is harmless on AMD;
//      can_run_sm90 and the compute-capability queries pick NVIDIA kernels: the ROCm build
//      instantiates the CDNA kernels only and never includes the sm90 files (splitkv_kernel.cuh's
//      Hopper loader lives in splitkv_bulk_loader.cuh, which only the NVIDIA launcher includes; the
//      kernel's bulk test is has_bulk_copies() above).
// hip/probe_attention_block.hip is one forward attention block written this way (S^T = K.Q^T, column
// softmax, O^T += V^T.P^T with P^T in registers) for both atoms and both dtypes.
#pragma once

#include <cstdint>
#include <type_traits>

#include <hip/hip_fp16.h>
#include <hip/hip_runtime.h>
#if __has_include(<hip/hip_bf16.h>)
#include <hip/hip_bf16.h>
#else
#include <hip/hip_bfloat16.h>
#endif

#include "cdna_layout.h"

#if defined(__HIP_DEVICE_COMPILE__) && !defined(__GFX9__)
#error "flash_attn: the CDNA arch layer needs a wave64 GFX9 target (gfx90a, gfx942)"
#endif

// sm80.cuh's FLASH_GRID_CONSTANT: no kernel here hands a parameter's address to the hardware.
#define FLASH_GRID_CONSTANT

// sm80.cuh's FLASH_LAUNCH_BOUNDS_MIN_CTAS: HIP reads __launch_bounds__' second argument as waves per
// execution unit, and the CDNA tiles size their own occupancy, so only the thread count.
#define FLASH_LAUNCH_BOUNDS_MIN_CTAS(threads, ctas) __launch_bounds__(threads)

namespace flash {
namespace arch {

constexpr int kWarpSize = cdna::kWaveSize;

// CDNA has no Hopper-style bulk copies: kernels with a bulk-copy variant return at once from it.
__device__ __forceinline__ constexpr bool has_bulk_copies() { return false; }

// No programmatic dependent launch on CDNA (sm90_grid_dependency.cuh): kernels run in stream order.
__device__ __forceinline__ void wait_for_prior_grid() {}
__device__ __forceinline__ void allow_dependent_launch() {}

// LDS per workgroup on gfx90a and gfx942; more is a compile error, so tile configs check first.
constexpr int kLdsBytesPerWorkgroup = 64 * 1024;

template <int kBytes>
__host__ __device__ constexpr int checked_lds_bytes() {
  static_assert(kBytes <= kLdsBytesPerWorkgroup, "tile config needs more than the 64 KiB of LDS of a workgroup");
  return kBytes;
}

using half_t = __half;
#if __has_include(<hip/hip_bf16.h>)
using bfloat16_t = __hip_bfloat16;  // hipify's spelling of NVIDIA's bf16 type
#else
using bfloat16_t = hip_bfloat16;  // ROCm < 6 (Debian's 5.2) has only this spelling
#endif

// 16-bit element <-> fp32, by bit pattern: independent of which conversion operators the HIP
// headers of a ROCm version offer (torch builds with -D__HIP_NO_HALF_CONVERSIONS__).
template <typename T>
__device__ __forceinline__ uint16_t bits_of(T x) {
  static_assert(sizeof(T) == 2, "16-bit element types");
  return __builtin_bit_cast(uint16_t, x);
}

template <typename T>
__device__ __forceinline__ uint16_t float_to_bits(float x);

template <>
__device__ __forceinline__ uint16_t float_to_bits<half_t>(float x) {
  return __builtin_bit_cast(uint16_t, static_cast<_Float16>(x));  // v_cvt_f16_f32: nearest even
}

// Nearest even, as torch converts; gfx90a and gfx942 have no fp32 -> bf16 instruction.
template <>
__device__ __forceinline__ uint16_t float_to_bits<bfloat16_t>(float x) {
  const uint32_t u = __builtin_bit_cast(uint32_t, x);
  if (x != x) return static_cast<uint16_t>((u >> 16) | 0x40u);  // NaN stays a quiet NaN
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

template <typename T>
__device__ __forceinline__ float float_of_bits(uint16_t bits);

template <>
__device__ __forceinline__ float float_of_bits<half_t>(uint16_t bits) {
  return static_cast<float>(__builtin_bit_cast(_Float16, bits));
}

template <>
__device__ __forceinline__ float float_of_bits<bfloat16_t>(uint16_t bits) {
  return __builtin_bit_cast(float, static_cast<uint32_t>(bits) << 16);
}

// Two fp32 values -> one register of two T, `lo` in the low half.
template <typename T>
__device__ __forceinline__ uint32_t pack_pair(float lo, float hi) {
  return float_to_bits<T>(lo) | (static_cast<uint32_t>(float_to_bits<T>(hi)) << 16);
}

// One register of two T -> two fp32 values (pack_pair's inverse): the low half into lo.
template <typename T>
__device__ __forceinline__ void unpack_pair(uint32_t bits, float& lo, float& hi) {
  lo = float_of_bits<T>(static_cast<uint16_t>(bits));
  hi = float_of_bits<T>(static_cast<uint16_t>(bits >> 16));
}

template <typename T>
__device__ __forceinline__ float to_float(T x) {
  return float_of_bits<T>(bits_of(x));
}

template <typename T>
__device__ __forceinline__ T from_float(float x) {
  return __builtin_bit_cast(T, float_to_bits<T>(x));
}

__device__ __forceinline__ float shuffle(float value, int src_lane) { return __shfl(value, src_lane, kWarpSize); }

__device__ __forceinline__ float shuffle_xor(float value, int lane_mask) {
  return __shfl_xor(value, lane_mask, kWarpSize);
}

__device__ __forceinline__ uint32_t shuffle_xor(uint32_t value, int lane_mask) {
  return __shfl_xor(value, lane_mask, kWarpSize);
}

// Max / sum over the lanes that agree with this one in lane % kStride (lane, lane ^ kStride, ...).
template <int kStride>
__device__ __forceinline__ float lane_group_max(float v) {
#pragma unroll
  for (int mask = kStride; mask < kWarpSize; mask *= 2) v = fmaxf(v, shuffle_xor(v, mask));
  return v;
}

template <int kStride>
__device__ __forceinline__ float lane_group_sum(float v) {
#pragma unroll
  for (int mask = kStride; mask < kWarpSize; mask *= 2) v += shuffle_xor(v, mask);
  return v;
}

__device__ __forceinline__ float warp_sum(float v) { return lane_group_sum<1>(v); }
__device__ __forceinline__ float warp_max(float v) { return lane_group_max<1>(v); }

// The lanes of a wavefront run in lockstep, but LDS writes are only visible to the other lanes
// once they have completed: release, wave barrier, acquire (what ROCm 6.2's __syncwarp does).
__device__ __forceinline__ void warp_sync() {
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront");
  __builtin_amdgcn_wave_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront");
}

// Whether `p` holds in any lane of the wavefront (every lane gets the answer).
__device__ __forceinline__ bool warp_any(bool p) { return __any(p); }

// 2^x, log2(x) and 1/x on the transcendental unit: exp2(-inf) = 0, log2(0) = -inf, 1/inf = 0.
// clang >= 17 has the amdgcn builtins; before, llvm.exp2 / llvm.log2 lower to the bare
// v_exp_f32 / v_log_f32 (checked in the ISA of hipcc 5.2).
__device__ __forceinline__ float exp2_approx(float x) {
#if __has_builtin(__builtin_amdgcn_exp2f)
  return __builtin_amdgcn_exp2f(x);
#else
  return __builtin_exp2f(x);
#endif
}

__device__ __forceinline__ float log2_approx(float x) {
#if __has_builtin(__builtin_amdgcn_logf)
  return __builtin_amdgcn_logf(x);
#else
  return __builtin_log2f(x);
#endif
}

__device__ __forceinline__ float reciprocal_approx(float x) { return __builtin_amdgcn_rcpf(x); }

// sm80.cuh's byte_sign_masks (PRMT's sign mode), byte by byte.
template <uint32_t kSelector>
__device__ __forceinline__ uint32_t byte_sign_masks(uint32_t low, uint32_t high) {
  static_assert((kSelector & 0x8888u) == 0x8888u, "sign mode in every selector nibble");
  uint32_t out = 0u;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint32_t source = (kSelector >> (4 * k)) & 7u;
    const uint32_t word = source < 4 ? low : high;
    if ((word >> (8 * (source % 4) + 7)) & 1u) out |= 0xffu << (8 * k);
  }
  return out;
}

// dst[0] += a, dst[1] += b. CDNA has no packed fp32 atomic add: two scalar ones (hardware atomics
// only with -munsafe-fp-atomics; a CAS loop otherwise).
__device__ __forceinline__ void atomic_add_pair(float* dst, float a, float b) {
  atomicAdd(dst, a);
  atomicAdd(dst + 1, b);
}

// *ptr where ptr is set, else fallback (sm80.cuh's macro). ptr is read as a global pointer:
// through a generic one, LLVM merged the two reads into one flat load from a selected pointer,
// with fallback's kernel argument copied to scratch.
#define FLASH_LOAD_IF_SET(ptr, fallback) \
  ((ptr) != nullptr ? static_cast<uint64_t>(*(const __attribute__((address_space(1))) int64_t*)(ptr)) : (fallback))

// *ptr for a pointer into global memory (sm80.cuh's name). Where the pointer was chosen against a
// null one (`p == nullptr ? nullptr : p + i`: a paged cache's block table, rotary's cos / sin
// rows), LLVM lost its address space and loaded through a flat instruction; cast back here. Read
// as bits, so that element types with constructors (__half) need none in the global address space.
template <typename T>
__device__ __forceinline__ T load_global(const T* ptr) {
  static_assert(sizeof(T) == 2 || sizeof(T) == 4, "16- and 32-bit values");
  using Bits = std::conditional_t<sizeof(T) == 2, uint16_t, uint32_t>;
  return __builtin_bit_cast(T, *(const __attribute__((address_space(1))) Bits*)ptr);
}

// The counters below live in global memory: addressed as such, the atomics are global_* rather
// than flat_* instructions (which also wait on LDS traffic and which hip/check_isa.py rejects). C
// casts: reinterpret_cast cannot change an address space.
using GlobalInt = __attribute__((address_space(1))) int;

// Spins until *counter == value (acquire: what the writer did before its release is visible).
__device__ __forceinline__ void wait_until_equal(const int* counter, int value) {
  const GlobalInt* global = (const GlobalInt*)counter;
  while (__hip_atomic_load(global, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_AGENT) != value) {
  }
}

// *counter = value after every earlier write of this thread is visible device-wide (release).
__device__ __forceinline__ void release_store(int* counter, int value) {
  __hip_atomic_store((GlobalInt*)counter, value, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_AGENT);
}

// 16 and 8 bytes in registers.
using Chunk16 = uint32_t __attribute__((ext_vector_type(4)));
using Chunk8 = uint32_t __attribute__((ext_vector_type(2)));

// Read in the global address space (a C cast, as load_global): from a generic pointer LLVM infers it
// only where it can trace the pointer to a kernel argument, and clang 19 lost that trace for the
// split-KV loader's cache rows (flat_load_dwordx4 on gfx942, which hip/check_isa.py rejects).
__device__ __forceinline__ Chunk16 load_global_16(const void* src) {
  return *(const __attribute__((address_space(1))) Chunk16*)src;
}

// As two 8-byte writes: MFMA-friendly tiles pad rows by 4 elements (8 bytes), so a row start is
// 8-byte aligned only, and ds_write_b128 wants 16.
__device__ __forceinline__ void store_lds_16(void* dst, Chunk16 value) {
  Chunk8* halves = static_cast<Chunk8*>(dst);
  halves[0] = Chunk8{value[0], value[1]};
  halves[1] = Chunk8{value[2], value[3]};
}

// The 8 16-bit values of `value` down one column of an LDS tile: dst[i * stride] = value[i].
// How a row-major global tile becomes a k-contiguous MFMA operand (V -> V^T) without ldmatrix.trans.
template <typename T>
__device__ __forceinline__ void store_lds_transposed_16(T* dst, int stride, Chunk16 value) {
  uint16_t* column = reinterpret_cast<uint16_t*>(dst);
#pragma unroll
  for (int i = 0; i < 8; ++i) column[i * stride] = static_cast<uint16_t>(value[i / 2] >> (16 * (i % 2)));
}

// sm80's cp.async, done synchronously through registers (gfx90a has no asynchronous 16-byte copy
// into LDS); zero-fills the destination when !valid and reads nothing then.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
  store_lds_16(dst, valid ? load_global_16(src) : Chunk16{0u, 0u, 0u, 0u});
}

__device__ __forceinline__ void cp_async_4(void* dst, const void* src, bool valid) {
  *static_cast<uint32_t*>(dst) = valid ? *static_cast<const uint32_t*>(src) : 0u;
}

__device__ __forceinline__ void cp_async_commit() {}

template <int kPending>
__device__ __forceinline__ void cp_async_wait() {}

}  // namespace arch
}  // namespace flash
