// Hopper backward launch: which head dims have a wgmma kernel, with which tile, and its launch
// where launch_sm90.cuh says it can run: the warp-specialized kernel (bwd_kernel_sm90_ws.cuh) where
// its tensor maps can be made, else the cp.async one (bwd_kernel_sm90.cuh).
#pragma once

#include "bwd_kernel_sm90.cuh"
#include "bwd_kernel_sm90_head_split.cuh"
#include "bwd_kernel_sm90_ws.cuh"
#include "env_switch.h"
#include "launch_attributes.h"
#include "launch_sm90.cuh"

namespace flash {

// Head dims with a wgmma backward; the others run the sm80 kernel on Hopper too. Measured on H200
// (sweep, benchmarks/NOTES.md): three query stages 0.5% ahead of two; two warpgroups per CTA ahead
// of one (hd 128: 452 vs 258 TFLOP/s at 8k). At hd 64, 128-query steps (dQ split by query) beat
// 64-query steps by 7% at 8k and 1.5% at 2k causal once the tiles were swizzled (they were 1%
// behind before); at hd 128 they were not tried: by count, S^T and dP^T of 128 queries are 64
// registers each next to 128 of dK and dV, over the 255 a thread has.
// `type` serves every shape; `short_causal_type` replaces it for causal attention over at most
// kShortCausalKeys keys, where the grid is short and the key blocks' work uneven, so smaller CTAs
// (one warpgroup, 64 keys) balance better: at hd 64, causal, 512 keys 160 vs 139 TFLOP/s; at 2k
// it is 2% behind (not measured between).
template <int kHeadDim>
struct BwdSm90Tile {
  static constexpr bool kAvailable = false;
};
template <>
struct BwdSm90Tile<64> {
  static constexpr bool kAvailable = true;
  using type = BwdSm90Config<64, 128, 3, 2>;
  using short_causal_type = BwdSm90Config<64, 64, 3, 1>;
};
template <>
struct BwdSm90Tile<128> {
  static constexpr bool kAvailable = true;
  using type = BwdSm90Config<128, 64, 3, 2>;
  using short_causal_type = type;  // one warpgroup measured 23% behind at 512 causal
};
constexpr int kShortCausalKeys = 1024;

// Head dims with a warp-specialized backward: BwdWsConfig<hd, queries per step, ring slots, shared
// dQ tiles, dV issued after dS>. The tiles are the cp.async kernel's (two warpgroups of 64 keys);
// two slots, not three, so that two dQ tiles fit (the loads no longer wait for the math warps'
// barrier, and three slots measured only 0.5% ahead of two in the cp.async kernel). dV after dS
// (bwd_sm90_step.cuh): in v14 the other order spilled 188 B at hd 128 and ran 6-10% behind; since
// the single-base dS^T / dQ stores (NOTES.md v23) both orders compile to the same spills at hd 128,
// where dV under the dS math now runs (with dK after dQ, v25: 1-5% faster backward, H200); hd 64
// keeps dV after dS (the other order spills 28 / 32 B against 16 / 20).
template <int kHeadDim>
struct BwdWsTile {
  static constexpr bool kAvailable = false;
};
template <>
struct BwdWsTile<64> {
  static constexpr bool kAvailable = true;
  using type = BwdWsConfig<64, 128, 2, 2, true>;
  // Every length, causal too: at 512 causal keys as fast as the cp.async kernel's one-warpgroup
  // tile (562-567 vs 562-564 µs), at 1k 5% faster (754 vs 794-795; H100, kernel_choice.py).
  static bool preferred(const BwdParams&) { return true; }
  // The score-extras kernel: softcap and ALiBi 2-3% faster here (s 2k-8k, causal and not), dropout
  // 1-2% slower (2870 vs 2833 µs at 2k, 10514 vs 10301 at 8k; H100, kernel_choice.py --options,
  // benchmarks/NOTES.md v16): the math warps' 240 registers hold dropout's tests beside dK and dV.
  static bool extras_preferred(const BwdParams& p) { return p.fwd.dropout.keep_prob >= 1.f; }
};
template <>
struct BwdWsTile<128> {
  static constexpr bool kAvailable = true;
  using type = BwdWsConfig<128, 64, 2, 2, false>;
  // Every length, causal too. Causal up to 512 keys used to keep the cp.async kernel (H100, v16:
  // 493-494 vs 522-523 µs at 512, before v23 / v25 changed the warp-specialized backward); on an H200
  // the warp-specialized one is ahead there: 512 causal 418-421 vs 441-444 µs, 1k causal 560-568 vs
  // 614-617, 512 / 1k non-causal 520-525 / 832-847 vs 566-572 / 906-910 (kernel_choice.py,
  // benchmarks/NOTES.md v31).
  static bool preferred(const BwdParams&) { return true; }
  // The score-extras kernel: faster here with dropout (6915-7236 vs 7629-8347 µs at 8k), softcap and
  // ALiBi (2-9% at s 2k-8k, causal and not; H100, kernel_choice.py --options, NOTES.md v16).
  static bool extras_preferred(const BwdParams& p) { return preferred(p); }
};

// hd 96 and 32 run the hd 128 and hd 64 kernels, as the forward does at hd 96 (launch_fwd_sm90.cuh):
// TMA boxes and the 128-byte swizzle move whole 64-column blocks, so the loads fill the columns
// past the call's head dim with zeros. Those add nothing to S, dP, dK, dV or dQ; the epilogue
// stores only the head dim's columns, and dq_accum rows are the kernel's width (dq_accum_columns,
// params.h). No cp.async wgmma kernel here: FLASH_ATTN_SM90_BWD=cpasync selects the sm80 kernel.
template <int kWiderHeadDim>
struct BwdWsOnWiderTile {
  static constexpr bool kAvailable = true;
  using type = typename BwdWsTile<kWiderHeadDim>::type;
  static bool preferred(const BwdParams&) { return true; }
  static bool extras_preferred(const BwdParams&) { return true; }
};
template <>
struct BwdWsTile<96> : BwdWsOnWiderTile<128> {};
template <>
struct BwdWsTile<32> : BwdWsOnWiderTile<64> {};
static_assert(dq_accum_columns(96) == BwdWsTile<96>::type::kHeadDim &&
                  dq_accum_columns(32) == BwdWsTile<32>::type::kHeadDim,
              "dq_accum rows as wide as the kernel's dQ tiles");

// Head dims whose dK and dV the two math warpgroups split by head dim (bwd_sm90_head_split_step.cuh):
// hd 256, where a warpgroup's 64 keys of dK and dV would need 256 registers per thread, and hd 192
// (192). Two stages: at hd 256, with the dQ tile over its step's Q and dO, they fill 210 of the
// 227 KB (a third would not fit); hd 192 keeps the same count (164 KB; three not measured).
template <int kHeadDim>
struct BwdHeadSplitTile {
  static constexpr bool kAvailable = false;
};
template <>
struct BwdHeadSplitTile<192> {
  static constexpr bool kAvailable = true;
  using type = BwdHeadSplitConfig<192, 2>;
};
template <>
struct BwdHeadSplitTile<256> {
  static constexpr bool kAvailable = true;
  using type = BwdHeadSplitConfig<256, 2>;
};

// FLASH_ATTN_SM90_BWD picks the Hopper backward: "ws" the warp-specialized one, "cpasync" the
// other (read per call: the tests and the A/B benchmarks switch it). Unset:
// - deterministic=True: the warp-specialized one, whose dQ-writer warp takes the turn and
//   completion waits off the math warps (H100, NOTES.md v14: 0.79-0.82 -> 0.97 of the default
//   speed at hd 64 2k);
// - the score-extras kernel otherwise: BwdWsTile::extras_preferred;
// - else BwdWsTile::preferred.
template <int kHeadDim, bool kScoreExtras>
bool warp_specialized_bwd_chosen(const BwdParams& p) {
  return env_switch_or("FLASH_ATTN_SM90_BWD", "ws", "cpasync", [&] {
    if (p.dq_semaphore != nullptr) return true;
    if (kScoreExtras) return BwdWsTile<kHeadDim>::extras_preferred(p);
    return BwdWsTile<kHeadDim>::preferred(p);
  });
}

// The TMA views of q, dout, k and v (sequence_rows_view). False when the driver cannot describe them;
// the caller then runs the cp.async kernel.
template <typename Cfg>
bool make_bwd_tensor_maps(const BwdParams& p, BwdTensorMaps& maps) {
  const FwdParams& f = p.fwd;
  return arch::encode_swizzled_row_map(&maps.q, sequence_rows_view(f, f.q, false), Cfg::kBlockM) &&
         arch::encode_swizzled_row_map(&maps.dout, sequence_rows_view(f, p.dout, false), Cfg::kBlockM) &&
         arch::encode_swizzled_row_map(&maps.k, sequence_rows_view(f, f.k, true), Cfg::kBlockN) &&
         arch::encode_swizzled_row_map(&maps.v, sequence_rows_view(f, f.v, true), Cfg::kBlockN);
}

template <typename T, int kHeadDim, bool kScoreExtras>
cudaError_t try_run_bwd_sm90_ws(const BwdParams& params, cudaStream_t stream, bool& launched) {
  launched = false;
  if constexpr (BwdWsTile<kHeadDim>::kAvailable) {
    using Cfg = typename BwdWsTile<kHeadDim>::type;
    BwdTensorMaps maps;
    if (!warp_specialized_bwd_chosen<kHeadDim, kScoreExtras>(params)) return cudaSuccess;
    if (!make_bwd_tensor_maps<Cfg>(params, maps)) return cudaSuccess;
    auto kernel = bwd_kernel_sm90_ws<T, Cfg, kScoreExtras>;
    cudaError_t err = allow_dynamic_smem(kernel, Cfg::kSmemBytes);
    if (err != cudaSuccess) return err;
    launched = true;
    const FwdParams& f = params.fwd;
    const dim3 grid(ceil_div(f.shape.seqlen_k, Cfg::kBlockN), f.shape.heads, f.shape.batch);
    kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(params, maps);
    return cudaGetLastError();
  }
  return cudaSuccess;
}

template <typename T, typename Cfg, bool kScoreExtras>
cudaError_t launch_bwd_sm90(const BwdParams& params, cudaStream_t stream) {
  auto kernel = bwd_kernel_sm90<T, Cfg, kScoreExtras>;
  cudaError_t err = allow_dynamic_smem(kernel, Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  const dim3 grid(ceil_div(params.fwd.shape.seqlen_k, Cfg::kBlockN), params.fwd.shape.heads, params.fwd.shape.batch);
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(params);
  return cudaGetLastError();
}

// The head-split kernel where its tensor maps can be made (else the caller runs the sm80 kernel);
// FLASH_ATTN_SM90_BWD=cpasync, which names the kernels of the other head dims that have no tensor
// maps, selects the sm80 kernel here, so that tests and A/B runs can compare the two.
template <typename T, int kHeadDim, bool kScoreExtras>
cudaError_t try_run_bwd_head_split(const BwdParams& params, cudaStream_t stream, int device, bool& launched) {
  using Cfg = typename BwdHeadSplitTile<kHeadDim>::type;
  auto kernel = bwd_kernel_sm90_head_split<T, Cfg, kScoreExtras>;
  bool usable = false;
  cudaError_t err = can_run_sm90(kernel, device, usable);
  const bool forced_off = read_env_switch("FLASH_ATTN_SM90_BWD", "ws", "cpasync") == EnvSwitch::kOff;
  if (err != cudaSuccess || !usable || forced_off) return err;
  BwdTensorMaps maps;
  if (!make_bwd_tensor_maps<Cfg>(params, maps)) return cudaSuccess;
  err = allow_dynamic_smem(kernel, Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  launched = true;
  const FwdParams& f = params.fwd;
  const dim3 grid(ceil_div(f.shape.seqlen_k, Cfg::kBlockN), f.shape.heads, f.shape.batch);
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(params, maps);
  return cudaGetLastError();
}

// Launches the wgmma backward kernel when possible; `launched` says whether it did.
template <typename T, int kHeadDim, bool kScoreExtras>
cudaError_t try_run_bwd_sm90(const BwdParams& params, cudaStream_t stream, int device, bool& launched) {
  launched = false;
  if constexpr (BwdHeadSplitTile<kHeadDim>::kAvailable) {
    return try_run_bwd_head_split<T, kHeadDim, kScoreExtras>(params, stream, device, launched);
  } else if constexpr (BwdSm90Tile<kHeadDim>::kAvailable) {
    using Tile = BwdSm90Tile<kHeadDim>;
    bool usable = false;
    cudaError_t err = can_run_sm90(bwd_kernel_sm90<T, typename Tile::type, kScoreExtras>, device, usable);
    if (err != cudaSuccess || !usable) return err;
    err = try_run_bwd_sm90_ws<T, kHeadDim, kScoreExtras>(params, stream, launched);
    if (err != cudaSuccess || launched) return err;
    launched = true;
    if (params.fwd.causal && params.fwd.shape.seqlen_k <= kShortCausalKeys)
      return launch_bwd_sm90<T, typename Tile::short_causal_type, kScoreExtras>(params, stream);
    return launch_bwd_sm90<T, typename Tile::type, kScoreExtras>(params, stream);
  } else if constexpr (BwdWsTile<kHeadDim>::kAvailable) {  // the warp-specialized kernel alone
    bool usable = false;
    using Cfg = typename BwdWsTile<kHeadDim>::type;
    cudaError_t err = can_run_sm90(bwd_kernel_sm90_ws<T, Cfg, kScoreExtras>, device, usable);
    if (err != cudaSuccess || !usable) return err;
    return try_run_bwd_sm90_ws<T, kHeadDim, kScoreExtras>(params, stream, launched);
  }
  return cudaSuccess;
}

}  // namespace flash
