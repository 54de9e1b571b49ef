"""Test hook, as flash_attn.ops.set_poison_outputs is for the CUDA ops: while on, the outputs the
Triton kernels must write in full (dense out and lse, dq / dk / dv, the split-KV decode's partial
and combined outputs) start as NaN instead of uninitialized memory, so an element a kernel never
writes fails the reference comparison rather than passing by whatever the allocator left there."""

import torch

_poison_outputs = False


def set_poison_outputs(enabled):
    """Turns the hook on or off; returns the previous setting."""
    global _poison_outputs
    previous, _poison_outputs = _poison_outputs, bool(enabled)
    return previous


def unwritten(shape, *, dtype, device):
    """A new tensor the caller's kernels overwrite in full: NaN while the hook is on, else uninitialized."""
    if _poison_outputs:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)
