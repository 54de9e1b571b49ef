// Compile-only coverage of the CDNA arch layer: every arch:: function the probe does not call,
// instantiated for both element types and both MFMA atoms, so a template that no kernel uses yet
// still has to compile for gfx90a and gfx942. Built by hip/ci_check.sh and tests/test_hip.py:
//   hipcc --offload-arch=gfx90a --cuda-device-only -I csrc -c tests/hip/cdna_api_compile.hip
#include <hip/hip_runtime.h>

#include "flash/arch/arch.cuh"

namespace arch = flash::arch;

namespace {

constexpr int kStride = 36;  // elements per LDS row: 32 + 4 of padding

template <typename T, typename Shape>
__device__ void gemms_and_stores(T* lds, T* out, int lane) {
  arch::Accumulator<Shape> c[1][2];
  arch::zero_accumulators(c);
  arch::wave_gemm_ss<Shape, 1, 2, 32 / Shape::kK>(c, lds, kStride, 0, lds, kStride, 0, lane);
  arch::Operand<T> b[2][32 / Shape::kK];
  arch::load_b_operands<Shape>(b, lds, kStride, 0, lane);
  arch::wave_gemm_sr<Shape>(c, lds, kStride, 0, b, lane);
  arch::Operand<T> next[2][Shape::kAccGroups];
  arch::accumulators_to_b_operands<T, Shape>(next, c);
  arch::mfma<T, Shape>(c[0][0], arch::load_a_operand<Shape>(lds, kStride, 0, 0, lane), next[0][0]);
  arch::mfma<T, Shape>(c[0][1], arch::load_a_operand_k_major<Shape>(lds, kStride, 0, 0, lane),
                       arch::load_b_operand_k_major<Shape>(lds, kStride, 0, 0, lane));
  c[0][1][0] = arch::column_max<Shape>(c[0][1][0]) + arch::column_sum<Shape>(c[0][1][1]);
  arch::store_accumulators_transposed<Shape>(out, 2 * Shape::kN, 0, 0, c, lane);
}

template <typename T>
__device__ void element_conversions(T* out, float x) {
  out[0] = arch::from_float<T>(arch::to_float(out[1]) + x);
  reinterpret_cast<uint32_t*>(out)[1] = arch::pack_pair<T>(x, -x);
}

__device__ void copies_and_sync(unsigned char* lds, const unsigned char* global, bool valid) {
  arch::cp_async_16(lds, global, valid);
  arch::cp_async_4(lds + 16, global + 16, valid);
  arch::cp_async_commit();
  arch::cp_async_wait<0>();
  arch::store_lds_transposed_16(reinterpret_cast<uint16_t*>(lds + 32), 8, arch::load_global_16(global));
  arch::warp_sync();
}

__device__ float math_and_shuffles(float x, int lane) {
  uint32_t lo;
  const uint32_t hi = arch::mul_hi_lo(static_cast<uint32_t>(lane), 0xD2511F53u, lo);
  return arch::warp_sum(x) + arch::warp_max(x) + arch::shuffle(x, 0) + arch::shuffle_xor(x, 1) +
         arch::exp2_approx(x) + arch::log2_approx(x) + arch::reciprocal_approx(x) + static_cast<float>(hi ^ lo);
}

__device__ void atomics(float* sums, int* counter) {
  arch::atomic_add_pair(sums, 1.f, 2.f);
  arch::wait_until_equal(counter, 1);
  arch::release_store(counter + 1, 2);
}

}  // namespace

__global__ void __launch_bounds__(arch::kWarpSize) cdna_api(arch::half_t* half_out, arch::bfloat16_t* bf16_out,
                                                            float* sums, int* counter, const unsigned char* global) {
  __shared__ __attribute__((aligned(16))) unsigned char lds[arch::checked_lds_bytes<64 * kStride * 2>()];
  const int lane = threadIdx.x % arch::kWarpSize;
  gemms_and_stores<arch::half_t, arch::Mfma32x32x8>(reinterpret_cast<arch::half_t*>(lds), half_out, lane);
  gemms_and_stores<arch::half_t, arch::Mfma16x16x16>(reinterpret_cast<arch::half_t*>(lds), half_out, lane);
  gemms_and_stores<arch::bfloat16_t, arch::Mfma32x32x8>(reinterpret_cast<arch::bfloat16_t*>(lds), bf16_out, lane);
  gemms_and_stores<arch::bfloat16_t, arch::Mfma16x16x16>(reinterpret_cast<arch::bfloat16_t*>(lds), bf16_out, lane);
  element_conversions(half_out, sums[0]);
  element_conversions(bf16_out, sums[0]);
  copies_and_sync(lds, global, lane < 32);
  sums[2] = math_and_shuffles(sums[3], lane);
  atomics(sums, counter);
}
