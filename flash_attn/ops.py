"""torch.library custom ops behind the public API.

    flash_attn::fwd(q, k, v, softmax_scale, causal) -> (out, lse)
    flash_attn::bwd(dout, q, k, v, out, lse, softmax_scale, causal) -> (dq, dk, dv)

The schemas are defined here, once, whether or not the CUDA extension was built. The CUDA
kernels are registered by the extension (`flash_attn._C`, csrc/torch/ops.cpp) for the CUDA
dispatch key; CPU tensors run the chunked fp32 reference (the slow path). Fake kernels make the
ops traceable by torch.compile, and the autograd formula makes fwd differentiable through bwd.

Shapes: q (b, sq, h, d), k/v (b, sk, hk, d), d a multiple of 8 (the public functions pad),
out (b, sq, h, d) contiguous, lse (b, h, sq) float32, dq/dk/dv contiguous like q/k/v. Inputs may
have any strides (the CUDA op copies those its kernels cannot read in place: odd strides, a
misaligned start, or a non-unit last-dim stride of dout), except a non-unit last-dim stride of q,
k or v, which FlashAttention 2 rejects too.
"""

import torch

from . import reference

torch.library.define(
    "flash_attn::fwd",
    "(Tensor q, Tensor k, Tensor v, float softmax_scale, bool causal) -> (Tensor, Tensor)",
)
torch.library.define(
    "flash_attn::bwd",
    "(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, float softmax_scale, "
    "bool causal) -> (Tensor, Tensor, Tensor)",
)

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
    return None if _cuda_extension is not None else f"flash_attn._C could not be imported: {_cuda_import_error}"


def compiled_configs():
    """Set of (dtype, headdim) pairs the CUDA extension was built with; empty without it."""
    if _cuda_extension is None:
        return set()
    names = {"fp16": torch.float16, "bf16": torch.bfloat16}
    return {(names[dtype], hdim) for dtype, hdim in _cuda_extension.compiled_configs()}


def set_poison_outputs(enabled):
    """Test hook: when enabled, the CUDA ops fill every output (out, lse, dq, dk, dv) with NaN before
    the kernels run, so an element a kernel fails to write shows up as NaN. Returns the old setting."""
    if _cuda_extension is None:
        raise RuntimeError(cuda_kernels_unavailable_reason())
    return _cuda_extension.set_poison_outputs(bool(enabled))


@torch.library.impl("flash_attn::fwd", "CPU")
def _fwd_cpu(q, k, v, softmax_scale, causal):
    return reference.attention_forward_chunked(q, k, v, causal, softmax_scale)


@torch.library.impl("flash_attn::bwd", "CPU")
def _bwd_cpu(dout, q, k, v, out, lse, softmax_scale, causal):
    return reference.attention_backward_chunked(dout, q, k, v, out, lse, causal, softmax_scale)


@torch.library.register_fake("flash_attn::fwd")
def _fwd_fake(q, k, v, softmax_scale, causal):
    batch, seqlen_q, nheads, _ = q.shape
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, nheads, seqlen_q), dtype=torch.float32, device=q.device)
    return out, lse


@torch.library.register_fake("flash_attn::bwd")
def _bwd_fake(dout, q, k, v, out, lse, softmax_scale, causal):
    return (
        torch.empty(q.shape, dtype=q.dtype, device=q.device),
        torch.empty(k.shape, dtype=k.dtype, device=k.device),
        torch.empty(v.shape, dtype=v.dtype, device=v.device),
    )


def _fwd_setup_context(ctx, inputs, output):
    q, k, v, softmax_scale, causal = inputs
    out, lse = output
    # No gradient flows through lse (as in FlashAttention 2); without this, autograd would allocate
    # a zero dlse (batch x nheads x seqlen_q float32) for every backward.
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.softmax_scale = softmax_scale
    ctx.causal = causal


def _fwd_backward(ctx, dout, _dlse):
    q, k, v, out, lse = ctx.saved_tensors
    if dout is None:  # the loss depends on lse alone: zero gradients, as FlashAttention 2 gives
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v), None, None
    dq, dk, dv = torch.ops.flash_attn.bwd(dout, q, k, v, out, lse, ctx.softmax_scale, ctx.causal)
    return dq, dk, dv, None, None


torch.library.register_autograd("flash_attn::fwd", _fwd_backward, setup_context=_fwd_setup_context)
