// launch_kernel(..., dependent, args...): a kernel launch that, with dependent = true, lets the kernel
// start while the previous kernel of the stream finishes (programmatic dependent launch on Hopper
// and newer: arch/sm90_dependent_launch.h), hiding the launch latency between two kernels of one
// call. The rules (arch/sm90_grid_dependency.cuh): only for a kernel whose predecessor in the stream
// is a kernel of the same call, never for a call's first kernel (its predecessor may be the
// caller's); the kernel waits for its predecessor (arch::wait_for_prior_grid) before touching what
// it wrote. Elsewhere (AMD) an ordinary launch.
#pragma once

#include <utility>

#include <cuda_runtime.h>

#if !defined(__HIP_PLATFORM_AMD__)
#include "arch/sm90_dependent_launch.h"
#endif

namespace flash {

template <typename... Params, typename... Args>
cudaError_t launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream,
                          bool dependent, Args&&... args) {
#if defined(__HIP_PLATFORM_AMD__)
  kernel<<<grid, block, smem_bytes, stream>>>(std::forward<Args>(args)...);
  return cudaGetLastError();
#else
  return arch::launch_after_prior_grid(kernel, grid, block, smem_bytes, stream, dependent, std::forward<Args>(args)...);
#endif
}

}  // namespace flash
