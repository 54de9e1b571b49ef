"""Which implementation serves a call: the Triton backend (flash_attn/triton) where
flash_attn/triton/ops.py chooses it (FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE, or float32 CUDA
tensors), else the op that dispatches to the CUDA kernels or, for CPU tensors, the reference.
float8_e4m3fn inputs run the CUDA fp8 forward (flash_attn::fwd_fp8) where it serves the call (a
Hopper GPU, dense, no softcap or ALiBi, a built head dim) and the switch is off, else the Triton
backend's fp8 forward."""

import functools

import os

import torch

from . import ops  # noqa: F401 - importing it defines torch.ops.flash_attn.fwd / fwd_kvcache

try:  # the Triton backend and its ops, where triton is installed
    from .triton import ops as triton_ops
except ImportError:
    triton_ops = None


def op_for(q, name):
    """torch.ops.flash_attn.<name>.default, or its Triton twin triton_<name> where the backend serves q
    (for "fwd" triton_ops.forward, which runs the op through a cheaper autograd path when eager)."""
    if triton_ops is not None and triton_ops.uses_triton(q):
        return triton_ops.forward if name == "fwd" else getattr(torch.ops.flash_attn, f"triton_{name}").default
    if triton_ops is None and os.environ.get("FLASH_ATTENTION_TRITON_AMD_ENABLE", "").upper() == "TRUE":
        raise RuntimeError("flash_attn: FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE needs triton, which is not installed")
    if q.is_cuda and q.dtype == torch.float32:
        raise TypeError("flash_attn: float32 CUDA tensors run the Triton backend, and triton is not installed; "
                        "use float16 or bfloat16, or install triton")
    return getattr(torch.ops.flash_attn, name).default


@functools.lru_cache(maxsize=None)
def _query_cuda_fp8_headdims(device_index):
    return ops.fp8_forward_headdims(device_index)


@torch.compiler.assume_constant_result  # a fact of the build and the GPU: torch.compile bakes the choice in
def _cuda_fp8_headdims(device_index):
    return _query_cuda_fp8_headdims(device_index)


def _cuda_fp8_serves(q, varlen, softcap, alibi_slopes):
    """Whether flash_attn::fwd_fp8 takes this call: a CUDA tensor on a GPU its kernel runs on, a head
    dim (a multiple of 16) up to a built one, dense, no softcap or ALiBi, and not the Triton switch."""
    if not q.is_cuda or varlen or softcap > 0 or alibi_slopes is not None:
        return False
    if os.environ.get("FLASH_ATTENTION_TRITON_AMD_ENABLE", "").upper() == "TRUE":
        return False
    headdims = _cuda_fp8_headdims(q.device.index if q.device.index is not None else torch.cuda.current_device())
    return q.shape[-1] % 16 == 0 and any(q.shape[-1] <= d for d in headdims)


def fp8_forward_op(q, varlen=False, softcap=0.0, alibi_slopes=None):
    """torch.ops.flash_attn.fwd_fp8.default where it serves the call, else
    torch.ops.flash_attn.triton_fwd_fp8.default, or an error saying why neither can serve q (the
    16-bit CUDA kernels and the CPU path have no fp8)."""
    if _cuda_fp8_serves(q, varlen, softcap, alibi_slopes):
        return torch.ops.flash_attn.fwd_fp8.default
    if triton_ops is None:
        raise TypeError("flash_attn: float8_e4m3fn inputs run the Triton backend, and triton is not installed")
    if not triton_ops.runs_on(q):
        raise TypeError("flash_attn: float8_e4m3fn inputs run the Triton backend, which needs GPU tensors "
                        "(or, for CPU tensors, Triton's interpreter: TRITON_INTERPRET=1)")
    return torch.ops.flash_attn.triton_fwd_fp8.default
