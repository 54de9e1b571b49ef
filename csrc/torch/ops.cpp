// Argument checks, allocation, params, the current stream, and the CUDA implementations of
// flash_attn::fwd / flash_attn::bwd (schemas live in flash_attn/ops.py; their CUDA autograd is in
// autograd.cpp).
// Every check raises RuntimeError (TORCH_CHECK); the public functions validate first and raise
// ValueError / TypeError themselves.
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/PhiloxCudaState.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <torch/extension.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "flash/features.h"
#include "op_common.h"

namespace {

using namespace flash_attn_op;

// Checks shared by fwd and bwd; returns the compiled head dim that serves q's head dim.
int check_attention_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double softmax_scale) {
  check_qkv_shapes(q, k, v);
  check_last_dim_contiguous(q, "q");
  check_last_dim_contiguous(k, "k");
  check_last_dim_contiguous(v, "v");
  const auto dtype = q.scalar_type();
  TORCH_CHECK(dtype == at::kHalf || dtype == at::kBFloat16, "flash_attn: q must be float16 or bfloat16, got ",
              c10::toString(dtype));
  TORCH_CHECK(k.scalar_type() == dtype && v.scalar_type() == dtype, "flash_attn: k and v must have q's dtype ",
              c10::toString(dtype));
  const int64_t headdim = q.size(3);
  TORCH_CHECK(headdim > 0 && headdim <= kMaxHeaddim && headdim % kRowAlignment == 0,
              "flash_attn: head dim must be a multiple of 8 in [8, 256] (the public functions pad), got ",
              text(headdim));
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

// The optional and scalar arguments shared by fwd and bwd, as the op schemas carry them.
struct Options {
  const c10::optional<at::Tensor>& cu_seqlens_q;
  const c10::optional<at::Tensor>& cu_seqlens_k;
  int64_t max_seqlen_q, max_seqlen_k;
  double dropout_p, softmax_scale;
  int64_t window_left, window_right;
  double softcap;
  const c10::optional<at::Tensor>& alibi_slopes;

  bool varlen() const { return cu_seqlens_q.has_value(); }
};

void check_cu_seqlens(const at::Tensor& cu, const char* name, int64_t batch, const at::Tensor& q) {
  TORCH_CHECK(cu.is_cuda() && cu.device() == q.device(), "flash_attn: ", name, " must be on q's device");
  TORCH_CHECK(cu.scalar_type() == at::kInt, "flash_attn: ", name, " must be int32, got ", c10::toString(cu.scalar_type()));
  TORCH_CHECK(cu.dim() == 1 && cu.size(0) == batch + 1 && cu.is_contiguous(), "flash_attn: ", name,
              " must be a contiguous (batch + 1,) tensor, got ", text(cu.sizes()));
}

// Checks of the options against q (4-dim, as the kernels see it); returns the batch size.
int64_t check_options(const Options& o, const at::Tensor& q) {
  check_feature(o.varlen(), flash::kVarlenCompiled, "varlen", "FLASH_ATTN_DISABLE_VARLEN");
  check_feature(o.dropout_p > 0, flash::kDropoutCompiled, "dropout", "FLASH_ATTN_DISABLE_DROPOUT");
  check_feature(o.softcap > 0, flash::kSoftcapCompiled, "softcap", "FLASH_ATTN_DISABLE_SOFTCAP");
  check_feature(o.alibi_slopes.has_value(), flash::kAlibiCompiled, "alibi_slopes", "FLASH_ATTN_DISABLE_ALIBI");
  check_feature(o.window_left >= 0 || o.window_right > 0, flash::kLocalCompiled, "window_size (local attention)",
                "FLASH_ATTN_DISABLE_LOCAL");
  TORCH_CHECK(o.dropout_p >= 0 && o.dropout_p < 1, "flash_attn: dropout_p must be in [0, 1), got ",
              std::to_string(o.dropout_p));
  TORCH_CHECK(o.softcap >= 0 && std::isfinite(o.softcap), "flash_attn: softcap must be >= 0, got ",
              std::to_string(o.softcap));
  TORCH_CHECK(o.window_left >= -1 && o.window_right >= -1, "flash_attn: window_size entries must be >= -1");
  TORCH_CHECK(o.cu_seqlens_q.has_value() == o.cu_seqlens_k.has_value(),
              "flash_attn: cu_seqlens_q and cu_seqlens_k are given together");
  int64_t batch = q.size(0);
  if (o.varlen()) {
    batch = o.cu_seqlens_q->size(0) - 1;
    TORCH_CHECK(batch >= 0, "flash_attn: cu_seqlens_q must have batch + 1 >= 1 entries");
    check_cu_seqlens(*o.cu_seqlens_q, "cu_seqlens_q", batch, q);
    check_cu_seqlens(*o.cu_seqlens_k, "cu_seqlens_k", batch, q);
    TORCH_CHECK(o.max_seqlen_q >= 0 && o.max_seqlen_k >= 0 && o.max_seqlen_q <= std::numeric_limits<int>::max() &&
                    o.max_seqlen_k <= std::numeric_limits<int>::max(),
                "flash_attn: max_seqlen_q and max_seqlen_k must be non-negative ints");
    TORCH_CHECK(batch <= kMaxGridYZ, "flash_attn: batch must be <= ", text(kMaxGridYZ));
  }
  if (o.alibi_slopes.has_value()) {
    const auto& a = *o.alibi_slopes;
    TORCH_CHECK(a.is_cuda() && a.device() == q.device(), "flash_attn: alibi_slopes must be on q's device");
    TORCH_CHECK(a.scalar_type() == at::kFloat, "flash_attn: alibi_slopes must be float32");
    const bool per_head = a.dim() == 1 && a.size(0) == q.size(2);
    const bool per_batch_head = a.dim() == 2 && a.size(0) == batch && a.size(1) == q.size(2);
    TORCH_CHECK((per_head || per_batch_head) && a.stride(-1) == 1, "flash_attn: alibi_slopes must be (nheads,) or "
                "(batch, nheads) with a contiguous last dim, got ", text(a.sizes()));
  }
  return batch;
}

// The kernels' 4-dim view of a q/k/v-like tensor: varlen tensors (total, heads, headdim) become
// (1, total, heads, headdim).
at::Tensor as_4d(const at::Tensor& t, bool varlen) { return varlen ? t.unsqueeze(0) : t; }

// Random bytes below this are kept: round(256 * keep_prob), at most 255 so that the kernels test four
// bytes at once (dropout.cuh); flash_attn/dropout.py's keep_threshold.
uint32_t keep_threshold_of(double dropout_p) {
  return static_cast<uint32_t>(std::min(255.0, std::round((1.0 - dropout_p) * 256.0)));
}

flash::FwdParams fwd_params(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                            const at::Tensor& lse, const Options& o, int64_t batch) {
  flash::FwdParams p{};
  p.q = strided(q);
  p.k = strided(k);
  p.v = strided(v);
  p.out = strided(out);
  p.lse = lse.data_ptr<float>();
  const bool varlen = o.varlen();
  const int64_t seqlen_q = varlen ? o.max_seqlen_q : q.size(1), seqlen_k = varlen ? o.max_seqlen_k : k.size(1);
  p.shape = {static_cast<int>(batch), static_cast<int>(seqlen_q), static_cast<int>(seqlen_k),
             static_cast<int>(q.size(2)), static_cast<int>(k.size(2)), static_cast<int>(q.size(3))};
  p.lse_head_stride = varlen ? q.size(1) : seqlen_q;
  if (varlen) {
    p.varlen = {o.cu_seqlens_q->data_ptr<int>(), o.cu_seqlens_k->data_ptr<int>(), static_cast<int>(q.size(1)),
                static_cast<int>(k.size(1))};
  }
  p.window = {static_cast<int>(o.window_left), static_cast<int>(o.window_right)};
  p.causal = o.window_right == 0;
  p.softmax_scale = static_cast<float>(o.softmax_scale);
  p.score_mod.softcap = static_cast<float>(o.softcap);
  if (o.alibi_slopes.has_value()) {
    p.score_mod.alibi_slopes = o.alibi_slopes->data_ptr<float>();
    p.score_mod.alibi_batch_stride = o.alibi_slopes->dim() == 2 ? o.alibi_slopes->stride(0) : 0;
  }
  p.logit_scale = o.softcap > 0 ? static_cast<float>(o.softcap) : p.softmax_scale;
  p.logit_scale_log2 = static_cast<float>(p.logit_scale * M_LOG2E);
  p.dropout.keep_prob = static_cast<float>(1.0 - o.dropout_p);
  p.dropout.keep_threshold = keep_threshold_of(o.dropout_p);
  return p;
}

// Philox state for a forward with dropout: torch's CUDA generator advanced by the counters the
// kernels use (batch * heads, dropout.cuh), as values or, under graph capture, as pointers.
flash::PhiloxArgs philox_for_forward(int64_t batch, int64_t heads) {
  auto* gen = at::get_generator_or_default<at::CUDAGeneratorImpl>(std::nullopt,
                                                                   at::cuda::detail::getDefaultCUDAGenerator());
  const uint64_t increment = static_cast<uint64_t>((batch * heads + 3) / 4 * 4);  // philox_cuda_state wants x4
  at::PhiloxCudaState state;
  {
    std::lock_guard<std::mutex> lock(gen->mutex_);
    state = gen->philox_cuda_state(increment);
  }
  flash::PhiloxArgs args{};
  if (state.captured_) {
    args.seed_ptr = state.seed_.ptr;
    args.offset_ptr = state.offset_.ptr;
    args.offset_add = state.offset_intragraph_;
  } else {
    args.seed = state.seed_.val;
    args.offset = state.offset_.val;
  }
  return args;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> mha_fwd(
    const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
    const c10::optional<at::Tensor>& cu_seqlens_q, const c10::optional<at::Tensor>& cu_seqlens_k,
    int64_t max_seqlen_q, int64_t max_seqlen_k, double dropout_p, double softmax_scale, int64_t window_left,
    int64_t window_right, double softcap, const c10::optional<at::Tensor>& alibi_slopes,
    bool /*deterministic: read by the backward only*/) {
  const Options o{cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
                  window_left,  window_right, softcap,      alibi_slopes};
  const bool varlen = o.varlen();
  const auto q4 = as_4d(q_in, varlen), k4 = as_4d(k_in, varlen), v4 = as_4d(v_in, varlen);
  const int kernel_hd = check_attention_inputs(q4, k4, v4, softmax_scale);
  const int64_t batch = check_options(o, q4);
  const c10::cuda::CUDAGuard guard(q_in.device());
  const auto q = kernel_ready_copy(q4), k = kernel_ready_copy(k4), v = kernel_ready_copy(v4);
  auto out4 = at::empty(q.sizes(), q.options());
  const int64_t heads = q.size(2);
  auto lse = varlen ? at::empty({heads, q.size(1)}, q.options().dtype(at::kFloat))
                    : at::empty({batch, heads, q.size(1)}, q.options().dtype(at::kFloat));
  auto rng_state = at::empty({2}, q.options().dtype(at::kLong));
  poison({out4, lse});
  auto out = varlen ? out4.squeeze(0) : out4;
  auto params = fwd_params(q, k, v, out4, lse, o, batch);
  if (dropout_p > 0) params.dropout.philox = philox_for_forward(batch, heads);
  params.dropout.rng_state_out = rng_state.data_ptr<int64_t>();
  if (out4.numel() == 0 || batch == 0 || params.shape.seqlen_q == 0) {
    rng_state.zero_();
    return {out, lse, rng_state};
  }
  check_launch(launch<FwdPass>(q.scalar_type(), kernel_hd, params, at::cuda::getCurrentCUDAStream()), "forward",
               q.scalar_type(), kernel_hd);
  return {out, lse, rng_state};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> mha_bwd(
    const at::Tensor& dout_in, const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
    const at::Tensor& out_in, const at::Tensor& lse, const c10::optional<at::Tensor>& cu_seqlens_q,
    const c10::optional<at::Tensor>& cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k, double dropout_p,
    double softmax_scale, int64_t window_left, int64_t window_right, double softcap,
    const c10::optional<at::Tensor>& alibi_slopes, const at::Tensor& rng_state, bool deterministic) {
  const Options o{cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
                  window_left,  window_right, softcap,      alibi_slopes};
  const bool varlen = o.varlen();
  const auto q4 = as_4d(q_in, varlen), k4 = as_4d(k_in, varlen), v4 = as_4d(v_in, varlen);
  const int kernel_hd = check_attention_inputs(q4, k4, v4, softmax_scale);
  const int64_t batch = check_options(o, q4);
  check_same_shape(dout_in, q_in, "dout", "q");
  check_same_shape(out_in, q_in, "out", "q");
  TORCH_CHECK(dout_in.is_cuda() && out_in.is_cuda(), "flash_attn: dout and out must be CUDA tensors");
  TORCH_CHECK(dout_in.scalar_type() == q_in.scalar_type() && out_in.scalar_type() == q_in.scalar_type(),
              "flash_attn: dout and out must have q's dtype");
  const c10::cuda::CUDAGuard guard(q_in.device());
  const auto q = kernel_ready_copy(q4), k = kernel_ready_copy(k4), v = kernel_ready_copy(v4);
  const auto dout = kernel_ready_copy(as_4d(dout_in, varlen)), out = kernel_ready_copy(as_4d(out_in, varlen));
  const int64_t rows_q = q.size(1), heads = q.size(2), headdim = q.size(3);
  const int64_t rows_k = k.size(1), heads_k = k.size(2);
  const auto expected_lse = varlen ? std::vector<int64_t>{heads, rows_q} : std::vector<int64_t>{batch, heads, rows_q};
  TORCH_CHECK(lse.is_cuda() && lse.device() == q.device() && lse.scalar_type() == at::kFloat && lse.is_contiguous() &&
                  lse.sizes() == at::IntArrayRef(expected_lse),
              "flash_attn: lse must be a contiguous float32 ", text(expected_lse), " tensor on q's device, got ",
              text(lse.sizes()));
  TORCH_CHECK(rng_state.is_cuda() && rng_state.device() == q.device() && rng_state.scalar_type() == at::kLong &&
                  rng_state.numel() == 2 && rng_state.is_contiguous(),
              "flash_attn: rng_state must be the forward's (2,) int64 tensor on q's device");
  const bool expand_kv = heads != heads_k;  // GQA / MQA: one dK/dV slice per query head, summed below
  const auto kv_options = k.options();
  const int64_t batch_dim = k.size(0);
  auto dk_slices = at::empty({batch_dim, rows_k, heads, headdim}, kv_options);
  auto dv_slices = at::empty({batch_dim, rows_k, heads, headdim}, kv_options);
  auto dq = at::empty(q.sizes(), q.options());
  poison({dq, dk_slices, dv_slices});
  const int64_t seqlen_q = varlen ? max_seqlen_q : rows_q, seqlen_k = varlen ? max_seqlen_k : rows_k;
  if (varlen) {  // rows outside every sequence get no gradient from the kernels
    dq.zero_();
    dk_slices.zero_();
    dv_slices.zero_();
  }
  if (seqlen_q == 0 || seqlen_k == 0 || batch == 0) {  // no query, or no key to attend to
    dq.zero_();
    dk_slices.zero_();
    dv_slices.zero_();
  } else if (q.numel() > 0) {
    flash::BwdParams p{};
    p.fwd = fwd_params(q, k, v, out, lse, o, batch);
    if (dropout_p > 0) {
      p.fwd.dropout.philox.seed_ptr = rng_state.data_ptr<int64_t>();
      p.fwd.dropout.philox.offset_ptr = rng_state.data_ptr<int64_t>() + 1;
    }
    p.dq_accum_head_rows = flash::dq_accum_rows_per_head(varlen, batch, seqlen_q, rows_q);
    p.dq_slices = deterministic ? flash::dq_slice_count(seqlen_q, seqlen_k,
                                                        flash::staggered_dq_walk(window_left, window_right))
                                : 1;
    p.dq_slice_stride = heads * p.dq_accum_head_rows * flash::dq_accum_columns(kernel_hd);
    const auto dq_accum = at::empty({p.dq_slices * p.dq_slice_stride}, q.options().dtype(at::kFloat));
    const auto dsum = at::empty(lse.sizes(), q.options().dtype(at::kFloat));
    at::Tensor semaphore;
    if (deterministic) {
      semaphore = at::empty({flash::dq_semaphore_count(p.fwd.shape, p.dq_slices)}, q.options().dtype(at::kInt));
      p.dq_semaphore = semaphore.data_ptr<int>();
    }
    p.dout = strided(dout);
    p.dk = strided(dk_slices);
    p.dv = strided(dv_slices);
    p.dq = strided(dq);
    p.dq_accum = dq_accum.data_ptr<float>();
    p.dsum = dsum.data_ptr<float>();
    check_launch(launch<BwdPass>(q.scalar_type(), kernel_hd, p, at::cuda::getCurrentCUDAStream()), "backward",
                 q.scalar_type(), kernel_hd);
  }
  auto dk = dk_slices, dv = dv_slices;
  if (expand_kv) {
    const int64_t group = heads / heads_k;
    dk = dk_slices.view({batch_dim, rows_k, heads_k, group, headdim}).sum(3);
    dv = dv_slices.view({batch_dim, rows_k, heads_k, group, headdim}).sum(3);
  }
  if (varlen) return {dq.squeeze(0), dk.squeeze(0), dv.squeeze(0)};
  return {dq, dk, dv};
}

// Keep mask (batch, nheads, seqlen_q, seqlen_k) of the dropout a forward with this rng_state used.
at::Tensor dropout_keep_mask(const at::Tensor& rng_state, int64_t batch, int64_t heads, int64_t seqlen_q,
                             int64_t seqlen_k, double dropout_p) {
  TORCH_CHECK(rng_state.is_cuda() && rng_state.scalar_type() == at::kLong && rng_state.numel() == 2 &&
                  rng_state.is_contiguous(),
              "flash_attn: rng_state must be a (2,) int64 CUDA tensor");
  TORCH_CHECK(dropout_p >= 0 && dropout_p < 1, "flash_attn: dropout_p must be in [0, 1)");
  const c10::cuda::CUDAGuard guard(rng_state.device());
  auto keep = at::empty({batch, heads, seqlen_q, seqlen_k}, rng_state.options().dtype(at::kBool));
  if (keep.numel() == 0) return keep;
  flash::DropoutArgs args{};
  args.keep_prob = static_cast<float>(1.0 - dropout_p);
  args.keep_threshold = keep_threshold_of(dropout_p);
  args.philox.seed_ptr = rng_state.data_ptr<int64_t>();
  args.philox.offset_ptr = rng_state.data_ptr<int64_t>() + 1;
  const cudaError_t err = flash::run_dropout_keep_mask(args, static_cast<int>(batch), static_cast<int>(heads),
                                                        static_cast<int>(seqlen_q), static_cast<int>(seqlen_k),
                                                        keep.data_ptr<bool>(), at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "flash_attn: dropout mask kernel launch failed: ", cudaGetErrorString(err));
  return keep;
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
  m.impl("dropout_keep_mask", &dropout_keep_mask);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "CUDA kernels of flash_attn; the ops are torch.ops.flash_attn.fwd / bwd";
  m.def("compiled_configs", &compiled_configs, "(dtype name, head dim) pairs this build has kernels for");
  m.def("compiled_features", [] {
    return std::vector<std::pair<std::string, bool>>{{"dropout", flash::kDropoutCompiled},
                                                     {"softcap", flash::kSoftcapCompiled},
                                                     {"alibi", flash::kAlibiCompiled},
                                                     {"local", flash::kLocalCompiled},
                                                     {"varlen", flash::kVarlenCompiled}};
  }, "(feature, compiled) pairs: FLASH_ATTN_DISABLE_* build flags compile features out");
  m.def("fp8_forward_headdims", &fp8_forward_headdims,
        "Head dims of the CUDA fp8 forward (flash_attn::fwd_fp8) that run on the given device index");
  m.def(
      "set_poison_outputs", [](bool enabled) { return poison_outputs.exchange(enabled); },
      "Test hook: fill op outputs with NaN before the kernels run; returns the previous setting");
}
