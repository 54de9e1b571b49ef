// How many splits of the key range a kvcache call uses when the caller passes num_splits = 0
// (host code, torch-free: the op sizes the partial-result buffers with it).
//
// FlashAttention's rule, adapted: split only when batch x KV heads x m blocks leaves more than a
// fifth of the CTA slots idle; then choose the split count whose CTAs fill the last wave best, the
// fewest among those within 5% of the best, with at least kMinKeysPerSplit keys per split so each
// warp streams several steps. A slot is where one CTA runs: an SM holds one wide CTA (8 warps,
// ~210 KB of shared memory) or two narrow ones (4 warps, about half of it: launch_kvcache.cuh).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace flash {

constexpr int kMaxSplits = 128;
constexpr int kMinKeysPerSplit = 256;

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

// The narrow tile exists up to this kernel head dim; its shared memory is at most this many bytes
// (static_assert in launch_kvcache.cuh), plus the 1 KB the hardware reserves per CTA.
constexpr int kSplitKvNarrowMaxHeadDim = 128;
constexpr int kSplitKvNarrowSmemBytes = 111 * 1024;
constexpr int kSmemReservedPerCta = 1024;

// CTAs of the split-KV kernel per SM: 2 (narrow tiles) where the head dim has them and two fit in
// the SM's shared memory (Hopper's 228 KB, not an A100's 164 KB), else 1.
// FLASH_ATTN_SPLITKV_CTAS_PER_SM=1 forces the wide tile (an A/B switch, read per call as the tests
// switch it).
inline int splitkv_ctas_per_sm(int kernel_headdim, int64_t smem_per_sm) {
  const char* choice = std::getenv("FLASH_ATTN_SPLITKV_CTAS_PER_SM");
  const bool wide_forced = choice != nullptr && std::strcmp(choice, "1") == 0;
  const bool two_fit = 2 * static_cast<int64_t>(kSplitKvNarrowSmemBytes + kSmemReservedPerCta) <= smem_per_sm;
  return !wide_forced && kernel_headdim <= kSplitKvNarrowMaxHeadDim && two_fit ? 2 : 1;
}

}  // namespace flash
