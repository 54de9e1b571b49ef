// The backward's score tiles (S^T = K.Q^T and dP^T = V.dO^T, keys x queries) split over waves by
// head dim, for a step with fewer score atoms than waves (CDNA at hd 192 and 256, BwdConfigDimSplit
// in bwd_kernel.cuh: 64 KiB of LDS holds one 32 x 32 score tile per step, and 2 waves split dK and
// dV by head dim). The head dim is the k of both products: kWarpsAlongDims waves compute the same
// tile over their own slices of it, and the partial products are summed in shared memory by the
// wave of slice 0, which alone goes on to P^T and dS^T. With one wave per tile (every other
// config) there is nothing to sum.
#pragma once

#include "arch/arch.cuh"

namespace flash {

template <int kHeadDim, int kWarpsAlongDims_>
struct ScoreDimSplit {
  static constexpr int kWarpsAlongDims = kWarpsAlongDims_;
  static constexpr int kDims = kHeadDim / kWarpsAlongDims;  // head dims (k) of each wave's products
  static constexpr int kKSteps = kDims / arch::kAtomK;
  static_assert(kDims % arch::kAtomK == 0, "whole k-steps per slice");

  // The waves of one tile are consecutive: tile t is computed by waves t * kWarpsAlongDims + slice.
  __device__ __forceinline__ static int slice(int warp) { return warp % kWarpsAlongDims; }
  __device__ __forceinline__ static int dim0(int warp) { return slice(warp) * kDims; }
  // The wave's index in the score phase's WarpGrid (whose waves are the tiles).
  __device__ __forceinline__ static int tile_warp(int warp) { return warp / kWarpsAlongDims; }
  // The wave that sums its tile's partial products and finishes P^T and dS^T.
  __device__ __forceinline__ static bool finishes(int warp) { return slice(warp) == 0; }

  // Shared memory for the partial products of `tiles` score tiles of (kAtomM*MT x kAtomN*NT):
  // S^T and dP^T of every slice but the first, fp32.
  template <int MT, int NT>
  static constexpr int partial_bytes(int tiles) {
    return tiles * (kWarpsAlongDims - 1) * 2 * MT * NT * arch::kAccRegs * arch::kWarpSize * 4;
  }
};

// One wave's fp32 fragment (kAtomM*MT x kAtomN*NT) in shared memory, 4 registers per lane at a time,
// the lanes side by side: lane L's registers 4g..4g+3 at floats (g * kWarpSize + L) * 4 (16-byte
// LDS accesses).
static_assert(arch::kAccRegs % 4 == 0, "whole groups of 4 accumulator registers");
template <int NT>
__device__ __forceinline__ int fragment_float(int mt, int nt, int r, int lane) {
  const int group = (mt * NT + nt) * arch::kAccRegs / 4 + r / 4;
  return (group * arch::kWarpSize + lane) * 4 + r % 4;
}

template <int MT, int NT>
__device__ __forceinline__ void store_fragment(float* dst, const float (&c)[MT][NT][arch::kAccRegs], int lane) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int r = 0; r < arch::kAccRegs; ++r) dst[fragment_float<NT>(mt, nt, r, lane)] = c[mt][nt][r];
}

// c += the fragment store_fragment wrote at src.
template <int MT, int NT>
__device__ __forceinline__ void add_fragment(float (&c)[MT][NT][arch::kAccRegs], const float* src, int lane) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int r = 0; r < arch::kAccRegs; ++r) c[mt][nt][r] += src[fragment_float<NT>(mt, nt, r, lane)];
}

// S^T and dP^T of this wave's tile, summed over the waves that share it: each wave past slice 0
// leaves its partial products in `partials` (Split::partial_bytes of every tile), a barrier, and
// slice 0 adds them to its own. Every wave of the CTA calls it (the barrier); afterwards only the
// Split::finishes waves hold whole tiles.
template <typename Split, int MT, int NT>
__device__ __forceinline__ void sum_score_partials(float (&scores_t)[MT][NT][arch::kAccRegs],
                                                   float (&dprobs_t)[MT][NT][arch::kAccRegs], float* partials,
                                                   int warp, int lane) {
  constexpr int kFragmentFloats = MT * NT * arch::kAccRegs * arch::kWarpSize;
  constexpr int kSlicesSummed = Split::kWarpsAlongDims - 1;
  // (tile, slice - 1, S^T / dP^T) fragments
  float* tile_partials = partials + Split::tile_warp(warp) * kSlicesSummed * 2 * kFragmentFloats;
  const int slice = Split::slice(warp);
  if (slice > 0) {
    store_fragment(tile_partials + (slice - 1) * 2 * kFragmentFloats, scores_t, lane);
    store_fragment(tile_partials + ((slice - 1) * 2 + 1) * kFragmentFloats, dprobs_t, lane);
  }
  __syncthreads();
  if (slice == 0) {
#pragma unroll
    for (int s = 0; s < kSlicesSummed; ++s) {
      add_fragment(scores_t, tile_partials + s * 2 * kFragmentFloats, lane);
      add_fragment(dprobs_t, tile_partials + (s * 2 + 1) * kFragmentFloats, lane);
    }
  }
}

}  // namespace flash
