"""Argument checks for the public functions: every problem is reported, naming the argument,
before any kernel runs."""

import functools
import math

import torch

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
MAX_HEADDIM = 256
MIN_CUDA_CAPABILITY = (8, 0)


def check_not_yet_implemented(dropout_p, window_size, softcap, alibi_slopes, deterministic):
    """Arguments of FlashAttention 2's API that this version accepts only at their defaults."""
    if dropout_p != 0.0:
        raise NotImplementedError(f"flash_attn: dropout_p={dropout_p} is not implemented yet; only dropout_p=0.0")
    if tuple(window_size) != (-1, -1):
        raise NotImplementedError(
            f"flash_attn: window_size={tuple(window_size)} (local attention) is not implemented yet; "
            "only window_size=(-1, -1)"
        )
    if softcap != 0.0:
        raise NotImplementedError(f"flash_attn: softcap={softcap} is not implemented yet; only softcap=0.0")
    if alibi_slopes is not None:
        raise NotImplementedError("flash_attn: alibi_slopes is not implemented yet; pass alibi_slopes=None")
    if deterministic:
        raise NotImplementedError(
            "flash_attn: deterministic=True is not implemented yet (the backward adds dq with atomics)"
        )


def check_softmax_scale(softmax_scale):
    """The kernels mask with -inf before scaling, which needs a positive scale."""
    if not (math.isfinite(softmax_scale) and softmax_scale > 0):
        raise ValueError(f"flash_attn: softmax_scale must be a positive finite number, got {softmax_scale}")


def check_packed(name, tensor, rank, packed_dim, packed_size):
    """qkv (b, s, 3, h, d) or kv (b, s, 2, h, d)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"flash_attn: {name} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dim() != rank or tensor.shape[packed_dim] != packed_size:
        raise ValueError(
            f"flash_attn: {name} must have shape (batch, seqlen, {packed_size}, nheads, headdim), "
            f"got {tuple(tensor.shape)}"
        )


def check_qkv(q, k, v):
    """q (b, sq, h, d), k and v (b, sk, hk, d) on one device, one supported dtype, h % hk == 0."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"flash_attn: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(
                f"flash_attn: {name} must have 4 dims (batch, seqlen, nheads, headdim), got shape {tuple(t.shape)}"
            )
    for name, t in (("k", k), ("v", v)):
        if t.device != q.device:
            raise ValueError(f"flash_attn: {name} is on {t.device} but q is on {q.device}; put them on one device")
    if q.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"flash_attn: q has dtype {q.dtype}; supported dtypes are float16 and bfloat16")
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise TypeError(f"flash_attn: {name} has dtype {t.dtype} but q has {q.dtype}; use one dtype")
    batch, _, nheads, headdim = q.shape
    if k.shape != v.shape:
        raise ValueError(f"flash_attn: k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if k.shape[0] != batch:
        raise ValueError(f"flash_attn: k has batch {k.shape[0]} but q has batch {batch}")
    if k.shape[3] != headdim:
        raise ValueError(f"flash_attn: k and v have headdim {k.shape[3]} but q has headdim {headdim}")
    if headdim > MAX_HEADDIM or headdim < 1:
        raise ValueError(f"flash_attn: headdim {headdim} is not supported; it must be between 1 and {MAX_HEADDIM}")
    nheads_k = k.shape[2]
    if nheads_k == 0 or nheads % nheads_k != 0:
        raise ValueError(
            f"flash_attn: nheads of q ({nheads}) must be a multiple of nheads of k/v ({nheads_k})"
        )
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.stride(-1) != 1 and t.shape[-1] > 1:
            raise ValueError(f"flash_attn: {name} must have a contiguous last dimension (stride 1), got {t.stride()}")
    if q.is_cuda and not torch.compiler.is_compiling():
        check_cuda_capability(q.device)


@functools.lru_cache(maxsize=None)
def _cuda_capability(device_index):
    return torch.cuda.get_device_capability(device_index)


def check_cuda_capability(device):
    capability = _cuda_capability(device.index if device.index is not None else torch.cuda.current_device())
    if tuple(capability) < MIN_CUDA_CAPABILITY:
        raise RuntimeError(
            f"flash_attn: q is on a GPU of compute capability {capability[0]}.{capability[1]}; "
            "flash_attn needs sm80 (Ampere) or newer"
        )
