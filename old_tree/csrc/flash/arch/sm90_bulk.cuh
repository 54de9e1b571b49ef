// NVIDIA Hopper bulk asynchronous copies (the TMA engine without a tensor map): a contiguous
// shared-memory range reduced into or stored to global memory, or a contiguous global range loaded into shared
// memory, by one thread's instruction; loads complete on an mbarrier's transaction count.
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

// gmem[i] = smem[i] for `bytes` bytes; same alignment and visibility rules as bulk_reduce_add_f32.
__device__ __forceinline__ void bulk_store(void* gmem, const void* smem, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(gmem), "r"(smem_address(smem)),
               "r"(bytes)
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

// mbarrier for bulk loads: one arrival (the thread that posts the expected bytes) per phase.
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t arrivals) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_address(bar)), "r"(arrivals) : "memory");
#endif
}

// Makes initialized mbarriers visible to the async proxy (the bulk copies that complete on them).
__device__ __forceinline__ void fence_mbarrier_init() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// Arrives on `bar` and adds `bytes` to the transaction count its current phase waits for.
__device__ __forceinline__ void mbarrier_arrive_expect_bytes(uint64_t* bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_address(bar)), "r"(bytes)
               : "memory");
#endif
}

// Copies `bytes` (a multiple of 16; both addresses 16-byte aligned) from global to shared memory;
// completion counts against bar's transaction count.
__device__ __forceinline__ void bulk_load(void* smem, const void* gmem, uint32_t bytes, uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_address(smem)),
               "l"(gmem), "r"(bytes), "r"(smem_address(bar))
               : "memory");
#endif
}

// Waits until the phase of `bar` with this parity has completed.
__device__ __forceinline__ void mbarrier_wait_parity(uint64_t* bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n"
      "}\n" ::"r"(smem_address(bar)),
      "r"(parity)
      : "memory");
#endif
}

}  // namespace arch
}  // namespace flash
