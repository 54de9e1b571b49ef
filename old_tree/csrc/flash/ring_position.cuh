// Where step i of a kernel's walk sits in an mbarrier-guarded ring of kSlots slots (the
// warp-specialized kernels' K/V and Q/dO rings): slot i % kSlots, and the parity of the slot's
// barrier phase, which flips every round of the ring.
#pragma once

#include <cstdint>

namespace flash {

template <int kSlots>
struct RingPosition {
  int slot;
  uint32_t parity;
  __device__ __forceinline__ explicit RingPosition(int i) : slot(i % kSlots), parity((i / kSlots) & 1) {}
};

}  // namespace flash
