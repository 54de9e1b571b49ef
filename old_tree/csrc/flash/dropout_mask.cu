// The dropout keep mask as a tensor, one thread per element (a debugging and testing path: the
// attention kernels never materialize it).
#include "dropout.cuh"
#include "launch_api.h"

namespace flash {

__global__ void dropout_keep_mask_kernel(const DropoutArgs args, int batch, int heads, int seqlen_q, int seqlen_k,
                                         bool* keep) {
  const int64_t total = static_cast<int64_t>(batch) * heads * seqlen_q * seqlen_k;
  const int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= total) return;
  const int key = static_cast<int>(index % seqlen_k);
  const int query = static_cast<int>((index / seqlen_k) % seqlen_q);
  const int head = static_cast<int>((index / (static_cast<int64_t>(seqlen_k) * seqlen_q)) % heads);
  const int b = static_cast<int>(index / (static_cast<int64_t>(seqlen_k) * seqlen_q * heads));
  keep[index] = Dropout::of(args, b, heads, head).keeps_element(query, key);
}

cudaError_t run_dropout_keep_mask(const DropoutArgs& args, int batch, int heads, int seqlen_q, int seqlen_k, bool* keep,
                                  cudaStream_t stream) {
  constexpr int kThreads = 256;
  const int64_t total = static_cast<int64_t>(batch) * heads * seqlen_q * seqlen_k;
  const unsigned blocks = static_cast<unsigned>((total + kThreads - 1) / kThreads);
  dropout_keep_mask_kernel<<<blocks, kThreads, 0, stream>>>(args, batch, heads, seqlen_q, seqlen_k, keep);
  return cudaGetLastError();
}

}  // namespace flash
