// The fp8 (e4m3) forward on Hopper, FlashAttention 3's FP8 API: the warp-specialized forward
// (fwd_kernel_sm90_ws.cuh) on e4m3 operands with a bf16 output, for dense batches (launch_api.h
// says what the op passes: V transposed, keys permuted). No score extras (softcap, ALiBi, dropout):
// the op sends those calls to the Triton backend.
#pragma once

#include "fwd_kernel_sm90_ws.cuh"
#include "launch_api.h"
#include "launch_fwd_sm90.cuh"
#include "launch_sm90.cuh"

namespace flash {

// FwdWsConfig<hd, keys per step, consumers, slots, element bytes>. Steps are 128 keys: e4m3 V's
// transposed tile has key rows, and one 128-byte swizzle row is 128 keys.
// hd 128: three consumers of 64 rows (192-row tiles), P to P.V through shared memory
// (FwdWsConfig::kPInShared); the step is bound by each warpgroup's softmax chain, and a third chain
// per scheduler ran 6-7.5% faster than two at 4k-16k non-causal and 0.4-6% causal in two calls
// (one causal reading +13%; H200, benchmarks/NOTES.md v37). Shared memory: Q 24 KiB, 2 x (16 + 16)
// of K and V, O staged in 48, P 24.
// hd 256: two consumers (O alone is 128 registers); 2 slots fill 224 KiB (Q 32, rings 128, O 64),
// the most that fits.
template <int kHeadDim>
struct FwdFp8Tile;
template <>
struct FwdFp8Tile<128> {
  using type = FwdWsConfig<128, 128, 3, 2, 1>;
};
template <>
struct FwdFp8Tile<256> {
  using type = FwdWsConfig<256, 128, 2, 2, 1>;
};

template <int kHeadDim>
constexpr auto fwd_fp8_kernel = fwd_fp8_kernel_sm90_ws<typename FwdFp8Tile<kHeadDim>::type>;

// A view of e4m3 elements in the 16-bit columns the tensor maps describe (two elements each).
inline arch::RowTensor as_16bit_columns(arch::RowTensor t) {
  t.cols /= 2;
  t.row_stride /= 2;
  t.head_stride /= 2;
  t.batch_stride /= 2;
  return t;
}

// q and k as sequence rows; V transposed, its rows the head dim and its columns the keys.
template <typename Cfg>
bool make_fp8_tensor_maps(const FwdParams& p, FwdFp8TensorMaps& maps) {
  const int64_t keys = fp8_transposed_v_keys(p.shape.seqlen_k);
  const arch::RowTensor v_transposed{p.v.ptr,          keys,           p.shape.headdim, p.shape.heads_k,
                                     p.shape.batch,    p.v.row_stride, p.v.head_stride, p.v.batch_stride};
  maps.o_by_tma = Cfg::kStageO && make_output_tensor_map<64>(p, maps.o);
  return arch::encode_swizzled_row_map(&maps.q, as_16bit_columns(sequence_rows_view(p, p.q, false)), Cfg::kBlockM) &&
         arch::encode_swizzled_row_map(&maps.k, as_16bit_columns(sequence_rows_view(p, p.k, true)), Cfg::kBlockN) &&
         arch::encode_swizzled_row_map(&maps.v, as_16bit_columns(v_transposed), Cfg::kHeadDim);
}

template <int kHeadDim>
cudaError_t can_run_fwd_fp8(int device, bool& usable) {
  return can_run_sm90(fwd_fp8_kernel<kHeadDim>, device, usable);
}

template <int kHeadDim>
cudaError_t run_fwd_fp8(const FwdParams& params, const Fp8Descales& descales, cudaStream_t stream) {
  using Cfg = typename FwdFp8Tile<kHeadDim>::type;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  bool usable = false;
  if (err == cudaSuccess) err = can_run_fwd_fp8<kHeadDim>(device, usable);
  if (err != cudaSuccess) return err;
  FwdFp8TensorMaps maps;
  maps.descales = descales;
  if (!usable || !make_fp8_tensor_maps<Cfg>(params, maps)) return cudaErrorNotSupported;
  return launch_over_query_tiles<Cfg>(fwd_fp8_kernel<kHeadDim>, params, maps, stream);
}

}  // namespace flash
