// deterministic=True: the key blocks that see one query block add their dQ into its dq_accum tile
// one after the other, in a fixed order, so the float sums (and dq) are bitwise reproducible.
//
// The order follows the order in which the blocks reach the tile: a key block walks its query
// blocks upwards from the first that sees it, so with a bounded right window (causal) the later
// key blocks reach a tile first and go first (descending); otherwise all start at query block 0
// and go ascending. The launch order matches (descending: the grid runs the key blocks in reverse),
// so a block only ever waits for one that was launched before it, and the wait cannot deadlock
// however few CTAs are resident.
//
// Partial sums: position j in that order adds into slice j % dq_slices of dq_accum, as turn
// j / dq_slices of that slice's chain; the convert pass sums the slices in slice order. With all
// key blocks starting on query block 0 (non-causal), key block j waits for j - 1 on every query
// block, so the last key block of a chain starts (chain length - 1) adds late. Slices cut the
// chain by their count: at hd 128, 8k tokens on H100, one slice ran at 0.69x of the default
// backward and four at 0.77x (benchmarks/NOTES.md v8, runs 1 and 2). The first turn
// of a slice writes the tile instead of adding to it (no zeroing pass over the slices), and one
// counter per (slice, batch, head, kMinBwdBlockM rows), zeroed by the preprocess, counts the adds
// done: key block j waits until it equals its turn, adds, and releases turn + 1; the convert pass
// reads a slice's rows only where its counter is not 0.
#pragma once

#include "arch/arch.cuh"
#include "common.cuh"
#include "mask.cuh"
#include "params.h"

namespace flash {

struct DqOrder {
  bool descending;

  __device__ __forceinline__ static DqOrder of(const FwdParams& p) { return DqOrder{p.window.right >= 0}; }

  // The key block a CTA owns: blockIdx.x, reversed when the order is descending.
  __device__ __forceinline__ int key_block(const BwdParams& p) const {
    return p.dq_semaphore != nullptr && descending ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  }
};

// Counter of (slice, batch, head, unit of kMinBwdBlockM query rows).
__device__ __forceinline__ int64_t dq_counter_index(const AttentionShape& shape, int slice, int batch, int head,
                                                    int unit) {
  const int units = ceil_div(shape.seqlen_q, kMinBwdBlockM);
  return ((static_cast<int64_t>(slice) * shape.batch + batch) * shape.heads + head) * units + unit;
}

template <int kBlockM, int kBlockN>
struct DqTurn {
  static constexpr int kCounterRows = kBlockM / kMinBwdBlockM;  // counters per query block
  static_assert(kBlockM % kMinBwdBlockM == 0, "whole counters per query block");
  int* counter;  // null: not deterministic
  int turn;
  int slice;

  // Key block n_block's turn at query block m_block of (batch, head).
  __device__ __forceinline__ static DqTurn of(const BwdParams& p, const DqOrder& order, const AttentionMask& mask,
                                              int batch, int head, int m_block, int n_block) {
    DqTurn t{nullptr, 0, 0};
    if (p.dq_semaphore == nullptr) return t;
    const int m0 = m_block * kBlockM, rows = min(kBlockM, mask.seqlen_q - m0);
    const int n_begin = mask.kv_begin(m0) / kBlockN, n_end = ceil_div(mask.kv_end(m0, rows), kBlockN);
    const int position = order.descending ? n_end - 1 - n_block : n_block - n_begin;
    t.slice = position % p.dq_slices;
    t.turn = position / p.dq_slices;
    t.counter = p.dq_semaphore + dq_counter_index(p.fwd.shape, t.slice, batch, head, m0 / kMinBwdBlockM);
    return t;
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
