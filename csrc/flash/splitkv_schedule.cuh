// The scheduler piece of the split-KV decode kernel: which packed query rows and which key steps a
// CTA owns. Grid (m block x split, KV head, batch).
//
// GQA packing: the `group` query heads that share KV head hk are stacked into one tile of rows, so
// K/V are read once per KV head: packed row r is token r / group of query head hk * group + r % group.
// Key steps (kWarpKeys keys each) cover the keys the block's tokens can see (mask.cuh), so windows
// and causal skip whole steps. They are dealt round-robin: step j of the visible range goes to
// split (j / kWarps) % num_splits, warp j % kWarps, so at any moment all CTAs of a (batch, KV head)
// read neighbouring rows (whole DRAM pages, shared with the other KV heads' CTAs) and every split
// has work whatever the cache lengths are. (Until v20 each warp started its walk at a round that
// depended on the batch entry, tried against DRAM bank conflicts between equally long caches; it
// measured no effect on H100 (benchmarks/NOTES.md v6) and cost two integer divisions per step.)
#pragma once

#include "common.cuh"
#include "kvcache_view.cuh"
#include "mask.cuh"
#include "params.h"
#include "splitkv_heuristic.h"

namespace flash {

struct PackedQueryRows {
  int group;        // query heads per KV head
  int head_k;
  int row0;         // first packed row of the block
  int rows;         // packed rows of the block inside [0, seqlen_q * group)
  int token_first;  // tokens [token_first, token_first + token_count) hold the block's valid rows
  int token_count;

  __device__ __forceinline__ int token(int r) const { return (row0 + r) / group; }
  __device__ __forceinline__ int head(int r) const { return head_k * group + (row0 + r) % group; }
};

template <int kRows, int kWarpKeys, int kWarps>
struct SplitKvBlock {
  static_assert(kRows == kSplitKvRows, "the op chooses num_splits for kSplitKvRows rows per CTA");

  int batch;
  int split;
  PackedQueryRows q;
  KvCacheView cache;
  AttentionMask mask;  // over tokens (queries) and attended keys
  int num_splits;
  int first_step;      // visible key steps [first_step, first_step + steps); step n holds keys
  int steps;           //   [n * kWarpKeys, (n + 1) * kWarpKeys) of the attended range

  // How many steps warp `warp` of this split walks.
  __device__ __forceinline__ int warp_step_count(int warp) const {
    const int offset = split * kWarps + warp, stride = num_splits * kWarps;
    return steps > offset ? ceil_div(steps - offset, stride) : 0;
  }

  // The first key of the warp's k-th step (k < warp_step_count(warp)).
  __device__ __forceinline__ int warp_step_keys(int warp, int k) const {
    return (first_step + (k * num_splits + split) * kWarps + warp) * kWarpKeys;
  }

  __device__ __forceinline__ static SplitKvBlock current(const SplitKvParams& p) {
    SplitKvBlock b;
    const AttentionShape& shape = p.fwd.shape;
    b.batch = blockIdx.z;
    b.split = blockIdx.x % p.num_splits;
    b.q.group = shape.heads / shape.heads_k;
    b.q.head_k = blockIdx.y;
    b.q.row0 = blockIdx.x / p.num_splits * kRows;
    b.q.rows = min(kRows, shape.seqlen_q * b.q.group - b.q.row0);
    b.q.token_first = b.q.row0 / b.q.group;
    b.q.token_count = (b.q.row0 + b.q.rows - 1) / b.q.group - b.q.token_first + 1;
    b.cache = KvCacheView::of(p.cache, b.batch);
    b.mask = AttentionMask::of(shape.seqlen_q, b.cache.seqlen_k, p.fwd.window);
    const int key_begin = b.mask.kv_begin(b.q.token_first);
    const int key_end = b.mask.kv_end(b.q.token_first, b.q.token_count);
    b.num_splits = p.num_splits;
    b.first_step = key_begin / kWarpKeys;
    b.steps = key_end > key_begin ? ceil_div(key_end, kWarpKeys) - b.first_step : 0;
    return b;
  }
};

}  // namespace flash
