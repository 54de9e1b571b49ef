"""flash_attn.bert_padding: packing and unpacking variable-length batches (CPU, runs in CI)."""

import pytest
import torch

from flash_attn.bert_padding import (
    index_first_axis,
    index_first_axis_residual,
    index_put_first_axis,
    pad_input,
    unpad_input,
    unpad_input_for_concatenated_sequences,
)

I32 = torch.int32
I64 = torch.int64


def random_mask(batch, seqlen):
    """A random bool (batch, seqlen) mask whose row 0 is all False and row 1 all True."""
    mask = torch.rand(batch, seqlen) < 0.5
    mask[0] = False
    mask[1] = True
    return mask


def expected_packing(mask):
    """Flat indices, per-row lengths and cu_seqlens of a (batch, seqlen) mask, by plain Python loops."""
    batch, seqlen = mask.shape
    rows = mask.tolist()
    indices = [b * seqlen + s for b in range(batch) for s in range(seqlen) if rows[b][s]]
    seqlens = [sum(row) for row in rows]
    cu_seqlens = [0]
    for length in seqlens:
        cu_seqlens.append(cu_seqlens[-1] + length)
    return indices, seqlens, cu_seqlens


def test_pad_of_unpad_is_input_times_mask():
    x = torch.randn(4, 7, 3, 5)
    mask = random_mask(4, 7)
    unpadded, indices, _, _, _ = unpad_input(x, mask)
    padded = pad_input(unpadded, indices, 4, 7)
    assert padded.shape == x.shape
    assert torch.equal(padded, x * mask[:, :, None, None])


def test_unpad_values_on_random_mask():
    x = torch.randn(5, 9, 4)
    mask = random_mask(5, 9)
    unpadded, indices, cu_seqlens, max_seqlen, seqused = unpad_input(x, mask)
    want_indices, want_seqlens, want_cu = expected_packing(mask)
    assert indices.dtype == I64 and indices.tolist() == want_indices
    assert cu_seqlens.dtype == I32 and cu_seqlens.tolist() == want_cu
    assert seqused.dtype == I32 and seqused.tolist() == want_seqlens
    assert want_seqlens[0] == 0 and want_seqlens[1] == 9
    assert isinstance(max_seqlen, int) and max_seqlen == 9
    assert unpadded.shape == (len(want_indices), 4)


def test_unpad_values_on_hand_written_mask():
    mask = torch.tensor([[1, 0, 1, 1, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1], [0, 1, 0, 0, 0]])
    _, indices, cu_seqlens, max_seqlen, seqused = unpad_input(torch.randn(4, 5, 2), mask)
    assert indices.tolist() == [0, 2, 3, 10, 11, 12, 13, 14, 16]
    assert cu_seqlens.tolist() == [0, 3, 3, 8, 9]
    assert max_seqlen == 5
    assert seqused.tolist() == [3, 0, 5, 1]


def test_int_mask_matches_bool_mask():
    x = torch.randn(3, 6, 2)
    mask = random_mask(3, 6)
    from_bool = unpad_input(x, mask)
    from_int = unpad_input(x, mask.to(I64))
    for got, want in zip(from_int, from_bool):
        assert torch.equal(torch.as_tensor(got), torch.as_tensor(want))


def test_all_padding_gives_no_tokens():
    unpadded, indices, cu_seqlens, max_seqlen, seqused = unpad_input(torch.randn(2, 3, 4), torch.zeros(2, 3))
    assert unpadded.shape == (0, 4) and indices.numel() == 0
    assert cu_seqlens.tolist() == [0, 0, 0] and max_seqlen == 0 and seqused.tolist() == [0, 0]


def test_unpadded_rows_are_in_row_major_order():
    x = torch.randn(3, 8, 2, 3)
    mask = random_mask(3, 8)
    unpadded, indices, _, _, _ = unpad_input(x, mask)
    positions = [(b, s) for b in range(3) for s in range(8) if mask[b, s]]
    assert [divmod(int(i), 8) for i in indices] == positions
    for row, (b, s) in zip(unpadded, positions):
        assert torch.equal(row, x[b, s])


def test_gradcheck_unpad_and_pad():
    x = torch.randn(3, 4, 2, dtype=torch.float64, requires_grad=True)
    mask = random_mask(3, 4)
    assert torch.autograd.gradcheck(lambda t: unpad_input(t, mask)[0], (x,))
    _, indices, _, _, _ = unpad_input(x, mask)
    packed = torch.randn(indices.numel(), 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: pad_input(t, indices, 3, 4), (packed,))


def test_gradients_of_unpad_and_pad_values():
    x = torch.randn(2, 5, 3, requires_grad=True)
    mask = random_mask(2, 5)
    unpadded, indices, _, _, _ = unpad_input(x, mask)
    grad_out = torch.randn_like(unpadded)
    unpadded.backward(grad_out)
    assert torch.equal(x.grad, pad_input(grad_out, indices, 2, 5))
    assert torch.equal(x.grad[0], torch.zeros(5, 3))


def test_gradcheck_index_functions():
    table = torch.randn(6, 3, dtype=torch.float64, requires_grad=True)
    repeated = torch.tensor([4, 0, 4, 2])
    assert torch.autograd.gradcheck(lambda t: index_first_axis(t, repeated), (table,))
    rows = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
    unique = torch.tensor([5, 1, 3])
    assert torch.autograd.gradcheck(lambda t: index_put_first_axis(t, unique, 7), (rows,))
    assert torch.autograd.gradcheck(lambda t: index_first_axis_residual(t, repeated), (table,))


def test_index_first_axis_residual_values_and_gradient():
    x = torch.randn(5, 2, requires_grad=True)
    indices = torch.tensor([3, 1])
    output, residual = index_first_axis_residual(x, indices)
    assert torch.equal(output, x.detach()[[3, 1]]) and torch.equal(residual, x.detach())
    grad_output, grad_residual = torch.randn(2, 2), torch.randn(5, 2)
    torch.autograd.backward((output, residual), (grad_output, grad_residual))
    want = grad_residual.clone()
    want[3] += grad_output[0]
    want[1] += grad_output[1]
    assert torch.equal(x.grad, want)


def test_index_put_first_axis_places_rows_in_zeros():
    values = torch.randn(2, 3)
    output = index_put_first_axis(values, torch.tensor([2, 0]), 4)
    assert torch.equal(output, torch.stack([values[1], torch.zeros(3), values[0], torch.zeros(3)]))


def test_unused_mask_is_packed_but_not_in_seqused():
    x = torch.randn(2, 4, 3)
    attention_mask = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.bool)
    unused_mask = torch.tensor([[0, 1, 1, 0], [0, 1, 1, 0]], dtype=torch.bool)
    unpadded, indices, cu_seqlens, max_seqlen, seqused = unpad_input(x, attention_mask, unused_mask)
    assert indices.tolist() == [0, 1, 2, 4, 5, 6]
    assert cu_seqlens.tolist() == [0, 3, 6]
    assert max_seqlen == 3
    assert seqused.tolist() == [2, 1]
    assert torch.equal(unpadded, x.flatten(0, 1)[[0, 1, 2, 4, 5, 6]])


def test_concatenated_sequences_hand_written():
    x = torch.randn(3, 6, 2)
    lengths = torch.tensor([[2, 3, 0, 0, 0, 0], [3, 2, 0, 0, 0, 0], [6, 0, 0, 0, 0, 0]])
    unpadded, indices, cu_seqlens, max_seqlen = unpad_input_for_concatenated_sequences(x, lengths)
    assert indices.tolist() == [0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 12, 13, 14, 15, 16, 17]
    assert cu_seqlens.dtype == I32 and cu_seqlens.tolist() == [0, 2, 5, 8, 10, 16]
    assert isinstance(max_seqlen, int) and max_seqlen == 6
    assert torch.equal(unpadded, x.flatten(0, 1)[indices])


def test_concatenated_sequences_longer_than_row_raise():
    with pytest.raises(ValueError, match=r"attention_mask_in_length: a row's lengths add up to 7"):
        unpad_input_for_concatenated_sequences(torch.randn(1, 6, 2), torch.tensor([[4, 3, 0, 0, 0, 0]]))


@pytest.mark.parametrize("mask_shape", [(3, 6), (2, 5), (2, 6, 1), (12,)])
def test_mismatched_attention_mask_raises(mask_shape):
    with pytest.raises(ValueError, match=r"attention_mask must have shape \(batch, seqlen\) = \(2, 6\)"):
        unpad_input(torch.randn(2, 6, 4), torch.ones(mask_shape, dtype=torch.bool))


def test_mismatched_unused_mask_raises():
    with pytest.raises(ValueError, match=r"unused_mask must have shape"):
        unpad_input(torch.randn(2, 6, 4), torch.ones(2, 6), torch.zeros(2, 5))


def test_mismatched_attention_mask_in_length_raises():
    with pytest.raises(ValueError, match=r"attention_mask_in_length must have shape"):
        unpad_input_for_concatenated_sequences(torch.randn(2, 6, 4), torch.ones(2, 7, dtype=I64))


def test_pad_input_row_count_mismatch_raises():
    with pytest.raises(ValueError, match=r"hidden_states has 3 rows but indices has 2 entries"):
        pad_input(torch.randn(3, 4), torch.tensor([0, 1]), 2, 2)
