// Autograd of flash_attn::fwd for CUDA tensors, in C++. The Python formula (register_autograd in
// flash_attn/ops.py) cost more host time per call than small problems spend on the GPU
// (benchmarks/NOTES.md). The dispatcher prefers a kernel registered directly to AutogradCUDA over
// one registered to the Autograd alias key, so CUDA tensors come here while CPU tensors keep the
// Python formula.
//
// Semantics are the Python formula's: only q, k and v get gradients. lse stays differentiable but
// its gradient is ignored, so a loss of lse alone gives zero gradients (as FlashAttention 2 does);
// rng_state is int64, which autograd never differentiates. Both passes go through the dispatcher,
// so tracing (make_fx, AOTAutograd) records flash_attn::fwd and flash_attn::bwd.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <tuple>

namespace {

using at::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using OptionalTensor = std::optional<Tensor>;
using ThreeTensors = std::tuple<Tensor, Tensor, Tensor>;

// The C++ signatures the CUDA kernels are registered with (csrc/torch/ops.cpp); the dispatcher
// rejects a typed handle or a kernel whose signature differs from theirs.
using FwdSignature = ThreeTensors(const Tensor& q, const Tensor& k, const Tensor& v, const OptionalTensor& cu_seqlens_q,
                                  const OptionalTensor& cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
                                  double dropout_p, double softmax_scale, int64_t window_left, int64_t window_right,
                                  double softcap, const OptionalTensor& alibi_slopes, bool deterministic);
using BwdSignature = ThreeTensors(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& out, const Tensor& lse, const OptionalTensor& cu_seqlens_q,
                                  const OptionalTensor& cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
                                  double dropout_p, double softmax_scale, int64_t window_left, int64_t window_right,
                                  double softcap, const OptionalTensor& alibi_slopes, const Tensor& rng_state,
                                  bool deterministic);

// Looked up on first use rather than at load time: the schemas are defined from Python
// (flash_attn/ops.py), and a name lookup per call would cost a hash of the name.
const c10::TypedOperatorHandle<FwdSignature>& fwd_op() {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("flash_attn::fwd", "").typed<FwdSignature>();
  return op;
}

const c10::TypedOperatorHandle<BwdSignature>& bwd_op() {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("flash_attn::bwd", "").typed<BwdSignature>();
  return op;
}

// The non-tensor arguments of fwd that bwd takes again.
struct ScalarOptions {
  int64_t max_seqlen_q, max_seqlen_k;
  double dropout_p, softmax_scale;
  int64_t window_left, window_right;
  double softcap;
  bool deterministic;
};

void save_options(AutogradContext* ctx, const ScalarOptions& o) {
  auto& data = ctx->saved_data;
  data["max_seqlen_q"] = o.max_seqlen_q;
  data["max_seqlen_k"] = o.max_seqlen_k;
  data["dropout_p"] = o.dropout_p;
  data["softmax_scale"] = o.softmax_scale;
  data["window_left"] = o.window_left;
  data["window_right"] = o.window_right;
  data["softcap"] = o.softcap;
  data["deterministic"] = o.deterministic;
}

ScalarOptions load_options(const AutogradContext* ctx) {
  const auto& data = ctx->saved_data;
  return {data.at("max_seqlen_q").toInt(),  data.at("max_seqlen_k").toInt(),  data.at("dropout_p").toDouble(),
          data.at("softmax_scale").toDouble(), data.at("window_left").toInt(), data.at("window_right").toInt(),
          data.at("softcap").toDouble(),   data.at("deterministic").toBool()};
}

// Saved tensors, in save_for_backward order. An absent optional is saved as an undefined tensor.
enum Saved { kQ, kK, kV, kOut, kLse, kRngState, kCuSeqlensQ, kCuSeqlensK, kAlibiSlopes };

// Back to an optional for bwd: the kernels tell varlen from dense by has_value(), so an undefined
// tensor must become nullopt, not an optional holding it.
OptionalTensor as_optional(const Tensor& t) { return t.defined() ? OptionalTensor(t) : std::nullopt; }

// Runs fwd below the autograd keys: on the CUDA kernel, or on the fake / functional kernels when
// tracing.
ThreeTensors fwd_below_autograd(const Tensor& q, const Tensor& k, const Tensor& v, const OptionalTensor& cu_seqlens_q,
                                const OptionalTensor& cu_seqlens_k, const ScalarOptions& o,
                                const OptionalTensor& alibi_slopes) {
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  return fwd_op().call(q, k, v, cu_seqlens_q, cu_seqlens_k, o.max_seqlen_q, o.max_seqlen_k, o.dropout_p,
                       o.softmax_scale, o.window_left, o.window_right, o.softcap, alibi_slopes, o.deterministic);
}

class FlashAttnFunction : public torch::autograd::Function<FlashAttnFunction> {
 public:
  // One gradient slot per argument of apply: q, k, v, cu_seqlens_q, cu_seqlens_k, options, alibi_slopes.
  static constexpr size_t kNumInputs = 7;

  static variable_list forward(AutogradContext* ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                               const OptionalTensor& cu_seqlens_q, const OptionalTensor& cu_seqlens_k,
                               const ScalarOptions& options, const OptionalTensor& alibi_slopes) {
    auto [out, lse, rng_state] = fwd_below_autograd(q, k, v, cu_seqlens_q, cu_seqlens_k, options, alibi_slopes);
    // lse and rng_state get no gradient; materializing one would allocate a zero dlse per backward.
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({q, k, v, out, lse, rng_state, cu_seqlens_q.value_or(Tensor()),
                            cu_seqlens_k.value_or(Tensor()), alibi_slopes.value_or(Tensor())});
    save_options(ctx, options);
    return {out, lse, rng_state};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Tensor& dout = grads[0];
    variable_list input_grads(kNumInputs);  // undefined: the options get no gradient
    if (!dout.defined()) {  // the loss depends on lse alone: zero gradients, as FlashAttention 2 gives
      input_grads[0] = at::zeros_like(saved[kQ]);
      input_grads[1] = at::zeros_like(saved[kK]);
      input_grads[2] = at::zeros_like(saved[kV]);
      return input_grads;
    }
    const ScalarOptions o = load_options(ctx);
    std::tie(input_grads[0], input_grads[1], input_grads[2]) = bwd_op().call(
        dout, saved[kQ], saved[kK], saved[kV], saved[kOut], saved[kLse], as_optional(saved[kCuSeqlensQ]),
        as_optional(saved[kCuSeqlensK]), o.max_seqlen_q, o.max_seqlen_k, o.dropout_p, o.softmax_scale,
        o.window_left, o.window_right, o.softcap, as_optional(saved[kAlibiSlopes]), saved[kRngState],
        o.deterministic);
    return input_grads;
  }
};

// The AutogradCUDA kernel of flash_attn::fwd; its signature must be FwdSignature.
ThreeTensors fwd_autograd(const Tensor& q, const Tensor& k, const Tensor& v, const OptionalTensor& cu_seqlens_q,
                          const OptionalTensor& cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
                          double dropout_p, double softmax_scale, int64_t window_left, int64_t window_right,
                          double softcap, const OptionalTensor& alibi_slopes, bool deterministic) {
  const ScalarOptions options{max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
                              window_left,  window_right, softcap,   deterministic};
  // Function::apply makes the same test, but only after building a graph node it then drops.
  if (!torch::autograd::compute_requires_grad(q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes)) {
    return fwd_below_autograd(q, k, v, cu_seqlens_q, cu_seqlens_k, options, alibi_slopes);
  }
  const auto outputs = FlashAttnFunction::apply(q, k, v, cu_seqlens_q, cu_seqlens_k, options, alibi_slopes);
  return {outputs[0], outputs[1], outputs[2]};
}

}  // namespace

TORCH_LIBRARY_IMPL(flash_attn, AutogradCUDA, m) { m.impl("fwd", &fwd_autograd); }
