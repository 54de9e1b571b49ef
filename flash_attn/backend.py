"""Which implementation serves a call: the Triton backend (flash_attn/triton) where
flash_attn/triton/ops.py chooses it (FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE, or float32 CUDA
tensors), else the op that dispatches to the CUDA kernels or, for CPU tensors, the reference."""

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
