// Checks the Hopper arch layer (csrc/flash/arch/sm90_wgmma.cuh, sm90_swizzled_tile.cuh) on its
// own: the wgmma operand forms the kernels use, against a CPU product of small integers (exact in
// bf16/fp32).
//   kmajor: A = K-major rows 64..127 of a 128-row tile (loaded by load_core_tile_async), B K-major
//   mn:     A and B MN-major ("transposed"), both starting at a column offset
//   rs:     A from registers (mma.sync A layout), B MN-major
//   swizzled kmajor: as kmajor in the 128-byte swizzled layout (load_swizzled_tile_async), K = 128
//                    (two 64-column blocks)
//   swizzled rs:     A from registers, B MN-major swizzled, N = 128 (two 64-column blocks)
//   swizzled mn:     A MN-major (no swizzle), B MN-major swizzled from column 32 (inside a block)
//   swizzled rs with a block of ones: N = 136 over B's two blocks and a third of ones (row sums)
// Prints one line per case and "ALL OK" when every element matches. Needs an sm_90a GPU:
//   nvcc -std=c++17 -I csrc -gencode=arch=compute_90a,code=sm_90a tests/cuda/wgmma_layouts.cu
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "flash/arch/sm90_swizzled_tile.cuh"
#include "flash/arch/sm90_wgmma.cuh"

using T = __nv_bfloat16;
using namespace flash::arch;

constexpr int kK = 32;  // two k-steps

__device__ void put(void* tile, int offset, float value) {
  *reinterpret_cast<T*>(static_cast<char*>(tile) + offset) = __float2bfloat16(value);
}

// Writes accumulators d (64 x N, mma C layout per warp) to out (row-major 64 x N).
template <int NT>
__device__ void write_out(float* out, const float (&d)[NT][4]) {
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  for (int j = 0; j < NT; ++j)
    for (int r = 0; r < 4; ++r) out[(warp * 16 + acc_row(lane, r)) * (NT * 8) + j * 8 + acc_col(lane, r)] = d[j][r];
}

// a: (128 x kK) row-major, rows 64.. used; b: (64 x kK) row-major (N x K). out = a[64:] . b^T
__global__ void kmajor_case(const T* a, const T* b, float* out) {
  __shared__ __align__(128) char sa[CoreTile<128, kK>::kBytes];
  __shared__ __align__(128) char sb[CoreTile<64, kK>::kBytes];
  load_core_tile_async<128, kK, 128>(sa, a, kK, 128, kK, threadIdx.x);
  cp_async_commit();
  for (int i = threadIdx.x; i < 64 * kK; i += 128)
    put(sb, CoreTile<64, kK>::byte_offset(i / kK, i % kK), __bfloat162float(b[i]));
  cp_async_wait<0>();
  fence_proxy_async();
  __syncthreads();
  float d[8][4];
  wgmma_fence();
  for (int ks = 0; ks < kK / 16; ++ks)
    Wgmma<T, 64>::ss<false, false>(d, CoreTile<128, kK>::k_major(sa, 64, ks), CoreTile<64, kK>::k_major(sb, 0, ks),
                                   ks > 0);
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_fence_operand(d);
  write_out(out, d);
}

// at: (kK x 128) row-major (K x M), columns 64.. used; b: (kK x 64) row-major (K x N), columns 32..
// used. out (64 x 32) = at[:, 64:]^T . b[:, 32:]. kSwapOffsets exchanges the descriptor's leading and
// stride byte offsets: a diagnostic that says which reading of the MN-major layout the GPU uses.
template <int kRows, int kCols>
__device__ uint64_t mn_descriptor(const void* tile, int col0, int ks, bool swap_offsets) {
  using Tile = CoreTile<kRows, kCols>;
  if (!swap_offsets) return Tile::mn_major(tile, col0, ks);
  const char* start = static_cast<const char*>(tile) + (col0 / 8) * Tile::kChunkBytes + 2 * ks * kCoreBytes;
  return smem_descriptor(start, Tile::kChunkBytes, kCoreBytes);
}

template <bool kSwapOffsets>
__global__ void mn_case(const T* at, const T* b, float* out) {
  __shared__ __align__(128) char sa[CoreTile<kK, 128>::kBytes];
  __shared__ __align__(128) char sb[CoreTile<kK, 64>::kBytes];
  for (int i = threadIdx.x; i < kK * 128; i += 128)
    put(sa, CoreTile<kK, 128>::byte_offset(i / 128, i % 128), __bfloat162float(at[i]));
  for (int i = threadIdx.x; i < kK * 64; i += 128)
    put(sb, CoreTile<kK, 64>::byte_offset(i / 64, i % 64), __bfloat162float(b[i]));
  fence_proxy_async();
  __syncthreads();
  float d[4][4];
  wgmma_fence();
  for (int ks = 0; ks < kK / 16; ++ks)
    Wgmma<T, 32>::ss<true, true>(d, mn_descriptor<kK, 128>(sa, 64, ks, kSwapOffsets),
                                 mn_descriptor<kK, 64>(sb, 32, ks, kSwapOffsets), ks > 0);
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_fence_operand(d);
  write_out(out, d);
}

// The A fragments (mma.sync A layout) of this thread's warp for a (64 x kK) row-major matrix.
__device__ void load_a_fragments(uint32_t (&frag)[kK / 16][4], const T* a) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int ks = 0; ks < kK / 16; ++ks)
    for (int i = 0; i < 4; ++i) {  // a0: (g, 2t), a1: (g + 8, 2t), a2: (g, 2t + 8), a3: (g + 8, 2t + 8)
      const int row = warp * 16 + lane / 4 + 8 * (i % 2), col = ks * 16 + 2 * (lane % 4) + 8 * (i / 2);
      frag[ks][i] = pack_pair<T>(__bfloat162float(a[row * kK + col]), __bfloat162float(a[row * kK + col + 1]));
    }
}

// a: (64 x kK) row-major, held in registers; b: (kK x 64) row-major (K x N). out = a . b
__global__ void rs_case(const T* a, const T* b, float* out) {
  __shared__ __align__(128) char sb[CoreTile<kK, 64>::kBytes];
  for (int i = threadIdx.x; i < kK * 64; i += 128)
    put(sb, CoreTile<kK, 64>::byte_offset(i / 64, i % 64), __bfloat162float(b[i]));
  fence_proxy_async();
  __syncthreads();
  uint32_t frag[kK / 16][4];
  load_a_fragments(frag, a);
  float d[8][4];
  wgmma_fence();
  for (int ks = 0; ks < kK / 16; ++ks) Wgmma<T, 64>::rs<true>(d, frag[ks], CoreTile<kK, 64>::mn_major(sb, 0, ks), ks > 0);
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_fence_operand(d);
  write_out(out, d);
}

constexpr int kWideK = 128;  // two 64-column swizzle blocks

// a: (128 x kWideK) row-major, rows 64.. used; b: (64 x kWideK) row-major (N x K). out = a[64:] . b^T
__global__ void swizzled_kmajor_case(const T* a, const T* b, float* out) {
  using ATile = SwizzledTile<128, kWideK>;
  using BTile = SwizzledTile<64, kWideK>;
  __shared__ __align__(1024) char sa[ATile::kBytes];
  __shared__ __align__(1024) char sb[BTile::kBytes];
  load_swizzled_tile_async<128, kWideK, 128>(sa, a, kWideK, 128, kWideK, threadIdx.x);
  cp_async_commit();
  for (int i = threadIdx.x; i < 64 * kWideK; i += 128)
    put(sb, BTile::byte_offset(i / kWideK, i % kWideK), __bfloat162float(b[i]));
  cp_async_wait<0>();
  fence_proxy_async();
  __syncthreads();
  float d[8][4];
  wgmma_fence();
  for (int ks = 0; ks < kWideK / 16; ++ks)
    Wgmma<T, 64>::ss<false, false>(d, ATile::k_major(sa, 64, ks), BTile::k_major(sb, 0, ks), ks > 0);
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_fence_operand(d);
  write_out(out, d);
}

// a: (64 x kK) row-major, in registers; b: (kK x 128) row-major (K x N), MN-major swizzled.
// out (64 x 128) = a . b. kSwapOffsets exchanges the leading and stride offsets (diagnostic).
template <bool kSwapOffsets>
__global__ void swizzled_rs_case(const T* a, const T* b, float* out) {
  using BTile = SwizzledTile<kK, 128>;
  __shared__ __align__(1024) char sb[BTile::kBytes];
  for (int i = threadIdx.x; i < kK * 128; i += 128) put(sb, BTile::byte_offset(i / 128, i % 128), __bfloat162float(b[i]));
  fence_proxy_async();
  __syncthreads();
  uint32_t frag[kK / 16][4];
  load_a_fragments(frag, a);
  float d[16][4];
  wgmma_fence();
  for (int ks = 0; ks < kK / 16; ++ks) {
    uint64_t desc = BTile::mn_major(sb, 0, ks);
    if (kSwapOffsets)
      desc = smem_descriptor_swizzle128(sb + ks * 2 * kSwizzleAtomBytes, kSwizzleAtomBytes, BTile::kBlockBytes);
    Wgmma<T, 128>::rs<true>(d, frag[ks], desc, ks > 0);
  }
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_fence_operand(d);
  write_out(out, d);
}

// The forward's P.V with row sums (fwd_kernel_sm90.cuh, Sm90ForwardRows::kSumsByMma): a from
// registers, b (kK x 128) MN-major swizzled, followed by a third 64-column block of ones; N = 136.
// out (64 x 136) = a . b in columns 0..127 and each row's sum of a in columns 128..135.
__global__ void swizzled_rs_ones_case(const T* a, const T* b, float* out) {
  using BTile = SwizzledTile<kK, 128>;
  __shared__ __align__(1024) char sb[BTile::kBytes + BTile::kBlockBytes];
  for (int i = threadIdx.x; i < kK * 128; i += 128) put(sb, BTile::byte_offset(i / 128, i % 128), __bfloat162float(b[i]));
  for (int i = threadIdx.x; i < BTile::kBlockBytes / 2; i += 128) put(sb + BTile::kBytes, 2 * i, 1.0f);
  fence_proxy_async();
  __syncthreads();
  uint32_t frag[kK / 16][4];
  load_a_fragments(frag, a);
  float d[17][4];
  wgmma_fence();
  for (int ks = 0; ks < kK / 16; ++ks) Wgmma<T, 136>::rs<true>(d, frag[ks], BTile::mn_major(sb, 0, ks), ks > 0);
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_fence_operand(d);
  write_out(out, d);
}

// at: (kK x 128) row-major (K x M), columns 64.. used, no swizzle; b: (kK x 64) row-major (K x N),
// swizzled, columns 32.. used. out (64 x 32) = at[:, 64:]^T . b[:, 32:]
__global__ void swizzled_mn_case(const T* at, const T* b, float* out) {
  using BTile = SwizzledTile<kK, 64>;
  __shared__ __align__(128) char sa[CoreTile<kK, 128>::kBytes];
  __shared__ __align__(1024) char sb[BTile::kBytes];
  for (int i = threadIdx.x; i < kK * 128; i += 128)
    put(sa, CoreTile<kK, 128>::byte_offset(i / 128, i % 128), __bfloat162float(at[i]));
  for (int i = threadIdx.x; i < kK * 64; i += 128) put(sb, BTile::byte_offset(i / 64, i % 64), __bfloat162float(b[i]));
  fence_proxy_async();
  __syncthreads();
  float d[4][4];
  wgmma_fence();
  for (int ks = 0; ks < kK / 16; ++ks)
    Wgmma<T, 32>::ss<true, true>(d, CoreTile<kK, 128>::mn_major(sa, 64, ks), BTile::mn_major(sb, 32, ks), ks > 0);
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_fence_operand(d);
  write_out(out, d);
}

struct Matrix {
  int rows, cols;
  std::vector<float> host;
  T* device = nullptr;
  Matrix(int r, int c, unsigned seed) : rows(r), cols(c), host(r * c) {
    srand(seed);
    std::vector<T> bits(r * c);
    for (int i = 0; i < r * c; ++i) {
      host[i] = static_cast<float>(rand() % 7 - 3);
      bits[i] = __float2bfloat16(host[i]);
    }
    cudaMalloc(&device, bits.size() * sizeof(T));
    cudaMemcpy(device, bits.data(), bits.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  float at(int r, int c) const { return host[r * cols + c]; }
};

// expected(m, n) for an M x N result; prints and returns whether out matches.
template <typename F>
bool check(const char* name, void (*launch)(float*), int m_size, int n_size, F expected) {
  float* out = nullptr;
  cudaMalloc(&out, m_size * n_size * sizeof(float));
  cudaMemset(out, 0xFF, m_size * n_size * sizeof(float));  // NaN poison
  launch(out);
  const cudaError_t err = cudaDeviceSynchronize();
  std::vector<float> got(m_size * n_size);
  cudaMemcpy(got.data(), out, got.size() * sizeof(float), cudaMemcpyDeviceToHost);
  int bad = 0;
  for (int m = 0; m < m_size; ++m)
    for (int n = 0; n < n_size; ++n)
      if (!(got[m * n_size + n] == expected(m, n))) ++bad;
  printf("%s: %s, %d of %d elements wrong\n", name, err == cudaSuccess ? "ran" : cudaGetErrorString(err), bad,
         m_size * n_size);
  cudaFree(out);
  return err == cudaSuccess && bad == 0;
}

static Matrix *g_a, *g_b;
int main() {
  bool ok = true;
  {
    Matrix a(128, kK, 1), b(64, kK, 2);
    g_a = &a, g_b = &b;
    ok &= check("kmajor", [](float* out) { kmajor_case<<<1, 128>>>(g_a->device, g_b->device, out); }, 64, 64,
                [&](int m, int n) { float s = 0; for (int k = 0; k < kK; ++k) s += a.at(64 + m, k) * b.at(n, k); return s; });
  }
  {
    Matrix at(kK, 128, 3), b(kK, 64, 4);
    g_a = &at, g_b = &b;
    auto expected = [&](int m, int n) {
      float s = 0;
      for (int k = 0; k < kK; ++k) s += at.at(k, 64 + m) * b.at(k, 32 + n);
      return s;
    };
    const bool mn_ok = check("mn", [](float* out) { mn_case<false><<<1, 128>>>(g_a->device, g_b->device, out); }, 64,
                             32, expected);
    if (!mn_ok)
      check("mn (offsets swapped, diagnostic)",
            [](float* out) { mn_case<true><<<1, 128>>>(g_a->device, g_b->device, out); }, 64, 32, expected);
    ok &= mn_ok;
  }
  {
    Matrix a(64, kK, 5), b(kK, 64, 6);
    g_a = &a, g_b = &b;
    ok &= check("rs", [](float* out) { rs_case<<<1, 128>>>(g_a->device, g_b->device, out); }, 64, 64,
                [&](int m, int n) { float s = 0; for (int k = 0; k < kK; ++k) s += a.at(m, k) * b.at(k, n); return s; });
  }
  {
    Matrix a(128, kWideK, 7), b(64, kWideK, 8);
    g_a = &a, g_b = &b;
    ok &= check("swizzled kmajor", [](float* out) { swizzled_kmajor_case<<<1, 128>>>(g_a->device, g_b->device, out); },
                64, 64, [&](int m, int n) {
                  float s = 0;
                  for (int k = 0; k < kWideK; ++k) s += a.at(64 + m, k) * b.at(n, k);
                  return s;
                });
  }
  {
    Matrix a(64, kK, 9), b(kK, 128, 10);
    g_a = &a, g_b = &b;
    auto expected = [&](int m, int n) {
      float s = 0;
      for (int k = 0; k < kK; ++k) s += a.at(m, k) * b.at(k, n);
      return s;
    };
    const bool rs_ok = check("swizzled rs",
                             [](float* out) { swizzled_rs_case<false><<<1, 128>>>(g_a->device, g_b->device, out); },
                             64, 128, expected);
    if (!rs_ok)
      check("swizzled rs (offsets swapped, diagnostic)",
            [](float* out) { swizzled_rs_case<true><<<1, 128>>>(g_a->device, g_b->device, out); }, 64, 128, expected);
    ok &= rs_ok;
  }
  {
    Matrix a(64, kK, 13), b(kK, 128, 14);
    g_a = &a, g_b = &b;
    ok &= check("swizzled rs with a block of ones (N = 136)",
                [](float* out) { swizzled_rs_ones_case<<<1, 128>>>(g_a->device, g_b->device, out); }, 64, 136,
                [&](int m, int n) {
                  float s = 0;
                  for (int k = 0; k < kK; ++k) s += a.at(m, k) * (n < 128 ? b.at(k, n) : 1.0f);
                  return s;
                });
  }
  {
    Matrix at(kK, 128, 11), b(kK, 64, 12);
    g_a = &at, g_b = &b;
    ok &= check("swizzled mn", [](float* out) { swizzled_mn_case<<<1, 128>>>(g_a->device, g_b->device, out); }, 64, 32,
                [&](int m, int n) {
                  float s = 0;
                  for (int k = 0; k < kK; ++k) s += at.at(k, 64 + m) * b.at(k, 32 + n);
                  return s;
                });
  }
  printf(ok ? "ALL OK\n" : "FAILED\n");
  return ok ? 0 : 1;
}
