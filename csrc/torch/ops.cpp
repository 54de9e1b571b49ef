// The only torch-aware C++: argument checks, allocation, params, the current stream, and the
// CUDA implementations of flash_attn::fwd / flash_attn::bwd (schemas live in flash_attn/ops.py).
// Every check raises RuntimeError (TORCH_CHECK); the public functions validate first and raise
// ValueError / TypeError themselves.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <torch/extension.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "flash/launch_api.h"
#include "instantiations/compiled_configs.h"

namespace {

std::atomic<bool> poison_outputs{false};

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
int kernel_headdim(at::ScalarType dtype, int headdim) {
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
std::string text(int64_t value) { return std::to_string(value); }

std::string text(at::IntArrayRef dims) {
  std::string joined = "(";
  for (size_t i = 0; i < dims.size(); ++i) joined += (i ? ", " : "") + std::to_string(dims[i]);
  return joined + ")";
}

void check_cuda_4d(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda(), "flash_attn: ", name, " must be a CUDA tensor, got ", t.device().str());
  TORCH_CHECK(t.dim() == 4, "flash_attn: ", name, " must have 4 dims, got ", text(t.sizes()));
}

void check_last_dim_contiguous(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.size(3) <= 1 || t.stride(3) == 1, "flash_attn: ", name,
              " must have a contiguous last dimension, got strides ", text(t.strides()));
}

// The kernels move rows in 16-byte pieces: unit stride on the last dim, every other stride a
// multiple of 8 elements and a 16-byte aligned start (dims of size 1 have no stride to obey).
bool kernel_ready(const at::Tensor& t) {
  if (t.size(3) > 1 && t.stride(3) != 1) return false;
  for (int dim = 0; dim < 3; ++dim) {
    if (t.size(dim) > 1 && t.stride(dim) % kRowAlignment != 0) return false;
  }
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

// `t` itself when the kernels can read it in place, else a fresh contiguous copy (a new
// allocation, so a misaligned start is fixed too). Outputs never depend on it: they are allocated
// contiguous, as the fake kernels say.
at::Tensor kernel_ready_copy(const at::Tensor& t) {
  return kernel_ready(t) ? t : at::empty(t.sizes(), t.options()).copy_(t);
}

void check_same_shape(const at::Tensor& t, const at::Tensor& like, const char* name, const char* like_name) {
  TORCH_CHECK(t.sizes() == like.sizes(), "flash_attn: ", name, " must have the shape of ", like_name, " ",
              text(like.sizes()), ", got ", text(t.sizes()));
}

// Checks shared by fwd and bwd; returns the compiled head dim that serves q's head dim.
int check_attention_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double softmax_scale) {
  check_cuda_4d(q, "q");
  check_cuda_4d(k, "k");
  check_cuda_4d(v, "v");
  check_last_dim_contiguous(q, "q");
  check_last_dim_contiguous(k, "k");
  check_last_dim_contiguous(v, "v");
  TORCH_CHECK(k.device() == q.device() && v.device() == q.device(), "flash_attn: q, k and v must be on one device");
  const auto dtype = q.scalar_type();
  TORCH_CHECK(dtype == at::kHalf || dtype == at::kBFloat16, "flash_attn: q must be float16 or bfloat16, got ",
              c10::toString(dtype));
  TORCH_CHECK(k.scalar_type() == dtype && v.scalar_type() == dtype, "flash_attn: k and v must have q's dtype ",
              c10::toString(dtype));
  check_same_shape(v, k, "v", "k");
  TORCH_CHECK(k.size(0) == q.size(0), "flash_attn: k has batch ", text(k.size(0)), " but q has ", text(q.size(0)));
  TORCH_CHECK(k.size(3) == q.size(3), "flash_attn: k has head dim ", text(k.size(3)), " but q has ",
              text(q.size(3)));
  const int64_t headdim = q.size(3);
  TORCH_CHECK(headdim > 0 && headdim <= kMaxHeaddim && headdim % kRowAlignment == 0,
                    "flash_attn: head dim must be a multiple of 8 in [8, 256] (the public functions pad), got ",
              text(headdim));
  TORCH_CHECK(k.size(2) > 0 && q.size(2) % k.size(2) == 0, "flash_attn: nheads of q (", text(q.size(2)),
              ") must be a multiple of nheads of k and v (", text(k.size(2)), ")");
  TORCH_CHECK(q.size(2) <= kMaxGridYZ && q.size(0) <= kMaxGridYZ, "flash_attn: batch and nheads must be <= ",
              text(kMaxGridYZ));
  TORCH_CHECK(std::isfinite(softmax_scale) && softmax_scale > 0, "flash_attn: softmax_scale must be positive "
              "and finite, got ", std::to_string(softmax_scale));
  const auto* props = at::cuda::getDeviceProperties(q.get_device());
  TORCH_CHECK(props->major >= 8, "flash_attn: ", props->name, " has compute capability ", text(props->major), ".",
              text(props->minor), "; flash_attn needs sm80 (Ampere) or newer");
  const int kernel_hd = kernel_headdim(dtype, static_cast<int>(headdim));
  TORCH_CHECK(kernel_hd > 0, "flash_attn: this build has no ", c10::toString(dtype), " kernel for head dim ",
              text(headdim), " (built with FLASH_ATTN_DTYPES=\"", FLASH_ATTN_BUILD_DTYPES,
                              "\" FLASH_ATTN_HDIMS=\"", FLASH_ATTN_BUILD_HDIMS, "\"); rebuild to include it");
  return kernel_hd;
}

flash::Strided4d strided(const at::Tensor& t) {
  return {t.data_ptr(), t.stride(0), t.stride(1), t.stride(2)};
}

flash::FwdParams fwd_params(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                            const at::Tensor& lse, double softmax_scale, bool causal) {
  flash::FwdParams p{};
  p.q = strided(q);
  p.k = strided(k);
  p.v = strided(v);
  p.out = strided(out);
  p.lse = lse.data_ptr<float>();
  p.shape = {static_cast<int>(q.size(0)), static_cast<int>(q.size(1)), static_cast<int>(k.size(1)),
             static_cast<int>(q.size(2)), static_cast<int>(k.size(2)), static_cast<int>(q.size(3))};
  p.softmax_scale = static_cast<float>(softmax_scale);
  p.scale_log2 = static_cast<float>(softmax_scale * M_LOG2E);
  p.causal = causal;
  return p;
}

void poison(std::initializer_list<at::Tensor> tensors) {
  if (!poison_outputs.load()) return;
  for (const auto& t : tensors) t.fill_(std::numeric_limits<float>::quiet_NaN());
}

void check_launch(cudaError_t err, const char* pass, at::ScalarType dtype, int headdim) {
  const char* hint = err == cudaErrorInvalidValue ? " (the kernel's shared memory may exceed this GPU's per-block "
                                                    "limit: sm86/sm89 GPUs have 99 KB, the kernels are tuned for "
                                                    "A100/H100)"
                                                  : "";
  TORCH_CHECK(err == cudaSuccess, "flash_attn: ", pass, " kernel launch failed for ", c10::toString(dtype),
              " head dim ", text(headdim), ": ", cudaGetErrorString(err), hint);
}

std::tuple<at::Tensor, at::Tensor> mha_fwd(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                                           double softmax_scale, bool causal) {
  const int kernel_hd = check_attention_inputs(q_in, k_in, v_in, softmax_scale);
  const c10::cuda::CUDAGuard guard(q_in.device());
  const auto q = kernel_ready_copy(q_in), k = kernel_ready_copy(k_in), v = kernel_ready_copy(v_in);
  auto out = at::empty(q.sizes(), q.options());
  auto lse = at::empty({q.size(0), q.size(2), q.size(1)}, q.options().dtype(at::kFloat));
  poison({out, lse});
  if (out.numel() == 0) return {out, lse};
  const auto params = fwd_params(q, k, v, out, lse, softmax_scale, causal);
  check_launch(launch<FwdPass>(q.scalar_type(), kernel_hd, params, at::cuda::getCurrentCUDAStream()), "forward",
               q.scalar_type(), kernel_hd);
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> mha_bwd(const at::Tensor& dout_in, const at::Tensor& q_in,
                                                       const at::Tensor& k_in, const at::Tensor& v_in,
                                                       const at::Tensor& out_in, const at::Tensor& lse,
                                                       double softmax_scale, bool causal) {
  const int kernel_hd = check_attention_inputs(q_in, k_in, v_in, softmax_scale);
  check_cuda_4d(dout_in, "dout");
  check_cuda_4d(out_in, "out");
  check_same_shape(dout_in, q_in, "dout", "q");
  check_same_shape(out_in, q_in, "out", "q");
  TORCH_CHECK(dout_in.scalar_type() == q_in.scalar_type() && out_in.scalar_type() == q_in.scalar_type(),
              "flash_attn: dout and out must have q's dtype");
  const c10::cuda::CUDAGuard guard(q_in.device());
  const auto q = kernel_ready_copy(q_in), k = kernel_ready_copy(k_in), v = kernel_ready_copy(v_in);
  const auto dout = kernel_ready_copy(dout_in), out = kernel_ready_copy(out_in);
  TORCH_CHECK(lse.is_cuda() && lse.device() == q.device() && lse.scalar_type() == at::kFloat && lse.is_contiguous() &&
                  lse.sizes() == at::IntArrayRef({q.size(0), q.size(2), q.size(1)}),
              "flash_attn: lse must be a contiguous float32 (batch, nheads, seqlen_q) tensor on q's device");
  const int64_t batch = q.size(0), seqlen_q = q.size(1), heads = q.size(2), headdim = q.size(3);
  const int64_t seqlen_k = k.size(1), heads_k = k.size(2);
  const bool expand_kv = heads != heads_k;  // GQA / MQA: one dK/dV slice per query head, summed below
  const auto kv_options = k.options();
  auto dk_slices = expand_kv ? at::empty({batch, seqlen_k, heads, headdim}, kv_options) : at::empty(k.sizes(), kv_options);
  auto dv_slices = expand_kv ? at::empty({batch, seqlen_k, heads, headdim}, kv_options) : at::empty(v.sizes(), kv_options);
  auto dq = at::empty(q.sizes(), q.options());
  poison({dq, dk_slices, dv_slices});
  if (seqlen_q == 0 || seqlen_k == 0) {  // no query, or no key to attend to: every gradient is zero
    dq.zero_();
    dk_slices.zero_();
    dv_slices.zero_();
  } else if (q.numel() > 0) {
    const auto dq_accum =
        at::empty({flash::dq_accum_elements(batch, heads, seqlen_q, kernel_hd)}, q.options().dtype(at::kFloat));
    const auto dsum = at::empty({batch, heads, seqlen_q}, q.options().dtype(at::kFloat));
    flash::BwdParams p{};
    p.fwd = fwd_params(q, k, v, out, lse, softmax_scale, causal);
    p.dout = strided(dout);
    p.dk = strided(dk_slices);
    p.dv = strided(dv_slices);
    p.dq = strided(dq);
    p.dq_accum = dq_accum.data_ptr<float>();
    p.dsum = dsum.data_ptr<float>();
    check_launch(launch<BwdPass>(q.scalar_type(), kernel_hd, p, at::cuda::getCurrentCUDAStream()), "backward",
                 q.scalar_type(), kernel_hd);
  }
  if (!expand_kv) return {dq, dk_slices, dv_slices};
  const int64_t group = heads / heads_k;
  auto dk = dk_slices.view({batch, seqlen_k, heads_k, group, headdim}).sum(3);
  auto dv = dv_slices.view({batch, seqlen_k, heads_k, group, headdim}).sum(3);
  return {dq, dk, dv};
}

std::vector<std::pair<std::string, int64_t>> compiled_configs() {
  std::vector<std::pair<std::string, int64_t>> configs;
#define FLASH_ATTN_LIST(T, D) configs.emplace_back(scalar_type_of<T>() == at::kHalf ? "fp16" : "bf16", (D));
  FLASH_ATTN_FOR_EACH_CONFIG(FLASH_ATTN_LIST)
#undef FLASH_ATTN_LIST
  return configs;
}

}  // namespace

TORCH_LIBRARY_IMPL(flash_attn, CUDA, m) {
  m.impl("fwd", &mha_fwd);
  m.impl("bwd", &mha_bwd);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "CUDA kernels of flash_attn; the ops are torch.ops.flash_attn.fwd / bwd";
  m.def("compiled_configs", &compiled_configs, "(dtype name, head dim) pairs this build has kernels for");
  m.def(
      "set_poison_outputs", [](bool enabled) { return poison_outputs.exchange(enabled); },
      "Test hook: fill op outputs with NaN before the kernels run; returns the previous setting");
}
