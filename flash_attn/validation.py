"""Argument checks for the public functions: every problem is reported, naming the argument,
before any kernel runs."""

import functools
import math

import torch

from .reference import default_softmax_scale

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)  # the CUDA kernels'
# The attention functions': float32 runs the Triton backend on CUDA (flash_attn/triton) and the
# reference on CPU.
ATTENTION_DTYPES = (torch.float32, *SUPPORTED_DTYPES)
MAX_HEADDIM = 256
MIN_CUDA_CAPABILITY = (8, 0)


def check_options(dropout_p, window_size, softcap, alibi_slopes, deterministic, q, batch):
    """The options of FlashAttention 2's API; alibi_slopes against q's device and (batch, nheads)."""
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)) or not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"flash_attn: dropout_p must be a float in [0, 1), got {dropout_p!r}")
    if (not isinstance(window_size, (tuple, list)) or len(window_size) != 2
            or not all(isinstance(w, int) and not isinstance(w, bool) and w >= -1 for w in window_size)):
        raise ValueError(
            f"flash_attn: window_size must be a pair (left, right) of ints >= -1 (-1: unbounded), got {window_size!r}"
        )
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or not (math.isfinite(softcap)
                                                                                    and softcap >= 0):
        raise ValueError(f"flash_attn: softcap must be a finite float >= 0 (0: off), got {softcap!r}")
    if not isinstance(deterministic, bool):
        raise TypeError(f"flash_attn: deterministic must be a bool, got {type(deterministic).__name__}")
    if alibi_slopes is not None:
        check_alibi_slopes(alibi_slopes, q, batch)


def check_typed_tensor(name, t, dtype, device):
    """t is a tensor of `dtype` on `device` (q's): the first checks of every metadata argument."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"flash_attn: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise TypeError(f"flash_attn: {name} must be {str(dtype).removeprefix('torch.')}, got {t.dtype}")
    if t.device != device:
        raise ValueError(f"flash_attn: {name} is on {t.device} but q is on {device}")


def check_alibi_slopes(alibi_slopes, q, batch):
    nheads = q.shape[-2]
    check_typed_tensor("alibi_slopes", alibi_slopes, torch.float32, q.device)
    if tuple(alibi_slopes.shape) not in ((nheads,), (batch, nheads)):
        raise ValueError(
            f"flash_attn: alibi_slopes must have shape (nheads,) = ({nheads},) or (batch, nheads) = "
            f"({batch}, {nheads}), got {tuple(alibi_slopes.shape)}"
        )


def check_cu_seqlens(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, q):
    """int32 (batch + 1,) offsets on q's device, and non-negative int max lengths."""
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        check_typed_tensor(name, cu, torch.int32, q.device)
        if cu.dim() != 1 or cu.shape[0] < 1:
            raise ValueError(f"flash_attn: {name} must have shape (batch + 1,), got {tuple(cu.shape)}")
    if cu_seqlens_q.shape != cu_seqlens_k.shape:
        raise ValueError(
            f"flash_attn: cu_seqlens_q {tuple(cu_seqlens_q.shape)} and cu_seqlens_k {tuple(cu_seqlens_k.shape)} "
            "must both have batch + 1 entries"
        )
    for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**31:
            raise ValueError(f"flash_attn: {name} must be a non-negative int, got {value!r}")


def check_softmax_scale(softmax_scale):
    """The kernels mask with -inf before scaling, which needs a positive scale."""
    if not (math.isfinite(softmax_scale) and softmax_scale > 0):
        raise ValueError(f"flash_attn: softmax_scale must be a positive finite number, got {softmax_scale}")


def softmax_scale_or_default(softmax_scale, headdim):
    """The user's softmax_scale, checked, or 1 / sqrt(headdim). The default is not checked: it is
    valid, and symbolic when torch.compile has made headdim dynamic (a check would break the graph)."""
    if softmax_scale is None:
        return default_softmax_scale(headdim)
    check_softmax_scale(softmax_scale)
    return softmax_scale


def check_packed(name, tensor, rank, packed_dim, packed_size):
    """qkv (b, s, 3, h, d) or kv (b, s, 2, h, d); varlen (rank 4) qkv (total, 3, h, d), kv (total, 2, h, d)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"flash_attn: {name} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dim() != rank or tensor.shape[packed_dim] != packed_size:
        raise ValueError(
            f"flash_attn: {name} must have shape "
            f"{'(batch, seqlen' if rank == 5 else '(total_tokens'}, {packed_size}, nheads, headdim), "
            f"got {tuple(tensor.shape)}"
        )


def check_tensor(name, t, rank, dims):
    """t is a tensor of `rank` dims, described as `dims` in the error."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"flash_attn: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != rank:
        raise ValueError(f"flash_attn: {name} must have {rank} dims {dims}, got shape {tuple(t.shape)}")


def check_last_dim_contiguous(name, t):
    if t.stride(-1) != 1 and t.shape[-1] > 1:
        raise ValueError(f"flash_attn: {name} must have a contiguous last dimension (stride 1), got {t.stride()}")


def check_like_q(name, t, q):
    """t on q's device, in q's dtype, with a contiguous last dim."""
    if t.device != q.device:
        raise ValueError(f"flash_attn: {name} is on {t.device} but q is on {q.device}; put them on one device")
    if t.dtype != q.dtype:
        raise TypeError(f"flash_attn: {name} has dtype {t.dtype} but q has {q.dtype}; use one dtype")
    check_last_dim_contiguous(name, t)


def check_qkv(q, k, v, varlen=False):
    """q (b, sq, h, d), k and v (b, sk, hk, d) on one device, one supported dtype, h % hk == 0;
    varlen: q (total_q, h, d), k and v (total_k, hk, d)."""
    rank, dims = (3, "(total_tokens, nheads, headdim)") if varlen else (4, "(batch, seqlen, nheads, headdim)")
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, rank, dims)
    if q.dtype not in ATTENTION_DTYPES and q.dtype != torch.float8_e4m3fn:  # fp8: validation_fp8.py
        raise TypeError(f"flash_attn: q has dtype {q.dtype}; supported dtypes are float32, float16 and bfloat16, "
                        "and float8_e4m3fn for the forward")
    check_last_dim_contiguous("q", q)
    for name, t in (("k", k), ("v", v)):
        check_like_q(name, t, q)
    nheads, headdim = q.shape[-2:]
    if k.shape != v.shape:
        raise ValueError(f"flash_attn: k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if not varlen and k.shape[0] != q.shape[0]:
        raise ValueError(f"flash_attn: k has batch {k.shape[0]} but q has batch {q.shape[0]}")
    if k.shape[-1] != headdim:
        raise ValueError(f"flash_attn: k and v have headdim {k.shape[-1]} but q has headdim {headdim}")
    if headdim > MAX_HEADDIM or headdim < 1:
        raise ValueError(f"flash_attn: headdim {headdim} is not supported; it must be between 1 and {MAX_HEADDIM}")
    nheads_k = k.shape[-2]
    if nheads_k == 0 or nheads % nheads_k != 0:
        raise ValueError(
            f"flash_attn: nheads of q ({nheads}) must be a multiple of nheads of k/v ({nheads_k})"
        )
    if q.is_cuda and not torch.compiler.is_compiling():
        check_cuda_capability(q.device)


@functools.lru_cache(maxsize=None)
def _cuda_capability(device_index):
    return torch.cuda.get_device_capability(device_index)


def nvidia_gpu(device):
    """Whether the device is an NVIDIA GPU (a CUDA device of a build without ROCm)."""
    return device.type == "cuda" and torch.version.hip is None


def cuda_capability(device):
    """(major, minor) of a CUDA device, cached per device index ("cuda" alone: the current device)."""
    return _cuda_capability(device.index if device.index is not None else torch.cuda.current_device())


def check_cuda_capability(device):
    capability = cuda_capability(device)
    if tuple(capability) < MIN_CUDA_CAPABILITY:
        raise RuntimeError(
            f"flash_attn: q is on a GPU of compute capability {capability[0]}.{capability[1]}; "
            "flash_attn needs sm80 (Ampere) or newer"
        )
