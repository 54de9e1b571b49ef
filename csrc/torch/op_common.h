// Helpers shared by the ops' CUDA implementations (ops.cpp, ops_kvcache.cpp, ops_fp8.cpp): argument
// checks that raise RuntimeError naming the argument, kernel-ready layouts, params pieces, the
// dispatch to the compiled (dtype, head dim) kernels, output poisoning for the tests, and launch
// checks.
#pragma once

#include <ATen/cuda/CUDAContext.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <torch/extension.h>

#include <atomic>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "flash/launch_api.h"
#include "instantiations/compiled_configs.h"

namespace flash_attn_op {

// Test hook (set_poison_outputs): fill every output with NaN before the kernels run.
inline std::atomic<bool> poison_outputs{false};

constexpr int kMaxHeaddim = 256;
constexpr int kRowAlignment = 8;       // elements: rows move in 16-byte pieces
constexpr int kMaxGridYZ = 65535;      // heads and batch are grid dims y and z

template <typename T>
constexpr at::ScalarType scalar_type_of();
template <>
constexpr at::ScalarType scalar_type_of<__half>() {
  return at::kHalf;
}
template <>
constexpr at::ScalarType scalar_type_of<__nv_bfloat16>() {
  return at::kBFloat16;
}

// The smallest compiled head dim >= headdim for this dtype, or -1.
inline int kernel_headdim(at::ScalarType dtype, int headdim) {
  int best = -1;
#define FLASH_ATTN_CONSIDER(T, D) \
  if (scalar_type_of<T>() == dtype && (D) >= headdim && (best < 0 || (D) < best)) best = (D);
  FLASH_ATTN_FOR_EACH_CONFIG(FLASH_ATTN_CONSIDER)
#undef FLASH_ATTN_CONSIDER
  return best;
}

// The kernels of one pass, as a type the dispatch below can name.
struct FwdPass {
  template <typename T, int D>
  static cudaError_t run(const flash::FwdParams& params, cudaStream_t stream) {
    return flash::run_fwd<T, D>(params, stream);
  }
};

struct BwdPass {
  template <typename T, int D>
  static cudaError_t run(const flash::BwdParams& params, cudaStream_t stream) {
    return flash::run_bwd<T, D>(params, stream);
  }
};

// Runs the compiled (dtype, head dim) kernel of the pass; the caller checked that it exists.
template <typename Pass, typename Params>
cudaError_t launch(at::ScalarType dtype, int headdim, const Params& params, cudaStream_t stream) {
#define FLASH_ATTN_TRY(T, D) \
  if (scalar_type_of<T>() == dtype && (D) == headdim) return Pass::template run<T, D>(params, stream);
  FLASH_ATTN_FOR_EACH_CONFIG(FLASH_ATTN_TRY)
#undef FLASH_ATTN_TRY
  return cudaErrorInvalidValue;
}

// Message pieces are made strings here: streaming a number into a TORCH_CHECK message from this
// library (c10::str -> std::ostream << long, instantiated in the extension) crashed inside
// libstdc++ on the GPU machine (torch 2.11, the image's g++ 13), while strings stream safely.
inline std::string text(int64_t value) { return std::to_string(value); }

inline std::string text(at::IntArrayRef dims) {
  std::string joined = "(";
  for (size_t i = 0; i < dims.size(); ++i) joined += (i ? ", " : "") + std::to_string(dims[i]);
  return joined + ")";
}

inline void check_cuda_4d(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda(), "flash_attn: ", name, " must be a CUDA tensor, got ", t.device().str());
  TORCH_CHECK(t.dim() == 4, "flash_attn: ", name, " must have 4 dims, got ", text(t.sizes()));
}

inline void check_last_dim_contiguous(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.size(3) <= 1 || t.stride(3) == 1, "flash_attn: ", name,
              " must have a contiguous last dimension, got strides ", text(t.strides()));
}

// The kernels move rows in 16-byte pieces: unit stride on the last dim, every other stride a
// multiple of 8 elements and a 16-byte aligned start (dims of size 1 have no stride to obey).
inline bool kernel_ready(const at::Tensor& t) {
  if (t.size(3) > 1 && t.stride(3) != 1) return false;
  for (int dim = 0; dim < 3; ++dim) {
    if (t.size(dim) > 1 && t.stride(dim) % kRowAlignment != 0) return false;
  }
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

// `t` itself when the kernels can read it in place, else a fresh contiguous copy (a new
// allocation, so a misaligned start is fixed too). Outputs never depend on it: they are allocated
// contiguous, as the fake kernels say.
inline at::Tensor kernel_ready_copy(const at::Tensor& t) {
  return kernel_ready(t) ? t : at::empty(t.sizes(), t.options()).copy_(t);
}

inline void check_same_shape(const at::Tensor& t, const at::Tensor& like, const char* name, const char* like_name) {
  TORCH_CHECK(t.sizes() == like.sizes(), "flash_attn: ", name, " must have the shape of ", like_name, " ",
              text(like.sizes()), ", got ", text(t.sizes()));
}

// The shapes and devices of q, k, v (4-dim) that every attention op needs: one device, v shaped
// like k, q's batch and head dim, whole GQA groups, grid-sized batch and heads.
inline void check_qkv_shapes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  check_cuda_4d(q, "q");
  check_cuda_4d(k, "k");
  check_cuda_4d(v, "v");
  TORCH_CHECK(k.device() == q.device() && v.device() == q.device(), "flash_attn: q, k and v must be on one device");
  check_same_shape(v, k, "v", "k");
  TORCH_CHECK(k.size(0) == q.size(0), "flash_attn: k has batch ", text(k.size(0)), " but q has ", text(q.size(0)));
  TORCH_CHECK(k.size(3) == q.size(3), "flash_attn: k has head dim ", text(k.size(3)), " but q has ",
              text(q.size(3)));
  TORCH_CHECK(k.size(2) > 0 && q.size(2) % k.size(2) == 0, "flash_attn: nheads of q (", text(q.size(2)),
              ") must be a multiple of nheads of k and v (", text(k.size(2)), ")");
  TORCH_CHECK(q.size(2) <= kMaxGridYZ && q.size(0) <= kMaxGridYZ, "flash_attn: batch and nheads must be <= ",
              text(kMaxGridYZ));
}

inline flash::Strided4d strided(const at::Tensor& t) {
  return {t.data_ptr(), t.stride(0), t.stride(1), t.stride(2)};
}

inline void check_feature(bool used, bool compiled, const char* what, const char* flag) {
  TORCH_CHECK(!used || compiled, "flash_attn: ", what, " is compiled out of this build (", flag,
              "=1); rebuild without it");
}

inline void poison(std::initializer_list<at::Tensor> tensors) {
  if (!poison_outputs.load()) return;
  for (const auto& t : tensors) t.fill_(std::numeric_limits<float>::quiet_NaN());
}

// A launch error's likely cause, for the message.
inline const char* launch_hint(cudaError_t err) {
  if (err == cudaErrorInvalidValue)
    return " (the kernel's shared memory may exceed this GPU's per-block limit: sm86/sm89 GPUs have 99 KB, the "
           "kernels are tuned for A100/H100)";
  // Only the CDNA launchers return it: a (pass, head dim) without a tile that fits 64 KiB of LDS
  // (every pass has one at every head dim today).
  if (err == cudaErrorNotSupported)
    return " (no kernel for this pass and head dim on AMD GPUs in this build; csrc/flash/launch_*_cdna.cuh "
           "list the tiles)";
  return "";
}

// The compiled fp8 forward head dims whose kernel runs on `device` (ops_fp8.cpp).
std::vector<int64_t> fp8_forward_headdims(int64_t device);

inline void check_launch(cudaError_t err, const char* pass, at::ScalarType dtype, int headdim) {
  const char* hint = launch_hint(err);
  TORCH_CHECK(err == cudaSuccess, "flash_attn: ", pass, " kernel launch failed for ", c10::toString(dtype),
              " head dim ", text(headdim), ": ", cudaGetErrorString(err), hint);
}

}  // namespace flash_attn_op
