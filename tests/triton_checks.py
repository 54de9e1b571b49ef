"""Shared checks of the Triton backend's block sources (flash_attn/triton/attention.py,
_forward_descriptors): which source each forward call took, and that the descriptor paths give the
pointer loads' results bit for bit. Importers skip first where triton is missing."""

import torch

from flash_attn.triton import attention as triton_attention, kernels, tuning

POINTERS = kernels.POINTER_BLOCKS.value


def recorded_descriptors(monkeypatch):
    """A list to which each forward call appends the block source it took. The cached plans are
    cleared first: a plan made before would launch without asking _forward_descriptors."""
    triton_attention.clear_plans()
    chosen = []
    real = triton_attention._forward_descriptors
    monkeypatch.setattr(triton_attention, "_forward_descriptors",
                        lambda *a, **kw: chosen.append(real(*a, **kw)) or chosen[-1])
    return chosen


def assert_descriptors_match_pointers(monkeypatch, q, k, v, scale, expected, asked=("1", "2"), **options):
    """The forward with descriptors forced off, then with each setting of `asked`: the calls took
    the block sources `expected`, and out and lse equal the pointer loads' bit for bit."""
    chosen = recorded_descriptors(monkeypatch)
    results = []
    for flag in ("0",) + tuple(asked)[:len(expected)]:
        monkeypatch.setenv(tuning.DESCRIPTORS_VARIABLE, flag)
        results.append(triton_attention.forward(q, k, v, scale, **options))
    assert chosen == [POINTERS] + list(expected)
    (out, lse), others = results[0], results[1:]
    for out_described, lse_described in others:
        assert torch.equal(out, out_described) and torch.equal(lse, lse_described)
    return out, lse
