// The backward's register-resident operands, for an LDS budget that cannot hold K, V, P^T and dS^T
// next to Q and dO (CDNA's 64 KiB): V as the A operand of dP^T = V.dO^T, loaded once per CTA, and
// P^T as the A operand of dV += P^T.dO, converted from the score accumulators without a trip
// through shared memory, as FlashAttention 2's Is_V_in_regs and Mma_dKV_is_RS options do. A config
// opts in with kVInRegisters / kPtInRegisters (BwdConfigVPInRegisters, bwd_kernel.cuh); for the
// others these types are empty.
#pragma once

#include "arch/arch.cuh"

namespace flash {

// V's rows of this warp's score-phase tile over its head-dim slice (Cfg::ScoreSplit: the whole head
// dim unless waves share the tile), (kAtomM*kMT keys x ScoreSplit::kDims), as register A operands,
// one per k-step.
template <typename T, typename Cfg, bool = Cfg::kVInRegisters>
struct VOperands {};

template <typename T, typename Cfg>
struct VOperands<T, Cfg, true> {
  static constexpr int kMT = Cfg::ScoreGrid::kMT, kKSteps = Cfg::ScoreSplit::kKSteps;
  arch::AFragment<T> a[kMT][kKSteps];

  // From V stored (kBlockN, kStride) in shared memory: rows key0.., columns dim0.. of it.
  __device__ __forceinline__ void load(const T* sV, int key0, int dim0, int lane) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks)
        arch::load_a_fragment<arch::Layout::kRowMajorMK>(a[mt][ks], sV, Cfg::kStride, key0 + mt * arch::kAtomM,
                                                         dim0 + ks * arch::kAtomK, lane);
  }
};

// P^T of this warp's score tile, (kAtomM*kMT keys x kBlockM queries), as register A operands of
// dV += P^T.dO, one per k-step of queries.
template <typename T, typename Cfg, bool = Cfg::kPtInRegisters>
struct PtOperands {};

template <typename T, typename Cfg>
struct PtOperands<T, Cfg, true> {
  arch::AFragment<T> a[Cfg::ScoreGrid::kMT][Cfg::kBlockM / arch::kAtomK];
};

}  // namespace flash
