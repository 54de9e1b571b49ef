// Hopper forward launch: which head dims have a wgmma kernel, with which tile, and its launch
// where launch_sm90.cuh says it can run.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "arch/sm90_tensor_map.h"
#include "env_switch.h"
#include "fwd_kernel_sm90.cuh"
#include "fwd_kernel_sm90_ws.cuh"
#include "launch_attributes.h"
#include "launch_sm90.cuh"

namespace flash {

// Head dims with a cp.async wgmma forward (fwd_kernel_sm90.cuh); FwdWsTile below lists those with
// a warp-specialized one. The others run the sm80 kernel on Hopper too.
// FwdSm90Config<hd, keys per step, warpgroups (64 queries each), CTAs per SM>; `causal_type`
// replaces `type` for causal attention. Measured on H200 (sweep, benchmarks/NOTES.md, TFLOP/s):
//   hd 64: one CTA of two warpgroups per SM left the SM idle through every CTA's loads, barriers
//     and epilogue (243 at 2k causal, below the sm80 kernel's 247). Several CTAs per SM, at the
//     price of 64-key steps to fit their registers: two CTAs of two warpgroups 390 at 8k and 304 at
//     512 (non-causal); three CTAs of one warpgroup 206 at 512 causal and 308 at 2k causal (two
//     CTAs: 175 and 291), the finer grid balancing the uneven causal rows.
//   hd 128: 128-key steps, two warpgroups, one CTA per SM: 471 at 8k, 358 at 2k causal, 340 at 512
//     (64-key steps 417 / 327 / 301).
template <int kHeadDim>
struct FwdSm90Tile {
  static constexpr bool kAvailable = false;
};
template <>
struct FwdSm90Tile<64> {
  static constexpr bool kAvailable = true;
  using type = FwdSm90Config<64, 64, 2, 2>;
  using causal_type = FwdSm90Config<64, 64, 1, 3>;
};
template <>
struct FwdSm90Tile<128> {
  static constexpr bool kAvailable = true;
  using type = FwdSm90Config<128, 128, 2>;
  using causal_type = type;
};

// Head dims with a warp-specialized forward (fwd_kernel_sm90_ws.cuh): FwdWsConfig<hd, keys per
// step, consumer warpgroups, ring slots>, from a sweep on H200 (benchmarks/NOTES.md v9, bf16,
// hidden 2048, 16k tokens, forward ms):
//   hd 128: 128-key steps, two consumers, two slots: 0.167 / 0.459 / 1.648 / 3.331 ms at 512 / 2k
//     / 8k / 16k non-causal. Three slots: the same within 2%. 192-key steps: 3-6% faster from 8k
//     but 19% slower at 512; 160: between; 64: 15-20% slower.
//   hd 64: three consumers of 64 rows, 128-key steps, two slots: 0.604 / 2.028 / 4.006 ms at 2k /
//     8k / 16k non-causal, 1.228 / 2.238 at 8k / 16k causal (three slots within 2%; two consumers
//     or 64-key steps 10-30% slower). With one CTA per tile the cp.async kernel, two or three CTAs
//     per SM, stayed ahead on short walks (512 non-causal 0.227 vs 0.237 ms): one CTA per SM left
//     each tile's prologue and epilogue exposed. The persistent grid (non-causal) overlaps them:
//     316 vs 304 TFLOP/s at 512 (fwd_ab_persistent.md). Causal: since the heaviest-first groups
//     alternate direction (balanced strides, NOTES.md v17), the warp-specialized kernel wins from
//     2k keys (H100, 16k tokens, benchmarks/results/nvidia-h100_2026-11-24_v17/scheduler_ab.md:
//     2k 336 vs 304 TFLOP/s) and the cp.async one at 512 (208 vs 166). Since each consumer walks
//     only the key blocks its rows see (FwdQueryBlock::steps_seen_by) the warp-specialized
//     kernel wins causal from 512 too (H200: 512 156 vs 164 µs, 1k 235 vs 259; NOTES.md v27). Below
//     512 keys the cp.async kernel stays, unmeasured.
//     `preferred` says where the warp-specialized kernel runs by default; `extras_type` is the
//     configuration of the score-extras kernel (features.h) where it differs from `type`.
template <int kHeadDim>
struct FwdWsTile {
  static constexpr bool kAvailable = false;
};
template <>
struct FwdWsTile<64> {
  static constexpr bool kAvailable = true;
  using type = FwdWsConfig<64, 128, 3, 2>;
  using extras_type = type;
  static bool preferred(const FwdParams& p) { return p.shape.seqlen_k >= 512; }
};
template <>
struct FwdWsTile<128> {
  static constexpr bool kAvailable = true;
  using type = FwdWsConfig<128, 128, 2, 2>;
  using extras_type = type;
  static bool preferred(const FwdParams&) { return true; }
};
// hd 192 and 256: two consumers, two slots. Dropout's drop tests pair 16-column tiles
// (dropout.cuh), so the score-extras kernel's steps are a multiple of 32 keys: 64 (96 would need
// 256 KiB at hd 256). The plain kernel at hd 256 takes FA3's 80-key steps: Q and the rings then fill
// 224 of the 227 KiB, and O is stored from the accumulators (FwdWsConfig::kStageO), as with 64-key
// steps (192 KiB). The plain kernel at hd 192 takes FA3's 112-key steps (Q 48 + rings 168 KiB; O from
// the accumulators): against 64-key steps with O staged, 7-11% less time from 2k keys, causal and
// not, 3.5% at 512, but 6.5% more at 512 causal (H200, bf16, two rounds; 80-key steps with O staged
// and 96-key steps sat between; benchmarks/NOTES.md v31). No cp.async wgmma kernel at these head
// dims: the sm80 kernel is the fallback.
// Short causal walks at hd 192 / 256 take a second plain kernel on 64-key steps (short_steps_type,
// where short_steps_preferred). Against 128-row tiles, a tile ending at row 128 k walks ceil(128 k /
// N) blocks of N keys: 80-key blocks cover 12.5% more key columns than the causal triangle at 512
// keys, 6% at 1k, 3% at 2k; 112-key blocks 22.5%, 9.4%, 4.9%. 64-key blocks end on every tile's
// diagonal. hd 256 (H200, bf16, one process): 512 causal 110.4 -> 105.4 µs, 1k 159.6 -> 157.7, 2k
// 260.3 -> 263.2 (benchmarks/NOTES.md v33 item 4); hd 192: 512 causal 6.5% faster on 64-key steps (v31
// item 11), 2k 7% slower; 1k level at both (where the switch stops).
inline bool short_causal_walk(const FwdParams& p) { return p.causal && p.shape.seqlen_k <= 1024; }
template <>
struct FwdWsTile<192> {
  static constexpr bool kAvailable = true;
  using type = FwdWsConfig<192, 112, 2, 2>;
  using extras_type = FwdWsConfig<192, 64, 2, 2>;
  using short_steps_type = extras_type;
  static bool preferred(const FwdParams&) { return true; }
  static bool short_steps_preferred(const FwdParams& p) { return short_causal_walk(p); }
};
template <>
struct FwdWsTile<256> {
  static constexpr bool kAvailable = true;
  using type = FwdWsConfig<256, 80, 2, 2>;
  using extras_type = FwdWsConfig<256, 64, 2, 2>;
  using short_steps_type = extras_type;
  static bool preferred(const FwdParams&) { return true; }
  static bool short_steps_preferred(const FwdParams& p) { return short_causal_walk(p); }
};

// hd 96: TMA boxes and the 128-byte swizzle move whole 64-column blocks, so it runs the hd 128
// kernel: TMA fills the columns past the tensor's head dim with zeros, which add nothing to S, and
// the epilogue stores only the head dim's columns. A quarter of its MMA work is on those zeros,
// and it still takes 0.65-0.72 of the sm80 kernel's time (H100, 512 to 8k, causal and not;
// benchmarks/results/nvidia-h100_2026-11-24_v18/narrow_head_dims.md). hd 32 runs the hd 64 kernel
// (half the MMA work on zeros): in v18 it was 6-8% behind the sm80 kernel at 512 and 2k causal, but
// since each consumer walks only its own rows' key blocks it is ahead at every length measured,
// 512 to 8k, causal and not (H200: 512 360 vs 392 µs, 512 causal 280 vs 295, 8k causal 2159 vs
// 2736; benchmarks/NOTES.md v28); below 512 keys not measured.
template <>
struct FwdWsTile<96> : FwdWsTile<128> {};
template <>
struct FwdWsTile<32> : FwdWsTile<64> {
  static bool preferred(const FwdParams&) { return true; }
};

// The warp-specialized configuration of the plain (kScoreExtras false) or score-extras kernel.
template <int kHeadDim, bool kScoreExtras>
using FwdWsConfigFor =
    std::conditional_t<kScoreExtras, typename FwdWsTile<kHeadDim>::extras_type, typename FwdWsTile<kHeadDim>::type>;

// Whether FwdWsTile<kHeadDim> has a second plain configuration on shorter key steps.
template <int kHeadDim, typename = void>
struct HasShortSteps : std::false_type {};
template <int kHeadDim>
struct HasShortSteps<kHeadDim, std::void_t<typename FwdWsTile<kHeadDim>::short_steps_type>> : std::true_type {};

// FLASH_ATTN_SM90_FWD_SHORT_STEPS=1 / 0 forces the short-step plain kernel on / off where a head
// dim has one (tests, A/B measurements); unset, FwdWsTile::short_steps_preferred decides per call.
template <int kHeadDim>
bool short_steps_chosen(const FwdParams& p) {
  return env_switch_or("FLASH_ATTN_SM90_FWD_SHORT_STEPS", "1", "0",
                       [&] { return FwdWsTile<kHeadDim>::short_steps_preferred(p); });
}

// FLASH_ATTN_SM90_FWD picks the Hopper forward where both exist: "ws" the warp-specialized one,
// "cpasync" the other, unset FwdWsTile::preferred (read per call: the tests and the A/B benchmarks
// switch it).
template <int kHeadDim>
bool warp_specialized_fwd_chosen(const FwdParams& p) {
  return env_switch_or("FLASH_ATTN_SM90_FWD", "ws", "cpasync", [&] { return FwdWsTile<kHeadDim>::preferred(p); });
}

// Launches the warp-specialized forward over its query tiles (query_tile_scheduler.cuh): one CTA
// per SM walks them, each CTA's producer loading the next tile under the current one's last MMAs
// and epilogue; uneven tiles (causal, window) in the heaviest-first order, so that the strides
// finish together. FLASH_ATTN_SM90_FWD_GRID=tiles gives one CTA per tile instead (tests, A/B
// measurements): the hardware hands them out as SMs free up.
template <typename Cfg, typename Kernel, typename Maps>
cudaError_t launch_over_query_tiles(Kernel kernel, const FwdParams& params, const Maps& maps, cudaStream_t stream) {
  cudaError_t err = allow_dynamic_smem(kernel, Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  const bool varlen = params.varlen.cu_seqlens_q != nullptr;
  const bool uneven = params.window.left >= 0 || params.window.right >= 0;
  const int tiles = query_tile_count<Cfg::kBlockM>(params);  // varlen: over max_seqlen_q, a bound
  const char* grid_choice = std::getenv("FLASH_ATTN_SM90_FWD_GRID");
  int grid = tiles, sms = 0;
  int device = 0;
  err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cached_device_attribute<cudaDevAttrMultiProcessorCount>(device, sms);
  if (err != cudaSuccess) return err;
  if (!(grid_choice != nullptr && std::strcmp(grid_choice, "tiles") == 0)) grid = std::min(tiles, sms);
  // The groups are strides of the persistent grid (one CTA per SM), in either grid mode;
  // FLASH_ATTN_SM90_FWD_GROUP_STRIDES sets how many (A/B measurements), else the L2 budget does.
  const char* strides = std::getenv("FLASH_ATTN_SM90_FWD_GROUP_STRIDES");
  const int group_pairs =
      heaviest_first_group_pairs<Cfg::kBlockM>(params, sms, strides != nullptr ? std::atoi(strides) : 0);
  const QueryTileOrder order = make_query_tile_order<Cfg::kBlockM>(params, !varlen && uneven ? group_pairs : 0);
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(params, maps, order);
  return cudaGetLastError();
}

// The TMA views of q, k and v (sequence_rows_view), and of out where the epilogue stores by TMA. False
// when the driver cannot describe q, k or v; the caller then runs the cp.async kernel.
template <typename Cfg>
bool make_fwd_tensor_maps(const FwdParams& p, FwdTensorMaps& maps) {
  maps.o_by_tma = Cfg::kStageO && make_output_tensor_map<64>(p, maps.o);
  return arch::encode_swizzled_row_map(&maps.q, sequence_rows_view(p, p.q, false), Cfg::kBlockM) &&
         arch::encode_swizzled_row_map(&maps.k, sequence_rows_view(p, p.k, true), Cfg::kBlockN) &&
         arch::encode_swizzled_row_map(&maps.v, sequence_rows_view(p, p.v, true), Cfg::kBlockN);
}

template <typename T, typename Cfg, bool kScoreExtras>
cudaError_t run_fwd_sm90_ws(const FwdParams& params, cudaStream_t stream, bool& launched) {
  FwdTensorMaps maps;
  if (!make_fwd_tensor_maps<Cfg>(params, maps)) return cudaSuccess;
  launched = true;
  return launch_over_query_tiles<Cfg>(fwd_kernel_sm90_ws<T, Cfg, kScoreExtras>, params, maps, stream);
}

template <typename T, int kHeadDim, bool kScoreExtras>
cudaError_t try_run_fwd_sm90_ws(const FwdParams& params, cudaStream_t stream, bool& launched) {
  launched = false;
  if constexpr (FwdWsTile<kHeadDim>::kAvailable) {
    if (!warp_specialized_fwd_chosen<kHeadDim>(params)) return cudaSuccess;
    if constexpr (!kScoreExtras && HasShortSteps<kHeadDim>::value) {
      if (short_steps_chosen<kHeadDim>(params))
        return run_fwd_sm90_ws<T, typename FwdWsTile<kHeadDim>::short_steps_type, false>(params, stream, launched);
    }
    return run_fwd_sm90_ws<T, FwdWsConfigFor<kHeadDim, kScoreExtras>, kScoreExtras>(params, stream, launched);
  }
  return cudaSuccess;
}

// Whether this binary's Hopper forward for kHeadDim can run here (launch_sm90.cuh), asked of
// whichever wgmma kernel the head dim has.
template <typename T, int kHeadDim, bool kScoreExtras>
cudaError_t can_run_fwd_sm90(int device, bool& usable) {
  if constexpr (FwdSm90Tile<kHeadDim>::kAvailable)
    return can_run_sm90(fwd_kernel_sm90<T, typename FwdSm90Tile<kHeadDim>::type, kScoreExtras>, device, usable);
  else
    return can_run_sm90(fwd_kernel_sm90_ws<T, FwdWsConfigFor<kHeadDim, kScoreExtras>, kScoreExtras>, device, usable);
}

// Launches a wgmma forward kernel when possible; `launched` says whether it did.
template <typename T, int kHeadDim, bool kScoreExtras>
cudaError_t try_run_fwd_sm90(const FwdParams& params, cudaStream_t stream, bool& launched) {
  launched = false;
  if constexpr (FwdSm90Tile<kHeadDim>::kAvailable || FwdWsTile<kHeadDim>::kAvailable) {
    int device = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err != cudaSuccess) return err;
    bool usable = false;
    err = can_run_fwd_sm90<T, kHeadDim, kScoreExtras>(device, usable);
    if (err != cudaSuccess || !usable) return err;
    err = try_run_fwd_sm90_ws<T, kHeadDim, kScoreExtras>(params, stream, launched);
    if (err != cudaSuccess || launched) return err;
    if constexpr (FwdSm90Tile<kHeadDim>::kAvailable) {
      using Tile = FwdSm90Tile<kHeadDim>;
      using CausalCfg = typename Tile::causal_type;
      using Cfg = typename Tile::type;
      launched = true;
      if (params.causal) {
        return launch_over_query_blocks<CausalCfg>(fwd_kernel_sm90<T, CausalCfg, kScoreExtras>, params, stream);
      }
      return launch_over_query_blocks<Cfg>(fwd_kernel_sm90<T, Cfg, kScoreExtras>, params, stream);
    }
  }
  return cudaSuccess;
}

}  // namespace flash
