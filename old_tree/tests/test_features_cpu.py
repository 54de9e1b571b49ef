"""The training API's options on the CPU path (runs in CI): every option and combinations, dense and
varlen, forward and backward against an fp64 reference with the tolerance rule; dropout's mask
against the documented Philox definition and its keep fraction."""

import pytest
import torch

import flash_attn
from feature_checks import Mods, check_dense, check_varlen, dropped_fraction, keep_mask_from_probs
from flash_attn import dropout as dropout_lib
from flash_attn.reference import window_keep_mask

F64 = torch.float64
OPTIONS = {
    "window": Mods(window_size=(5, 3)),
    "window_left_only": Mods(window_size=(4, -1)),
    "window_right_only": Mods(window_size=(-1, 2)),
    "causal_window": Mods(causal=True, window_size=(6, -1)),
    "softcap": Mods(softcap=2.0),
    "alibi_head": Mods(alibi="head"),
    "alibi_batch": Mods(alibi="batch", causal=True),
    "dropout": Mods(dropout_p=0.17),
    "deterministic": Mods(deterministic=True, causal=True),
    "everything": Mods(causal=True, window_size=(7, -1), softcap=3.0, alibi="batch", dropout_p=0.1,
                       deterministic=True),
}


@pytest.mark.parametrize("seqlen_q,seqlen_k", [(19, 19), (13, 29), (29, 13), (1, 17)])
@pytest.mark.parametrize("name", OPTIONS)
def test_option_dense(name, seqlen_q, seqlen_k):
    torch.manual_seed(0)
    check_dense(OPTIONS[name], 2, seqlen_q, seqlen_k, 4, 2, 24, torch.bfloat16, "cpu", compute_dtype=F64)


@pytest.mark.parametrize("packing", ["none", "kv"])
@pytest.mark.parametrize("name", OPTIONS)
def test_option_varlen(name, packing):
    """Lengths 0 and 1 inside the batch, keys without queries and queries without keys."""
    torch.manual_seed(1)
    check_varlen(OPTIONS[name], [7, 0, 1, 20, 3], [9, 4, 1, 15, 0], 4, 2, 16, torch.float16, "cpu",
                 compute_dtype=F64, packing=packing)


def test_varlen_qkvpacked():
    torch.manual_seed(2)
    check_varlen(Mods(causal=True, dropout_p=0.1), [5, 1, 12], [5, 1, 12], 3, 3, 16, torch.bfloat16, "cpu",
                 compute_dtype=F64, packing="qkv")


def test_dropout_mask_is_the_documented_philox_mask():
    """S_dmask's signs are flash_attn.dropout.keep_mask of the seed the forward drew."""
    torch.manual_seed(3)
    q, k, v = (torch.randn(2, 40, 3, 16, dtype=torch.bfloat16) for _ in range(3))
    state = torch.random.get_rng_state()
    _, _, s_dmask = flash_attn.flash_attn_func(q, k, v, dropout_p=0.3, return_attn_probs=True)
    torch.random.set_rng_state(state)
    seed = int(torch.randint(0, 2**62, (1,), dtype=torch.int64))
    expected = dropout_lib.keep_mask(seed, 0, 2, 3, 40, 40, 0.3)
    assert torch.equal(keep_mask_from_probs(s_dmask, 40, 40), expected)


def test_dropout_mask_is_the_written_definition():
    """keep_mask against its docstring, one scalar Philox call per element: 16 x 16 tiles, call
    4 ((i % 8) // 2) + (j % 8) // 2, word 2 (i % 2) + j % 2, byte 2 ((i % 16) // 8) + (j % 16) // 8; a
    window that starts inside tiles and crosses them."""
    seed, offset, heads, p = 0x0123456789ABCDEF, 2**32 + 5, 3, 0.3
    mask = dropout_lib.keep_mask(seed, offset, 2, heads, 41, 45, p, key_start=7)
    one = lambda x: torch.tensor([x], dtype=torch.int64)  # noqa: E731
    for b, h, i, j in [(b, h, i, j) for b in range(2) for h in (0, 2) for i in range(9, 41, 3) for j in range(7, 45, 2)]:
        stream = offset + b * heads + h
        call = 4 * ((i % 8) // 2) + (j % 8) // 2
        words = dropout_lib.philox4x32(one(j // 16), one((i // 16) * 16 + call), one(stream & 0xFFFFFFFF),
                                       one(stream >> 32), seed & 0xFFFFFFFF, seed >> 32)
        byte = (int(words[2 * (i % 2) + j % 2]) >> (8 * (2 * ((i % 16) // 8) + (j % 16) // 8))) & 0xFF
        assert bool(mask[b, h, i, j - 7]) == (byte < dropout_lib.keep_threshold(p)), (b, h, i, j)


def test_dropout_reproducible_with_manual_seed():
    q, k, v = (torch.randn(1, 30, 2, 16, dtype=torch.bfloat16) for _ in range(3))
    torch.manual_seed(11)
    first = flash_attn.flash_attn_func(q, k, v, dropout_p=0.5)
    torch.manual_seed(11)
    second = flash_attn.flash_attn_func(q, k, v, dropout_p=0.5)
    third = flash_attn.flash_attn_func(q, k, v, dropout_p=0.5)
    assert torch.equal(first, second) and not torch.equal(second, third)


@pytest.mark.parametrize("dropout_p", [0.1, 0.5, 0.9])
def test_dropout_keep_fraction(dropout_p):
    keep = dropout_lib.keep_mask(12345, 678, 2, 4, 128, 256, dropout_p)
    assert abs(dropped_fraction(keep, torch.ones(1, dtype=torch.bool)) - dropout_p) <= 0.01


def test_dropout_keep_mask_chunks_agree():
    whole = dropout_lib.keep_mask(99, 5, 2, 3, 33, 70, 0.2)
    parts = [dropout_lib.keep_mask(99, 5, 2, 3, 33, 70, 0.2, key_start=s, key_end=min(s + 32, 70))
             for s in range(0, 70, 32)]
    assert torch.equal(whole, torch.cat(parts, dim=-1))


def test_philox_known_answer():
    """Philox4x32 against Random123's known-answer vectors (counter and key all ones, all zeros) at
    the 7 rounds the masks use and at Random123's default 10."""
    ones = lambda: torch.tensor([0xFFFFFFFF], dtype=torch.int64)  # noqa: E731
    zero = lambda: torch.tensor([0], dtype=torch.int64)  # noqa: E731
    expected = {
        7: ([0x5207DDC2, 0x45165E59, 0x4D8EE751, 0x8C52F662], [0x5F6FB709, 0x0D893F64, 0x4F121F81, 0x4F730A48]),
        10: ([0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD], [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]),
    }
    assert dropout_lib.PHILOX_ROUNDS == 7
    for rounds, (from_ones, from_zeros) in expected.items():
        words = dropout_lib.philox4x32(ones(), ones(), ones(), ones(), 0xFFFFFFFF, 0xFFFFFFFF, rounds)
        assert [int(w) for w in words] == from_ones
        words = dropout_lib.philox4x32(zero(), zero(), zero(), zero(), 0, 0, rounds)
        assert [int(w) for w in words] == from_zeros


def test_window_semantics_bottom_right():
    """FA2's local mask: query i sees keys [i + sk - sq - left, i + sk - sq + right]."""
    keep = window_keep_mask(3, 6, (1, 0), "cpu")
    assert keep.int().tolist() == [[0, 0, 1, 1, 0, 0], [0, 0, 0, 1, 1, 0], [0, 0, 0, 0, 1, 1]]


def test_window_without_keys_gives_zero_rows():
    """window (0, 0) with seqlen_q > seqlen_k: rows above the diagonal see no key: out 0, lse +inf."""
    q, k, v = (torch.randn(1, s, 2, 16, dtype=torch.bfloat16) for s in (8, 4, 4))
    out, lse, _ = flash_attn.flash_attn_func(q, k, v, window_size=(0, 0), return_attn_probs=True)
    assert (lse[:, :, :4] == float("inf")).all() and not out[:, :4].any()
    assert torch.isfinite(lse[:, :, 4:]).all()
