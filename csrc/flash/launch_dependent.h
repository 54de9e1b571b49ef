// Programmatic dependent launch, the host side: launch_kernel(..., dependent = true) lets a kernel
// start while the previous kernel of the stream finishes, hiding the launch latency between two
// kernels of one call (the device side and its rules: arch/dependent_launch.cuh). Only for a kernel
// whose predecessor in the stream is a kernel of the same call that calls allow_dependent_launch:
// never for a call's first kernel, whose predecessor may be the caller's.
// Used where Hopper and newer run it (compute capability >= 9); FLASH_ATTN_PDL=0 turns it off (an
// A/B switch for the benchmarks and tests, read per launch).
#pragma once

#include <cstdlib>
#include <cstring>
#include <utility>

#include <cuda_runtime.h>

#include "launch_attributes.h"

namespace flash {

inline bool dependent_launch_enabled() {
  const char* choice = std::getenv("FLASH_ATTN_PDL");
  return choice == nullptr || std::strcmp(choice, "0") != 0;
}

template <typename... Params, typename... Args>
cudaError_t launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream,
                          bool dependent, Args&&... args) {
#if defined(__HIP_PLATFORM_AMD__)
  kernel<<<grid, block, smem_bytes, stream>>>(std::forward<Args>(args)...);
  return cudaGetLastError();
#else
  int device = 0, major = 0;
  cudaError_t err = cudaSuccess;
  if (dependent && dependent_launch_enabled()) {
    err = cudaGetDevice(&device);
    if (err == cudaSuccess) err = cached_device_attribute<cudaDevAttrComputeCapabilityMajor>(device, major);
    if (err != cudaSuccess) return err;
  }
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = major >= 9 ? 1 : 0;
  err = cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
  return err == cudaSuccess ? cudaGetLastError() : err;
#endif
}

}  // namespace flash
