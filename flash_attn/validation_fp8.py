"""Argument checks of the fp8 forward (FlashAttention 3's FP8 API): float8_e4m3fn q, k, v with
optional q_descale, k_descale, v_descale, each float32 (batch, nheads_k) (None: 1.0, as in
FlashAttention 3). Forward only: the CUDA fp8 forward on Hopper or the Triton backend's
(flash_attn/backend.py chooses)."""

import torch

from .validation import check_typed_tensor, cuda_capability, nvidia_gpu

FP8_DTYPE = torch.float8_e4m3fn
DESCALE_NAMES = ("q_descale", "k_descale", "v_descale")
MIN_FP8_CUDA_CAPABILITY = (8, 9)  # Triton's fp8e4nv products need Ada or newer


def is_fp8(q):
    return q.dtype == FP8_DTYPE


def check_descales(q, k, descales, batch):
    """descales (q_descale, k_descale, v_descale), each None or float32 (batch, nheads_k) on q's
    device; given only with float8_e4m3fn inputs (FlashAttention 3 reads them only then)."""
    given = [(name, t) for name, t in zip(DESCALE_NAMES, descales) if t is not None]
    if not given:
        return
    if not is_fp8(q):
        raise ValueError(f"flash_attn: {given[0][0]} applies to float8_e4m3fn inputs only, but q is {q.dtype}")
    nheads_k = k.shape[-2]
    for name, t in given:
        check_typed_tensor(name, t, torch.float32, q.device)
        if tuple(t.shape) != (batch, nheads_k):
            raise ValueError(f"flash_attn: {name} must have shape (batch, nheads_k) = ({batch}, {nheads_k}), "
                             f"got {tuple(t.shape)}")


def check_fp8_call(q, dropout_p):
    """What the fp8 forward lacks: dropout (it is for training, and there is no fp8 backward), and
    GPUs older than sm89 (checked outside torch.compile, as validation.check_cuda_capability)."""
    if dropout_p != 0:
        raise ValueError(f"flash_attn: dropout_p must be 0 with float8_e4m3fn inputs (the fp8 path is forward-only, "
                         f"as in FlashAttention 3), got {dropout_p!r}")
    if nvidia_gpu(q.device) and not torch.compiler.is_compiling():
        capability = cuda_capability(q.device)
        if tuple(capability) < MIN_FP8_CUDA_CAPABILITY:
            raise RuntimeError(f"flash_attn: float8_e4m3fn inputs need a GPU of compute capability 8.9 or newer "
                               f"(Ada, Hopper); q is on one of {capability[0]}.{capability[1]}")
