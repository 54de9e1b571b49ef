// Plain kernel arguments: pointers, sizes, int64 strides (in elements), flags and scales.
// No torch, no templates: the launchers and kernels see only these structs.
#pragma once

#include <cstdint>

namespace flash {

// A (batch, seqlen, heads, headdim) tensor whose last dim is contiguous (varlen: (1, total, heads,
// headdim), batch_stride unused). Every stride is a multiple of 8 elements and the pointer 16-byte
// aligned (checked by the op), so rows can be moved in 16-byte pieces.
struct Strided4d {
  void* ptr;
  int64_t batch_stride;
  int64_t row_stride;
  int64_t head_stride;
};

struct AttentionShape {
  int batch;
  int seqlen_q;  // varlen: max_seqlen_q (the grid covers it; each sequence has its own length)
  int seqlen_k;  // varlen: max_seqlen_k
  int heads;     // query heads
  int heads_k;   // key/value heads; heads % heads_k == 0 (MQA / GQA)
  int headdim;   // runtime head dim, a multiple of 8, <= the compiled kHeadDim
};

// Packed variable-length batches (FlashAttention's varlen API): sequence b has queries
// [cu_seqlens_q[b], cu_seqlens_q[b+1]) of the packed q rows and keys likewise. Null pointers mean
// dense tensors. The kernels clamp every entry to [0, total] and each length to the max seqlen,
// so no metadata can send an access out of the tensors (sequence.cuh).
struct VarlenArgs {
  const int* cu_seqlens_q;
  const int* cu_seqlens_k;
  int total_q;  // rows of the packed q / out tensors
  int total_k;  // rows of the packed k / v tensors
};

// Which (query, key) pairs attend, bottom-right aligned (FlashAttention 2): with
// d = seqlen_k - seqlen_q, query i sees key j iff j >= i + d - left (left >= 0) and
// j <= i + d + right (right >= 0); -1 is unbounded. causal is right = 0.
struct WindowArgs {
  int left;
  int right;
};

// Score modifiers (score_mod.cuh), each off at its zero value.
struct ScoreModArgs {
  float softcap;              // > 0: scores become softcap * tanh(scaled score / softcap)
  const float* alibi_slopes;  // fp32 slopes, (heads) or (batch, heads); null: no ALiBi
  int64_t alibi_batch_stride; // 0 for (heads)
};

// Philox seed and offset as torch's CUDA generator hands them out (at::PhiloxCudaState): values,
// or, under CUDA-graph capture, device pointers read when the kernel runs plus an intra-graph
// offset. The backward passes the forward's rng_state (seed, offset) as the pointers.
struct PhiloxArgs {
  uint64_t seed;
  uint64_t offset;
  const int64_t* seed_ptr;    // non-null: read the seed here
  const int64_t* offset_ptr;  // non-null: read the offset here and add offset_add
  uint64_t offset_add;
};

struct DropoutArgs {
  float keep_prob;         // 1 - dropout_p; 1 means no dropout
  uint32_t keep_threshold; // an element is kept iff its random byte < keep_threshold (0..255)
  PhiloxArgs philox;
  int64_t* rng_state_out;  // forward: (seed, offset) written here for the backward; may be null
};

// The fp8 forward's descales (FlashAttention 3's FP8 API): float32 (batch, heads_k) contiguous each,
// or null for 1. Scores are scaled by q * k descale, O by v's.
struct Fp8Descales {
  const float* q;
  const float* k;
  const float* v;
};

struct FwdParams {
  Strided4d q, k, v, out;
  float* lse;  // dense (batch, heads, seqlen_q), varlen (heads, total_q); natural log; +inf where a
               // row sees no key
  int64_t lse_head_stride;  // seqlen_q (dense) or total_q (varlen)
  AttentionShape shape;
  VarlenArgs varlen;
  WindowArgs window;
  ScoreModArgs score_mod;
  DropoutArgs dropout;
  float softmax_scale;  // multiplies q.k
  // The softmax runs on "logits" x with probabilities exp(x * logit_scale - lse): x = q.k and
  // logit_scale = softmax_scale, or with softcap x = tanh(q.k * softmax_scale / softcap) and
  // logit_scale = softcap (score_mod.cuh).
  float logit_scale;
  float logit_scale_log2;  // logit_scale * log2(e): the kernels exponentiate in base 2
  bool causal;             // window.right == 0: selects the causal tile configurations
};

struct BwdParams {
  FwdParams fwd;    // q, k, v, out and lse of the forward, and its shape, scales, mask and dropout
  Strided4d dout;   // like out
  Strided4d dk;     // like k but with `heads` heads: one slice per query head, summed over
  Strided4d dv;     //   the query heads of a KV head by the op when heads != heads_k
  Strided4d dq;     // output, like q
  float* dq_accum;  // float32 scratch laid out as in dq_accum.cuh; the main kernel adds into it,
                    //   a last pass converts. dq_slices partial sums (dq_order.cuh), each
                    //   dq_slice_stride floats; zeroed by the preprocess unless deterministic
  int64_t dq_accum_head_rows;  // rows of one head in one slice of dq_accum (dq_accum_rows_per_head)
  int dq_slices;               // 1, or with deterministic=True dq_slice_count()
  int64_t dq_slice_stride;     // heads * dq_accum_head_rows * dq_accum_columns(kernel head dim)
  float* dsum;      // rowsum(dout * out), float32, laid out like lse
  int* dq_semaphore;  // deterministic: dq_semaphore_count() counters (dq_order.cuh); else null
};

// flash_attn_with_kvcache's cache (kvcache_view.cuh): batch entry b's keys are cache positions
// [leftpad[b], min(cache_seqlens[b] + seqlen_new, capacity)), the new tokens appended at
// cache_seqlens[b]. Contiguous caches are (entries, capacity, heads_k, headdim) and batch entry b
// uses entry cache_batch_idx[b] (or b); paged caches are (pages, page_size, heads_k, headdim) and
// position j of batch entry b lives in row j % page_size of page block_table[b][j / page_size].
// Every entry of the metadata is clamped into range by the kernels, so no value makes them touch
// memory outside the cache, the block table or the new tokens.
struct KvCacheArgs {
  const int* cache_seqlens;    // (batch): tokens already in the cache
  const int* cache_batch_idx;  // (batch) or null
  const int* leftpad;          // (batch) or null: the first valid cache position
  const int* block_table;      // (batch, max_pages) or null: paged
  int64_t block_table_stride;  // entries between batch rows of block_table
  int max_pages;               // block_table columns
  int page_size;               // paged: rows per page
  int page_shift;              // log2(page_size) when it is a power of two, else -1
  int entries;                 // k_cache.size(0): cache entries (contiguous) or pages (paged)
  int capacity;                // positions one batch entry can hold
  int seqlen_new;              // tokens appended per batch entry (0: none)
};

// Rotary embedding of q and the new keys: the append kernel rotates the new keys, the split-KV
// kernel its queries as it loads them. cos / sin are
// (seqlen_ro, rotary_dim / 2) in the element type. Non-interleaved rotates (x[i], x[i + dim/2]),
// interleaved (x[2i], x[2i + 1]). New key t sits at position cache_seqlens + t; query t too when
// q_positions_per_token (causal or local attention), else every query at cache_seqlens.
struct RotaryArgs {
  const void* cos;  // null: no rotary
  const void* sin;
  int rotary_dim;   // a multiple of 16, <= headdim
  int seqlen_ro;    // rows of cos / sin; positions are clamped below it
  bool interleaved;
  bool q_positions_per_token;
};

// Writing the new tokens (keys rotated) into the cache before the attention reads them.
struct KvAppendParams {
  Strided4d k_new, v_new;      // (batch, seqlen_new, heads_k, headdim)
  Strided4d k_cache, v_cache;  // written at the new tokens' positions
  AttentionShape shape;
  KvCacheArgs cache;
  RotaryArgs rotary;
};

// Decode attention over the cache, split along the keys (splitkv_kernel.cuh): CTA (m block,
// split) x KV head x batch; the query heads that share a KV head are packed into one tile of rows.
// With num_splits > 1 each split writes fp32 partial outputs and lse, which the combine kernel
// merges into out and lse.
struct SplitKvParams {
  FwdParams fwd;       // q, k / v = the caches, out, lse (batch, heads, seqlen_q); shape.seqlen_k is the
                       // capacity; window, score modifiers and scales as in the forward
  KvCacheArgs cache;
  RotaryArgs rotary;   // applied to q as it is loaded
  int num_splits;
  float* out_accum;    // (num_splits, batch, heads, seqlen_q, headdim_accum) fp32; num_splits > 1
  float* lse_accum;    // (num_splits, batch, heads, seqlen_q) fp32, natural log; -inf: empty split
  int headdim_accum;   // the kernel head dim (row length of out_accum)
};

// dq_accum holds (heads, dq_accum_head_rows, dq_accum_columns(kernel head dim)) floats: on Hopper
// the backward of head dims 32 and 96 runs the wgmma kernel of the next head dim with a whole
// swizzle block of columns, 64 and 128 (launch_bwd_sm90.cuh), whose dQ tiles are that wide; every
// other kernel of those head dims uses the same rows and leaves the spare columns alone. Sequence
// b's rows start at b * dq_accum_rows(seqlen_q) (dense) or cu_seqlens_q[b] + kDqAccumRowMultiple * b
// (varlen), so each sequence has kDqAccumRowMultiple spare rows after it and every query block of
// every backward kernel is a whole tile.
constexpr int dq_accum_columns(int kernel_headdim) {
  return kernel_headdim == 32 ? 64 : kernel_headdim == 96 ? 128 : kernel_headdim;
}
constexpr int kDqAccumRowMultiple = 128;
constexpr int64_t dq_accum_rows(int64_t seqlen_q) {
  return (seqlen_q + kDqAccumRowMultiple - 1) / kDqAccumRowMultiple * kDqAccumRowMultiple;
}
constexpr int64_t dq_accum_rows_per_head(bool varlen, int64_t batch, int64_t seqlen_q, int64_t total_q) {
  return varlen ? total_q + kDqAccumRowMultiple * batch : batch * dq_accum_rows(seqlen_q);
}

// Deterministic backward (dq_order.cuh): the key blocks that see a query block add into it in a
// fixed order, spread over dq_slice_count() partial sums; one counter per (slice, batch, head,
// kMinBwdBlockM query rows), the rows of every backward kernel's query blocks. 32 on CDNA, whose
// 64 KiB of LDS takes 32-query steps from hd 96 with the score extras (launch_bwd_cdna.cuh); host
// and device code of a ROCm build both see __HIP_PLATFORM_AMD__ (torch passes it to both compilers).
#if defined(__HIP_PLATFORM_AMD__)
constexpr int kMinBwdBlockM = 32;
#else
constexpr int kMinBwdBlockM = 64;
#endif
constexpr int kMaxBwdBlockM = 128;
constexpr int kMaxDqSlices = 4;
// Counters per (slice, batch, head): whole query blocks of the largest kBlockM, so that a block's
// release of all its kBlockM / kMinBwdBlockM counters stays inside its own head's, also past the
// last query (seqlen_q = 1 with 128-query blocks: two counters, not one). Those padding counters
// are only ever written: waits read a block's first counter and the convert pass the counters of
// rows that exist, which the preprocess zeroes.
constexpr int64_t dq_counter_units(int64_t seqlen_q) {
  return (seqlen_q + kMaxBwdBlockM - 1) / kMaxBwdBlockM * (kMaxBwdBlockM / kMinBwdBlockM);
}
// The staggered walk (dq_order.cuh) serves calls without a window: the kernels walk that way and
// the op sizes the slices for it, from this one test of the normalized window (-1: unbounded).
constexpr bool staggered_dq_walk(int64_t window_left, int64_t window_right) {
  return window_left < 0 && window_right < 0;
}
// Each slice costs dq_accum's size again (twice q's bytes in fp16/bf16), so: staggered (the walk
// without a window), one slice per lap, of which a query block has at most 1 + ceil(seqlen_k /
// seqlen_q) when kBlockN >= kBlockM (DqTurn asserts it); the other walks, one slice up to 512 keys
// (chains of at most 4 key blocks of 128), then one per 512 keys. At most kMaxDqSlices: beyond
// that, laps or chain positions share slices and wait longer. Varlen passes the max lengths: a
// sequence with more laps than slices is still ordered, only slower.
constexpr int dq_slice_count(int64_t seqlen_q, int64_t seqlen_k, bool staggered) {
  const int64_t slices = staggered ? 1 + (seqlen_k + seqlen_q - 1) / (seqlen_q > 0 ? seqlen_q : 1)
                                   : (seqlen_k + 511) / 512;
  return slices < 1 ? 1 : slices > kMaxDqSlices ? kMaxDqSlices : static_cast<int>(slices);
}
constexpr int64_t dq_semaphore_count(const AttentionShape& s, int slices) {
  return static_cast<int64_t>(slices) * s.batch * s.heads * dq_counter_units(s.seqlen_q);
}

}  // namespace flash
