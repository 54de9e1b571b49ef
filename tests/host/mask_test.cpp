// Host check of csrc/flash/mask.cuh (built by tests/test_host_headers.py with g++): the header's own
// code, its CUDA qualifiers defined away. For random sequence lengths, windows (causal, local,
// none), row ranges and block sizes: keys_seen_by_all is the intersection of every row's
// keys_seen_by, and key_blocks_seen_whole_by holds exactly the blocks block_fully_visible accepts
// (which the forward's step walk trusts to leave a block unmasked).
#include <algorithm>
#include <cstdio>
#include <random>

#define __host__
#define __device__
#define __forceinline__ inline
using std::max;
using std::min;
#include "flash/mask.cuh"

int main() {
  std::mt19937 rng(22);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const int block_sizes[] = {64, 80, 128, 176};
  long cases = 0, wrong = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    const int seqlen_q = uniform(1, 700), seqlen_k = uniform(1, 700);
    const int kind = uniform(0, 3);  // none, causal, local, left-only
    const int left = kind >= 2 ? uniform(0, 300) : -1;
    const int right = kind == 1 ? 0 : kind == 2 ? uniform(0, 300) : -1;
    const flash::AttentionMask mask{seqlen_q, seqlen_k, left, right};
    const int m0 = uniform(0, seqlen_q - 1), rows = uniform(1, min(192, seqlen_q - m0));
    const int block_n = block_sizes[uniform(0, 3)];
    ++cases;
    // keys_seen_by_all against the intersection of the rows' ranges
    int first = 0, end = seqlen_k;
    for (int i = m0; i < m0 + rows; ++i) {
      const flash::IndexRange r = mask.keys_seen_by(i);
      first = max(first, r.first);
      end = min(end, r.end);
    }
    const flash::IndexRange all = mask.keys_seen_by_all(m0, rows);
    const bool all_empty = all.first >= all.end, expected_empty = first >= end;
    bool ok = all_empty == expected_empty && (expected_empty || (all.first == first && all.end == end));
    // key_blocks_seen_whole_by against block_fully_visible, block by block
    const flash::IndexRange blocks = mask.key_blocks_seen_whole_by(m0, rows, block_n);
    for (int n = 0; n * block_n < seqlen_k + block_n; ++n) {
      const bool whole = mask.block_fully_visible(m0, rows, n * block_n, block_n);
      if (whole != blocks.contains(n)) ok = false;
      // a whole block has every pair visible
      for (int i = m0; whole && i < m0 + rows; i += max(1, rows / 7))
        for (int j = n * block_n; j < (n + 1) * block_n; j += 7)
          if (!mask.visible(i, j)) ok = false;
    }
    if (!ok) {
      if (++wrong <= 5)
        std::printf("mismatch: seqlen_q %d seqlen_k %d left %d right %d m0 %d rows %d block_n %d\n", seqlen_q, seqlen_k,
                    left, right, m0, rows, block_n);
    }
  }
  std::printf("%ld cases, %ld wrong\n", cases, wrong);
  return wrong == 0 ? 0 : 1;
}
