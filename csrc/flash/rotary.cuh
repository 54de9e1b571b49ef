// Rotary position embedding of one row (a token of one head) in 16-byte pieces of 8 elements
// (params.h, RotaryArgs). Rotated pairs (a, b) become (a cos - b sin, a sin + b cos), computed in
// fp32 with each product and sum rounded on its own (no FMA): the same arithmetic as
// flash_attn.layers.rotary, so the cache contents match the reference bit for bit.
#pragma once

#include <cstdint>

#include "arch/arch.cuh"
#include "params.h"

namespace flash {

constexpr int kRotaryPiece = 8;  // elements per 16-byte piece

template <typename T>
union Piece {
  uint4 bits;
  T x[kRotaryPiece];
};

template <typename T>
__device__ __forceinline__ Piece<T> load_piece(const T* p) {
  Piece<T> piece;
  piece.bits = *reinterpret_cast<const uint4*>(p);
  return piece;
}

template <typename T>
__device__ __forceinline__ void store_piece(T* p, const Piece<T>& piece) {
  *reinterpret_cast<uint4*>(p) = piece.bits;
}

template <typename T>
__device__ __forceinline__ void rotate_pair(T& a, T& b, T cos_t, T sin_t) {
  const float x = arch::to_float(a), y = arch::to_float(b), c = arch::to_float(cos_t), s = arch::to_float(sin_t);
  a = arch::from_float<T>(__fsub_rn(__fmul_rn(x, c), __fmul_rn(y, s)));
  b = arch::from_float<T>(__fadd_rn(__fmul_rn(x, s), __fmul_rn(y, c)));
}

// Writes piece `piece` of row src (headdim elements) to dst, rotated where it lies in the first
// rotary_dim features (cos_row / sin_row: the rows of cos / sin at the token's position, null when
// rotary is off). Non-interleaved pairs live in two pieces (i and i + rotary_dim / 16): the lower
// piece's call writes both and the upper piece's call writes nothing.
template <typename T>
__device__ __forceinline__ void rotate_piece(T* dst, const T* src, int piece, const T* cos_row, const T* sin_row,
                                             const RotaryArgs& r) {
  const int col = piece * kRotaryPiece;
  if (cos_row == nullptr || col >= r.rotary_dim) {
    store_piece(dst + col, load_piece(src + col));
    return;
  }
  if (r.interleaved) {  // pairs (2i, 2i + 1) inside the piece, angles col / 2 ..
    Piece<T> x = load_piece(src + col);
#pragma unroll
    for (int i = 0; i < kRotaryPiece / 2; ++i)
      rotate_pair(x.x[2 * i], x.x[2 * i + 1], arch::load_global(cos_row + col / 2 + i),
                  arch::load_global(sin_row + col / 2 + i));
    store_piece(dst + col, x);
    return;
  }
  const int half = r.rotary_dim / 2;
  if (col >= half) return;
  Piece<T> lo = load_piece(src + col), hi = load_piece(src + col + half);
#pragma unroll
  for (int i = 0; i < kRotaryPiece; ++i)
    rotate_pair(lo.x[i], hi.x[i], arch::load_global(cos_row + col + i), arch::load_global(sin_row + col + i));
  store_piece(dst + col, lo);
  store_piece(dst + col + half, hi);
}

}  // namespace flash
