// Host check of csrc/flash/fast_divmod.h (built by tests/test_host_headers.py with g++): the header's
// own code, its CUDA qualifiers defined away and __umulhi given its CUDA meaning (the high 32 bits
// of the 64-bit product), against / and % over divisors up to 2^31 - 1 and dividends up to 2^31 - 1.
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#define __host__
#define __device__
#define __forceinline__ inline
static inline uint32_t __umulhi(uint32_t a, uint32_t b) {
  return static_cast<uint32_t>((static_cast<uint64_t>(a) * b) >> 32);
}
#include "flash/fast_divmod.h"

int main() {
  std::mt19937_64 rng(21);
  std::vector<int> divisors;
  for (int d = 1; d <= 4096; ++d) divisors.push_back(d);
  for (int k = 1; k < 31; ++k) {
    divisors.push_back(1 << k);
    divisors.push_back((1 << k) - 1);
    divisors.push_back((1 << k) + 1);
  }
  divisors.push_back(2147483647);
  for (int i = 0; i < 4000; ++i) divisors.push_back(1 + static_cast<int>(rng() % 2147483647u));
  long checked = 0, failures = 0;
  for (const int d : divisors) {
    const flash::FastDivmod fast(d);
    std::vector<int> dividends = {0, 1, d - 1, d, 2147483647, 2147483646};
    if (d < 1073741823) dividends.push_back(2 * d + 1);
    for (int i = 0; i < 300; ++i) dividends.push_back(static_cast<int>(rng() % 2147483648u));
    for (int i = 0; i < 100; ++i) dividends.push_back(static_cast<int>(rng() % (16ull * d)) & 0x7fffffff);
    for (const int n : dividends) {
      int q = -1, r = -1;
      fast.divmod(n, q, r);
      ++checked;
      if (q != n / d || r != n % d || fast.div(n) != n / d) {
        if (++failures <= 10) std::printf("FAIL d=%d n=%d: got %d r %d, want %d r %d\n", d, n, q, r, n / d, n % d);
      }
    }
  }
  std::printf("%ld divisions checked, %ld wrong\n", checked, failures);
  return failures == 0 ? 0 : 1;
}
