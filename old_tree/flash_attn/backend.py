"""Which implementation serves a call: the Triton backend (flash_attn/triton) where
flash_attn/triton/ops.py chooses it (FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE, or float32 CUDA
tensors), else the op that dispatches to the CUDA kernels or, for CPU tensors, the reference.
float8_e4m3fn inputs have one implementation, the Triton backend's fp8 forward."""

import os

import torch

from . import ops  # noqa: F401 - importing it defines torch.ops.flash_attn.fwd / fwd_kvcache

try:  # the Triton backend and its ops, where triton is installed
    from .triton import ops as triton_ops
except ImportError:
    triton_ops = None


def op_for(q, name):
    """torch.ops.flash_attn.<name>.default, or its Triton twin triton_<name> where the backend serves q."""
    if triton_ops is not None and triton_ops.uses_triton(q):
        return getattr(torch.ops.flash_attn, f"triton_{name}").default
    if triton_ops is None and os.environ.get("FLASH_ATTENTION_TRITON_AMD_ENABLE", "").upper() == "TRUE":
        raise RuntimeError("flash_attn: FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE needs triton, which is not installed")
    if q.is_cuda and q.dtype == torch.float32:
        raise TypeError("flash_attn: float32 CUDA tensors run the Triton backend, and triton is not installed; "
                        "use float16 or bfloat16, or install triton")
    return getattr(torch.ops.flash_attn, name).default


def fp8_forward_op(q):
    """torch.ops.flash_attn.triton_fwd_fp8.default, or an error saying why it cannot serve q: the CUDA
    kernels take float16 / bfloat16 only, and the CPU path has no fp8 either."""
    if triton_ops is None:
        raise TypeError("flash_attn: float8_e4m3fn inputs run the Triton backend, and triton is not installed")
    if not triton_ops.runs_on(q):
        raise TypeError("flash_attn: float8_e4m3fn inputs run the Triton backend, which needs GPU tensors "
                        "(or, for CPU tensors, Triton's interpreter: TRITON_INTERPRET=1)")
    return torch.ops.flash_attn.triton_fwd_fp8.default
