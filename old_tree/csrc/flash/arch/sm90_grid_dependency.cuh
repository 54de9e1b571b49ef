// Programmatic dependent launch, the device side (PTX griddepcontrol, sm_90+): a kernel launched
// with the host's dependent-launch attribute (sm90_dependent_launch.h) may start while the kernel before
// it in the stream still runs, once every CTA of that kernel has called allow_dependent_launch (or
// exited). It must call wait_for_prior_grid before it reads or writes anything that kernel, or any
// kernel before it, touches: the wait returns when the prior grid has completed and its memory
// operations are visible. In a kernel launched without the attribute the wait returns at once, so
// kernels call both unconditionally. Older NVIDIA archs have no such launch: no-ops there (and in
// the CDNA layer, cdna.cuh).
#pragma once

namespace flash {
namespace arch {

__device__ __forceinline__ void wait_for_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next kernel of the stream (if launched as dependent) be scheduled now; what this CTA
// writes afterwards is still visible to it after its wait_for_prior_grid.
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

}  // namespace arch
}  // namespace flash
