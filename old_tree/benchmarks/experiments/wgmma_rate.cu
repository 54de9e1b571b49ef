// Tensor-core issue rate of wgmma on this GPU, by shared-memory layout (torch-free experiment):
// each warpgroup of a CTA issues back-to-back m64nNk16 wgmmas from one shared tile, and the kernel
// reports multiply-adds per clock per SM. The data is whatever shared memory holds: only the
// rate matters. Compares the no-swizzle core-matrix layout our kernels use with the 128-byte
// swizzle (descriptor bits 62-63 = 1), for A and B from shared memory (ss) and A from registers
// (rs).
//
//   nvcc -O3 -std=c++17 -I csrc -gencode=arch=compute_90a,code=sm_90a \
//        benchmarks/experiments/wgmma_rate.cu -o /tmp/wgmma_rate && /tmp/wgmma_rate
#include <cuda_bf16.h>

#include <cstdio>

#include "flash/arch/sm90_wgmma.cuh"

using T = __nv_bfloat16;
constexpr int kSteps = 4096;  // wgmmas per warpgroup

__device__ uint64_t descriptor(const void* start, int swizzle_mode, uint32_t leading, uint32_t stride) {
  return flash::arch::smem_descriptor(start, leading, stride) | (static_cast<uint64_t>(swizzle_mode) << 62);
}

template <int N, bool kRegisterA>
__global__ void wgmma_rate(int swizzle_mode, unsigned long long* cycles, float* sink) {
  extern __shared__ __align__(1024) unsigned char smem[];
  for (int i = threadIdx.x; i < 64 * 1024 / 4; i += blockDim.x) reinterpret_cast<float*>(smem)[i] = 0.f;
  __syncthreads();
  flash::arch::fence_proxy_async();
  __syncthreads();
  // No swizzle: leading (K) offset 1 KB apart per 8-column chunk, stride (M/N) 128 B per 8 rows.
  // 128-byte swizzle, K-major: rows of 128 bytes, 8-row groups 1 KB apart; k-steps 32 B apart.
  const bool swizzled = swizzle_mode != 0;
  const uint32_t leading = swizzled ? 16 : 1024, stride = swizzled ? 1024 : 128;
  float d[N / 8][4] = {};
  uint32_t a[4] = {threadIdx.x, 1, 2, 3};
  const unsigned long long start = clock64();
#pragma unroll 1
  for (int step = 0; step < kSteps; step += 8) {
    flash::arch::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 8; ++ks) {
      const int k_offset = swizzled ? (ks % 4) * 32 : ks * 2048;
      const uint64_t desc_b = descriptor(smem + 32768 + k_offset, swizzle_mode, leading, stride);
      if constexpr (kRegisterA) {
        flash::arch::Wgmma<T, N>::template rs<false>(d, a, desc_b, true);
      } else {
        const uint64_t desc_a = descriptor(smem + k_offset, swizzle_mode, leading, stride);
        flash::arch::Wgmma<T, N>::template ss<false, false>(d, desc_a, desc_b, true);
      }
    }
    flash::arch::wgmma_commit();
    flash::arch::wgmma_wait<1>();
  }
  flash::arch::wgmma_wait<0>();
  const unsigned long long stop = clock64();
  float total = 0.f;
  for (int j = 0; j < N / 8; ++j) total += d[j][0] + d[j][1] + d[j][2] + d[j][3];
  if (total == 12345.f) *sink = total;  // keeps the MMAs alive
  if (threadIdx.x == 0) cycles[blockIdx.x] = stop - start;
}

template <int N, bool kRegisterA>
void measure(int warpgroups, int swizzle_mode, int sms) {
  unsigned long long* cycles;
  float* sink;
  cudaMalloc(&cycles, sms * sizeof(unsigned long long));
  cudaMalloc(&sink, sizeof(float));
  auto kernel = wgmma_rate<N, kRegisterA>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024);
  kernel<<<sms, 128 * warpgroups, 64 * 1024>>>(swizzle_mode, cycles, sink);
  kernel<<<sms, 128 * warpgroups, 64 * 1024>>>(swizzle_mode, cycles, sink);
  unsigned long long host = 0;
  cudaMemcpy(&host, cycles, sizeof(host), cudaMemcpyDeviceToHost);
  const cudaError_t err = cudaDeviceSynchronize();
  const double fma = 64.0 * N * 16 * kSteps * warpgroups;
  std::printf("m64n%dk16 %s %d warpgroups, %-10s: %6.0f multiply-adds per clock per SM (%s)\n", N,
              kRegisterA ? "rs" : "ss", warpgroups, swizzle_mode ? "swizzle128" : "no swizzle", fma / host,
              cudaGetErrorString(err));
  cudaFree(cycles);
  cudaFree(sink);
}

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  for (int warpgroups : {1, 2}) {
    for (int swizzle : {0, 1}) {
      measure<128, false>(warpgroups, swizzle, sms);
      measure<64, false>(warpgroups, swizzle, sms);
      measure<128, true>(warpgroups, swizzle, sms);
      measure<64, true>(warpgroups, swizzle, sms);
    }
  }
  return 0;
}
