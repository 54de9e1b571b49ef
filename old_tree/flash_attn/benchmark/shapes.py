"""Shapes, FLOP and byte counts, and memory estimates, as the design notes' BENCHMARKS.md defines them;
exact score-element counts under causal and window masks; the random lengths of varlen and padded batches.

Attention tensors are (batch, seqlen, nheads, headdim). FLOPs are counted as the published
FlashAttention, cuDNN and FA3/FA4 numbers count them, so TFLOP/s compare across those sources.
"""

import random
from dataclasses import dataclass

TRAINING_HIDDEN = 2048  # model width of the published training benchmarks
TRAINING_TOKENS = 16384  # batch * seqlen of the published training benchmarks

PASS_FLOP_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}  # backward = 2.5 forwards (5 matmuls vs 2)
PASSES = tuple(PASS_FLOP_FACTOR)

# A materializing attention (naive, SDPA MATH) holds about four (batch, nheads, seqlen_q, seqlen_k)
# score-sized tensors at its forward+backward peak: PEERS.md measured 65664 MiB for naive at
# batch 8, 16 heads, seqlen 8k, bf16, where one score tensor is 16384 MiB.
SCORE_TENSORS_AT_PEAK = 4


@dataclass(frozen=True)
class AttnShape:
    """One attention problem. nheads_k < nheads is grouped-query attention."""

    batch: int
    seqlen_q: int
    seqlen_k: int
    nheads: int
    nheads_k: int
    headdim: int

    def describe(self):
        heads = f"h={self.nheads}" if self.nheads == self.nheads_k else f"h={self.nheads}/{self.nheads_k}"
        lens = f"s={self.seqlen_q}" if self.seqlen_q == self.seqlen_k else f"sq={self.seqlen_q} sk={self.seqlen_k}"
        return f"b={self.batch} {lens} {heads} d={self.headdim}"


def training_shape(seqlen, headdim, hidden=TRAINING_HIDDEN, tokens=TRAINING_TOKENS):
    """The training benchmark's shape: nheads = hidden // headdim, batch = tokens // seqlen (at least 1),
    so every point of a sweep does the same number of tokens and only the attention span changes."""
    if hidden % headdim:
        raise ValueError(f"headdim {headdim} does not divide the hidden size {hidden}")
    nheads = hidden // headdim
    return AttnShape(max(1, tokens // seqlen), seqlen, seqlen, nheads, nheads, headdim)


def attention_flops(shape, causal, pass_name="fwd"):
    """Floating-point operations of one attention pass: forward 4 * b * sq * sk * h * d (two matmuls
    of 2 FLOPs per multiply-add), halved when causal (the square case's masked half is skipped),
    times 2.5 for the backward and 3.5 for forward+backward."""
    flops = 4.0 * shape.batch * shape.seqlen_q * shape.seqlen_k * shape.nheads * shape.headdim
    if causal:
        flops /= 2
    return flops * PASS_FLOP_FACTOR[pass_name]


def tflops_per_s(flops, ms):
    """TFLOP/s from a FLOP count and a time in milliseconds."""
    return flops / (ms * 1e-3) / 1e12


def kv_cache_bytes(batch, context, nheads_k, headdim, element_size):
    """Bytes of K and V that one decode step must read: the whole cache, once."""
    return 2 * batch * context * nheads_k * headdim * element_size


def gb_per_s(nbytes, ms):
    """GB/s (10^9 bytes per second) from a byte count and a time in milliseconds."""
    return nbytes / (ms * 1e-3) / 1e9


def materialized_peak_bytes(shape, score_element_bytes):
    """Estimated forward+backward peak, in bytes, of an attention that materializes the scores."""
    scores = shape.batch * shape.nheads * shape.seqlen_q * shape.seqlen_k
    return SCORE_TENSORS_AT_PEAK * scores * score_element_bytes


def parse_seqlen(text):
    """'512' -> 512, '2k' -> 2048, '128K' -> 131072."""
    text = text.strip().lower()
    if text.endswith("k"):
        return int(text[:-1]) * 1024
    return int(text)


def format_seqlen(seqlen):
    """2048 -> '2k', 512 -> '512', 1536 -> '1536'."""
    return f"{seqlen // 1024}k" if seqlen >= 1024 and seqlen % 1024 == 0 else str(seqlen)


def score_pairs(seqlen_q, seqlen_k, window=(-1, -1)):
    """Exact number of (query, key) score elements attention computes: key j is seen by query i when
    i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q + right (bottom-right aligned, as
    FlashAttention 2; -1 is unbounded, so causal is window (-1, 0)). Counted per query row, so a
    window's ragged start and a causal diagonal are exact, not the s^2/2 of attention_flops."""
    left, right = window
    offset = seqlen_k - seqlen_q
    total = 0
    for i in range(seqlen_q):
        first = 0 if left < 0 else max(0, i + offset - left)
        last = seqlen_k - 1 if right < 0 else min(seqlen_k - 1, i + offset + right)
        total += max(0, last - first + 1)
    return total


def pairs_flops(pairs, nheads, headdim, pass_name="fwd"):
    """FLOPs of one pass over `pairs` score elements per head, counted as attention_flops counts
    them (4 * d per element forward, times the pass factor)."""
    return 4.0 * pairs * nheads * headdim * PASS_FLOP_FACTOR[pass_name]


def mixed_lengths(count, total, low, high, seed):
    """`count` random sequence lengths in [low, high] that add up to exactly `total`: a varlen batch
    with as many sequences and tokens as a dense batch of count x (total / count), only the lengths
    mixed. Drawn uniformly, then the surplus or shortfall is moved onto randomly chosen sequences,
    each step clamped to the bounds."""
    if not count * low <= total <= count * high:
        raise ValueError(f"{count} lengths in [{low}, {high}] cannot add up to {total}")
    rng = random.Random(seed)
    lengths = [rng.randint(low, high) for _ in range(count)]
    while (missing := total - sum(lengths)) != 0:
        index = rng.randrange(count)
        lengths[index] += max(low - lengths[index], min(high - lengths[index], missing))
    return lengths


def padding_lengths(batch, seqlen, seed):
    """The kept length of each sequence of a padded batch: random in [seqlen / 2, seqlen], as the
    FlashAttention paper's padding-mask benchmark draws them."""
    rng = random.Random(seed)
    return [rng.randint(seqlen // 2, seqlen) for _ in range(batch)]
