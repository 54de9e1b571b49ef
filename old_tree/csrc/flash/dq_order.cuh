// deterministic=True: the key blocks that see one query block add their dQ into its dq_accum tile
// one after the other, in a fixed order, so the float sums (and dq) are bitwise reproducible.
//
// The order follows the order in which the blocks reach the tile, and a block only ever waits for
// one launched before it (lower blockIdx.x), so the wait cannot deadlock however few CTAs are
// resident. Three walks:
// - descending (a bounded right window: causal): a key block walks its query blocks upwards from
//   the first that sees it, so the later key blocks reach a tile first and go first; the grid runs
//   the key blocks in reverse.
// - staggered (no window): every key block sees every query block, and key block j walks them
//   starting at query block (-j) mod M (M query blocks): it reaches query block m at step
//   (m + j) mod M, so in step i the key blocks are on different tiles (all of them when N <= M key
//   blocks) and a block's turn is ready when it arrives. Sorting by
//   arrival makes the order cyclic in j, which would wait on later launches; it is cut into laps
//   instead: lap L = (m + j) / M holds consecutive key blocks that arrive one step apart, and lap L
//   adds into slice L % dq_slices. Within a lap, key block j waits for j - 1, which got there a
//   step earlier. A lap whose slice already served an earlier lap (more laps than slices: seqlen_k
//   beyond (dq_slices - 1) x seqlen_q) waits for that lap's last block, a stall of up to a pass.
//   Measured against the ascending walk (H100, benchmarks/NOTES.md v11): deterministic / default
//   0.77 -> 0.80 at hd 64 (2k tokens), 0.81 -> 0.82 at hd 128 (2k), unchanged at hd 128 (8k); the
//   start lag was not most of the cost.
// - ascending (a bounded left window only): all key blocks start at query block 0; position j
//   adds into slice j % dq_slices, as turn j / dq_slices of that slice's chain, so the last key
//   block of a chain starts (chain length - 1) adds late. Before the staggered walk, non-causal
//   calls ran this way: hd 128 at 8k tokens ran at 0.69x of the default backward with one slice
//   and 0.77x with four (H100, benchmarks/NOTES.md v8).
// The first turn of a slice writes the tile instead of adding to it (no zeroing pass over the
// slices), and one counter per (slice, batch, head, kMinBwdBlockM rows), zeroed by the preprocess,
// counts the adds done: a key block waits until it equals its turn, adds, and releases turn + 1;
// the convert pass sums the slices in slice order, reading a slice's rows only where its counter
// is not 0.
#pragma once

#include "arch/arch.cuh"
#include "common.cuh"
#include "mask.cuh"
#include "params.h"

namespace flash {

struct DqOrder {
  enum Walk { kAscending, kDescending, kStaggered };
  Walk walk;

  __device__ __forceinline__ static DqOrder of(const FwdParams& p) {
    return DqOrder{staggered_dq_walk(p.window.left, p.window.right) ? kStaggered
                   : p.window.right >= 0                                 ? kDescending
                                                                         : kAscending};
  }

  // The key block a CTA owns: blockIdx.x, reversed when the order is descending.
  __device__ __forceinline__ int key_block(const BwdParams& p) const {
    return p.dq_semaphore != nullptr && walk == kDescending ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  }

  // The step at which key block n_block starts its walk over query blocks [m_first, m_first +
  // count): 0, or (-n_block) mod count when staggered (then m_first is 0 and count is M).
  __device__ __forceinline__ int walk_rotation(const BwdParams& p, int n_block, int count) const {
    if (p.dq_semaphore == nullptr || walk != kStaggered || count <= 0) return 0;
    const int r = n_block % count;
    return r == 0 ? 0 : count - r;
  }
};

// Counter of (slice, batch, head, unit of kMinBwdBlockM query rows).
__device__ __forceinline__ int64_t dq_counter_index(const AttentionShape& shape, int slice, int batch, int head,
                                                    int unit) {
  const int64_t units = dq_counter_units(shape.seqlen_q);
  return ((static_cast<int64_t>(slice) * shape.batch + batch) * shape.heads + head) * units + unit;
}

template <int kBlockM, int kBlockN>
struct DqTurn {
  static constexpr int kCounterRows = kBlockM / kMinBwdBlockM;  // counters per query block
  static_assert(kBlockM % kMinBwdBlockM == 0 && kBlockM <= kMaxBwdBlockM, "whole counters per query block, "
                "inside dq_counter_units");
  static_assert(kBlockN >= kBlockM, "dq_slice_count bounds the staggered walk's laps with kBlockN >= kBlockM");
  int* counter;  // null: not deterministic
  int turn;
  int slice;

  // Key block n_block's turn at query block m_block of (batch, head).
  __device__ __forceinline__ static DqTurn of(const BwdParams& p, const DqOrder& order, const AttentionMask& mask,
                                              int batch, int head, int m_block, int n_block) {
    DqTurn t{nullptr, 0, 0};
    if (p.dq_semaphore == nullptr) return t;
    const int m0 = m_block * kBlockM;
    if (order.walk == DqOrder::kStaggered) {
      staggered_turn(t, p.dq_slices, ceil_div(mask.seqlen_q, kBlockM), m_block, n_block);
    } else {
      const int rows = min(kBlockM, mask.seqlen_q - m0);
      const int n_begin = mask.kv_begin(m0) / kBlockN, n_end = ceil_div(mask.kv_end(m0, rows), kBlockN);
      const int position = order.walk == DqOrder::kDescending ? n_end - 1 - n_block : n_block - n_begin;
      t.slice = position % p.dq_slices;
      t.turn = position / p.dq_slices;
    }
    t.counter = p.dq_semaphore + dq_counter_index(p.fwd.shape, t.slice, batch, head, m0 / kMinBwdBlockM);
    return t;
  }

  // The staggered walk's slice and turn of key block j at query block m (of M): lap L = (m + j) / M
  // holds key blocks [max(0, L M - m), (L + 1) M - m), and its slice L % slices served the laps
  // L - slices, L - 2 slices, ... before it: full laps of M blocks, except lap 0 of M - m.
  __device__ __forceinline__ static void staggered_turn(DqTurn& t, int slices, int query_blocks, int m, int j) {
    const int u = m + j, lap = u / query_blocks;
    const int earlier_laps = lap / slices;  // of this slice
    const bool lap0_among_them = earlier_laps > 0 && lap % slices == 0;
    t.slice = lap % slices;
    t.turn = earlier_laps * query_blocks - (lap0_among_them ? m : 0) + (lap == 0 ? j : u - lap * query_blocks);
  }

  // This turn's slice of dq_accum; whether it writes the tile rather than adding to it.
  __device__ __forceinline__ float* accum(const BwdParams& p) const { return p.dq_accum + slice * p.dq_slice_stride; }
  __device__ __forceinline__ bool writes() const { return counter != nullptr && turn == 0; }

  // One thread: wait for the earlier blocks' adds.
  __device__ __forceinline__ void wait() const {
    if (counter != nullptr) arch::wait_until_equal(counter, turn);
  }
  // One thread, once this block's adds are complete and visible to it (sm80: after every thread's
  // fence and a barrier; sm90: after the bulk group completed and the async-proxy fence): let the
  // next block add. The release store orders them before the counter.
  __device__ __forceinline__ void release() const {
    if (counter == nullptr) return;
#pragma unroll
    for (int r = 0; r < kCounterRows; ++r) arch::release_store(counter + r, turn + 1);
  }
};

}  // namespace flash
