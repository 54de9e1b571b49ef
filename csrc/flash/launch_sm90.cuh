// Whether the Hopper (sm_90a) kernels can run here: a compute-capability 9.0 device, a binary whose
// loaded image is sm_90a, and no FLASH_ATTN_DISABLE_SM90=1; and the TMA view of a sequence tensor.
// Shared by the forward, backward and kvcache launchers.
#pragma once

#include <atomic>
#include <cstdlib>
#include <cstring>

#include <cuda_runtime.h>

#include "arch/sm90_tensor_map.h"
#include "params.h"

namespace flash {

// The TMA view of a query-side (q, dout) or key-side (k, v) tensor: dense (batch, seqlen, heads,
// headdim), varlen one batch of the packed rows. Shared by the warp-specialized launchers.
inline arch::RowTensor sequence_rows_view(const FwdParams& p, const Strided4d& t, bool key_side) {
  const bool varlen = p.varlen.cu_seqlens_q != nullptr;
  const int64_t rows = varlen ? (key_side ? p.varlen.total_k : p.varlen.total_q)
                              : (key_side ? p.shape.seqlen_k : p.shape.seqlen_q);
  const int64_t heads = key_side ? p.shape.heads_k : p.shape.heads, batches = varlen ? 1 : p.shape.batch;
  return arch::RowTensor{t.ptr, p.shape.headdim, rows, heads, batches, t.row_stride, t.head_stride, t.batch_stride};
}

// The TMA view of out for the warp-specialized forward's epilogue, a box of kRows rows: dense
// batches only (a varlen box would run into the next sequence's rows). False where it is not used.
template <int kRows>
bool make_output_tensor_map(const FwdParams& p, CUtensorMap& map) {
  return p.varlen.cu_seqlens_q == nullptr &&
         arch::encode_swizzled_row_map(&map, sequence_rows_view(p, p.out, false), kRows);
}

// True on a compute-capability 9.0 device when the kernel's loaded image was built for sm_90a
// (not JIT-compiled from older PTX). The image of a kernel does not change within a process, so
// the answer is kept per device (0 unknown, 1 yes, 2 no) and the CUDA queries run once.
template <typename Kernel>
cudaError_t loaded_image_is_sm90a(Kernel kernel, int device, bool& result) {
  constexpr int kCachedDevices = 64;
  static std::atomic<int> known[kCachedDevices];
  if (device < kCachedDevices && known[device] != 0) {
    result = known[device] == 1;
    return cudaSuccess;
  }
  result = false;
  int major = 0;
  cudaError_t err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (err != cudaSuccess) return err;
  if (major == 9) {
    cudaFuncAttributes attributes;
    err = cudaFuncGetAttributes(&attributes, kernel);
    if (err != cudaSuccess) return err;
    result = attributes.binaryVersion == 90 && attributes.ptxVersion == 90;
  }
  if (device < kCachedDevices) known[device] = result ? 1 : 2;
  return cudaSuccess;
}

// The sm90 kernel can run, unless FLASH_ATTN_DISABLE_SM90=1 asks for the sm80 one (read per call:
// the tests switch it).
template <typename Kernel>
cudaError_t can_run_sm90(Kernel kernel, int device, bool& result) {
  result = false;
  const char* disabled = std::getenv("FLASH_ATTN_DISABLE_SM90");
  if (disabled != nullptr && std::strcmp(disabled, "1") == 0) return cudaSuccess;
  return loaded_image_is_sm90a(kernel, device, result);
}

}  // namespace flash
