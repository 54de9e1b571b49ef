// Shared-memory operand views for the warp GEMMs (sm80_gemm.cuh, cdna_gemm.cuh): where element
// (row, col) of a tile sits, col a multiple of 8 (the start of a 16-byte chunk, the unit every
// fragment load reads). The (pointer, stride) arguments of the GEMMs are a PaddedTile; the Hopper
// decode reads TMA-filled tiles through SwizzledTileView (sm90_swizzled_tile.cuh).
#pragma once

namespace flash {
namespace arch {

// Row-major with a padded row stride (elements).
template <typename T>
struct PaddedTile {
  using Element = T;
  const T* ptr;
  int stride;

  __device__ __forceinline__ const T* chunk(int row, int col) const { return ptr + row * stride + col; }
};

}  // namespace arch
}  // namespace flash
