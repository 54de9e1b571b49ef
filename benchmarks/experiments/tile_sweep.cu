// Tile-configuration sweep for the forward and backward kernels, torch-free (llm.c dev/cuda style):
// times several FwdConfig / BwdConfig variants on the benchmark's training shapes and checks each
// variant's output against the first one of its head dim, so a broken variant shows at once.
//
//   nvcc -O3 --expt-relaxed-constexpr -I csrc -gencode=arch=compute_90a,code=sm_90a \
//        benchmarks/experiments/tile_sweep.cu -o /tmp/tile_sweep && /tmp/tile_sweep
//
// Results and the reasons for the chosen tiles go to benchmarks/NOTES.md.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "flash/launch_bwd.cuh"
#include "flash/launch_fwd.cuh"

#define CUDA_OK(call)                                                                              \
  do {                                                                                             \
    cudaError_t err_ = (call);                                                                     \
    if (err_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(err_)); \
      std::exit(1);                                                                                \
    }                                                                                              \
  } while (0)

using T = __nv_bfloat16;

__global__ void fill_random(T* x, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    x[i] = __float2bfloat16((h & 0xffff) / 32768.0f - 1.0f);  // uniform in [-1, 1)
  }
}

struct Problem {
  int headdim, seqlen, batch, heads;
  bool causal;
  double fwd_flops() const {
    return 4.0 * batch * (double)seqlen * seqlen * heads * headdim / (causal ? 2.0 : 1.0);
  }
};

struct Buffers {
  T *q, *k, *v, *out, *dout, *dq, *dk, *dv;
  float *lse, *dq_accum, *dsum;
};

Buffers allocate(const Problem& pb) {
  const int64_t n = (int64_t)pb.batch * pb.seqlen * pb.heads * pb.headdim;
  const int64_t rows = (int64_t)pb.batch * pb.heads * pb.seqlen;
  Buffers b{};
  for (T** p : {&b.q, &b.k, &b.v, &b.out, &b.dout, &b.dq, &b.dk, &b.dv}) CUDA_OK(cudaMalloc(p, n * sizeof(T)));
  CUDA_OK(cudaMalloc(&b.lse, rows * sizeof(float)));
  CUDA_OK(cudaMalloc(&b.dsum, rows * sizeof(float)));
  CUDA_OK(cudaMalloc(&b.dq_accum, (size_t)pb.heads * flash::dq_accum_rows_per_head(false, pb.batch, pb.seqlen, 0) *
                                       flash::dq_accum_columns(pb.headdim) * sizeof(float)));
  uint32_t seed = 1;
  for (T* p : {b.q, b.k, b.v, b.dout}) fill_random<<<1024, 256>>>(p, n, seed++);
  CUDA_OK(cudaGetLastError());
  return b;
}

void release(Buffers& b) {
  for (void* p : {(void*)b.q, (void*)b.k, (void*)b.v, (void*)b.out, (void*)b.dout, (void*)b.dq, (void*)b.dk, (void*)b.dv,
                  (void*)b.lse, (void*)b.dq_accum, (void*)b.dsum})
    CUDA_OK(cudaFree(p));
}

flash::BwdParams make_params(const Problem& pb, const Buffers& b) {
  const int64_t row = (int64_t)pb.heads * pb.headdim, batch = row * pb.seqlen;
  auto view = [&](void* p) { return flash::Strided4d{p, batch, row, pb.headdim}; };
  flash::BwdParams p{};
  p.fwd.q = view(b.q);
  p.fwd.k = view(b.k);
  p.fwd.v = view(b.v);
  p.fwd.out = view(b.out);
  p.fwd.lse = b.lse;
  p.fwd.lse_head_stride = pb.seqlen;
  p.fwd.shape = {pb.batch, pb.seqlen, pb.seqlen, pb.heads, pb.heads, pb.headdim};
  p.fwd.softmax_scale = 1.0f / std::sqrt((float)pb.headdim);
  p.fwd.logit_scale = p.fwd.softmax_scale;
  p.fwd.logit_scale_log2 = p.fwd.softmax_scale * 1.4426950408889634f;
  p.fwd.window = {-1, pb.causal ? 0 : -1};
  p.fwd.dropout.keep_prob = 1.f;
  p.fwd.causal = pb.causal;
  p.dout = view(b.dout);
  p.dk = view(b.dk);
  p.dv = view(b.dv);
  p.dq = view(b.dq);
  p.dq_accum = b.dq_accum;
  p.dq_accum_head_rows = flash::dq_accum_rows_per_head(false, pb.batch, pb.seqlen, 0);
  p.dq_slices = 1;
  p.dq_slice_stride = pb.heads * p.dq_accum_head_rows * flash::dq_accum_columns(pb.headdim);
  p.dsum = b.dsum;
  return p;
}

// Median time in ms of `launch` over `reps` runs, after warm-up.
template <typename Launch>
float median_ms(Launch launch, int reps = 15) {
  cudaEvent_t start, stop;
  CUDA_OK(cudaEventCreate(&start));
  CUDA_OK(cudaEventCreate(&stop));
  for (int i = 0; i < 3; ++i) launch();
  std::vector<float> times;
  for (int i = 0; i < reps; ++i) {
    CUDA_OK(cudaEventRecord(start));
    launch();
    CUDA_OK(cudaEventRecord(stop));
    CUDA_OK(cudaEventSynchronize(stop));
    float ms = 0;
    CUDA_OK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms);
  }
  CUDA_OK(cudaGetLastError());
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

std::vector<float> download(const void* src, int64_t n, bool is_float) {
  std::vector<float> host(n);
  if (is_float) {
    CUDA_OK(cudaMemcpy(host.data(), src, n * sizeof(float), cudaMemcpyDeviceToHost));
  } else {
    std::vector<T> raw(n);
    CUDA_OK(cudaMemcpy(raw.data(), src, n * sizeof(T), cudaMemcpyDeviceToHost));
    for (int64_t i = 0; i < n; ++i) host[i] = __bfloat162float(raw[i]);
  }
  return host;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::isnan(a[i] - b[i]) ? INFINITY : std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

std::vector<float> reference_out, reference_dk;

void report(const char* pass, const char* name, const Problem& pb, float ms, double flops, float diff) {
  std::printf("%-4s hd%-3d s%-5d %-6s %-34s %8.3f ms %6.1f TFLOP/s  max|diff| vs first %.3g\n", pass, pb.headdim,
              pb.seqlen, pb.causal ? "causal" : "full", name, ms, flops / ms / 1e9, diff);
}

// Times one forward kernel (fwd_kernel or, with the sm_90a build, fwd_kernel_sm90), checks out
// against the first variant.
template <typename Cfg, typename Kernel>
void time_and_check_fwd(const char* name, const Problem& pb, const Buffers& b, bool first, Kernel kernel) {
  const flash::BwdParams p = make_params(pb, b);
  CUDA_OK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes));
  const dim3 grid(flash::ceil_div(pb.seqlen, Cfg::kBlockM), pb.heads, pb.batch);
  const float ms = median_ms([&] { kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes>>>(p.fwd); });
  const int64_t n = (int64_t)pb.batch * pb.seqlen * pb.heads * pb.headdim;
  auto out = download(b.out, n, false);
  if (first) reference_out = out;
  report("fwd", name, pb, ms, pb.fwd_flops(), max_abs_diff(out, reference_out));
}

template <typename Cfg>
void sweep_fwd(const char* name, const Problem& pb, const Buffers& b, bool first) {
  time_and_check_fwd<Cfg>(name, pb, b, first, flash::fwd_kernel<T, Cfg, false>);
}

template <typename Cfg>
void sweep_fwd_sm90(const char* name, const Problem& pb, const Buffers& b, bool first) {
  time_and_check_fwd<Cfg>(name, pb, b, first, flash::fwd_kernel_sm90<T, Cfg, false>);
}

// The warp-specialized Hopper forward (fwd_kernel_sm90_ws.cuh), with its tensor maps.
template <typename Cfg>
void sweep_fwd_ws(const char* name, const Problem& pb, const Buffers& b, bool first) {
  const flash::BwdParams p = make_params(pb, b);
  flash::FwdTensorMaps maps;
  if (!flash::make_fwd_tensor_maps<Cfg>(p.fwd, maps)) {
    std::printf("%s: no tensor maps\n", name);
    return;
  }
  const float ms =
      median_ms([&] { CUDA_OK(flash::launch_over_query_tiles<Cfg>(flash::fwd_kernel_sm90_ws<T, Cfg, false>, p.fwd, maps, 0)); });
  const int64_t n = (int64_t)pb.batch * pb.seqlen * pb.heads * pb.headdim;
  auto out = download(b.out, n, false);
  if (first) reference_out = out;
  report("fwd", name, pb, ms, pb.fwd_flops(), max_abs_diff(out, reference_out));
}

// Times `launch` (backward preprocess + one backward kernel), checks dk against the first variant.
template <typename Launch>
void time_and_check_bwd(const char* name, const Problem& pb, const Buffers& b, bool first, Launch launch) {
  const float ms = median_ms(launch);
  const int64_t n = (int64_t)pb.batch * pb.seqlen * pb.heads * pb.headdim;
  auto dk = download(b.dk, n, false);
  if (first) reference_dk = dk;
  report("bwd", name, pb, ms, 2.5 * pb.fwd_flops(), max_abs_diff(dk, reference_dk));
}

template <typename Cfg>
void sweep_bwd(const char* name, const Problem& pb, const Buffers& b, bool first) {
  const flash::BwdParams p = make_params(pb, b);
  auto kernel = flash::bwd_kernel<T, Cfg, false>;
  int smem_optin = 0;
  CUDA_OK(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
  const int stages = Cfg::smem_bytes(2) <= smem_optin ? 2 : 1;
  const int smem = Cfg::smem_bytes(stages);
  CUDA_OK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const dim3 grid(flash::ceil_div(pb.seqlen, Cfg::kBlockN), pb.heads, pb.batch);
  time_and_check_bwd(name, pb, b, first, [&] {
    flash::run_bwd_preprocess<T, Cfg::kHeadDim>(p, 0);
    kernel<<<grid, Cfg::kThreads, smem>>>(p, stages);
  });
}

// The Hopper backward (launch_bwd_sm90.cuh); needs the sm_90a build.
template <typename Cfg>
void sweep_bwd_sm90(const char* name, const Problem& pb, const Buffers& b, bool first) {
  const flash::BwdParams p = make_params(pb, b);
  auto kernel = flash::bwd_kernel_sm90<T, Cfg, false>;
  CUDA_OK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes));
  const dim3 grid(flash::ceil_div(pb.seqlen, Cfg::kBlockN), pb.heads, pb.batch);
  time_and_check_bwd(name, pb, b, first, [&] {
    flash::run_bwd_preprocess<T, Cfg::kHeadDim>(p, 0);
    kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes>>>(p);
  });
}

#define FWD(first, ...) sweep_fwd<flash::__VA_ARGS__>(#__VA_ARGS__, pb, b, first)
#define FWD90(first, ...) sweep_fwd_sm90<flash::__VA_ARGS__>(#__VA_ARGS__, pb, b, first)
#define FWDWS(first, ...) sweep_fwd_ws<flash::__VA_ARGS__>(#__VA_ARGS__, pb, b, first)
#define BWD(first, ...) sweep_bwd<flash::__VA_ARGS__>(#__VA_ARGS__, pb, b, first)
#define BWD90(first, ...) sweep_bwd_sm90<flash::__VA_ARGS__>(#__VA_ARGS__, pb, b, first)

// Optional arguments narrow the sweep (e.g. for a profiler): tile_sweep [headdim [seqlen [causal]]].
// -DSWEEP_FWD_WS compiles only the warp-specialized forward variants (and the kernel they replace,
// first): a quarter of the compile time.
int main(int argc, char** argv) {
  auto selected = [&](int index, int value) { return argc <= index || std::atoi(argv[index]) == value; };
  for (int headdim : {64, 128}) {
    for (int seqlen : {512, 2048, 8192, 16384}) {
      for (bool causal : {false, true}) {
        if (!selected(1, headdim) || !selected(2, seqlen) || !selected(3, causal)) continue;
        const Problem pb{headdim, seqlen, 16384 / seqlen, 2048 / headdim, causal};
        Buffers b = allocate(pb);
#if defined(SWEEP_FWD_WS)
        if (headdim == 64) {
          if (causal) FWD90(true, FwdSm90Config<64, 64, 1, 3>);
          else FWD90(true, FwdSm90Config<64, 64, 2, 2>);
          FWDWS(false, FwdWsConfig<64, 128, 3, 3>);
          FWDWS(false, FwdWsConfig<64, 128, 3, 2>);
          FWDWS(false, FwdWsConfig<64, 64, 3, 4>);
          FWDWS(false, FwdWsConfig<64, 128, 2, 3>);
          FWDWS(false, FwdWsConfig<64, 192, 2, 2>);
          FWDWS(false, FwdWsConfig<64, 64, 2, 4>);
        } else {
          FWD90(true, FwdSm90Config<128, 128, 2>);
          FWDWS(false, FwdWsConfig<128, 128, 2, 2>);
          FWDWS(false, FwdWsConfig<128, 128, 2, 3>);
          FWDWS(false, FwdWsConfig<128, 160, 2, 2>);
          FWDWS(false, FwdWsConfig<128, 192, 2, 2>);
          FWDWS(false, FwdWsConfig<128, 64, 2, 4>);
        }
#else
        if (seqlen == 16384) {
          release(b);
          continue;
        }
        if (headdim == 64) {
          FWD(true, FwdConfig<64, 128, 128, 4>);
          FWD(false, FwdConfig<64, 128, 64, 4>);
          FWD90(false, FwdSm90Config<64, 128, 2>);
          FWD90(false, FwdSm90Config<64, 128, 3>);
          FWD90(false, FwdSm90Config<64, 64, 2>);
          FWD90(false, FwdSm90Config<64, 64, 2, 2>);
          FWD90(false, FwdSm90Config<64, 64, 1, 3>);
          FWD90(false, FwdSm90Config<64, 128, 1, 2>);
          BWD(true, BwdConfig<64, 128, 128, 8, 4, 4, 4>);
          BWD(false, BwdConfig<64, 128, 128, 8, 4, 4, 2>);
          BWD90(false, BwdSm90Config<64, 64, 3, 2>);
          BWD90(false, BwdSm90Config<64, 64, 3, 1>);
          BWD90(false, BwdSm90Config<64, 128, 3, 2>);
        } else {
          FWD(true, FwdConfig<128, 128, 64, 4>);
          FWD90(false, FwdSm90Config<128, 128, 2>);
          FWD90(false, FwdSm90Config<128, 64, 2>);
          FWD90(false, FwdSm90Config<128, 64, 1, 2>);
          BWD(true, BwdConfig<128, 64, 128, 8, 4, 4, 2>);
          BWD(false, BwdConfig<128, 64, 128, 8, 4, 2, 2>);
          BWD(false, BwdConfig<128, 128, 128, 8, 4, 4, 4>);
          BWD90(false, BwdSm90Config<128, 64, 3, 2>);
          BWD90(false, BwdSm90Config<128, 64, 3, 1>);
        }
#endif
        release(b);
      }
    }
  }
  return 0;
}
