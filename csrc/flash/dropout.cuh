// Dropout keep-bits from Philox4x32-7 (counter-based: recomputed in the backward, never stored).
//
// Definition (the same in every kernel, whatever its tiles, and in flash_attn/dropout.py for the
// CPU path and flash_attn/triton/kernels.py): element (query i, key j) of (batch b, head h) has one
// random byte. The bytes come in "dropout tiles" of 16 queries x 16 keys, 16 Philox calls each:
// call v = 4 * ((i % 8) / 2) + (j % 8) / 2 holds the 16 elements whose (i % 8, j % 8) fall in one
// 2 x 2 cell, element (i, j) as byte 2 * ((i % 16) / 8) + (j % 16) / 8 of word 2 * (i % 2) + j % 2.
// The call's key is the 64-bit seed, its counter
//   (j / 16, (i / 16) * 16 + v, low and high words of offset + b * heads + h),
// so each forward reserves batch * heads counters of torch's Philox offset. An element is kept iff
// its byte < keep_threshold (round(256 * keep_prob)) and kept probabilities are scaled by
// 1 / keep_prob, as FlashAttention 2 does with 8-bit thresholds.
//
// Why this shape: in an m16n8 accumulator fragment lane (g, t) = (lane / 4, lane % 4) holds rows
// g, g + 8 and columns 2t, 2t + 1 (+ 8) of a 16 x 16 block. The forward (rows = queries) needs 8
// bytes of call 4 (g / 2) + t, the words with i % 2 = g % 2; the backward (S^T, rows = keys) needs
// 8 bytes of call 4t + g / 2, the words with j % 2 = g % 2. In both, lanes L and L ^ 4 need the two
// halves of the same call: each draws it for one of two neighbouring tiles and hands its partner
// the partner's half with two shuffles, so either pass draws one call per 16 elements per lane.
// (Before, with 16 x 32 tiles shaped for the forward, the backward drew one per 8: NOTES.md v16.)
#pragma once

#include <cstdint>
#include <type_traits>

#include "arch/arch.cuh"
#include "features.h"
#include "params.h"

namespace flash {

constexpr int kDropoutTile = 16;  // queries and keys of a dropout tile

// Rounds of Philox4x32 per call: 7, as FlashAttention 2's generator runs, the fewest with which
// Random123's authors (Salmon et al., SC'11) found Philox4x32 to pass TestU01's BigCrush; their
// default of 10 adds a safety margin that an 8-bit keep test does not need. Measured cost:
// benchmarks/NOTES.md v10 (10 rounds: +46% forward, +65% backward time at dropout 0.1, H100).
constexpr int kPhiloxRounds = 7;

// N independent Philox4x32 calls in lockstep: the round keys (key + round * Weyl constant) are
// computed once per round for all N, and the N chains interleave.
template <int N>
__device__ __forceinline__ void philox4x32(uint4 (&counters)[N], uint32_t key0, uint32_t key1) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
#pragma unroll
  for (int round = 0; round < kPhiloxRounds; ++round) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      uint4& c = counters[i];
      uint32_t lo0, lo1;
      const uint32_t hi0 = arch::mul_hi_lo(kMul0, c.x, lo0);
      const uint32_t hi1 = arch::mul_hi_lo(kMul1, c.z, lo1);
      c = make_uint4(hi1 ^ c.y ^ key0, lo1, hi0 ^ c.w ^ key1, lo0);
    }
    key0 += kWeyl0;
    key1 += kWeyl1;
  }
}

__device__ __forceinline__ uint32_t word_of(const uint4& v, int c) {
  return c == 0 ? v.x : c == 1 ? v.y : c == 2 ? v.z : v.w;
}

// The per-(batch, head) part of the generator: key and the counter's high half.
struct Dropout {
  uint32_t key0, key1;
  uint32_t stream_lo, stream_hi;  // offset + batch * heads + head
  uint32_t keep_threshold;  // 0..255
  float keep_scale;  // 1 / keep_prob
  bool enabled;

  __device__ __forceinline__ static Dropout of(const DropoutArgs& a, int batch, int heads, int head) {
    Dropout d = none();
    d.enabled = kDropoutCompiled && a.keep_prob < 1.f;
    d.keep_threshold = a.keep_threshold;
    d.keep_scale = d.enabled ? 1.f / a.keep_prob : 1.f;
    if (!d.enabled) return d;
    const PhiloxArgs& ph = a.philox;
    const uint64_t seed = FLASH_LOAD_IF_SET(ph.seed_ptr, ph.seed);
    const uint64_t offset = FLASH_LOAD_IF_SET(ph.offset_ptr, ph.offset) + ph.offset_add;
    const uint64_t stream = offset + static_cast<uint64_t>(batch) * heads + head;
    d.key0 = static_cast<uint32_t>(seed);
    d.key1 = static_cast<uint32_t>(seed >> 32);
    d.stream_lo = static_cast<uint32_t>(stream);
    d.stream_hi = static_cast<uint32_t>(stream >> 32);
    return d;
  }

  // No dropout: what the kernels' plain variants use, known at compile time.
  __device__ __forceinline__ static Dropout none() { return Dropout{0u, 0u, 0u, 0u, 255u, 1.f, false}; }

  // The Philox counter of call `call` (0..15) of the dropout tile (query_tile, key_tile).
  __device__ __forceinline__ uint4 tile_counter(int query_tile, int key_tile, int call) const {
    return make_uint4(static_cast<uint32_t>(key_tile),
                      static_cast<uint32_t>(query_tile) * 16u + static_cast<uint32_t>(call), stream_lo, stream_hi);
  }
  // N calls in one lockstep run: counters in, random words out.
  template <int N>
  __device__ __forceinline__ void draw(uint4 (&counters)[N]) const {
    philox4x32(counters, key0, key1);
  }

  __device__ __forceinline__ bool keeps(uint32_t word, int byte) const {
    return ((word >> (8 * byte)) & 0xffu) < keep_threshold;
  }

  // The drop tests of a word's four bytes at once: the top bit of byte k of the result is set iff
  // byte k of `word` is >= keep_threshold (dropped). Per byte, (x | 128) - (T & 127) stays in 1..255
  // (no borrow between bytes) and its top bit is (x & 127) >= (T & 127); where the top bits of x and
  // T differ, x's decides. Three instructions for four bytes; why keep_threshold stops at 255.
  __device__ __forceinline__ uint32_t dropped_byte_tests(uint32_t word) const {
    const uint32_t threshold_bytes = keep_threshold * 0x01010101u;  // loop-invariant: ptxas hoists it
    const uint32_t low_bits = (word | 0x80808080u) - (threshold_bytes & 0x7f7f7f7fu);
    return (word & ~threshold_bytes) | (~(word ^ threshold_bytes) & low_bits);
  }

  // Whether element (query, key) is kept: one Philox call for one element (the S_dmask pass).
  __device__ __forceinline__ bool keeps_element(int query, int key) const {
    uint4 call[1] = {tile_counter(query / kDropoutTile, key / kDropoutTile, 4 * (query % 8 / 2) + key % 8 / 2)};
    draw(call);
    return keeps(word_of(call[0], 2 * (query % 2) + key % 2), 2 * (query % 16 / 8) + key % 16 / 8);
  }
};

// The forward's first thread records the (seed, offset) it used for the backward (rng_state),
// whether or not the CTA has work: torch's values, or under graph capture the ones read at replay.
__device__ __forceinline__ void record_rng_state(const DropoutArgs& a, int tid) {
  if (a.rng_state_out == nullptr || tid != 0 || blockIdx.x != 0 || blockIdx.y != 0 || blockIdx.z != 0) return;
  const PhiloxArgs& ph = a.philox;
  const uint64_t seed = FLASH_LOAD_IF_SET(ph.seed_ptr, ph.seed);
  const uint64_t offset = FLASH_LOAD_IF_SET(ph.offset_ptr, ph.offset) + ph.offset_add;
  a.rng_state_out[0] = static_cast<int64_t>(seed);
  a.rng_state_out[1] = static_cast<int64_t>(offset);
}


// A fragment's drop tests as its lanes hold them after the pair exchange: per 16 x 16 dropout tile
// (accumulator tiles nt = 2u, 2u + 1 of row block mt), Dropout::dropped_byte_tests of the lane's
// two words of the tile's call, words[mt][u][r % 2] for accumulator element r (the column's parity:
// j % 2 in the forward, i % 2 in the backward). Element r of accumulator tile nt is byte
// 2 (r / 2) + nt % 2 of its word in the forward (rows = queries: byte 2 ((i % 16) / 8) + (j % 16) / 8)
// and 2 (nt % 2) + r / 2 in the backward (kRowsAreKeys, S^T). A mask is one sign-mode byte permute
// of the two words. Drawn before the scores exist (they do not depend on them), so the kernels draw
// them while their MMAs run.
template <int MT, int NT, bool kRowsAreKeys>
struct DropTests {
  static_assert(NT % 4 == 0, "whole pairs of 16-column dropout tiles");
  uint32_t words[MT][NT / 2][2];

  // Element r of accumulator tile nt as byte 0..7 of the pair (words[..][0], words[..][1]).
  __device__ __forceinline__ static constexpr int byte_of(int nt, int r) {
    return 4 * (r % 2) + (kRowsAreKeys ? 2 * (nt % 2) + r / 2 : 2 * (r / 2) + nt % 2);
  }
  // 0xffffffff if element r of accumulator tile (mt, nt) is dropped, else 0. (The switches fold away
  // once the callers' loops are unrolled: the selectors are immediates.)
  __device__ __forceinline__ uint32_t element_mask(int mt, int nt, int r) const {
    const uint32_t(&w)[2] = words[mt][nt / 2];
    switch (byte_of(nt, r)) {
      case 0: return arch::byte_sign_masks<0x8888u>(w[0], w[1]);
      case 1: return arch::byte_sign_masks<0x9999u>(w[0], w[1]);
      case 2: return arch::byte_sign_masks<0xAAAAu>(w[0], w[1]);
      case 3: return arch::byte_sign_masks<0xBBBBu>(w[0], w[1]);
      case 4: return arch::byte_sign_masks<0xCCCCu>(w[0], w[1]);
      case 5: return arch::byte_sign_masks<0xDDDDu>(w[0], w[1]);
      case 6: return arch::byte_sign_masks<0xEEEEu>(w[0], w[1]);
      default: return arch::byte_sign_masks<0xFFFFu>(w[0], w[1]);
    }
  }
  // 0xffff in each 16-bit half whose element is dropped: elements (2k, 2k + 1), low half first.
  // Element 2k is byte b of words[..][0] and 2k + 1 byte b of words[..][1], b = byte_of(nt, 2k).
  __device__ __forceinline__ uint32_t pair_mask(int mt, int nt, int k) const {
    const uint32_t(&w)[2] = words[mt][nt / 2];
    switch (byte_of(nt, 2 * k)) {
      case 0: return arch::byte_sign_masks<0xCC88u>(w[0], w[1]);
      case 1: return arch::byte_sign_masks<0xDD99u>(w[0], w[1]);
      case 2: return arch::byte_sign_masks<0xEEAAu>(w[0], w[1]);
      default: return arch::byte_sign_masks<0xFFBBu>(w[0], w[1]);
    }
  }
};
template <int MT, int NT>
using FwdDropTests = DropTests<MT, NT, false>;

// The drop tests of a fragment on any other accumulator layout (CDNA): bit r of dropped[mt][nt] is
// set iff element r of accumulator tile (mt, nt) is dropped, one register per atom.
template <int MT, int NT>
struct MappedDropTests {
  static_assert(arch::kAccRegs <= 32, "one bit per accumulator register");
  uint32_t dropped[MT][NT];

  // 0xffffffff if element r of accumulator tile (mt, nt) is dropped, else 0.
  __device__ __forceinline__ uint32_t element_mask(int mt, int nt, int r) const {
    return 0u - ((dropped[mt][nt] >> r) & 1u);
  }
};

// The backward's (S^T: rows are keys) drop tests in the arch layer's accumulator layout.
template <int MT, int NT>
using BwdDropTests = std::conditional_t<arch::kAccLayoutIsM16N8, DropTests<MT, NT, true>, MappedDropTests<MT, NT>>;

// Lanes L and L ^ 4 (`odd` = bit 2 of the lane) each drew the same call of two neighbouring tiles,
// the even lane tile 0's and the odd lane tile 1's; words (a0, a1) of a call are the even lane's,
// (b0, b1) the odd lane's. Writes this lane's two words of each tile: two shuffles.
__device__ __forceinline__ void swap_call_halves(uint32_t a0, uint32_t a1, uint32_t b0, uint32_t b1, bool odd,
                                                 uint32_t (&tile0)[2], uint32_t (&tile1)[2]) {
  const uint32_t got0 = arch::shuffle_xor(odd ? a0 : b0, 4), got1 = arch::shuffle_xor(odd ? a1 : b1, 4);
  tile0[0] = odd ? got0 : a0;
  tile0[1] = odd ? got1 : a1;
  tile1[0] = odd ? b0 : got0;
  tile1[1] = odd ? b1 : got1;
}

// The pair exchange and drop tests of N lockstep calls, call k's tiles being u = 2k, 2k + 1 of
// `tests`; kRowsAreKeys says which two words of a call are the even lane's.
template <bool kRowsAreKeys, int N, int U>
__device__ __forceinline__ void test_exchanged_calls(const Dropout& d, const uint4 (&calls)[N],
                                                     bool odd, uint32_t (&tests)[U][2]) {
#pragma unroll
  for (int k = 0; k < N; ++k) {
    const uint4& c = calls[k];
    uint32_t tile0[2], tile1[2];
    if constexpr (kRowsAreKeys) {  // S^T: the even lane's keys want words with i % 2 = 0, 1 at j % 2 = 0: x, z
      swap_call_halves(c.x, c.z, c.y, c.w, odd, tile0, tile1);
    } else {                       // S: the even lane's queries want words with j % 2 = 0, 1 at i % 2 = 0: x, y
      swap_call_halves(c.x, c.y, c.z, c.w, odd, tile0, tile1);
    }
#pragma unroll
    for (int w = 0; w < 2; ++w) {
      tests[2 * k][w] = d.dropped_byte_tests(tile0[w]);
      tests[2 * k + 1][w] = d.dropped_byte_tests(tile1[w]);
    }
  }
}

// The drop tests of an m16n8 accumulator fragment of 16*MT rows x 8*NT columns whose first row is
// row0 and first column col0 (multiples of 16): queries x keys in the forward, keys x queries in
// the backward (kRowsAreKeys). Lane (g, t) holds rows of residue g and columns of residues 2t, 2t + 1
// (mod 8), so call 4 (g / 2) + t of a tile in the forward and 4t + g / 2 in the backward; the lane
// pair draws the tiles of neighbouring column blocks and swaps halves (test_exchanged_calls).
template <int MT, int NT, bool kRowsAreKeys>
__device__ __forceinline__ DropTests<MT, NT, kRowsAreKeys> draw_drop_tests(const Dropout& d, int row0, int col0,
                                                                            int lane) {
  static_assert(MT > 0 && arch::kAccLayoutIsM16N8, "m16n8 accumulators (draw_mapped_drop_tests for others)");
  constexpr int kPairs = NT / 4;  // pairs of 16-column tiles
  const int g = lane / 4, t = lane % 4;
  const bool odd = g % 2;
  const int call = kRowsAreKeys ? 4 * t + g / 2 : 4 * (g / 2) + t;
  DropTests<MT, NT, kRowsAreKeys> out;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    uint4 calls[kPairs];
#pragma unroll
    for (int pair = 0; pair < kPairs; ++pair) {
      const int row_tile = row0 / kDropoutTile + mt, col_tile = col0 / kDropoutTile + 2 * pair + odd;
      calls[pair] = kRowsAreKeys ? d.tile_counter(col_tile, row_tile, call) : d.tile_counter(row_tile, col_tile, call);
    }
    d.draw(calls);
    test_exchanged_calls<kRowsAreKeys>(d, calls, odd, out.words[mt]);
  }
  return out;
}

// Forward: the drop tests of a (16*MT queries x 8*NT keys) fragment at (row0, col0).
template <int MT, int NT>
__device__ __forceinline__ FwdDropTests<MT, NT> drop_tests_fwd(const Dropout& d, int row0, int col0, int lane) {
  return draw_drop_tests<MT, NT, false>(d, row0, col0, lane);
}

// value with its bits cleared where `dropped` is set (0 for a dropped fp32 element).
__device__ __forceinline__ float clear_if(float value, uint32_t dropped) {
  return __uint_as_float(__float_as_uint(value) & ~dropped);
}

// In place: fp32 accumulators with the dropped elements zeroed (tests: DropTests or MappedDropTests
// drawn for this fragment).
template <typename Tests, int MT, int NT>
__device__ __forceinline__ void drop_accumulators(float (&acc)[MT][NT][arch::kAccRegs], const Tests& tests) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int r = 0; r < arch::kAccRegs; ++r) acc[mt][nt][r] = clear_if(acc[mt][nt][r], tests.element_mask(mt, nt, r));
}

// In place: the dropped probabilities of P packed as MMA A operands (accumulators_to_a_fragments
// of the fragment the tests were drawn for) zeroed, two elements per AND.
template <int MT, int NT, bool kRowsAreKeys>
__device__ __forceinline__ void drop_packed_probs(uint32_t (&probs)[MT][NT / 2][4],
                                                  const DropTests<MT, NT, kRowsAreKeys>& tests) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int ks = 0; ks < NT / 2; ++ks)
#pragma unroll
      for (int half = 0; half < 2; ++half) {  // accumulator tile 2 ks + half: elements (0, 1), (2, 3)
        probs[mt][ks][2 * half] &= ~tests.pair_mask(mt, 2 * ks + half, 0);
        probs[mt][ks][2 * half + 1] &= ~tests.pair_mask(mt, 2 * ks + half, 1);
      }
}

// How many classes (j % 8) / 2 the columns j of one lane's row take in a dropout tile, counted from
// the lane's own (acc_col_lane_part): the Philox calls it needs per row and tile.
__host__ __device__ constexpr int dropout_column_classes() {
  int classes = 1;
  for (int r = 0; r < arch::kAccRegs; ++r) {
    const int cls = arch::acc_col_register_part(r) % 8 / 2 + 1;
    classes = cls > classes ? cls : classes;
  }
  return classes;
}

// How many 16-key tiles the register parts of one atom's columns reach, counted from the tile of
// the lane's own part.
__host__ __device__ constexpr int dropout_register_tiles() {
  int tiles = 1;
  for (int r = 0; r < arch::kAccRegs; ++r) {
    const int tile = arch::acc_col_register_part(r) / kDropoutTile + 1;
    tiles = tile > tiles ? tile : tiles;
  }
  return tiles;
}

// The drop tests of a fragment on any other accumulator layout (CDNA), element by element through
// the definition: rows are queries and columns keys in the forward, keys and queries in the
// backward's S^T (kRowsAreKeys). A lane's row r needs, per atom, the calls 4 ((i % 8) / 2) + (j % 8)
// / 2 of the column classes and the 16-column tiles that its columns c = lane part + register part
// reach (the lane part even, and no carry past a multiple of 8 or of 16 between the two:
// cdna_layout.h, tests/hip/cdna_layout_test.cpp), so the classes and tiles are the lane's plus the
// register's; drawn in lockstep, one call per class and tile, each read for every element it holds.
// Element (i, j) is byte 2 ((i % 16) / 8) + (j % 16) / 8 of word 2 (i % 2) + j % 2.
template <bool kRowsAreKeys, int MT, int NT>
__device__ __forceinline__ MappedDropTests<MT, NT> draw_mapped_drop_tests(const Dropout& d, int row0, int col0,
                                                                          int lane) {
  constexpr int kClasses = dropout_column_classes(), kTiles = dropout_register_tiles();
  static_assert(MT > 0 && arch::kAtomN % kDropoutTile == 0, "whole dropout tiles per atom");
  const int lane_col = arch::acc_col_lane_part(lane);
  MappedDropTests<MT, NT> out;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) out.dropped[mt][nt] = 0u;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < arch::kAccRows; ++h) {
      const int row = row0 + mt * arch::kAtomM + arch::acc_row(lane, arch::acc_value(h, 0));
      const int row_class = row % 8 / 2, row_byte_half = row % 16 / 8;
      // The row's two words of a call (the column's parity picks one): with rows as queries, words
      // 2 (i % 2) and + 1; with rows as keys, words j % 2 and + 2.
      const uint32_t odd_row_mask = 0u - static_cast<uint32_t>(row % 2);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int first_tile = (col0 + nt * arch::kAtomN + lane_col) / kDropoutTile;
        uint4 calls[kTiles * kClasses];
#pragma unroll
        for (int tile = 0; tile < kTiles; ++tile)
#pragma unroll
          for (int c = 0; c < kClasses; ++c) {
            const int col_class = lane_col % 8 / 2 + c;
            calls[tile * kClasses + c] =
                kRowsAreKeys ? d.tile_counter(first_tile + tile, row / kDropoutTile, 4 * col_class + row_class)
                             : d.tile_counter(row / kDropoutTile, first_tile + tile, 4 * row_class + col_class);
          }
        d.draw(calls);
        // Blended with a mask: a select between two fields became a load at a selected address,
        // which kept `calls` in scratch (gfx942).
        uint32_t row_words[kTiles * kClasses][2];
#pragma unroll
        for (int k = 0; k < kTiles * kClasses; ++k) {
          const uint4& w = calls[k];
          row_words[k][0] = kRowsAreKeys ? (w.x & ~odd_row_mask) | (w.y & odd_row_mask)
                                         : (w.x & ~odd_row_mask) | (w.z & odd_row_mask);
          row_words[k][1] = kRowsAreKeys ? (w.z & ~odd_row_mask) | (w.w & odd_row_mask)
                                         : (w.y & ~odd_row_mask) | (w.w & odd_row_mask);
        }
#pragma unroll
        for (int j = 0; j < arch::kAccValuesPerRow; ++j) {
          const int r = arch::acc_value(h, j), part = arch::acc_col_register_part(r);
          const uint32_t word = row_words[part / kDropoutTile * kClasses + part % 8 / 2][part % 2];
          const int col_byte_half = (lane_col % kDropoutTile + part % kDropoutTile) / 8;
          const int byte = kRowsAreKeys ? 2 * col_byte_half + row_byte_half : 2 * row_byte_half + col_byte_half;
          if (!d.keeps(word, byte)) out.dropped[mt][nt] |= 1u << r;
        }
      }
    }
  return out;
}

// Backward: the drop tests of a (kAtomM*MT keys x kAtomN*NT queries) S^T fragment at (key0, query0).
template <int MT, int NT>
__device__ __forceinline__ BwdDropTests<MT, NT> drop_tests_bwd(const Dropout& d, int key0, int query0, int lane) {
  if constexpr (arch::kAccLayoutIsM16N8) {
    return draw_drop_tests<MT, NT, true>(d, key0, query0, lane);
  } else {
    return draw_mapped_drop_tests<true, MT, NT>(d, key0, query0, lane);
  }
}

// Forward: zeroes the dropped probabilities of a (kAtomM*MT queries x kAtomN*NT keys) fragment
// whose first row is row0 and first column col0 (multiples of 16); kept ones stay unscaled (the
// output is scaled by keep_scale once, at the end). For kernels whose MMAs are synchronous (sm80,
// CDNA): the bytes are used as they are drawn.
template <int MT, int NT>
__device__ __forceinline__ void drop_probs_fwd(float (&probs)[MT][NT][arch::kAccRegs], const Dropout& d, int row0,
                                               int col0, int lane) {
  if constexpr (arch::kAccLayoutIsM16N8) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {  // a row block at a time: the tests of one live at once
      float(&row_block)[1][NT][4] = *reinterpret_cast<float(*)[1][NT][4]>(&probs[mt]);
      drop_accumulators(row_block, drop_tests_fwd<1, NT>(d, row0 + mt * arch::kAtomM, col0, lane));
    }
  } else {
    drop_accumulators(probs, draw_mapped_drop_tests<false, MT, NT>(d, row0, col0, lane));
  }
}

}  // namespace flash
