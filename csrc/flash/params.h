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
  Strided4d dq_accum;  // float32 (batch, seqlen_q, heads, headdim), zeroed; the kernel adds into it
  float* dsum;      // (batch, heads, seqlen_q) float32: rowsum(dout * out), from bwd_preprocess
};

}  // namespace flash
