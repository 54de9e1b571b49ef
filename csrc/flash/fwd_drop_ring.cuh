// Dropout's drop tests for the warp-specialized Hopper forward (fwd_kernel_sm90_ws.cuh), drawn off
// the math warpgroups' critical path (issue #8). In the ping-pong a math warpgroup's softmax must
// finish while the tensor core runs the other one's MMAs; drawing its Philox calls there too cost
// the forward +38% with dropout (benchmarks/NOTES.md v16-v18). Here the producer warpgroup's three
// spare warps (warp 0's lane 0 issues the TMA loads) draw them into a ring of kStages slots that
// turns with K's: slot RingPosition(ring + i) holds step i's tests of every math warp, guarded by
// a "full" mbarrier (every drawing thread arrived) and an "empty" one (every math warp took its
// tests). The draws are those of drop_tests_fwd (dropout.cuh), one 32-column pair of dropout tiles
// at a time: a drawing warp computes, lane for lane, what the math warp's lanes would, so the
// pair exchange between lanes L and L ^ 4 happens inside it just the same.
// Slot layout: [math warp][column pair][lane] uint4 = words (tile 2 * pair: 0, 1; tile 2 * pair +
// 1: 0, 1) of FwdDropTests, so a warp takes a pair with one 512-byte conflict-free load.
#pragma once

#include <cstdint>

#include "arch/sm90_tma.cuh"
#include "dropout.cuh"
#include "ring_position.cuh"

namespace flash {

constexpr int kFwdDropWarps = 3;  // the producer warpgroup's warps 1..3

// The drawing warp drop_warp (0..kFwdDropWarps-1), one tile: for each step i (key block n_last - i)
// once its slot is free, the tests of math warps drop_warp, + kFwdDropWarps, ... (rows m0 + 16 w
// of the tile), then its arrival on the slot's full barrier.
template <typename Cfg, typename Smem>
__device__ __forceinline__ void draw_fwd_tile_drop_tests(const Smem& s, const Dropout& dropout, int m0, int n_last,
                                                          int n_blocks, int ring, int drop_warp, int lane) {
  constexpr int kPairs = Cfg::kBlockN / 32, kMathWarps = Cfg::kConsumers * 4;
  for (int i = 0; i < n_blocks; ++i) {
    const RingPosition<Cfg::kStages> at(ring + i);
    arch::mbarrier_wait_parity(s.drop_empty(at.slot), at.parity ^ 1);
    uint4* slot = s.drop_slot(at.slot);
    const int n0 = (n_last - i) * Cfg::kBlockN;
    for (int warp = drop_warp; warp < kMathWarps; warp += kFwdDropWarps) {
#pragma unroll 1
      for (int pair = 0; pair < kPairs; ++pair) {
        const FwdDropTests<1, 4> t = drop_tests_fwd<1, 4>(dropout, m0 + 16 * warp, n0 + 32 * pair, lane);
        slot[(warp * kPairs + pair) * arch::kWarpSize + lane] =
            make_uint4(t.words[0][0][0], t.words[0][0][1], t.words[0][1][0], t.words[0][1][1]);
      }
    }
    arch::mbarrier_arrive(s.drop_full(at.slot));
  }
}

// Math warp `warp` (16 w is its first row in the tile) at ring position `position`: waits for its
// tests, takes them, and (once every lane has) hands its share of the slot back.
template <typename Cfg, typename Smem>
__device__ __forceinline__ FwdDropTests<1, Cfg::kBlockN / 8> take_fwd_drop_tests(const Smem& s, int position, int warp,
                                                                                 int lane) {
  constexpr int kPairs = Cfg::kBlockN / 32;
  const RingPosition<Cfg::kStages> at(position);
  arch::mbarrier_wait_parity(s.drop_full(at.slot), at.parity);
  const uint4* slot = s.drop_slot(at.slot);
  FwdDropTests<1, Cfg::kBlockN / 8> tests;
#pragma unroll
  for (int pair = 0; pair < kPairs; ++pair) {
    const uint4 v = slot[(warp * kPairs + pair) * arch::kWarpSize + lane];
    tests.words[0][2 * pair][0] = v.x;
    tests.words[0][2 * pair][1] = v.y;
    tests.words[0][2 * pair + 1][0] = v.z;
    tests.words[0][2 * pair + 1][1] = v.w;
  }
  __syncwarp();
  if (lane == 0) arch::mbarrier_arrive(s.drop_empty(at.slot));
  return tests;
}

}  // namespace flash
