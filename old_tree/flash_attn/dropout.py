"""The dropout keep mask of csrc/flash/dropout.cuh, in PyTorch: the CPU path's dropout and the
tests' check that the CUDA kernels draw exactly these bits.

Element (query i, key j) of (batch b, head h) is kept iff its random byte < keep_threshold, with the
byte taken from Philox4x32-7 (key = the 64-bit seed; counter = (j // 16, (i // 16) * 16 + v,
low and high words of offset + b * heads + h), v = 4 * ((i % 8) // 2) + (j % 8) // 2), word
2 * (i % 2) + j % 2, byte 2 * ((i % 16) // 8) + (j % 16) // 8. Arithmetic is on int64 tensors with
32-bit values.
"""

import torch

_MASK32 = 0xFFFFFFFF
_MUL0, _MUL1 = 0xD2511F53, 0xCD9E8D57
_WEYL0, _WEYL1 = 0x9E3779B9, 0xBB67AE85


def keep_threshold(dropout_p):
    """Bytes below this are kept: round(256 * (1 - p)), at most 255, as the CUDA op computes it (its
    kernels test four bytes at once against a byte: csrc/flash/dropout.cuh). So byte 255 is always
    dropped and p below 1/512 drops 1/256, as FlashAttention 2's threshold floor(255 (1 - p)) does."""
    return min(255, int(round((1.0 - dropout_p) * 256.0)))


def _mul_hi_lo(a, b):
    """(high, low) 32-bit words of the 64-bit product of a (python int < 2^32) and b (int64 tensor of
    32-bit values), without overflowing int64: b is split in 16-bit halves."""
    low_part = a * (b & 0xFFFF)  # < 2^48
    high_part = a * (b >> 16)    # < 2^48
    lo = (low_part + ((high_part & 0xFFFF) << 16)) & _MASK32
    hi = (high_part + (low_part >> 16)) >> 16
    return hi & _MASK32, lo


# The rounds of dropout.cuh's kPhiloxRounds (FlashAttention 2's count; the reason is written there).
PHILOX_ROUNDS = 7


def philox4x32(c0, c1, c2, c3, key0, key1, rounds=PHILOX_ROUNDS):
    """Philox4x32 on int64 tensors of 32-bit counters; key0, key1 python ints."""
    for _ in range(rounds):
        hi0, lo0 = _mul_hi_lo(_MUL0, c0)
        hi1, lo1 = _mul_hi_lo(_MUL1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ key0, lo1, hi0 ^ c3 ^ key1, lo0
        key0 = (key0 + _WEYL0) & _MASK32
        key1 = (key1 + _WEYL1) & _MASK32
    return c0, c1, c2, c3


def keep_mask(seed, offset, batch, heads, seqlen_q, seqlen_k, dropout_p, batch_indices=None, key_start=0,
              key_end=None):
    """Bool (batch, heads, seqlen_q, keys [key_start, key_end)): True where the element is kept.
    batch_indices: the batch index each of the `batch` rows has in the generator (default 0..batch-1).
    seqlen_k is the full key count (key_end defaults to it)."""
    seed, offset = int(seed) & ((1 << 64) - 1), int(offset) & ((1 << 64) - 1)
    if batch_indices is None:
        batch_indices = range(batch)
    b = torch.tensor(list(batch_indices), dtype=torch.int64).view(-1, 1, 1, 1)
    h = torch.arange(heads, dtype=torch.int64).view(1, -1, 1, 1)
    i = torch.arange(seqlen_q, dtype=torch.int64).view(1, 1, -1, 1)
    key_end = seqlen_k if key_end is None else key_end
    j = torch.arange(key_start, key_end, dtype=torch.int64).view(1, 1, 1, -1)
    stream = (offset + b * heads + h) & ((1 << 64) - 1)  # < 2^63 for any realistic offset
    call = 4 * ((i % 8) // 2) + (j % 8) // 2
    shape = (batch, heads, seqlen_q, key_end - key_start)
    c0 = (j // 16).expand(shape)
    c1 = ((i // 16) * 16 + call).expand(shape) & _MASK32
    c2 = (stream & _MASK32).expand(shape)
    c3 = (stream >> 32).expand(shape)
    words = philox4x32(c0, c1, c2, c3, seed & _MASK32, seed >> 32)
    word_index = (2 * (i % 2) + j % 2).expand(shape)
    word = torch.zeros(shape, dtype=torch.int64)
    for index, w in enumerate(words):
        word = torch.where(word_index == index, w, word)
    byte_index = (2 * ((i % 16) // 8) + (j % 16) // 8).expand(shape)
    byte = (word >> (8 * byte_index)) & 0xFF
    return byte < keep_threshold(dropout_p)
