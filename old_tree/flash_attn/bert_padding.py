"""Padding helpers for variable-length batches: FlashAttention 2's `flash_attn.bert_padding` API.

`unpad_input` turns a padded batch (batch, seqlen, ...) and its attention mask into the packed
layout that variable-length attention takes: the selected tokens back to back (total_nnz, ...),
their flat indices into batch * seqlen, and the cumulative sequence lengths `cu_seqlens`.
`pad_input` puts packed tokens back into a zero-filled (batch, seqlen, ...) tensor. The gathers and
scatters underneath are autograd Functions, so gradients flow through both directions.
Pure PyTorch, same names, arguments and return values as FlashAttention 2's module.
"""

import torch
import torch.nn.functional as F

__all__ = [
    "IndexFirstAxis",
    "IndexFirstAxisResidual",
    "IndexPutFirstAxis",
    "index_first_axis",
    "index_first_axis_residual",
    "index_put_first_axis",
    "pad_input",
    "unpad_input",
    "unpad_input_for_concatenated_sequences",
]


def _scatter_add_rows(rows, indices, first_axis_dim, into=None):
    """Add `rows` (n, ...) at `indices` (n,) of dim 0 of `into`, or of zeros (first_axis_dim, ...)."""
    if into is None:
        into = rows.new_zeros((first_axis_dim, *rows.shape[1:]))
    return into.index_add_(0, indices, rows)


class IndexFirstAxis(torch.autograd.Function):
    """`input[indices]` along dim 0; the backward adds the gradient into zeros of input's shape."""

    @staticmethod
    def forward(ctx, input, indices):
        ctx.save_for_backward(indices)
        ctx.first_axis_dim = input.shape[0]
        return input.index_select(0, indices)

    @staticmethod
    def backward(ctx, grad_output):
        (indices,) = ctx.saved_tensors
        return _scatter_add_rows(grad_output, indices, ctx.first_axis_dim), None


index_first_axis = IndexFirstAxis.apply


class IndexPutFirstAxis(torch.autograd.Function):
    """Zeros (first_axis_dim, ...) with row `indices[i]` set to `values[i]` (indices unique);
    the backward gathers the gradient's rows at `indices`."""

    @staticmethod
    def forward(ctx, values, indices, first_axis_dim):
        ctx.save_for_backward(indices)
        output = values.new_zeros((first_axis_dim, *values.shape[1:]))
        output[indices] = values
        return output

    @staticmethod
    def backward(ctx, grad_output):
        (indices,) = ctx.saved_tensors
        return grad_output.index_select(0, indices), None, None


index_put_first_axis = IndexPutFirstAxis.apply


class IndexFirstAxisResidual(torch.autograd.Function):
    """`(input[indices], input)` along dim 0, the second output for a residual connection; the
    backward returns the residual's gradient plus the gathered rows' gradient added at `indices`."""

    @staticmethod
    def forward(ctx, input, indices):
        ctx.save_for_backward(indices)
        return input.index_select(0, indices), input.detach()

    @staticmethod
    def backward(ctx, grad_output, grad_residual):
        (indices,) = ctx.saved_tensors
        return _scatter_add_rows(grad_output, indices, None, into=grad_residual.clone()), None


index_first_axis_residual = IndexFirstAxisResidual.apply


def _check_mask(name, mask, hidden_states):
    """A (batch, seqlen) mask for hidden_states (batch, seqlen, ...)."""
    if hidden_states.dim() < 2:
        raise ValueError(
            f"hidden_states must have at least 2 dims (batch, seqlen, ...), got shape {tuple(hidden_states.shape)}"
        )
    if mask.dim() != 2 or mask.shape != hidden_states.shape[:2]:
        raise ValueError(
            f"{name} must have shape (batch, seqlen) = {tuple(hidden_states.shape[:2])} like hidden_states' "
            f"first two dims, got {tuple(mask.shape)}"
        )


def _cu_seqlens(seqlens):
    """(n,) lengths -> (n + 1,) int32 offsets starting at 0."""
    return F.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))


def _max_seqlen(seqlens):
    """The largest length as a Python int (0 for no sequences)."""
    return int(seqlens.max()) if seqlens.numel() > 0 else 0


def _gather_tokens(hidden_states, selected):
    """The rows of hidden_states (batch, seqlen, ...) where `selected` (batch, seqlen) is True,
    in row-major order, and their flat int64 indices into batch * seqlen."""
    indices = torch.nonzero(selected.flatten(), as_tuple=False).flatten()
    return index_first_axis(hidden_states.flatten(0, 1), indices), indices


def unpad_input(hidden_states, attention_mask, unused_mask=None):
    """Pack the tokens of a padded batch.

    hidden_states: (batch, seqlen, ...). attention_mask: (batch, seqlen), bool or int, nonzero for
    valid tokens. unused_mask: optional (batch, seqlen), nonzero for tokens that are allocated but
    unused: they are packed and counted in cu_seqlens, but not in seqused.

    Returns (hidden_states (total_nnz, ...), indices (total_nnz,) int64 flat indices into
    batch * seqlen, cu_seqlens (batch + 1,) int32, max_seqlen_in_batch (int), seqused (batch,) int32
    = the valid tokens of each sequence).
    """
    _check_mask("attention_mask", attention_mask, hidden_states)
    used = attention_mask != 0
    selected = used
    if unused_mask is not None:
        _check_mask("unused_mask", unused_mask, hidden_states)
        selected = used | (unused_mask != 0)
    seqlens = selected.sum(dim=-1, dtype=torch.int32)
    seqused = used.sum(dim=-1, dtype=torch.int32)
    unpadded, indices = _gather_tokens(hidden_states, selected)
    return unpadded, indices, _cu_seqlens(seqlens), _max_seqlen(seqlens), seqused


def pad_input(hidden_states, indices, batch, seqlen):
    """Inverse of `unpad_input`: hidden_states (total_nnz, ...) and their flat indices into
    batch * seqlen -> (batch, seqlen, ...), zero where no token was placed."""
    if hidden_states.shape[0] != indices.shape[0]:
        raise ValueError(
            f"hidden_states has {hidden_states.shape[0]} rows but indices has {indices.shape[0]} entries"
        )
    output = index_put_first_axis(hidden_states, indices, batch * seqlen)
    return output.view(batch, seqlen, *output.shape[1:])


def unpad_input_for_concatenated_sequences(hidden_states, attention_mask_in_length):
    """Pack a batch whose rows each hold several sequences back to back.

    hidden_states: (batch, seqlen, ...). attention_mask_in_length: (batch, seqlen), each row the
    lengths of the row's sequences in order, then zeros; e.g. [[2, 3, 0, 0, 0, 0], [3, 2, 0, 0, 0, 0]]
    means sequences of 2 and 3 tokens in row 0, of 3 and 2 in row 1.

    Returns (hidden_states (total_nnz, ...), indices (total_nnz,) int64 flat indices into
    batch * seqlen, cu_seqlens (number of sequences + 1,) int32 over all the sequences,
    max_seqlen_in_batch (int)).
    """
    _check_mask("attention_mask_in_length", attention_mask_in_length, hidden_states)
    lengths = attention_mask_in_length.flatten()
    seqlens = lengths[lengths != 0]
    row_tokens = attention_mask_in_length.sum(dim=-1)
    seqlen = attention_mask_in_length.shape[1]
    if row_tokens.numel() > 0 and int(row_tokens.max()) > seqlen:
        raise ValueError(
            f"attention_mask_in_length: a row's lengths add up to {int(row_tokens.max())}, more than seqlen={seqlen}"
        )
    positions = torch.arange(seqlen, device=attention_mask_in_length.device)
    selected = positions < row_tokens.unsqueeze(1)
    unpadded, indices = _gather_tokens(hidden_states, selected)
    return unpadded, indices, _cu_seqlens(seqlens), _max_seqlen(seqlens)
