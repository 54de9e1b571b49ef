// deterministic=True: the key blocks that see one query block add their dQ into its dq_accum tile
// one after the other, in a fixed order, so the float sums (and dq) are bitwise reproducible.
// One int counter per (batch, head, query block), zeroed by the launcher, counts the adds done;
// key block n waits until it equals n's turn, adds, and releases turn + 1.
//
// The order follows the order in which the blocks reach the tile: a key block walks its query
// blocks upwards from the first that sees it, so with a bounded right window (causal) the later
// key blocks reach a tile first and go first (descending); otherwise all start at query block 0
// and go ascending. The launch order matches (descending: the grid runs the key blocks in reverse),
// so a block only ever waits for one that was launched before it, and the wait cannot deadlock
// however few CTAs are resident.
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

template <int kBlockM, int kBlockN>
struct DqTurn {
  int* counter;  // null: not deterministic
  int turn;

  // Key block n_block's turn at query block m_block of (batch, head).
  __device__ __forceinline__ static DqTurn of(const BwdParams& p, const DqOrder& order, const AttentionMask& mask,
                                              int batch, int head, int m_block, int n_block) {
    DqTurn t{nullptr, 0};
    if (p.dq_semaphore == nullptr) return t;
    const int m0 = m_block * kBlockM, rows = min(kBlockM, mask.seqlen_q - m0);
    const int n_begin = mask.kv_begin(m0) / kBlockN, n_end = ceil_div(mask.kv_end(m0, rows), kBlockN);
    const int blocks_q = ceil_div(p.fwd.shape.seqlen_q, kBlockM);
    t.counter = p.dq_semaphore + (static_cast<int64_t>(batch) * p.fwd.shape.heads + head) * blocks_q + m_block;
    t.turn = order.descending ? n_end - 1 - n_block : n_block - n_begin;
    return t;
  }

  // One thread: wait for the earlier blocks' adds.
  __device__ __forceinline__ void wait() const {
    if (counter != nullptr) arch::wait_until_equal(counter, turn);
  }
  // One thread, once this block's adds are complete: let the next block add.
  __device__ __forceinline__ void release() const {
    if (counter == nullptr) return;
    __threadfence();
    arch::release_store(counter, turn + 1);
  }
};

}  // namespace flash
