// The forward's scheduler (ARCHITECTURE.md's scheduler piece): which query tiles a CTA computes,
// in which order, and how a persistent CTA finds its next one. Torch-free and arch-neutral (warp
// primitives from the arch layer), for any kernel that walks query tiles.
//
// Linear tile order, whatever the grid: batch by batch, the heads of a batch, and a head's query
// blocks heaviest causal first (its last block first), so the tiles in flight at once share one
// head's keys in L2. A dense batch has ceil(seqlen_q / kBlockM) blocks per head; varlen batch b
// has ceil(len_q(b) / kBlockM), len_q clamped as SequenceView clamps it: the order is packed, with
// no tile past a sequence's end (a grid over max_seqlen_q leaves most of its CTAs empty when the
// lengths differ).
//
// How a CTA walks it: its first tile is blockIdx.x, then either
//   static:  tile + gridDim.x (a persistent grid over equal tiles, or a grid of one CTA per tile
//            that stops after one), or
//   dynamic: gridDim.x + the next value of a global counter (zeroed before the launch), taken by
//            whichever CTA is free first: uneven tiles (causal, windows, varlen) balance the way
//            the hardware's block dispatch balances a grid of one CTA per tile, while each CTA
//            keeps its pipeline running across tiles.
#pragma once

#include "arch/arch.cuh"
#include "common.cuh"
#include "params.h"
#include "sequence.cuh"

namespace flash {

// A query tile: query block m_block of (head, batch); batch < 0 past the last tile.
struct QueryTileCoord {
  int m_block, head, batch;
  __device__ __forceinline__ bool valid() const { return batch >= 0; }
  __device__ __forceinline__ static QueryTileCoord end() { return QueryTileCoord{0, 0, -1}; }
};

struct QueryTileScheduler {
  int* counter;  // dynamic: the global counter; null: static

  __device__ __forceinline__ int first() const { return static_cast<int>(blockIdx.x); }
  // The tile after `tile` (one thread asks; a dynamic answer is that thread's alone).
  __device__ __forceinline__ int next(int tile) const {
    if (counter == nullptr) return tile + static_cast<int>(gridDim.x);
    return static_cast<int>(gridDim.x) + atomicAdd(counter, 1);
  }
};

// Maps linear tile indices to coordinates. Dense: arithmetic. Varlen: a warp-wide prefix sum of
// the batches' tile counts, kWarpSize batches per load of cu_seqlens, from a cursor that only
// moves forward: a CTA's tiles come in increasing order, so a whole walk reads each entry of
// cu_seqlens about once.
template <int kBlockM>
struct QueryTileWalk {
  int batch = 0;       // the batch of the tile last located, where the next search starts
  int first_tile = 0;  // the linear index of that batch's first tile

  // Warp-collective: every lane passes the same tile, at least every earlier call's.
  // kMaybeVarlen false: dense at compile time (as in SequenceView::of).
  template <bool kMaybeVarlen>
  __device__ __forceinline__ QueryTileCoord locate(const FwdParams& p, int tile, int lane) {
    if (!kMaybeVarlen || !kVarlenCompiled || p.varlen.cu_seqlens_q == nullptr) return locate_dense(p, tile);
    const int heads = p.shape.heads;
    while (batch < p.shape.batch) {
      const int b = batch + lane;
      const int tiles = b < p.shape.batch ? ceil_div(SequenceView::query_length(p, b), kBlockM) * heads : 0;
      int inclusive = tiles;
#pragma unroll
      for (int delta = 1; delta < arch::kWarpSize; delta *= 2) {
        const int below = arch::shuffle_up(inclusive, delta);
        if (lane >= delta) inclusive += below;
      }
      const int past_b = first_tile + inclusive;  // the first tile after batch b's
      // The first lane whose batch ends after `tile` holds it (a batch without tiles never does:
      // it ends where the one before it ends).
      const int hit = arch::first_lane_where(tile < past_b);
      if (hit >= 0) {
        batch += hit;
        first_tile = arch::shuffle(past_b - tiles, hit);
        const int m_blocks = arch::shuffle(tiles, hit) / heads;
        const int local = tile - first_tile;
        return QueryTileCoord{m_blocks - 1 - local % m_blocks, local / m_blocks, batch};
      }
      first_tile = arch::shuffle(past_b, arch::kWarpSize - 1);
      batch += arch::kWarpSize;
    }
    return QueryTileCoord::end();
  }

 private:
  __device__ __forceinline__ static QueryTileCoord locate_dense(const FwdParams& p, int tile) {
    const int m_blocks = ceil_div(p.shape.seqlen_q, kBlockM);
    if (m_blocks <= 0) return QueryTileCoord::end();
    const int rest = tile / m_blocks;
    if (rest / p.shape.heads >= p.shape.batch) return QueryTileCoord::end();
    return QueryTileCoord{m_blocks - 1 - tile % m_blocks, rest % p.shape.heads, rest / p.shape.heads};
  }
};

}  // namespace flash
