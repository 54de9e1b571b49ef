// Dropout keep masks drawn ahead by spare warps into shared memory, for kernels whose math warps
// would otherwise run Philox between their MMAs (the warp-specialized Hopper forward: the producer
// warpgroup's three warps that issue no TMA).
//
// A slot holds one block's masks (kRowWarps math warps of 16 query rows x kBlockN keys), the words
// each math lane would draw itself with dropout_keep_masks_fwd<1, kBlockN / 8>, laid out as
// [32-key tile][row warp][lane] of 16 bytes: a math warp reads 512 contiguous bytes per tile and
// the drawing warps write them the same way, both without bank conflicts. The math lane's work
// per element drops from Philox plus the threshold test (~3.5 instructions per score, v8's count)
// to a 16-byte load per 16 scores and the byte permute and AND of drop_packed_probs.
// The kernel owns the slots and their barriers; this file only says what a slot holds.
#pragma once

#include <cstdint>

#include "dropout.cuh"

namespace flash {

template <int kRowWarps, int kBlockN>
struct DropoutMasksAhead {
  static constexpr int kKeyTiles = kBlockN / kDropoutTileKeys;
  static constexpr int kCalls = kKeyTiles * kRowWarps * 32;  // one Philox call per 16 bytes
  static constexpr int kSlotBytes = kCalls * 16;
  static_assert(kBlockN % kDropoutTileKeys == 0, "whole 32-key dropout tiles");

  // Draws the block whose first query is row0 (a multiple of 16, the block's first row warp) and
  // first key col0 (a multiple of 32) into `slot`; `thread` of `threads` drawing threads, each
  // running kLockstep Philox calls at once: a call is a chain of dependent multiplies, so one call
  // at a time leaves a drawing warp waiting on that chain's latency. Calls past the block's last
  // are clamped to it (the same 16 bytes stored twice) rather than skipped: a guarded store lets
  // the compiler move each call's whole chain under its own branch, one after the other (SASS).
  template <int kLockstep>
  __device__ __forceinline__ static void draw(const Dropout& d, int row0, int col0, uint4* slot, int thread,
                                              int threads) {
    for (int first = thread; first < kCalls; first += kLockstep * threads) {
      uint4 counters[kLockstep];
      int calls[kLockstep];
#pragma unroll
      for (int j = 0; j < kLockstep; ++j) {
        const int call = min(first + j * threads, kCalls - 1);
        const int lane = call % 32, row_warp = (call / 32) % kRowWarps, tile = call / (32 * kRowWarps);
        calls[j] = call;
        counters[j] = d.tile_counter(row0 / kDropoutTileQueries + row_warp, col0 / kDropoutTileKeys + tile, lane);
      }
      d.tile_bytes(counters);
#pragma unroll
      for (int j = 0; j < kLockstep; ++j) slot[calls[j]] = keep_byte_masks(counters[j], d.keep_threshold);
    }
  }

  // The masks of math warp row_warp (rows row0 + 16 row_warp..) for lane `lane`.
  __device__ __forceinline__ static DropoutKeepMasks<1, kBlockN / 8> load(const uint4* slot, int row_warp,
                                                                          int lane) {
    DropoutKeepMasks<1, kBlockN / 8> out;
#pragma unroll
    for (int tile = 0; tile < kKeyTiles; ++tile) out.masks[0][tile] = slot[(tile * kRowWarps + row_warp) * 32 + lane];
    return out;
  }
};

}  // namespace flash
