"""A model of the warp-specialized forward's persistent grid on causal calls (query_tile_scheduler.cuh):
the heaviest-first order in groups of (batch, head) pairs, each CTA taking every ctas-th tile, each
tile costing its key blocks. Prints, per speed-suite shape (hidden 2048, 16k tokens), for groups of
the L2 budget alone (v22) and of whole strides within it (v23): the slowest CTA's load over the mean, and the
mean time between the start of a pair's first tile and the end of its last (its keys' stay in L2),
as a fraction of the kernel. CPU only.

    python benchmarks/experiments/stride_model.py [--ctas 132]
"""

import argparse
import math

L2_BUDGET = 24 << 20
TOKENS, HIDDEN = 16384, 2048
# (queries, keys) per tile and step of the plain warp-specialized forward (launch_fwd_sm90.cuh)
TILE = {64: (192, 128), 128: (128, 128), 256: (128, 80)}


def tile_costs(seqlen, block_m, block_n):
    blocks = math.ceil(seqlen / block_m)
    return [math.ceil(min((m + 1) * block_m, seqlen) / block_n) for m in range(blocks)]


def heaviest_first(pairs, m_blocks, group_pairs):
    """(pair, m_block) in the order of QueryTileWalk::locate_dense."""
    groups = math.ceil(pairs / group_pairs)
    for group in range(groups):
        first = group * group_pairs
        size = min(group_pairs, pairs - first)
        heavy_first = (groups - 1 - group) % 2 == 0
        for index in range(size * m_blocks):
            rank = index // size
            yield first + index % size, m_blocks - 1 - rank if heavy_first else rank


def simulate(seqlen, pairs, tile, group_pairs, ctas):
    costs = tile_costs(seqlen, *tile)
    load = [0.0] * ctas
    first_start, last_end = {}, {}
    for index, (pair, m_block) in enumerate(heaviest_first(pairs, len(costs), group_pairs)):
        cta = index % ctas
        first_start[pair] = min(first_start.get(pair, math.inf), load[cta])
        load[cta] += costs[m_block]
        last_end[pair] = max(last_end.get(pair, 0.0), load[cta])
    span = max(load)
    stay = sum(last_end[p] - first_start[p] for p in first_start) / len(first_start) / span
    return span / (sum(load) / ctas), stay


def group_sizes(seqlen, headdim, pairs, ctas):
    """The group size of v22 (as many pairs as fit the L2 budget) and of heaviest_first_group_pairs
    since v23 (as many whole strides as fit, at least one)."""
    fit = max(1, min(pairs, L2_BUDGET // (seqlen * headdim * 4)))
    m_blocks = math.ceil(seqlen / TILE[headdim][0])
    stride_pairs = ctas // m_blocks if ctas >= m_blocks else 1
    return fit, min(pairs, stride_pairs * max(1, fit // stride_pairs))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ctas", type=int, default=132)
    args = parser.parse_args()
    print("| hd | seqlen | pairs | L2 groups | max / mean | stay | whole-stride groups | max / mean | stay |")
    print("|---|---|---|---|---|---|---|---|---|")
    for headdim in (64, 128, 256):
        for seqlen in (512, 1024, 2048, 4096, 8192, 16384):
            pairs = (TOKENS // seqlen) * (HIDDEN // headdim)
            by_l2, by_stride = group_sizes(seqlen, headdim, pairs, args.ctas)
            a = simulate(seqlen, pairs, TILE[headdim], by_l2, args.ctas)
            b = simulate(seqlen, pairs, TILE[headdim], by_stride, args.ctas)
            print(f"| {headdim} | {seqlen} | {pairs} | {by_l2} | {a[0]:.3f} | {a[1]:.3f} | {by_stride} | "
                  f"{b[0]:.3f} | {b[1]:.3f} |")


if __name__ == "__main__":
    main()
