"""Global scratch memory for Triton launches whose kernels make tensor descriptors on the device
(tl.make_tensor_descriptor writes each program's descriptor to memory the launcher asks its allocator
for). Triton keeps that allocator in a context variable; the launch sets ours in a copy of the
caller's context, so the caller's own allocator (or its absence) is left as it was."""

import contextvars

import torch
import triton

# torch's caching allocator returns blocks aligned to 512 bytes; the forward asks for 128 (Triton 3.9
# for sm_90: 256 bytes a program, two descriptors, aligned to 128), so the block needs no padding.
TORCH_BLOCK_ALIGNMENT = 512


def launch_with_scratch(needs_scratch, launcher, device, *args, **meta):
    """launcher(*args, **meta), with an allocator of scratch on `device` where needs_scratch; the
    scratch comes from torch's caching allocator on the current stream, the launch's stream, so it is
    reused only after the kernel that was given it."""
    if not needs_scratch:
        return launcher(*args, **meta)
    return contextvars.copy_context().run(_launch_with_allocator, device, launcher, args, meta)


def _launch_with_allocator(device, launcher, args, meta):
    def allocate(size, alignment, stream):
        if alignment > TORCH_BLOCK_ALIGNMENT:
            raise RuntimeError(f"Triton asked for scratch aligned to {alignment} bytes, more than torch gives")
        return torch.empty(size, dtype=torch.int8, device=device)

    triton.set_allocator(allocate)
    return launcher(*args, **meta)
