// Dropout keep-bits from Philox4x32-7 (counter-based: recomputed in the backward, never stored).
//
// Definition (the same in every kernel, whatever its tiles, and in flash_attn/dropout.py for the
// CPU path): element (query i, key j) of (batch b, head h) has one random byte. The bytes come in
// "dropout tiles" of 16 queries x 32 keys, split over 32 virtual lanes v = 4 * (i % 8) + (j % 8) / 2,
// which is the thread that holds the element in an m16n8 accumulator fragment of S (queries as
// rows): one Philox call per virtual lane and tile gives its 16 bytes, word c = (j % 32) / 8 and byte
// 2 * ((i % 16) / 8) + j % 2 of it. The call's key is the 64-bit seed, its counter
//   (j / 32, (i / 16) * 32 + v, low and high words of offset + b * heads + h),
// so each forward reserves batch * heads counters of torch's Philox offset. An element is kept iff
// its byte < keep_threshold (round(256 * keep_prob)) and kept probabilities are scaled by
// 1 / keep_prob, as FlashAttention 2 does with 8-bit thresholds.
// The forward (rows = queries) uses each call's 16 bytes for its own 16 elements; the backward
// holds S^T (rows = keys), where a thread's 8 elements of a 16 x 16 block come from two calls that
// its neighbour lane needs too (keep_bits_bwd shares them), and half of each call's bytes belong
// to the other warp of the 32-key tile. Costs per score, measured: benchmarks/NOTES.md v8.
#pragma once

#include <cstdint>

#include "arch/arch.cuh"
#include "features.h"
#include "params.h"

namespace flash {

constexpr int kDropoutTileQueries = 16;
constexpr int kDropoutTileKeys = 32;

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

__device__ __forceinline__ uint4 philox4x32(uint4 counter, uint32_t key0, uint32_t key1) {
  uint4 one[1] = {counter};
  philox4x32(one, key0, key1);
  return one[0];
}

// The per-(batch, head) part of the generator: key and the counter's high half.
struct Dropout {
  uint32_t key0, key1;
  uint32_t stream_lo, stream_hi;  // offset + batch * heads + head
  uint32_t keep_threshold;
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
  __device__ __forceinline__ static Dropout none() { return Dropout{0u, 0u, 0u, 0u, 256u, 1.f, false}; }

  // The Philox counter of virtual lane `vlane` in the dropout tile holding query query_tile * 16
  // and key key_tile * 32; the call gives its 16 bytes.
  __device__ __forceinline__ uint4 tile_counter(int query_tile, int key_tile, int vlane) const {
    return make_uint4(static_cast<uint32_t>(key_tile),
                      static_cast<uint32_t>(query_tile) * 32u + static_cast<uint32_t>(vlane), stream_lo, stream_hi);
  }
  __device__ __forceinline__ uint4 tile_bytes(int query_tile, int key_tile, int vlane) const {
    return philox4x32(tile_counter(query_tile, key_tile, vlane), key0, key1);
  }
  // N tiles' bytes in one lockstep call; counters in, bytes out.
  template <int N>
  __device__ __forceinline__ void tile_bytes(uint4 (&counters)[N]) const {
    philox4x32(counters, key0, key1);
  }

  __device__ __forceinline__ bool keeps(uint32_t word, int byte) const {
    return ((word >> (8 * byte)) & 0xffu) < keep_threshold;
  }

  // Whether element (query, key) is kept: one Philox call for one element (the S_dmask pass).
  __device__ __forceinline__ bool keeps_element(int query, int key) const {
    const int vlane = 4 * (query % 8) + (key % 8) / 2;
    const uint4 bytes = tile_bytes(query / kDropoutTileQueries, key / kDropoutTileKeys, vlane);
    const int word = (key % kDropoutTileKeys) / 8;
    const uint32_t w = word == 0 ? bytes.x : word == 1 ? bytes.y : word == 2 ? bytes.z : bytes.w;
    return keeps(w, 2 * ((query % 16) / 8) + key % 2);
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

__device__ __forceinline__ uint32_t word_of(const uint4& v, int c) {
  return c == 0 ? v.x : c == 1 ? v.y : c == 2 ? v.z : v.w;
}

// Keep bits of a warp's fragment, one bit per element: bit (mt * NT + nt) * 4 + r of `words` is
// element r of accumulator tile (mt, nt).
template <int MT, int NT>
struct KeepBits {
  static constexpr int kWords = (MT * NT * 4 + 31) / 32;
  uint32_t words[kWords];

  __device__ __forceinline__ void clear() {
#pragma unroll
    for (int w = 0; w < kWords; ++w) words[w] = 0u;
  }
  __device__ __forceinline__ void set(int mt, int nt, int r) {
    const int bit = (mt * NT + nt) * 4 + r;
    words[bit / 32] |= 1u << (bit % 32);
  }
  __device__ __forceinline__ bool kept(int mt, int nt, int r) const {
    const int bit = (mt * NT + nt) * 4 + r;
    return (words[bit / 32] >> (bit % 32)) & 1u;
  }
};

// Forward, on the m16n8 accumulator layout that the definition is written in: a lane's 16
// elements of a (16 x 32) dropout tile are the bytes of the call of its own virtual lane.
template <int MT, int NT>
__device__ __forceinline__ void drop_probs_fwd_m16n8(float (&probs)[MT][NT][4], const Dropout& d, int row0, int col0,
                                                     int lane) {
  static_assert(NT % 4 == 0, "whole 32-key dropout tiles");
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int tile = 0; tile < NT / 4; ++tile) {
      const uint4 bytes =
          d.tile_bytes(row0 / kDropoutTileQueries + mt, col0 / kDropoutTileKeys + tile, lane);
#pragma unroll
      for (int c = 0; c < 4; ++c)
#pragma unroll
        for (int r = 0; r < 4; ++r)
          if (!d.keeps(word_of(bytes, c), r)) probs[mt][4 * tile + c][r] = 0.f;
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

// Forward, on any other accumulator layout (CDNA): each element (query i, key j) maps through the
// definition. A lane's row i needs, per 32-key tile, the calls of virtual lanes
// 4 (i % 8) + (j % 8) / 2 for the classes of its columns j (acc_col's lane part, even, plus a
// register part that never carries past a multiple of 8: sm80.cuh, cdna_layout.h), drawn in
// lockstep; element (i, j) is byte 2 ((i % 16) / 8) + j % 2 of word (j % 32) / 8 of its class's call.
template <int MT, int NT>
__device__ __forceinline__ void drop_probs_fwd_mapped(float (&probs)[MT][NT][arch::kAccRegs], const Dropout& d,
                                                      int row0, int col0, int lane) {
  constexpr int kAtomsPerTile = kDropoutTileKeys / arch::kAtomN;
  constexpr int kClasses = dropout_column_classes();
  static_assert(kDropoutTileKeys % arch::kAtomN == 0 && NT % kAtomsPerTile == 0, "whole 32-key dropout tiles");
  const int lane_col = arch::acc_col_lane_part(lane);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < arch::kAccRows; ++h) {
      const int query = row0 + mt * arch::kAtomM + arch::acc_row(lane, arch::acc_value(h, 0));
      const int byte_row = 2 * ((query % kDropoutTileQueries) / 8);
#pragma unroll
      for (int tile = 0; tile < NT / kAtomsPerTile; ++tile) {
        uint4 calls[kClasses];
#pragma unroll
        for (int c = 0; c < kClasses; ++c)
          calls[c] = d.tile_counter(query / kDropoutTileQueries, col0 / kDropoutTileKeys + tile,
                                    4 * (query % 8) + lane_col % 8 / 2 + c);
        d.tile_bytes(calls);
#pragma unroll
        for (int a = 0; a < kAtomsPerTile; ++a)
#pragma unroll
          for (int j = 0; j < arch::kAccValuesPerRow; ++j) {
            const int r = arch::acc_value(h, j);
            const int key = a * arch::kAtomN + lane_col + arch::acc_col_register_part(r);  // within the tile
            const uint32_t word = word_of(calls[arch::acc_col_register_part(r) % 8 / 2], key / 8);
            if (!d.keeps(word, byte_row + key % 2)) probs[mt][tile * kAtomsPerTile + a][r] = 0.f;
          }
      }
    }
}

// Forward: zeroes the dropped probabilities of a (kAtomM*MT queries x kAtomN*NT keys) fragment
// whose first row is row0 (a multiple of 16) and first column col0 (a multiple of 32); kept ones
// stay unscaled (the output is scaled by keep_scale once, at the end). For kernels whose MMAs are
// synchronous (sm80, CDNA): the bits are used as they are drawn, with no bit mask in between.
template <int MT, int NT>
__device__ __forceinline__ void drop_probs_fwd(float (&probs)[MT][NT][arch::kAccRegs], const Dropout& d, int row0,
                                               int col0, int lane) {
  if constexpr (arch::kAccLayoutIsM16N8) {
    drop_probs_fwd_m16n8(probs, d, row0, col0, lane);
  } else {
    drop_probs_fwd_mapped(probs, d, row0, col0, lane);
  }
}

// Forward, for kernels with asynchronous MMAs (sm90): the random bytes of the same fragment as
// drop_probs_fwd, kept as drawn (bytes[mt][tile] word c byte r: element r of accumulator tile
// (mt, 4 * tile + c)). They do not depend on the scores, so the kernel draws them while its S MMAs
// run, and drop_packed_probs applies them to P once it is packed as MMA operands.
template <int MT, int NT>
struct DropoutBytes {
  static_assert(NT % 4 == 0, "whole 32-key dropout tiles");
  uint4 bytes[MT][NT / 4];
};

template <int MT, int NT>
__device__ __forceinline__ DropoutBytes<MT, NT> dropout_bytes_fwd(const Dropout& d, int row0, int col0, int lane) {
  uint4 counters[MT * (NT / 4)];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int tile = 0; tile < NT / 4; ++tile)
      counters[mt * (NT / 4) + tile] =
          d.tile_counter(row0 / kDropoutTileQueries + mt, col0 / kDropoutTileKeys + tile, lane);
  d.tile_bytes(counters);
  DropoutBytes<MT, NT> out;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int tile = 0; tile < NT / 4; ++tile) out.bytes[mt][tile] = counters[mt * (NT / 4) + tile];
  return out;
}

// 0xffff in each 16-bit half whose element is dropped, for the elements of bytes `first` and
// first + 1 of `word` (low half: byte `first`). Each byte x goes to (x + 256 - threshold) << 7 in
// its half (a byte permute, then one multiply-add: at most 511 << 7, so no carry between halves),
// whose top bit is x >= threshold; half_sign_masks spreads that bit over the half.
__device__ __forceinline__ uint32_t dropped_pair_mask(uint32_t word, int first, uint32_t keep_threshold) {
  const uint32_t spread = arch::byte_perm(word, 0u, first == 0 ? 0x4140u : 0x4342u);  // x0 | x1 << 16
  return arch::half_sign_masks(spread * 128u + (256u - keep_threshold) * 128u * 0x10001u);
}

// Zeroes the dropped probabilities of P packed as MMA A operands (accumulators_to_a_fragments of
// the fragment `bytes` was drawn for): two elements per AND.
template <int MT, int NT>
__device__ __forceinline__ void drop_packed_probs(uint32_t (&probs)[MT][NT / 2][4], const DropoutBytes<MT, NT>& bytes,
                                                  uint32_t keep_threshold) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int ks = 0; ks < NT / 2; ++ks)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int nt = 2 * ks + half;  // accumulator tile; elements (0, 1) and (2, 3) are two registers
        const uint32_t word = word_of(bytes.bytes[mt][nt / 4], nt % 4);
        probs[mt][ks][2 * half] &= ~dropped_pair_mask(word, 0, keep_threshold);
        probs[mt][ks][2 * half + 1] &= ~dropped_pair_mask(word, 2, keep_threshold);
      }
}

// Backward: the keep bits of a (16*MT keys x 8*NT queries) S^T fragment whose first row is key0 (a
// multiple of 16) and first column query0 (a multiple of 16).
// Lane (g, t) = (lane / 4, lane % 4) holds keys g, g + 8 and queries 2t + e (e = 0, 1) of each
// 16 x 8 tile: per 16 x 16 block its 8 bytes come from the two Philox calls of virtual lanes
// 4 (2t + e) + g / 2, bytes 2h + g % 2 (h the query half) of the two words of its 16 keys. Lane
// g ^ 1 (lane ^ 4) needs the same two calls, bytes 2h + (g ^ 1) % 2: so each lane of the pair draws
// one call (e = g % 2) and hands the partner the partner's 4 bytes of it with one shuffle, one
// Philox call per 8 elements instead of two.
template <int MT, int NT>
__device__ __forceinline__ KeepBits<MT, NT> keep_bits_bwd(const Dropout& d, int key0, int query0, int lane) {
  static_assert(NT % 2 == 0, "whole 16-query dropout tiles");
  KeepBits<MT, NT> bits;
  bits.clear();
  const int g = lane / 4, t = lane % 4, parity = g % 2;
  // Packed byte 2 * hk + h of a pair of words (keys g + 8 hk, query half h): bytes 2h + parity.
  const uint32_t mine_selector = parity ? 0x7531u : 0x6420u, partner_selector = parity ? 0x6420u : 0x7531u;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const int key_block = key0 + mt * 16;
    const int key_tile = key_block / kDropoutTileKeys;
    const int word0 = (key_block % kDropoutTileKeys) / 8;  // word of keys g; keys g + 8 are the next
    uint4 calls[NT / 2];  // u: the 16-query tile
#pragma unroll
    for (int u = 0; u < NT / 2; ++u)
      calls[u] = d.tile_counter(query0 / kDropoutTileQueries + u, key_tile, 4 * (2 * t + parity) + g / 2);
    d.tile_bytes(calls);
#pragma unroll
    for (int u = 0; u < NT / 2; ++u) {
      const uint32_t low = word_of(calls[u], word0), high = word_of(calls[u], word0 + 1);
      const uint32_t mine = arch::byte_perm(low, high, mine_selector);
      const uint32_t from_partner = arch::shuffle_xor(arch::byte_perm(low, high, partner_selector), 4);
      const uint32_t even = parity ? from_partner : mine, odd = parity ? mine : from_partner;
#pragma unroll
      for (int h = 0; h < 2; ++h)          // query half of the tile: nt = 2u + h
#pragma unroll
        for (int hk = 0; hk < 2; ++hk)     // key g or g + 8
#pragma unroll
          for (int e = 0; e < 2; ++e)      // query parity
            if (d.keeps(e == 0 ? even : odd, 2 * hk + h)) bits.set(mt, 2 * u + h, 2 * hk + e);
    }
  }
  return bits;
}

}  // namespace flash
