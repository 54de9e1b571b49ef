// kvcache launch on CDNA (MI200 gfx90a, MI300 gfx942): the append, split-KV and combine kernels
// (launch_kvcache_kernels.cuh) compiled against the CDNA arch layer, with split-KV tiles that fit
// the 64 KiB of LDS of a workgroup and the cp.async loader (synchronous copies on CDNA; the Hopper
// bulk-copy variant is not built). Compiled for gfx90a and gfx942 by CI (hip/ci_check.sh, every
// tile below). A ROCm build's generated instantiations include this file for run_fwd_kvcache
// (generate_instantiations.py --target rocm); not yet run on AMD hardware.
#pragma once

#include "launch_api.h"
#include "launch_kvcache_kernels.cuh"
#include "splitkv_kernel.cuh"

namespace flash {

// One ring stage: the CDNA copies are synchronous (arch/cdna.cuh cp_async_16), so steps issued
// ahead would only hold LDS, not keep loads in flight; the loads of one wave are hidden by the
// other waves on its SIMD, so the LDS goes to waves instead.
constexpr int kSplitKvStagesCdna = 1;

// SplitKvConfig<hd, keys per wave step, stages, waves, workgroups per CU> per head dim. 32 packed query rows per
// workgroup (one 32x32 MFMA atom: arch::kAtomM) and steps of 32 keys, the least a wave's S^T atom
// holds. LDS = Q (32 rows) + per wave K and V of one step, rows padded by 16 bytes, + 8 bytes per
// wave (the bulk loader's barrier, unused here); the end-of-kernel merge of the waves' O rows
// reuses it and is smaller at every tile below. The waves per head dim are those that give the
// most waves per CU (whole workgroups in the CU's 64 KiB), then the fewest waves per workgroup
// (its waves wait for each other only at the end, and a small workgroup leaves less of the CU
// idle while it drains):
//   hd 32: 4 waves, 23072 B (2 workgroups, 8 waves per CU; 8 waves would fit 1 workgroup);
//   hd 64: 3 waves, 32280 B (2 workgroups, 6 waves; 4 waves would fit 1 workgroup, 4 waves);
//   hd 96: 4 waves, 59936 B (4 waves per CU);
//   hd 128: 3 waves, 60952 B (3 waves per CU; 4 would need 78368 B);
//   hd 192: 2 waves, 64016 B (2 waves per CU);
//   hd 256: 1 wave, 50696 B (1 wave per CU: 3 of its 4 SIMDs idle).
// Decode reads K and V once, so waves in flight per CU are what hides the memory latency; at hd
// 128 and up the LDS leaves too few (a register-prefetching loader would let one wave overlap its
// own loads: not written). None of this is measured (no AMD GPU).
template <int kHeadDim>
struct SplitKvTileCdna;
template <> struct SplitKvTileCdna<32> { using type = SplitKvConfig<32, 32, kSplitKvStagesCdna, 4, 2>; };
template <> struct SplitKvTileCdna<64> { using type = SplitKvConfig<64, 32, kSplitKvStagesCdna, 3, 2>; };
template <> struct SplitKvTileCdna<96> { using type = SplitKvConfig<96, 32, kSplitKvStagesCdna, 4, 1>; };
template <> struct SplitKvTileCdna<128> { using type = SplitKvConfig<128, 32, kSplitKvStagesCdna, 3, 1>; };
template <> struct SplitKvTileCdna<192> { using type = SplitKvConfig<192, 32, kSplitKvStagesCdna, 2, 1>; };
template <> struct SplitKvTileCdna<256> { using type = SplitKvConfig<256, 32, kSplitKvStagesCdna, 1, 1>; };

// Paged or contiguous, with the cp.async loader.
template <typename T, typename Cfg>
cudaError_t launch_splitkv_cdna(const SplitKvParams& params, cudaStream_t stream, bool after_append, bool& launched) {
  static_assert(arch::checked_lds_bytes<Cfg::kSmemBytes>() == Cfg::kSmemBytes, "LDS budget");
  return params.cache.block_table != nullptr
             ? launch_splitkv<T, Cfg, CpAsyncKvLoader<T, Cfg, true>>(params, {}, stream, after_append, launched)
             : launch_splitkv<T, Cfg, CpAsyncKvLoader<T, Cfg, false>>(params, {}, stream, after_append, launched);
}

template <typename T, int kHeadDim>
cudaError_t run_fwd_kvcache_cdna(const KvAppendParams& append, const SplitKvParams& params, cudaStream_t stream) {
  using Cfg = typename SplitKvTileCdna<kHeadDim>::type;
  static_assert(Cfg::kCtasPerSm == splitkv_ctas_per_sm(kHeadDim), "the op's split heuristic sizes this tile");
  static_assert(Cfg::kCtasPerSm * Cfg::kSmemBytes <= arch::kLdsBytesPerWorkgroup,
                "the workgroups fit a CU's LDS (64 KiB on gfx90a and gfx942, as a workgroup's)");
  bool appended = false, attended = false;
  cudaError_t err = launch_kvcache_append<T>(append, stream, appended);
  if (err != cudaSuccess) return err;
  err = launch_splitkv_cdna<T, Cfg>(params, stream, appended, attended);
  if (err != cudaSuccess || !attended) return err;
  return launch_splitkv_combine<T>(params, stream);
}

// launch_api.h's entry point in a ROCm build: every head dim has a CDNA tile.
template <typename T, int kHeadDim>
cudaError_t run_fwd_kvcache(const KvAppendParams& append, const SplitKvParams& params, cudaStream_t stream) {
  return run_fwd_kvcache_cdna<T, kHeadDim>(append, params, stream);
}

}  // namespace flash
