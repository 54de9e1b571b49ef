// The element types of the warp-specialized Hopper forward and what follows from them.
//   16-bit q, k, v (fp16, bf16): O in the same type; the logits scaled by softmax_scale (or
//     softcap), O by dropout's 1 / keep_prob.
//   e4m3 q, k, v (FlashAttention 3's FP8 API): O in bfloat16; per (batch, KV head) descales,
//     q_descale * k_descale on the logits and v_descale on O. V arrives transposed with its keys
//     permuted (arch/sm90_fp8.cuh), since 8-bit wgmma reads only K-major operands.
#pragma once

#include <type_traits>

#include "arch/sm90_fp8.cuh"
#include "arch/sm90_tma.cuh"
#include "params.h"

namespace flash {

template <typename T>
constexpr bool kIsFp8 = std::is_same_v<T, arch::Fp8E4m3>;

template <typename T>
using FwdOutputOf = std::conditional_t<kIsFp8<T>, __nv_bfloat16, T>;

// The tensor maps of q, k and v (host: launch_fwd_sm90.cuh, launch_fwd_fp8.cuh), and of out with a
// box of one consumer warpgroup's 64 rows where o_by_tma (dense batches: a TMA box cannot stop at a
// varlen sequence's end), for the epilogue's TMA store (fwd_kernel_sm90_ws.cuh).
struct FwdTensorMaps {
  arch::TensorMap q, k, v, o;
  int o_by_tma;
};

// The fp8 forward's kernel parameter: the maps (v: the transposed V; o as above) and the descales.
struct FwdFp8TensorMaps {
  arch::TensorMap q, k, v, o;
  int o_by_tma;
  Fp8Descales descales;
};

// The scales one query tile applies: to its logits (natural and base-2 units: the online softmax
// and the lse) and to the normalized O.
struct TileScales {
  float logit, logit_log2, output;
};

__device__ __forceinline__ float descale_at(const float* descale, int index) {
  return descale == nullptr ? 1.f : descale[index];
}

template <typename T, typename Maps>
__device__ __forceinline__ TileScales tile_scales(const FwdParams& p, const Maps& maps, int batch, int head_k,
                                                  float keep_scale) {
  if constexpr (kIsFp8<T>) {
    const int at = batch * p.shape.heads_k + head_k;
    const float qk = descale_at(maps.descales.q, at) * descale_at(maps.descales.k, at);
    return {p.logit_scale * qk, p.logit_scale_log2 * qk, descale_at(maps.descales.v, at)};
  } else {
    return {p.logit_scale, p.logit_scale_log2, keep_scale};
  }
}

}  // namespace flash
