// The forward's scheduler (ARCHITECTURE.md's scheduler piece): which query tiles a CTA computes
// and in which order. Torch-free and arch-neutral, for any kernel that walks query tiles; every
// role of a CTA walks the same tiles by itself, from the tile index, so nothing is handed between
// them.
//
// A persistent CTA takes tiles blockIdx.x, + gridDim.x, ... of one linear order (a grid of one CTA
// per tile takes one). The orders:
//   natural (equal tiles: dense, no causal mask or window): batch by batch, the heads of a batch,
//     a head's query blocks (last first), so the tiles in flight at once share a few heads' keys
//     in L2.
//   heaviest first (dense with a causal mask or a window): groups of `group_pairs` (batch, head)
//     pairs (about one stride of the persistent grid, within an L2 budget), one after the other;
//     within the last group, every pair's last query block (the one that sees the most keys),
//     then every pair's block before it, and so on; the groups before it alternate between
//     lightest and heaviest first, so that the last group is heaviest first. Consecutive tiles
//     then cost about the same, and a static stride hands each CTA a light and a heavy part of two
//     neighbouring groups in turn: every group heaviest first gave the CTAs that land on the
//     groups' heavy starts up to 20% more work than the mean (a model of the stride at the speed
//     suite's causal shapes, max / mean load 1.13-1.24; ncu at hd 128 8k causal: SMs active 81%
//     of the kernel's time), alternating 1.00-1.03 (benchmarks/NOTES.md v17; with groups of one
//     stride, v23). The last group heaviest first keeps the light tiles for the end, as the
//     longest-first ordering of FlashAttention 3's causal scheduler does with a counter.
//   packed (varlen): batch by batch, the heads, a head's blocks heaviest causal first; batch b has
//     ceil(len_q(b) / kBlockM) blocks, len_q clamped as SequenceView clamps it, so no tile lies
//     past a sequence's end (a grid over max_seqlen_q leaves most CTAs empty when lengths differ).
#pragma once

#include <algorithm>

#include "common.cuh"
#include "fast_divmod.h"
#include "params.h"
#include "sequence.cuh"

namespace flash {

// A query tile: query block m_block of (head, batch); batch < 0 past the last tile.
struct QueryTileCoord {
  int m_block, head, batch;
  __device__ __forceinline__ bool valid() const { return batch >= 0; }
  __device__ __forceinline__ static QueryTileCoord end() { return QueryTileCoord{0, 0, -1}; }
};

// The order, set by the launcher (make_query_tile_order), and the dense walk's divisors.
struct QueryTileOrder {
  int group_pairs;          // > 0: heaviest first in groups of this many (batch, head) pairs; 0: natural
  int groups;               // ceil(pairs / group_pairs) where group_pairs > 0
  FastDivmod m_blocks;      // query blocks per (batch, head) pair
  FastDivmod heads;         // pair -> (batch, head)
  FastDivmod group_tiles;   // group_pairs * m_blocks: tile -> (group, tile within it)
  FastDivmod group_size;    // group_pairs: tile within a group -> (rank, pair within it)
  FastDivmod last_group_size;  // the same for the last group, which may be smaller
};

// Maps a CTA's increasing tile indices to coordinates, in every thread on its own (no warp-wide
// step, which made ptxas spill in the warp-specialized forward's 24-register producer). Dense:
// arithmetic. Varlen: a scan over the batches' tile counts from a cursor that only moves forward,
// so a whole walk reads each entry of cu_seqlens once per thread (every thread of a CTA reads the
// same entries, so they should hit in L1 after the first; not measured); between two tiles of a
// stride it crosses the batches in between.
template <int kBlockM>
struct QueryTileWalk {
  int batch = 0;       // varlen: the batch of the tile last located, where the next search starts
  int first_tile = 0;  // varlen: the linear index of that batch's first tile

  // `tile` at least every earlier call's.
  __device__ __forceinline__ QueryTileCoord locate(const FwdParams& p, const QueryTileOrder& order, int tile) {
    if (!kVarlenCompiled || p.varlen.cu_seqlens_q == nullptr) return locate_dense(p, order, tile);
    const int heads = p.shape.heads;
    for (; batch < p.shape.batch; ++batch) {
      const int m_blocks = ceil_div(SequenceView::query_length(p, batch), kBlockM);
      const int local = tile - first_tile;
      if (local < m_blocks * heads) return QueryTileCoord{m_blocks - 1 - local % m_blocks, local / m_blocks, batch};
      first_tile += m_blocks * heads;
    }
    return QueryTileCoord::end();
  }

 private:
  __device__ __forceinline__ static QueryTileCoord locate_dense(const FwdParams& p, const QueryTileOrder& order, int tile) {
    const int m_blocks = ceil_div(p.shape.seqlen_q, kBlockM), pairs = p.shape.batch * p.shape.heads;
    if (tile >= m_blocks * pairs) return QueryTileCoord::end();
    int pair, m_block;
    if (order.group_pairs > 0) {
      int group, in_group, rank, in_rank;
      order.group_tiles.divmod(tile, group, in_group);
      const bool last = group == order.groups - 1;
      (last ? order.last_group_size : order.group_size).divmod(in_group, rank, in_rank);  // rank 0: heaviest
      const bool heaviest_first = ((order.groups - 1 - group) & 1) == 0;  // the last group, then every other one
      pair = group * order.group_pairs + in_rank;
      m_block = heaviest_first ? m_blocks - 1 - rank : rank;
    } else {
      int reversed;
      order.m_blocks.divmod(tile, pair, reversed);
      m_block = m_blocks - 1 - reversed;
    }
    int batch, head;
    order.heads.divmod(pair, batch, head);
    return QueryTileCoord{m_block, head, batch};
  }
};

// The group size of the heaviest-first order: whole strides of the persistent grid (a stride is
// `ctas` tiles, ctas / (query blocks per pair) pairs, at least 1), `strides` of them where > 0,
// else as many as have keys and values within kL2Budget bytes (at least one), their query heads'
// shares of GQA K/V heads counted whole (an over-estimate). Half of an H100's / H200's 50 MB L2:
// the rest holds Q, O and the neighbouring group's keys. Whole strides give every CTA the same
// number of tiles of each group, so with the groups alternating direction two neighbouring groups
// give each CTA a heavy and a light part. Groups of the L2 budget alone (up to ~3 strides, not
// whole) left the slowest CTA 13-17% above the mean at hd 256 (80-key steps) from 512 to 8k keys,
// and the hd 256 causal forward at 512 keys read 307 MB from DRAM for its 201 MB of Q, K and V
// (benchmarks/experiments/stride_model.py, benchmarks/NOTES.md v23).
constexpr int64_t kL2Budget = 24ll << 20;
template <int kBlockM>
inline int heaviest_first_group_pairs(const FwdParams& p, int ctas, int strides = 0) {
  const int64_t pair_bytes = static_cast<int64_t>(p.shape.seqlen_k) * p.shape.headdim * 2 * 2;
  const int64_t pairs = static_cast<int64_t>(p.shape.batch) * p.shape.heads;
  const int64_t m_blocks = ceil_div(p.shape.seqlen_q, kBlockM);
  const int64_t stride_pairs = m_blocks > 0 && ctas >= m_blocks ? ctas / m_blocks : 1;
  const int64_t fit = pair_bytes > 0 ? kL2Budget / pair_bytes : pairs;
  const int64_t whole = strides > 0 ? strides : fit / stride_pairs > 1 ? fit / stride_pairs : 1;
  const int64_t group = stride_pairs * whole;
  return static_cast<int>(group > pairs ? pairs : group);
}

// The order's parameters for `params`: heaviest first in groups of `group_pairs` pairs where > 0
// (dense batches with a causal mask or a window), else natural.
template <int kBlockM>
inline QueryTileOrder make_query_tile_order(const FwdParams& p, int group_pairs) {
  const int pairs = p.shape.batch * p.shape.heads;
  QueryTileOrder order{};
  const int m_blocks = std::max(ceil_div(p.shape.seqlen_q, kBlockM), 1);  // with no blocks no tile divides
  order.m_blocks = FastDivmod(m_blocks);
  order.heads = FastDivmod(p.shape.heads);
  if (group_pairs > 0 && pairs > 0) {
    order.group_pairs = group_pairs;
    order.groups = ceil_div(pairs, group_pairs);
    order.group_tiles = FastDivmod(group_pairs * m_blocks);
    order.group_size = FastDivmod(group_pairs);
    order.last_group_size = FastDivmod(pairs - (order.groups - 1) * group_pairs);
  }
  return order;
}

}  // namespace flash
