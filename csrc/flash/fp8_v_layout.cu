// The fp8 forward's V operand (launch_api.h: run_fp8_transposed_v): V (batch, seqlen_k, heads_k,
// headdim) e4m3 bytes -> (batch, heads_k, headdim, keys), keys = fp8_transposed_v_keys(seqlen_k), the
// keys past seqlen_k zero and those of every 32-key group in the order of fp8_v_key_at (fp8_v_order.h).
//
// One block moves a tile of 64 keys x headdim: coalesced 16-byte loads of the key rows into shared
// memory (swizzled), then each thread gathers 16 output bytes (16 keys of one head-dim row) and
// stores them as one 16-byte chunk. At 16k tokens x 16 heads x hd 128 on an H200 (benchmarks/NOTES.md
// v29): 20 us a call; torch's copy of an 8-dimensional permute of the bytes took ~185 us (a fifth of
// the 4k-key fp8 forward), this kernel with one lane per head-dim row 34 us (half-sector stores).
// Plain CUDA (no PTX): it hipifies with the other shared sources.
#include <cstdint>

#include "fp8_v_order.h"
#include "launch_api.h"

namespace flash {
namespace {

constexpr int kTileKeys = 64;      // two 32-key groups: each head-dim row of the tile is 4 chunks of 16 bytes
constexpr int kChunk = 16;         // bytes a thread loads or stores at once
constexpr int kMaxHeaddim = 256;   // the widest fp8 kernel
constexpr int kThreads = 256;
static_assert(kTileKeys % kFp8KeyGroup == 0, "a tile holds whole key groups");
static_assert(kChunk == 16, "gather_chunk's runs of 16 positions keep their 16 keys (fp8_v_key_at keeps bit 4)");

struct TransposedVArgs {
  const uint8_t* v;
  int64_t batch_stride, key_stride, head_stride;  // bytes; the head dim is contiguous
  uint8_t* out;                                   // (batch, heads_k, headdim, keys) contiguous
  int heads_k, seqlen_k, headdim;
  int64_t keys, key_tiles;
};

// Where byte `column` of tile row `row` lives in shared memory: the 16-byte column chunks of the row's
// 16-key run r = row / 16 are XORed with r, so that the 4 runs (one per output chunk) of a column sit
// in 4 different bank groups (the rows are 256 bytes, 0 mod 32 banks, apart).
__device__ __forceinline__ int swizzled_column(int row, int column) {
  return column ^ ((row / kChunk % (kTileKeys / kChunk)) * kChunk);
}

// Loads keys [first_key, first_key + kTileKeys) of one (batch, head) into tile, zeros past seqlen_k.
__device__ void load_key_rows(const TransposedVArgs& a, const uint8_t* head_v, int64_t first_key,
                              uint8_t (&tile)[kTileKeys][kMaxHeaddim]) {
  const int chunks_per_row = a.headdim / kChunk;
  for (int i = threadIdx.x; i < kTileKeys * chunks_per_row; i += kThreads) {
    const int row = i / chunks_per_row, column = (i % chunks_per_row) * kChunk;
    const int64_t key = first_key + row;
    uint4 bytes = make_uint4(0, 0, 0, 0);
    if (key < a.seqlen_k) bytes = *reinterpret_cast<const uint4*>(head_v + key * a.key_stride + column);
    *reinterpret_cast<uint4*>(&tile[row][swizzled_column(row, column)]) = bytes;
  }
}

// The 16 output bytes of head-dim row `dim` at tile positions 16 chunk .. 16 chunk + 15: position p
// holds key fp8_v_key_at(p % 32) of its group, and a 16-aligned run of positions maps onto the 16
// keys that start there (fp8_v_key_at keeps bit 4).
__device__ uint4 gather_chunk(const uint8_t (&tile)[kTileKeys][kMaxHeaddim], int chunk, int dim) {
  const int column = swizzled_column(kChunk * chunk, dim);  // the same for the run's 16 rows
  uint32_t words[4];
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    uint32_t word = 0;
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const uint32_t byte = tile[kChunk * chunk + fp8_v_key_at(4 * w + b)][column];
      word |= byte << (8 * b);
    }
    words[w] = word;
  }
  return make_uint4(words[0], words[1], words[2], words[3]);
}

__global__ void __launch_bounds__(kThreads) fp8_transposed_v_kernel(const TransposedVArgs a) {
  __shared__ __align__(16) uint8_t tile[kTileKeys][kMaxHeaddim];
  const int64_t key_tile = blockIdx.x % a.key_tiles, batch_head = blockIdx.x / a.key_tiles;
  const int64_t batch = batch_head / a.heads_k, head = batch_head % a.heads_k;
  const int64_t first_key = key_tile * kTileKeys;
  load_key_rows(a, a.v + batch * a.batch_stride + head * a.head_stride, first_key, tile);
  __syncthreads();
  uint8_t* head_out = a.out + batch_head * a.headdim * a.keys;
  // The chunk varies fastest: 4 lanes store a head-dim row's 64 bytes (whole 32-byte sectors), 8 rows
  // a warp; their reads, 8 adjacent bytes of 4 swizzled runs, meet no bank conflict.
  constexpr int kChunksPerRow = kTileKeys / kChunk;
  for (int i = threadIdx.x; i < a.headdim * kChunksPerRow; i += kThreads) {
    const int dim = i / kChunksPerRow, chunk = i % kChunksPerRow;
    const int64_t position = first_key + kChunk * chunk;
    if (position >= a.keys) continue;  // the last tile of a row may hold one 32-key group only
    *reinterpret_cast<uint4*>(head_out + dim * a.keys + position) = gather_chunk(tile, chunk, dim);
  }
}

}  // namespace

cudaError_t run_fp8_transposed_v(const uint8_t* v, int64_t batch_stride, int64_t key_stride, int64_t head_stride,
                                 int batch, int seqlen_k, int heads_k, int headdim, uint8_t* out,
                                 cudaStream_t stream) {
  const int64_t keys = fp8_transposed_v_keys(seqlen_k);
  const int64_t key_tiles = (keys + kTileKeys - 1) / kTileKeys;
  const int64_t blocks = key_tiles * heads_k * batch;
  if (headdim <= 0 || headdim > kMaxHeaddim || headdim % kChunk != 0 || blocks > INT32_MAX) {
    return cudaErrorInvalidValue;
  }
  if (blocks == 0) return cudaSuccess;
  const TransposedVArgs args{v, batch_stride, key_stride, head_stride, out, heads_k, seqlen_k, headdim, keys,
                             key_tiles};
  fp8_transposed_v_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace flash
