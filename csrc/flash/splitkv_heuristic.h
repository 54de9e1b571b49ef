// How many splits of the key range a kvcache call uses when the caller passes num_splits = 0
// (host code, torch-free: the op sizes the partial-result buffers with it).
//
// FlashAttention's rule, adapted: split only when batch x KV heads x m blocks (splitkv_m_blocks)
// leaves more than a fifth of the CTA slots idle (slots: SMs x splitkv_ctas_per_sm, the CTAs the
// tile's shared memory lets an SM hold); then choose the split count whose CTAs fill the last wave
// best, the fewest among those within 5% of the best, with at least kMinKeysPerSplit keys per split
// so each warp streams several steps.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace flash {

constexpr int kMaxSplits = 128;
constexpr int kMinKeysPerSplit = 256;

// Packed query rows per split-KV CTA: one MMA atom of rows (arch::kAtomM, SplitKvConfig::kRows),
// 16 on NVIDIA and 32 on CDNA (the 32x32 MFMA). Host code cannot include the arch layer, so the
// count is here too (splitkv_schedule.cuh asserts that the kernel's agrees); host and device code
// of a ROCm build both see __HIP_PLATFORM_AMD__ (torch passes it to both compilers).
#if defined(__HIP_PLATFORM_AMD__)
constexpr int kSplitKvRows = 32;
#else
constexpr int kSplitKvRows = 16;
#endif

// The split-KV grid's m blocks per (batch, KV head), as the launcher computes them: the `group`
// query heads of a KV head are packed with the tokens into seqlen_q x group rows.
constexpr int64_t splitkv_m_blocks(int64_t seqlen_q, int64_t group) {
  return (seqlen_q * group + kSplitKvRows - 1) / kSplitKvRows;
}

// CTAs per SM (workgroups per CU) of the split-KV tile of kernel head dim `headdim` (32, 64, 96, 128,
// 192 or 256). The launchers assert that their tiles agree (launch_kvcache.cuh,
// launch_kvcache_cdna.cuh).
//   NVIDIA: one CTA of ~210 KB of rings at every head dim.
//   CDNA: the workgroups per CU of 64 KiB of LDS: 2 at hd 32 and 64, 1 above.
constexpr int splitkv_ctas_per_sm(int64_t headdim) {
#if defined(__HIP_PLATFORM_AMD__)
  return headdim <= 64 ? 2 : 1;
#else
  static_cast<void>(headdim);
  return 1;
#endif
}

// slots: the CTAs the device runs at once (SMs x splitkv_ctas_per_sm).
inline int choose_num_splits(int64_t ctas_per_split, int slots, int64_t seqlen_k) {
  if (ctas_per_split >= 0.8 * slots || slots <= 0) return 1;
  const int64_t by_keys = std::max<int64_t>(1, seqlen_k / kMinKeysPerSplit);
  const int max_splits = static_cast<int>(std::min<int64_t>({kMaxSplits, slots, by_keys}));
  auto efficiency = [&](int splits) {
    const double waves = static_cast<double>(ctas_per_split * splits) / slots;
    return waves / std::ceil(waves);
  };
  double best = 0;
  for (int s = 1; s <= max_splits; ++s) best = std::max(best, efficiency(s));
  for (int s = 1; s <= max_splits; ++s) {
    if (efficiency(s) >= 0.95 * best) return s;
  }
  return 1;
}

}  // namespace flash
