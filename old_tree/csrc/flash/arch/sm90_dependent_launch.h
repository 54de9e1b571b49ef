// Programmatic dependent launch, the host side (CUDA 11.8+, used on compute capability >= 9): the
// kernel goes out with cudaLaunchAttributeProgrammaticStreamSerialization, so it may be scheduled
// before the previous kernel of the stream completes (the device side: sm90_grid_dependency.cuh).
// FLASH_ATTN_PDL=0 turns it off (an A/B switch for the benchmarks and tests, read per launch).
#pragma once

#include <cstdlib>
#include <cstring>
#include <utility>

#include <cuda_runtime.h>

#include "../launch_attributes.h"

namespace flash {
namespace arch {

inline bool dependent_launch_enabled() {
  const char* choice = std::getenv("FLASH_ATTN_PDL");
  return choice == nullptr || std::strcmp(choice, "0") != 0;
}

template <typename... Params, typename... Args>
cudaError_t launch_after_prior_grid(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes,
                                    cudaStream_t stream, bool dependent, Args&&... args) {
  int device = 0, major = 0;
  if (dependent && dependent_launch_enabled()) {
    cudaError_t err = cudaGetDevice(&device);
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
  const cudaError_t err = cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
  return err == cudaSuccess ? cudaGetLastError() : err;
}

}  // namespace arch
}  // namespace flash
