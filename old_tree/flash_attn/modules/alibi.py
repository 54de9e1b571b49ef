"""ALiBi slopes (Press et al., "Train Short, Test Long"), as FlashAttention 2's MHA builds them.

Head h of n (n a power of two) gets slope r ** (h + 1) with r = 2 ** (-8 / n): a geometric sequence
from 2 ** (-8 / n) down to 2 ** -8. For other n the paper's recipe is kept, so that a model trained
with FA2's MHA gets the same biases here: the slopes of the largest power of two p <= n, then every
other slope of 2p for the remaining n - p heads.
"""

import math


def _power_of_two_slopes(nheads):
    ratio = 2.0 ** (-8.0 / nheads)
    return [ratio ** (h + 1) for h in range(nheads)]


def get_alibi_slopes(nheads):
    """A list of nheads floats, the ALiBi slope of each head."""
    if not isinstance(nheads, int) or isinstance(nheads, bool) or nheads < 1:
        raise ValueError(f"get_alibi_slopes: nheads must be a positive int, got {nheads!r}")
    if math.log2(nheads).is_integer():
        return _power_of_two_slopes(nheads)
    largest = 2 ** math.floor(math.log2(nheads))
    return _power_of_two_slopes(largest) + get_alibi_slopes(2 * largest)[0::2][: nheads - largest]
