"""torch.library custom ops behind the public API.

    flash_attn::fwd(q, k, v, cu_seqlens_q?, cu_seqlens_k?, max_seqlen_q, max_seqlen_k, dropout_p,
                    softmax_scale, window_left, window_right, softcap, alibi_slopes?, deterministic)
        -> (out, lse, rng_state)
    flash_attn::bwd(dout, q, k, v, out, lse, cu_seqlens_q?, cu_seqlens_k?, max_seqlen_q, max_seqlen_k,
                    dropout_p, softmax_scale, window_left, window_right, softcap, alibi_slopes?,
                    rng_state, deterministic) -> (dq, dk, dv)
    flash_attn::dropout_keep_mask(rng_state, batch, heads, seqlen_q, seqlen_k, dropout_p) -> keep
    flash_attn::fwd_kvcache(q, k_cache!, v_cache!, k?, v?, rotary_cos?, rotary_sin?, cache_seqlens,
                            cache_batch_idx?, cache_leftpad?, block_table?, softmax_scale, window_left,
                            window_right, softcap, rotary_interleaved, alibi_slopes?, num_splits) -> (out, lse)
    flash_attn::fwd_fp8(q, k, v, q_descale?, k_descale?, v_descale?, cu_seqlens_q?, cu_seqlens_k?,
                        max_seqlen_q, max_seqlen_k, softmax_scale, window_left, window_right, softcap,
                        alibi_slopes?) -> (out, lse)
        the fp8 forward on Hopper (csrc/torch/ops_fp8.cpp): dense batches, no softcap or ALiBi (the
        Triton backend's flash_attn::triton_fwd_fp8, same schema, serves those); no backward

The schemas are defined here, once, whether or not the CUDA extension was built. The CUDA kernels
are registered by the extension (`flash_attn._C`, csrc/torch/ops.cpp) for the CUDA dispatch key;
CPU tensors run the chunked fp32 reference (the slow path). Fake kernels make the ops traceable by
torch.compile, and the autograd formula below makes fwd differentiable through bwd. For CUDA tensors
the extension registers the same formula in C++ (csrc/torch/autograd.cpp, AutogradCUDA key), which
the dispatcher prefers to this one (Autograd alias key): the Python formula cost more host time per
call than small problems spend on the GPU.

Shapes: dense q (b, sq, h, d), k/v (b, sk, hk, d); varlen (cu_seqlens given) q (total_q, h, d),
k/v (total_k, hk, d). d is a multiple of 8 (the public functions pad). out is contiguous like q;
lse is float32 (b, h, sq) dense, (h, total_q) varlen; rng_state is the (2,) int64 [seed, offset]
the dropout used (zeros without dropout), which the backward and dropout_keep_mask take back.
window_left / window_right are already normalized (-1 unbounded; causal is window_right == 0).
deterministic is read only by the backward (it rides on fwd so that autograd sees it).

fwd_kvcache (flash_attn_with_kvcache, reference_kvcache.py for its semantics) writes the new k / v
into k_cache / v_cache in place, which its schema declares (Tensor(a!)), so torch.compile
functionalizes it; cache_seqlens is always an int32 (batch,) tensor; head dims are multiples of 8.
"""

import importlib.util

import torch

from . import reference, reference_kvcache

# The schemas of fwd and bwd, shared with the Triton backend's pair (flash_attn/triton/ops.py).
FWD_SCHEMA = (
    "(Tensor q, Tensor k, Tensor v, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, int max_seqlen_q, "
    "int max_seqlen_k, float dropout_p, float softmax_scale, int window_left, int window_right, float softcap, "
    "Tensor? alibi_slopes, bool deterministic) -> (Tensor, Tensor, Tensor)"
)
BWD_SCHEMA = (
    "(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor? cu_seqlens_q, "
    "Tensor? cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, float dropout_p, float softmax_scale, "
    "int window_left, int window_right, float softcap, Tensor? alibi_slopes, Tensor rng_state, "
    "bool deterministic) -> (Tensor, Tensor, Tensor)"
)
torch.library.define("flash_attn::fwd", FWD_SCHEMA)
torch.library.define("flash_attn::bwd", BWD_SCHEMA)
torch.library.define(
    "flash_attn::dropout_keep_mask",
    "(Tensor rng_state, int batch, int heads, int seqlen_q, int seqlen_k, float dropout_p) -> Tensor",
)

# fwd_kvcache's, shared with the Triton backend's flash_attn::triton_fwd_kvcache.
FWD_KVCACHE_SCHEMA = (
    "(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor? k, Tensor? v, Tensor? rotary_cos, "
    "Tensor? rotary_sin, Tensor cache_seqlens, Tensor? cache_batch_idx, Tensor? cache_leftpad, Tensor? block_table, "
    "float softmax_scale, int window_left, int window_right, float softcap, bool rotary_interleaved, "
    "Tensor? alibi_slopes, int num_splits) -> (Tensor, Tensor)"
)
torch.library.define("flash_attn::fwd_kvcache", FWD_KVCACHE_SCHEMA)

# The fp8 forward's (FlashAttention 3's FP8 API), shared with the Triton backend's
# flash_attn::triton_fwd_fp8: float8_e4m3fn q, k, v, float32 (batch, nheads_k) descales; out bfloat16.
FWD_FP8_SCHEMA = (
    "(Tensor q, Tensor k, Tensor v, Tensor? q_descale, Tensor? k_descale, Tensor? v_descale, Tensor? cu_seqlens_q, "
    "Tensor? cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, float softmax_scale, int window_left, "
    "int window_right, float softcap, Tensor? alibi_slopes) -> (Tensor, Tensor)"
)
torch.library.define("flash_attn::fwd_fp8", FWD_FP8_SCHEMA)

try:  # registers the CUDA implementations of the ops above
    from . import _C as _cuda_extension
except ImportError as exc:  # built without CUDA (CPU machine) or not built at all
    _cuda_extension = None
    _cuda_import_error = exc
else:
    _cuda_import_error = None


def has_cuda_kernels():
    """True when the CUDA extension is built and loaded."""
    return _cuda_extension is not None


def cuda_kernels_unavailable_reason():
    if _cuda_extension is not None:
        return None
    if importlib.util.find_spec("flash_attn._C") is None:
        return ("flash_attn._C is not built: this install has no GPU extension (a CPU-only torch, "
                "FLASH_ATTN_SKIP_CUDA_BUILD=1, or no nvcc at build time; see README, Set up and run)")
    return f"flash_attn._C could not be imported: {_cuda_import_error}"


def compiled_configs():
    """Set of (dtype, headdim) pairs the CUDA extension was built with; empty without it."""
    if _cuda_extension is None:
        return set()
    names = {"fp16": torch.float16, "bf16": torch.bfloat16}
    return {(names[dtype], hdim) for dtype, hdim in _cuda_extension.compiled_configs()}


def compiled_features():
    """{feature: compiled} of the CUDA build (FLASH_ATTN_DISABLE_* flags); empty without it."""
    return {} if _cuda_extension is None else dict(_cuda_extension.compiled_features())


def fp8_forward_headdims(device_index):
    """Head dims of the CUDA fp8 forward (flash_attn::fwd_fp8) whose kernel runs on that CUDA device
    (an sm_90a GPU with a build for it); empty without the extension."""
    if _cuda_extension is None:
        return ()
    return tuple(_cuda_extension.fp8_forward_headdims(device_index))


def set_poison_outputs(enabled):
    """Test hook: when enabled, the CUDA ops fill every output (out, lse, dq, dk, dv) with NaN before
    the kernels run, so an element a kernel fails to write shows up as NaN. Returns the old setting."""
    if _cuda_extension is None:
        raise RuntimeError(cuda_kernels_unavailable_reason())
    return _cuda_extension.set_poison_outputs(bool(enabled))


def _cpu_rng_state(dropout_p):
    """[seed, offset] for a CPU forward: a seed drawn from torch's default (CPU) generator, so
    torch.manual_seed reproduces the run; zeros without dropout, as the CUDA op records."""
    if dropout_p <= 0:
        return torch.zeros(2, dtype=torch.int64)
    seed = torch.randint(0, 2**62, (1,), dtype=torch.int64)
    return torch.cat([seed, torch.zeros(1, dtype=torch.int64)])


def _score_options(dropout_p, window_left, window_right, softcap, alibi_slopes, rng_state):
    return reference.ScoreOptions(window=(window_left, window_right), softcap=softcap, alibi_slopes=alibi_slopes,
                                  dropout_p=dropout_p, rng_state=rng_state)


@torch.library.impl("flash_attn::fwd", "CPU")
def _fwd_cpu(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
             window_left, window_right, softcap, alibi_slopes, deterministic):
    rng_state = _cpu_rng_state(dropout_p)
    options = _score_options(dropout_p, window_left, window_right, softcap, alibi_slopes, rng_state)
    out, lse = reference.forward_any_layout(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale, options)
    return out, lse, rng_state


@torch.library.impl("flash_attn::bwd", "CPU")
def _bwd_cpu(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
             softmax_scale, window_left, window_right, softcap, alibi_slopes, rng_state, deterministic):
    options = _score_options(dropout_p, window_left, window_right, softcap, alibi_slopes, rng_state)
    return reference.backward_any_layout(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, softmax_scale,
                                         options)


@torch.library.impl("flash_attn::dropout_keep_mask", "CPU")
def _dropout_keep_mask_cpu(rng_state, batch, heads, seqlen_q, seqlen_k, dropout_p):
    from . import dropout

    seed, offset = (int(x) for x in rng_state.tolist())
    return dropout.keep_mask(seed, offset, batch, heads, seqlen_q, seqlen_k, dropout_p)


@torch.library.impl("flash_attn::fwd_kvcache", "CPU")
def _fwd_kvcache_cpu(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                     cache_leftpad, block_table, softmax_scale, window_left, window_right, softcap, rotary_interleaved,
                     alibi_slopes, num_splits):
    return reference_kvcache.forward_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                                             cache_batch_idx, cache_leftpad, block_table, softmax_scale,
                                             (window_left, window_right), softcap, rotary_interleaved, alibi_slopes)


@torch.library.register_fake("flash_attn::fwd_kvcache")
def fwd_kvcache_fake(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                      cache_leftpad, block_table, softmax_scale, window_left, window_right, softcap,
                      rotary_interleaved, alibi_slopes, num_splits):
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32, device=q.device)
    return out, lse


def _lse_shape(q, cu_seqlens_q):
    if cu_seqlens_q is not None:  # (total_q, h, d) -> (h, total_q)
        return (q.shape[1], q.shape[0])
    return (q.shape[0], q.shape[2], q.shape[1])


@torch.library.register_fake("flash_attn::fwd")
def fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
              window_left, window_right, softcap, alibi_slopes, deterministic):
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(_lse_shape(q, cu_seqlens_q), dtype=torch.float32, device=q.device)
    rng_state = torch.empty((2,), dtype=torch.int64, device=q.device)
    return out, lse, rng_state


@torch.library.register_fake("flash_attn::bwd")
def bwd_fake(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
              softmax_scale, window_left, window_right, softcap, alibi_slopes, rng_state, deterministic):
    return (
        torch.empty(q.shape, dtype=q.dtype, device=q.device),
        torch.empty(k.shape, dtype=k.dtype, device=k.device),
        torch.empty(v.shape, dtype=v.dtype, device=v.device),
    )


FP8_OUT_DTYPE = torch.bfloat16  # FlashAttention 3's output dtype for fp8 inputs


@torch.library.register_fake("flash_attn::fwd_fp8")
def fwd_fp8_fake(q, k, v, q_descale, k_descale, v_descale, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                 softmax_scale, window_left, window_right, softcap, alibi_slopes):
    out = torch.empty(q.shape, dtype=FP8_OUT_DTYPE, device=q.device)
    return out, torch.empty(_lse_shape(q, cu_seqlens_q), dtype=torch.float32, device=q.device)


FP8_BACKWARD_ERROR = ("flash_attn: the float8_e4m3fn forward has no backward (FlashAttention 3 has no fp8 backward "
                      "either); train with float16 or bfloat16 inputs")


def fp8_backward(ctx, *grads):
    raise NotImplementedError(FP8_BACKWARD_ERROR)


torch.library.register_autograd("flash_attn::fwd_fp8", fp8_backward, setup_context=lambda ctx, inputs, output: None)


@torch.library.register_fake("flash_attn::dropout_keep_mask")
def _dropout_keep_mask_fake(rng_state, batch, heads, seqlen_q, seqlen_k, dropout_p):
    return torch.empty((batch, heads, seqlen_q, seqlen_k), dtype=torch.bool, device=rng_state.device)


# Inputs of fwd after q, k, v that the backward needs again, by name, in schema order.
_FWD_OPTION_NAMES = ("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k", "dropout_p", "softmax_scale",
                     "window_left", "window_right", "softcap", "alibi_slopes", "deterministic")


def fwd_setup_context(ctx, inputs, output):
    q, k, v = inputs[:3]
    options = dict(zip(_FWD_OPTION_NAMES, inputs[3:]))
    out, lse, rng_state = output
    # No gradient flows through lse (as in FlashAttention 2); without this, autograd would allocate
    # a zero dlse (batch x nheads x seqlen_q float32) for every backward.
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(q, k, v, out, lse, rng_state, options.pop("cu_seqlens_q"), options.pop("cu_seqlens_k"),
                          options.pop("alibi_slopes"))
    ctx.options = options


def backward_through(bwd_op):
    """The autograd formula of a forward op with fwd's schema, whose backward op (bwd's schema) is
    bwd_op: this file's fwd / bwd, and the Triton backend's pair (flash_attn/triton/ops.py)."""
    def backward(ctx, dout, _dlse, _drng_state):
        q, k, v, out, lse, rng_state, cu_seqlens_q, cu_seqlens_k, alibi_slopes = ctx.saved_tensors
        no_grads = (None,) * len(_FWD_OPTION_NAMES)
        if dout is None:  # the loss depends on lse alone: zero gradients, as FlashAttention 2 gives
            return (torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)) + no_grads
        o = ctx.options
        dq, dk, dv = bwd_op(
            dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, o["max_seqlen_q"], o["max_seqlen_k"],
            o["dropout_p"], o["softmax_scale"], o["window_left"], o["window_right"], o["softcap"], alibi_slopes,
            rng_state, o["deterministic"])
        return (dq, dk, dv) + no_grads

    return backward


# Serves every device without an autograd kernel of its own: CUDA has one in C++ when the extension
# is built (csrc/torch/autograd.cpp, which must keep these semantics).
torch.library.register_autograd("flash_attn::fwd", backward_through(torch.ops.flash_attn.bwd),
                                setup_context=fwd_setup_context)
