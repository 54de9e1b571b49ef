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

// A piece is handled as four 32-bit words of two elements each (element 2i in the low half of word
// i), never as an array of elements: gfx90a's LLVM 15 kept such an array (a union with uint4) in
// scratch memory, in both kernels that rotate (hip/check_isa.py rejects scratch).
template <typename T>
__device__ __forceinline__ uint4 load_piece(const T* p) {
  return *reinterpret_cast<const uint4*>(p);
}

template <typename T>
__device__ __forceinline__ void store_piece(T* p, uint4 piece) {
  *reinterpret_cast<uint4*>(p) = piece;
}

// f(word, word index) for the four words of a piece; f(word of a, word of b, word index) for two.
template <typename F>
__device__ __forceinline__ void for_each_word(uint4& a, F&& f) {
  f(a.x, 0);
  f(a.y, 1);
  f(a.z, 2);
  f(a.w, 3);
}

template <typename F>
__device__ __forceinline__ void for_each_word(uint4& a, uint4& b, F&& f) {
  f(a.x, b.x, 0);
  f(a.y, b.y, 1);
  f(a.z, b.z, 2);
  f(a.w, b.w, 3);
}

// (x, y) -> (x cos - y sin, x sin + y cos), each product and sum rounded on its own.
template <typename T>
__device__ __forceinline__ void rotate_pair(float& x, float& y, T cos_t, T sin_t) {
  const float c = arch::to_float(cos_t), s = arch::to_float(sin_t);
  const float rotated_x = __fsub_rn(__fmul_rn(x, c), __fmul_rn(y, s));
  y = __fadd_rn(__fmul_rn(x, s), __fmul_rn(y, c));
  x = rotated_x;
}

// Rows of cos / sin at a rotary position, clamped below seqlen_ro; nulls when rotary is off.
template <typename T>
__device__ __forceinline__ void rotary_rows(const RotaryArgs& r, int position, const T*& cos_row, const T*& sin_row) {
  if (r.cos == nullptr) {
    cos_row = sin_row = nullptr;
    return;
  }
  const int64_t row = min(max(position, 0), r.seqlen_ro - 1) * static_cast<int64_t>(r.rotary_dim / 2);
  cos_row = static_cast<const T*>(r.cos) + row;
  sin_row = static_cast<const T*>(r.sin) + row;
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
  if (r.interleaved) {  // pairs (2i, 2i + 1): word i, angle col / 2 + i
    uint4 x = load_piece(src + col);
    for_each_word(x, [&](uint32_t& word, int i) {
      float a, b;
      arch::unpack_pair<T>(word, a, b);
      rotate_pair(a, b, arch::load_global(cos_row + col / 2 + i), arch::load_global(sin_row + col / 2 + i));
      word = arch::pack_pair<T>(a, b);
    });
    store_piece(dst + col, x);
    return;
  }
  const int half = r.rotary_dim / 2;
  if (col >= half) return;
  uint4 lo = load_piece(src + col), hi = load_piece(src + col + half);
  for_each_word(lo, hi, [&](uint32_t& lo_word, uint32_t& hi_word, int i) {  // pairs (lo[j], hi[j]), angle col + j
    float lo0, lo1, hi0, hi1;
    arch::unpack_pair<T>(lo_word, lo0, lo1);
    arch::unpack_pair<T>(hi_word, hi0, hi1);
    rotate_pair(lo0, hi0, arch::load_global(cos_row + col + 2 * i), arch::load_global(sin_row + col + 2 * i));
    rotate_pair(lo1, hi1, arch::load_global(cos_row + col + 2 * i + 1), arch::load_global(sin_row + col + 2 * i + 1));
    lo_word = arch::pack_pair<T>(lo0, lo1);
    hi_word = arch::pack_pair<T>(hi0, hi1);
  });
  store_piece(dst + col, lo);
  store_piece(dst + col + half, hi);
}

}  // namespace flash
