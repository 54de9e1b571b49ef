// How many splits of the key range a kvcache call uses when the caller passes num_splits = 0
// (host code, torch-free: the op sizes the partial-result buffers with it).
//
// FlashAttention's rule, adapted: split only when batch x KV heads x m blocks leaves more than a
// fifth of the SMs idle; then choose the split count whose CTAs fill the last wave best, the fewest
// among those within 5% of the best (each CTA holds one SM: splitkv_kernel.cuh uses ~210 KB of
// shared memory), with at least kMinKeysPerSplit keys per split so each warp streams several steps.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace flash {

constexpr int kMaxSplits = 128;
constexpr int kMinKeysPerSplit = 256;

inline int choose_num_splits(int64_t ctas_per_split, int num_sms, int64_t seqlen_k) {
  if (ctas_per_split >= 0.8 * num_sms || num_sms <= 0) return 1;
  const int64_t by_keys = std::max<int64_t>(1, seqlen_k / kMinKeysPerSplit);
  const int max_splits = static_cast<int>(std::min<int64_t>({kMaxSplits, num_sms, by_keys}));
  auto efficiency = [&](int splits) {
    const double waves = static_cast<double>(ctas_per_split * splits) / num_sms;
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
