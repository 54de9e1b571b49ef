// Checks the Hopper arch layer's e4m3 pieces (csrc/flash/arch/sm90_fp8.cuh, the e4m3 Wgmma ops) on
// their own, against a CPU product of small integers (exact in e4m3 and fp32):
//   scores: S = Q.K^T with Q (64 x 128) and K (64 x 128) e4m3 in the 128-byte swizzled layout
//           (rows of 128 bytes: SwizzledTile<rows, 64> in 16-bit columns), K-major, 4 k-steps of 32
//   output: O = P.V with P (64 x 128) given as fp32 accumulators (the S layout), converted by
//           accumulators_to_e4m3_a_fragments, and V (128 keys x 64) stored transposed (64 rows of 128
//           keys) with the keys of each 32-key group at fp8_v_key_at's positions, K-major
// Prints one line per case and "ALL OK" when every element matches. Needs an sm_90a GPU:
//   nvcc -std=c++17 -I csrc -gencode=arch=compute_90a,code=sm_90a tests/cuda/wgmma_fp8_layouts.cu
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "flash/arch/sm90_fp8.cuh"
#include "flash/arch/sm90_swizzled_tile.cuh"
#include "flash/arch/sm90_wgmma.cuh"

using namespace flash::arch;

constexpr int kRows = 64, kKeys = 128, kDims = 64;
using WideTile = SwizzledTile<64, 64>;  // 64 rows of 128 e4m3 (64 16-bit columns)

// Element (row, col) of an e4m3 tile whose rows are 128 bytes.
__device__ void put_e4m3(char* tile, int row, int col, float value) {
  tile[WideTile::byte_offset(row, col / 2) + col % 2] = static_cast<char>(__nv_fp8_e4m3(value).__x);
}

template <int NT>
__device__ void write_out(float* out, const float (&d)[NT][4]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int j = 0; j < NT; ++j)
    for (int r = 0; r < 4; ++r) out[(warp * 16 + acc_row(lane, r)) * (NT * 8) + j * 8 + acc_col(lane, r)] = d[j][r];
}

// q: (64 x 128), k: (64 x 128) row-major floats. out (64 x 64) = q . k^T
__global__ void scores_case(const float* q, const float* k, float* out) {
  __shared__ __align__(1024) char sq[WideTile::kBytes];
  __shared__ __align__(1024) char sk[WideTile::kBytes];
  for (int i = threadIdx.x; i < kRows * kKeys; i += 128) {
    put_e4m3(sq, i / kKeys, i % kKeys, q[i]);
    put_e4m3(sk, i / kKeys, i % kKeys, k[i]);
  }
  fence_proxy_async();
  __syncthreads();
  float d[8][4];
  wgmma_fence();
  for (int ks = 0; ks < WideTile::kKSteps; ++ks)
    Wgmma<Fp8E4m3, 64>::ss<false, false>(d, WideTile::k_major(sq, 0, ks), WideTile::k_major(sk, 0, ks), ks > 0);
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_fence_operand(d);
  write_out(out, d);
}

// p: (64 x 128 keys), v: (128 keys x 64) row-major floats. out (64 x 64) = p . v
__global__ void output_case(const float* p, const float* v, float* out) {
  __shared__ __align__(1024) char svt[WideTile::kBytes];  // V^T: 64 dim rows x 128 keys, permuted
  for (int i = threadIdx.x; i < kDims * kKeys; i += 128) {
    const int dim = i / kKeys, position = i % kKeys;
    const int key = position / kFp8KeyGroup * kFp8KeyGroup + fp8_v_key_at(position % kFp8KeyGroup);
    put_e4m3(svt, dim, position, v[key * kDims + dim]);
  }
  fence_proxy_async();
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float s[1][kKeys / 8][4];
  for (int j = 0; j < kKeys / 8; ++j)
    for (int r = 0; r < 4; ++r) s[0][j][r] = p[(warp * 16 + acc_row(lane, r)) * kKeys + j * 8 + acc_col(lane, r)];
  uint32_t frag[1][kKeys / 32][4];
  accumulators_to_e4m3_a_fragments(frag, s);
  float d[8][4];
  wgmma_fence();
  for (int ks = 0; ks < kKeys / 32; ++ks)
    Wgmma<Fp8E4m3, 64>::rs<false>(d, frag[0][ks], WideTile::k_major(svt, 0, ks), ks > 0);
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_fence_operand(d);
  write_out(out, d);
}

struct Matrix {
  int rows, cols;
  std::vector<float> host;
  float* device = nullptr;
  Matrix(int r, int c, unsigned seed) : rows(r), cols(c), host(r * c) {
    srand(seed);
    for (int i = 0; i < r * c; ++i) host[i] = static_cast<float>(rand() % 7 - 3);
    cudaMalloc(&device, host.size() * sizeof(float));
    cudaMemcpy(device, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice);
  }
  float at(int r, int c) const { return host[r * cols + c]; }
};

template <typename F>
bool check(const char* name, void (*launch)(float*), F expected) {
  float* out = nullptr;
  cudaMalloc(&out, kRows * kDims * sizeof(float));
  cudaMemset(out, 0xFF, kRows * kDims * sizeof(float));  // NaN poison
  launch(out);
  const cudaError_t err = cudaDeviceSynchronize();
  std::vector<float> got(kRows * kDims);
  cudaMemcpy(got.data(), out, got.size() * sizeof(float), cudaMemcpyDeviceToHost);
  int bad = 0;
  for (int m = 0; m < kRows; ++m)
    for (int n = 0; n < kDims; ++n)
      if (!(got[m * kDims + n] == expected(m, n))) ++bad;
  printf("%s: %s, %d of %d elements wrong\n", name, err == cudaSuccess ? "ran" : cudaGetErrorString(err), bad,
         kRows * kDims);
  cudaFree(out);
  return err == cudaSuccess && bad == 0;
}

static Matrix *g_a, *g_b;
int main() {
  bool ok = true;
  {
    Matrix q(kRows, kKeys, 1), k(kRows, kKeys, 2);
    g_a = &q, g_b = &k;
    ok &= check("e4m3 scores", [](float* out) { scores_case<<<1, 128>>>(g_a->device, g_b->device, out); },
                [&](int m, int n) { float s = 0; for (int c = 0; c < kKeys; ++c) s += q.at(m, c) * k.at(n, c); return s; });
  }
  {
    Matrix p(kRows, kKeys, 3), v(kKeys, kDims, 4);
    g_a = &p, g_b = &v;
    ok &= check("e4m3 output", [](float* out) { output_case<<<1, 128>>>(g_a->device, g_b->device, out); },
                [&](int m, int n) { float s = 0; for (int c = 0; c < kKeys; ++c) s += p.at(m, c) * v.at(c, n); return s; });
  }
  printf(ok ? "ALL OK\n" : "FAILED\n");
  return ok ? 0 : 1;
}
