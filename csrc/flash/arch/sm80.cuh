// NVIDIA sm80+ primitives: the only place that spells PTX.
//
// MMA atom: mma.sync m16n8k16, fp16/bf16 inputs, fp32 accumulators. Lane L of a warp, with
// g = L / 4 and t = L % 4, holds:
//   A (16x16, 4 regs of 2 halves): a0 = A[g][2t..2t+1], a1 = A[g+8][2t..], a2 = A[g][2t+8..], a3 = A[g+8][2t+8..]
//   B (16x8, 2 regs):              b0 = B[2t..2t+1][g],  b1 = B[2t+8..2t+9][g]
//   C (16x8, 4 fp32):              c0, c1 = C[g][2t], C[g][2t+1];  c2, c3 = C[g+8][2t], C[g+8][2t+1]
// ldmatrix.x4 loads four 8x8 b16 matrices; lane L gives the address of row L % 8 of matrix L / 8
// and receives, per matrix, row g cols 2t..2t+1 (or, with .trans, col g rows 2t..2t+1).
#pragma once

#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

// A kernel parameter whose address a kernel may take and hand to the hardware (a TMA tensor map):
// it stays in parameter memory instead of being copied to the stack.
#define FLASH_GRID_CONSTANT __grid_constant__

// __launch_bounds__ with the CTAs per SM the kernel is sized for (a kernel that fills the shared
// memory runs one): the compiler may then give a thread every register it can address.
#define FLASH_LAUNCH_BOUNDS_MIN_CTAS(threads, ctas) __launch_bounds__(threads, ctas)

namespace flash {
namespace arch {

constexpr int kWarpSize = 32;

// Whether this device code has Hopper's bulk copies and mbarrier transaction counts (sm90_bulk.cuh):
// kernels with a bulk-copy variant return at once where it is false (they are launched only where
// it is true).
__device__ __forceinline__ constexpr bool has_bulk_copies() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return true;
#else
  return false;
#endif
}

__device__ __forceinline__ uint32_t smem_address(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

// 16-byte global -> shared copy that bypasses registers; zero-fills the destination when !valid
// (no bytes are read then, but `src` must still be a mapped address).
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(dst)), "l"(src), "r"(src_bytes));
}

// 4-byte variant for float vectors whose rows are not 16-byte aligned (lse, dsum).
__device__ __forceinline__ void cp_async_4(void* dst, const void* src, bool valid) {
  const int src_bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_address(dst)), "l"(src), "r"(src_bytes));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Wait until at most `kPending` of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(smem_row)));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(smem_row)));
}

template <typename T>
struct Mma16816;

template <>
struct Mma16816<__half> {
  __device__ __forceinline__ static void run(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
};

template <>
struct Mma16816<__nv_bfloat16> {
  __device__ __forceinline__ static void run(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
};

template <typename T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  Mma16816<T>::run(c, a, b);
}

// Two fp32 values -> one register of two T, `lo` in the low half (the lower column index).
template <typename T>
__device__ __forceinline__ uint32_t pack_pair(float lo, float hi);

template <>
__device__ __forceinline__ uint32_t pack_pair<__half>(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

template <>
__device__ __forceinline__ uint32_t pack_pair<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

// One register of two T -> two fp32 values (pack_pair's inverse): the low half into lo.
template <typename T>
__device__ __forceinline__ void unpack_pair(uint32_t bits, float& lo, float& hi);

template <>
__device__ __forceinline__ void unpack_pair<__half>(uint32_t bits, float& lo, float& hi) {
  const __half2 h = *reinterpret_cast<const __half2*>(&bits);
  lo = __low2float(h);
  hi = __high2float(h);
}

template <>
__device__ __forceinline__ void unpack_pair<__nv_bfloat16>(uint32_t bits, float& lo, float& hi) {
  const __nv_bfloat162 h = *reinterpret_cast<const __nv_bfloat162*>(&bits);
  lo = __low2float(h);
  hi = __high2float(h);
}

template <typename T>
__device__ __forceinline__ float to_float(T x);

template <>
__device__ __forceinline__ float to_float<__half>(__half x) {
  return __half2float(x);
}

template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

// fp32 -> T, rounded to nearest even (as torch converts).
template <typename T>
__device__ __forceinline__ T from_float(float x);

template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}

template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

__device__ __forceinline__ float shuffle(float value, int src_lane) {
  return __shfl_sync(0xffffffffu, value, src_lane);
}

__device__ __forceinline__ float shuffle_xor(float value, int lane_mask) {
  return __shfl_xor_sync(0xffffffffu, value, lane_mask);
}

__device__ __forceinline__ uint32_t shuffle_xor(uint32_t value, int lane_mask) {
  return __shfl_xor_sync(0xffffffffu, value, lane_mask);
}

// The 4 lanes of a quad (same g) hold one accumulator row: reduce across them.
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, shuffle_xor(v, 1));
  return fmaxf(v, shuffle_xor(v, 2));
}

__device__ __forceinline__ float quad_sum(float v) {
  v += shuffle_xor(v, 1);
  return v + shuffle_xor(v, 2);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int mask = kWarpSize / 2; mask > 0; mask /= 2) v += shuffle_xor(v, mask);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int mask = kWarpSize / 2; mask > 0; mask /= 2) v = fmaxf(v, shuffle_xor(v, mask));
  return v;
}

// Waits until every lane of the warp reaches this point; their shared-memory writes (cp.async
// copies this lane waited for included) are then visible to the whole warp.
__device__ __forceinline__ void warp_sync() { __syncwarp(); }

// Whether `p` holds in any lane of the warp (every lane gets the answer).
__device__ __forceinline__ bool warp_any(bool p) { return __any_sync(0xffffffffu, p); }

// 2^x on the special-function unit; exp2(-inf) = 0.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// log2(x) on the special-function unit (relative error about 2^-22); log2(0) = -inf.
__device__ __forceinline__ float log2_approx(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// 1 / x on the special-function unit; 1 / inf = 0.
__device__ __forceinline__ float reciprocal_approx(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Byte k of the result is 0xff where the top bit of byte (kSelector >> 4k) & 7 of the 8 bytes
// {low, high} is set, else 0: PRMT's sign mode (bit 3 of every selector nibble), the selector an
// immediate.
template <uint32_t kSelector>
__device__ __forceinline__ uint32_t byte_sign_masks(uint32_t low, uint32_t high) {
  static_assert((kSelector & 0x8888u) == 0x8888u, "sign mode in every selector nibble");
  uint32_t out;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(out) : "r"(low), "r"(high), "n"(kSelector));
  return out;
}

// dst[0] += a, dst[1] += b; dst 8-byte aligned. One vector reduction on sm90, two scalar before.
__device__ __forceinline__ void atomic_add_pair(float* dst, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(dst), "f"(a), "f"(b) : "memory");
#else
  atomicAdd(dst, a);
  atomicAdd(dst + 1, b);
#endif
}

// *ptr where ptr is set, else fallback (torch's Philox seed and offset: device scalars under
// graph capture, host values otherwise). A macro, expanding to the expression dropout.cuh always
// had: as an inlined function it moved nvcc's scheduling of the sm90 forward's parameter loads.
#define FLASH_LOAD_IF_SET(ptr, fallback) ((ptr) != nullptr ? static_cast<uint64_t>(*(ptr)) : (fallback))

// *ptr for a pointer into global memory that may have been chosen against a null one (a paged
// cache's block table, rotary's cos / sin rows): a plain load here; cdna.cuh's reads it in the
// global address space.
template <typename T>
__device__ __forceinline__ T load_global(const T* ptr) {
  return *ptr;
}

// Spins until *counter == value (acquire: what the writer did before its release is visible).
__device__ __forceinline__ void wait_until_equal(const int* counter, int value) {
  int seen;
  do {
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(seen) : "l"(counter) : "memory");
  } while (seen != value);
}

// *counter = value after every earlier write of this thread is visible GPU-wide (release).
__device__ __forceinline__ void release_store(int* counter, int value) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(counter), "r"(value) : "memory");
}

// The accumulator layout is mma.sync's m16n8 C fragment (the one the dropout definition is
// written in: dropout.cuh), kAccRegs fp32 values per lane and atom.
constexpr bool kAccLayoutIsM16N8 = true;
constexpr int kAccRegs = 4;

// Accumulator element r (0..3) of lane `lane` sits at row acc_row(lane, r), col acc_col(lane, r)
// of its 16x8 tile.
__device__ __forceinline__ int acc_row(int lane, int r) { return lane / 4 + 8 * (r / 2); }

// The accumulator rows as the softmax sees them: per 16-row atom a thread owns kAccRows rows
// (g and g + 8) with kAccValuesPerRow adjacent columns each; value j of row slot h is register
// acc_value(h, j). The kAccLanesPerRow lanes of a quad share a row: row_max / row_sum reduce over
// them and is_row_leader picks the one that writes per-row results (lse).
constexpr int kAccRows = 2;
constexpr int kAccValuesPerRow = 2;
__device__ __forceinline__ constexpr int acc_value(int row_slot, int j) { return 2 * row_slot + j; }
__device__ __forceinline__ constexpr int acc_row_slot(int r) { return r / 2; }
__device__ __forceinline__ float row_max(float v) { return quad_max(v); }
__device__ __forceinline__ float row_sum(float v) { return quad_sum(v); }
__device__ __forceinline__ bool is_row_leader(int lane) { return lane % 4 == 0; }
__device__ __forceinline__ int acc_col(int lane, int r) { return 2 * (lane % 4) + (r % 2); }

// acc_col(lane, r) == acc_col_lane_part(lane) + acc_col_register_part(r): an even lane part whose
// remainder mod 8 plus the register part's stays below 8 (layout-generic code, dropout.cuh, counts
// on it).
__device__ __forceinline__ int acc_col_lane_part(int lane) { return 2 * (lane % 4); }
__host__ __device__ constexpr int acc_col_register_part(int r) { return r % 2; }

}  // namespace arch
}  // namespace flash
