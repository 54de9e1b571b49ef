// Host-side launch settings that do not change within a process, queried or set once per device:
// device attributes (SM count, opt-in shared memory per block) and each kernel's dynamic
// shared-memory opt-in. Each is a CUDA runtime call, and cudaFuncSetAttribute took 2.2 µs per
// launch on the GPU machine's host (torch.profiler, benchmarks/NOTES.md v11), where a short
// forward+backward is host-bound.
// A cudaDeviceReset would drop the opt-ins; nothing in torch resets the device under a live tensor.
#pragma once

#include <atomic>
#include <map>
#include <mutex>
#include <utility>

#include <cuda_runtime.h>

namespace flash {

// cudaDeviceGetAttribute(kAttribute, device), queried once per device (the first 64 devices;
// later ones are queried per call).
template <cudaDeviceAttr kAttribute>
cudaError_t cached_device_attribute(int device, int& value) {
  constexpr int kCachedDevices = 64;
  static std::atomic<int> known[kCachedDevices];  // value + 1; 0 when not queried yet
  if (device >= 0 && device < kCachedDevices) {
    const int stored = known[device].load(std::memory_order_relaxed);
    if (stored > 0) {
      value = stored - 1;
      return cudaSuccess;
    }
  }
  const cudaError_t err = cudaDeviceGetAttribute(&value, kAttribute, device);
  if (err == cudaSuccess && value >= 0 && device >= 0 && device < kCachedDevices)
    known[device].store(value + 1, std::memory_order_relaxed);
  return err;
}

// Lets `kernel` launch with `bytes` of dynamic shared memory on the current device: one
// cudaFuncSetAttribute per (kernel, device) and larger size (the attribute is an upper bound, so a
// grant of more serves every smaller launch).
template <typename Kernel>
cudaError_t allow_dynamic_smem(Kernel kernel, int bytes) {
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, int> granted;  // (kernel, device) -> bytes
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  const auto key = std::make_pair(reinterpret_cast<const void*>(kernel), device);
  std::lock_guard<std::mutex> lock(mutex);
  const auto found = granted.find(key);
  if (found != granted.end() && found->second >= bytes) return cudaSuccess;
  // by address: ROCm 5.2's hipFuncSetAttribute has no overload for a kernel's own pointer type
  err = cudaFuncSetAttribute(key.first, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err == cudaSuccess) granted[key] = bytes;
  return err;
}

}  // namespace flash
