// flash_attn::fwd_fp8, the fp8 (e4m3) forward on Hopper with FlashAttention 3's FP8 API (schema in
// flash_attn/ops.py; flash_attn/backend.py sends it the calls it serves and the others to the Triton
// backend's flash_attn::triton_fwd_fp8, which has the same schema): dense float8_e4m3fn q, k, v
// (batch, seqlen, heads, headdim), optional float32 (batch, heads_k) descales; out bfloat16 and lse
// float32. No varlen, softcap or ALiBi here (the op refuses them; the Triton backend has them), no
// dropout and no backward anywhere.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include "op_common.h"

namespace flash_attn_op {
namespace {

constexpr int64_t kFp8RowAlignment = 16;  // elements (bytes): TMA strides are 16-byte multiples

// The smallest compiled fp8 head dim >= headdim, or -1.
int fp8_kernel_headdim(int64_t headdim) {
  int best = -1;
#define FLASH_ATTN_CONSIDER(D) \
  if ((D) >= headdim && (best < 0 || (D) < best)) best = (D);
  FLASH_ATTN_FOR_EACH_FP8_HEADDIM(FLASH_ATTN_CONSIDER)
#undef FLASH_ATTN_CONSIDER
  return best;
}

cudaError_t launch_fp8(int kernel_hd, const flash::FwdParams& params, const flash::Fp8Descales& descales,
                       cudaStream_t stream) {
#define FLASH_ATTN_TRY(D) \
  if ((D) == kernel_hd) return flash::run_fwd_fp8<D>(params, descales, stream);
  FLASH_ATTN_FOR_EACH_FP8_HEADDIM(FLASH_ATTN_TRY)
#undef FLASH_ATTN_TRY
  return cudaErrorInvalidValue;
}

void check_fp8_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  check_qkv_shapes(q, k, v);
  for (const auto* t : {&q, &k, &v})
    TORCH_CHECK(t->scalar_type() == at::kFloat8_e4m3fn, "flash_attn: the fp8 forward takes float8_e4m3fn q, k and v, "
                "got ", c10::toString(t->scalar_type()));
  const int64_t headdim = q.size(3);
  TORCH_CHECK(headdim > 0 && headdim % kFp8RowAlignment == 0 && fp8_kernel_headdim(headdim) > 0,
              "flash_attn: the fp8 forward kernels take head dims that are multiples of 16 up to the largest built "
              "(FLASH_ATTN_HDIMS=\"", FLASH_ATTN_BUILD_HDIMS, "\": 128 and 256 have fp8 kernels), got ",
              text(headdim));
}

// The options this kernel lacks: the Python layer routes such calls to the Triton backend.
void check_fp8_options(const c10::optional<at::Tensor>& cu_seqlens_q, double softmax_scale, int64_t window_left,
                       int64_t window_right, double softcap, const c10::optional<at::Tensor>& alibi_slopes) {
  TORCH_CHECK(!cu_seqlens_q.has_value(), "flash_attn: the CUDA fp8 forward takes dense batches; varlen fp8 runs the "
              "Triton backend (flash_attn::triton_fwd_fp8)");
  TORCH_CHECK(softcap == 0 && !alibi_slopes.has_value(), "flash_attn: the CUDA fp8 forward has no softcap or "
              "alibi_slopes; those run the Triton backend (flash_attn::triton_fwd_fp8)");
  TORCH_CHECK(window_left >= -1 && window_right >= -1, "flash_attn: window_size entries must be >= -1");
  TORCH_CHECK(std::isfinite(softmax_scale) && softmax_scale > 0, "flash_attn: softmax_scale must be positive "
              "and finite, got ", std::to_string(softmax_scale));
}

// A descale as the kernel reads it: float32 (batch, heads_k) contiguous, or null (1).
const float* descale_ptr(const c10::optional<at::Tensor>& descale, at::Tensor& kept, const char* name,
                         const at::Tensor& k) {
  if (!descale.has_value()) return nullptr;
  const auto& d = *descale;
  TORCH_CHECK(d.is_cuda() && d.device() == k.device() && d.scalar_type() == at::kFloat && d.dim() == 2 &&
                  d.size(0) == k.size(0) && d.size(1) == k.size(2),
              "flash_attn: ", name, " must be a float32 (batch, nheads_k) = (", text(k.size(0)), ", ",
              text(k.size(2)), ") tensor on q's device, got ", text(d.sizes()));
  kept = d.contiguous();
  return kept.data_ptr<float>();
}

// `t` itself when TMA can read it (unit last stride, 16-byte strides and start), else a contiguous copy.
at::Tensor tma_ready(const at::Tensor& t) {
  bool ready = (t.size(3) <= 1 || t.stride(3) == 1) && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
  for (int dim = 0; dim < 3; ++dim) ready = ready && (t.size(dim) <= 1 || t.stride(dim) % kFp8RowAlignment == 0);
  return ready ? t : t.contiguous();
}

// V (batch, seqlen_k, heads_k, headdim) -> the fp8 forward's transposed V (flash/fp8_v_order.h), built
// by flash::run_fp8_transposed_v from a 16-byte aligned V (tma_ready).
at::Tensor transposed_permuted_v(const at::Tensor& v_in) {
  const auto v = tma_ready(v_in);
  const int64_t batch = v.size(0), seqlen_k = v.size(1), heads_k = v.size(2), headdim = v.size(3);
  auto out = at::empty({batch, heads_k, headdim, flash::fp8_transposed_v_keys(seqlen_k)}, v.options());
  const cudaError_t err = flash::run_fp8_transposed_v(
      static_cast<const uint8_t*>(v.data_ptr()), v.stride(0), v.stride(1), v.stride(2), static_cast<int>(batch),
      static_cast<int>(seqlen_k), static_cast<int>(heads_k), static_cast<int>(headdim),
      static_cast<uint8_t*>(out.data_ptr()), at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "flash_attn: the fp8 forward's V layout kernel failed: ", cudaGetErrorString(err));
  return out;
}

flash::FwdParams fp8_params(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v_transposed,
                            const at::Tensor& out, const at::Tensor& lse, double softmax_scale, int64_t window_left,
                            int64_t window_right) {
  flash::FwdParams p{};
  p.q = strided(q);
  p.k = strided(k);
  // rows of the transposed V are its head-dim rows: (batch, row, head) strides
  p.v = {v_transposed.data_ptr(), v_transposed.stride(0), v_transposed.stride(2), v_transposed.stride(1)};
  p.out = strided(out);
  p.lse = lse.data_ptr<float>();
  p.shape = {static_cast<int>(q.size(0)), static_cast<int>(q.size(1)), static_cast<int>(k.size(1)),
             static_cast<int>(q.size(2)), static_cast<int>(k.size(2)), static_cast<int>(q.size(3))};
  p.lse_head_stride = q.size(1);
  p.window = {static_cast<int>(window_left), static_cast<int>(window_right)};
  p.causal = window_right == 0;
  p.softmax_scale = static_cast<float>(softmax_scale);
  p.logit_scale = p.softmax_scale;
  p.logit_scale_log2 = static_cast<float>(softmax_scale * M_LOG2E);
  p.dropout.keep_prob = 1.f;
  return p;
}

void check_fp8_launch(cudaError_t err, int kernel_hd) {
  TORCH_CHECK(err != cudaErrorNotSupported, "flash_attn: the CUDA fp8 forward needs an sm_90a GPU (H100, H200) and a "
              "build for it (FLASH_ATTN_CUDA_ARCHS with 90), and FLASH_ATTN_DISABLE_SM90 unset");
  TORCH_CHECK(err == cudaSuccess, "flash_attn: fp8 forward kernel launch failed for head dim ", text(kernel_hd), ": ",
              cudaGetErrorString(err));
}

std::tuple<at::Tensor, at::Tensor> mha_fwd_fp8(
    const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in, const c10::optional<at::Tensor>& q_descale,
    const c10::optional<at::Tensor>& k_descale, const c10::optional<at::Tensor>& v_descale,
    const c10::optional<at::Tensor>& cu_seqlens_q, const c10::optional<at::Tensor>& /*cu_seqlens_k*/,
    int64_t /*max_seqlen_q*/, int64_t /*max_seqlen_k*/, double softmax_scale, int64_t window_left,
    int64_t window_right, double softcap, const c10::optional<at::Tensor>& alibi_slopes) {
  check_fp8_options(cu_seqlens_q, softmax_scale, window_left, window_right, softcap, alibi_slopes);
  check_fp8_inputs(q_in, k_in, v_in);
  const c10::cuda::CUDAGuard guard(q_in.device());
  at::Tensor kept[3];
  const flash::Fp8Descales descales{descale_ptr(q_descale, kept[0], "q_descale", k_in),
                                    descale_ptr(k_descale, kept[1], "k_descale", k_in),
                                    descale_ptr(v_descale, kept[2], "v_descale", k_in)};
  const auto q = tma_ready(q_in), k = tma_ready(k_in);
  auto out = at::empty(q.sizes(), q.options().dtype(at::kBFloat16));
  auto lse = at::empty({q.size(0), q.size(2), q.size(1)}, q.options().dtype(at::kFloat));
  poison({out, lse});
  if (out.numel() == 0) return {out, lse};
  if (k.size(1) == 0) {  // no key for any query: FlashAttention's zeros and lse +inf
    out.zero_();
    lse.fill_(std::numeric_limits<float>::infinity());
    return {out, lse};
  }
  const auto v_transposed = transposed_permuted_v(v_in);
  const int kernel_hd = fp8_kernel_headdim(q.size(3));
  const auto params = fp8_params(q, k, v_transposed, out, lse, softmax_scale, window_left, window_right);
  check_fp8_launch(launch_fp8(kernel_hd, params, descales, at::cuda::getCurrentCUDAStream()), kernel_hd);
  return {out, lse};
}

}  // namespace

// The compiled fp8 forward head dims whose kernel runs on `device` (for backend.py's routing).
std::vector<int64_t> fp8_forward_headdims(int64_t device) {
  std::vector<int64_t> usable_headdims;
#define FLASH_ATTN_ASK(D)                                                              \
  {                                                                                    \
    bool usable = false;                                                               \
    if (flash::can_run_fwd_fp8<D>(static_cast<int>(device), usable) == cudaSuccess && usable) \
      usable_headdims.push_back(D);                                                    \
  }
  FLASH_ATTN_FOR_EACH_FP8_HEADDIM(FLASH_ATTN_ASK)
#undef FLASH_ATTN_ASK
  return usable_headdims;
}

}  // namespace flash_attn_op

TORCH_LIBRARY_IMPL(flash_attn, CUDA, m) { m.impl("fwd_fp8", &flash_attn_op::mha_fwd_fp8); }
