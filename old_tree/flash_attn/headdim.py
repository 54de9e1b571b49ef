"""Head-dim padding shared by the public functions: the kernels move rows in 16-byte pieces, so a
head dim that is not a multiple of 8 is zero-padded first (zeros change no score and no output
column) and the output sliced back."""

import torch.nn.functional as F

HEADDIM_ALIGNMENT = 8


def padded_headdim(headdim):
    return -(-headdim // HEADDIM_ALIGNMENT) * HEADDIM_ALIGNMENT


def pad_headdim(t, headdim_padded):
    """t with its last dim zero-padded to headdim_padded (t itself when it already has it; None stays None)."""
    return t if t is None or t.shape[-1] == headdim_padded else F.pad(t, (0, headdim_padded - t.shape[-1]))


def unpad_headdim(out, headdim):
    """out sliced back to headdim columns; out itself when it has them (a slice would still be a view
    op, whose backward node the autograd engine then runs: ~10 µs of host time per call, measured
    on the GPU machine, benchmarks/NOTES.md v11)."""
    return out if out.shape[-1] == headdim else out[..., :headdim]
