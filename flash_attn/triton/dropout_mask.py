"""The dropout keep mask (flash_attn::dropout_keep_mask) on a GPU without the CUDA extension: a
Triton kernel that draws every element's bit with the Triton forward's own _dropout_keep
(kernels.py), so the S_dmask of `return_attn_probs=True` is the mask that forward used. Where the
extension is built it registers its CUDA kernel for the op instead (csrc/flash/dropout_mask.cu);
CPU tensors run flash_attn/dropout.py (flash_attn/ops.py)."""

import torch
import triton
import triton.language as tl

from .. import dropout as dropout_lib
from .kernels import _dropout_keep

# One program per 64 x 64 tile of one (batch, head): the Philox calls dominate, one per element.
BLOCK = 64


@triton.jit
def _keep_mask_kernel(Keep, Rng, heads, seqlen_q, seqlen_k, threshold, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr):
    """Keep (batch, heads, seqlen_q, seqlen_k) int8: 1 where element (i, j) of (batch b, head h)
    is kept. Grid (batch * heads, query tiles, key tiles): batch * heads on x, the dimension CUDA does
    not cap at 65535."""
    bh = tl.program_id(0)
    batch, head = bh // heads, bh % heads
    i = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    j = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
    keep = _dropout_keep(i[:, None], j[None, :], Rng, batch, heads, head, threshold)
    rows = bh.to(tl.int64) * seqlen_q + i.to(tl.int64)
    inside = (i[:, None] < seqlen_q) & (j[None, :] < seqlen_k)
    tl.store(Keep + rows[:, None] * seqlen_k + j[None, :], keep.to(tl.int8), mask=inside)


def keep_mask(rng_state, batch, heads, seqlen_q, seqlen_k, dropout_p):
    """Bool (batch, heads, seqlen_q, seqlen_k) on rng_state's device: the elements a forward with
    this rng_state ([seed, offset] int64) and dropout_p kept."""
    keep = torch.empty((batch, heads, seqlen_q, seqlen_k), dtype=torch.int8, device=rng_state.device)
    if keep.numel() == 0:
        return keep.view(torch.bool)
    grid = (batch * heads, triton.cdiv(seqlen_q, BLOCK), triton.cdiv(seqlen_k, BLOCK))
    _keep_mask_kernel[grid](keep, rng_state, heads, seqlen_q, seqlen_k, dropout_lib.keep_threshold(dropout_p),
                            BLOCK_M=BLOCK, BLOCK_N=BLOCK)
    return keep.view(torch.bool)
