// Plain kernel arguments: pointers, sizes, int64 strides (in elements), flags and scales.
// No torch, no templates: the launchers and kernels see only these structs.
#pragma once

#include <cstdint>

namespace flash {

// A (batch, seqlen, heads, headdim) tensor whose last dim is contiguous.
// Every stride is a multiple of 8 elements and the pointer 16-byte aligned (checked by the op),
// so rows can be moved in 16-byte pieces.
struct Strided4d {
  void* ptr;
  int64_t batch_stride;
  int64_t row_stride;
  int64_t head_stride;
};

struct AttentionShape {
  int batch;
  int seqlen_q;
  int seqlen_k;
  int heads;    // query heads
  int heads_k;  // key/value heads; heads % heads_k == 0 (MQA / GQA)
  int headdim;  // runtime head dim, a multiple of 8, <= the compiled kHeadDim
};

struct FwdParams {
  Strided4d q, k, v, out;
  float* lse;  // (batch, heads, seqlen_q), contiguous, natural log; +inf where a row sees no key
  AttentionShape shape;
  float softmax_scale;  // multiplies q.k
  float scale_log2;     // softmax_scale * log2(e): the kernels exponentiate in base 2
  bool causal;          // bottom-right aligned: query i sees key j iff j <= i + seqlen_k - seqlen_q
};

struct BwdParams {
  FwdParams fwd;    // q, k, v, out and lse of the forward, and its shape, scales and mask
  Strided4d dout;   // like out
  Strided4d dk;     // (batch, seqlen_k, heads, headdim): one slice per query head, summed over
  Strided4d dv;     //   the query heads of a KV head by the op when heads != heads_k
  Strided4d dq;     // output, like q
  float* dq_accum;  // float32 scratch of dq_accum_elements() floats, laid out as in dq_accum.cuh;
                    //   the preprocess zeroes it, the main kernel adds into it, a last pass converts
  float* dsum;      // (batch, heads, seqlen_q) float32: rowsum(dout * out), from bwd_preprocess
};

// dq_accum holds (batch, heads, dq_accum_rows(seqlen_q), kernel head dim) floats: rows padded to a
// multiple of 128, so every query block of every backward kernel is a whole tile of it.
constexpr int kDqAccumRowMultiple = 128;
constexpr int64_t dq_accum_rows(int64_t seqlen_q) {
  return (seqlen_q + kDqAccumRowMultiple - 1) / kDqAccumRowMultiple * kDqAccumRowMultiple;
}
constexpr int64_t dq_accum_elements(int64_t batch, int64_t heads, int64_t seqlen_q, int64_t kernel_headdim) {
  return batch * heads * dq_accum_rows(seqlen_q) * kernel_headdim;
}

}  // namespace flash
