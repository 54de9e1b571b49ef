// NVIDIA Hopper bulk asynchronous copies (the TMA engine without a tensor map): a contiguous
// shared-memory range reduced into global memory by one thread's instruction.
#pragma once

#include <cstdint>

#include "sm80.cuh"

namespace flash {
namespace arch {

// gmem[i] += smem[i] for `bytes` / 4 floats; both 16-byte aligned, bytes a multiple of 16. The
// shared-memory source must have been made visible with fence_proxy_async() (sm90_wgmma.cuh).
__device__ __forceinline__ void bulk_reduce_add_f32(float* gmem, const void* smem, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(gmem),
               "r"(smem_address(smem)), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }

// Until at most kPending of this thread's bulk groups still read their shared-memory source.
template <int kPending>
__device__ __forceinline__ void bulk_wait_source_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}

// Until at most kPending of this thread's bulk groups are still incomplete (writes done).
template <int kPending>
__device__ __forceinline__ void bulk_wait_complete() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Orders this thread's completed bulk (async-proxy) writes to global memory before its later
// generic-proxy operations, e.g. the release that lets another CTA add to the same tile.
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

}  // namespace arch
}  // namespace flash
