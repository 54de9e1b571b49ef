// Decode attention over a KV cache, split along the keys. CTA (m block x split, KV head, batch):
// one row atom (arch::kAtomM: 16 rows on sm80, 32 on CDNA) of packed query rows (the query heads
// of the KV head, GQA packing: splitkv_schedule.cuh) against this split's key steps. Decode is
// bound by reading K and V, so the kernel keeps as many bytes in flight as shared memory holds:
// each warp streams its own key steps (splitkv_schedule.cuh deals them) through a ring of kStages
// K/V buffers, filled by the Loader (splitkv_loaders.cuh: cp.async, Hopper row copies or TMA
// boxes; one stage on CDNA, whose copies are synchronous: launch_kvcache_cdna.cuh), and never
// waits on the other warps. Each warp keeps its own online
// softmax; at the end the warps' partial results are merged through shared memory and written to
// out / lse (one split) or to the fp32 partials that the combine kernel merges (combine_kernel.cuh).
#pragma once

#include <cmath>

#include "arch/arch.cuh"
#include "common.cuh"
#include "fragment_scores.cuh"
#include "kvcache_view.cuh"
#include "mask.cuh"
#include "params.h"
#include "rotary.cuh"
#include "score_mod.cuh"
#include "softmax.cuh"
#include "splitkv_loaders.cuh"
#include "splitkv_schedule.cuh"
#include "tile_io.cuh"

namespace flash {

template <int kHeadDim_, int kWarpKeys_, int kStages_, int kWarps_, int kCtasPerSm_>
struct SplitKvConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kWarpKeys = kWarpKeys_;  // keys per warp step
  static constexpr int kStages = kStages_;      // K/V steps in each warp's ring
  static constexpr int kWarps = kWarps_;
  static constexpr int kCtasPerSm = kCtasPerSm_;  // CTAs (workgroups) its shared memory lets an SM (CU) hold
  static constexpr int kThreads = kWarps * arch::kWarpSize;
  static constexpr int kRows = arch::kAtomM;  // packed query rows per CTA: 16 on sm80, 32 on CDNA
  static constexpr int kNT = kWarpKeys / arch::kAtomN;
  static constexpr int kDT = kHeadDim / arch::kAtomN;
  static constexpr int kStride = padded_stride<kHeadDim>();
  static constexpr int kQElems = kRows * kStride;
  static constexpr int kStageElems = 2 * kWarpKeys * kStride;  // K then V
  static constexpr int kBarrierBytes = kWarps * kStages * 8;  // the Hopper loaders' mbarriers (unused on CDNA)
  // Shared memory: the warps' rings (sized for padded rows; the TMA loader's swizzled slots are
  // smaller), then Q, then the barriers.
  static constexpr int kRingBytes = kWarps * kStages * kStageElems * 2;
  static constexpr int kPipelineBytes = kRingBytes + kQElems * 2 + kBarrierBytes;
  static constexpr int kMergeStride = kHeadDim + 4;  // floats per merged row (16-byte aligned rows)
  // The warps' O rows, then their row max and sum, then each row's per-warp weights and lse.
  static constexpr int kMergeBytes = (kWarps * kRows * kMergeStride + 2 * kWarps * kRows + kWarps * kRows + kRows) * 4;
  static constexpr int kSmemBytes = kPipelineBytes > kMergeBytes ? kPipelineBytes : kMergeBytes;
  static_assert(kWarpKeys % arch::kWarpTileColStep == 0 && kWarpKeys % arch::kAtomK == 0,
                "whole score atoms of Q.K^T and whole k-steps of P.V");
  static_assert(kWarpKeys * (kHeadDim / kElementsPer16B) % arch::kWarpSize == 0, "whole 16-byte pieces per lane");
};

// Issues the CTA's cp.async copies of its packed query rows; padding rows are zero-filled.
template <typename T, typename Cfg>
__device__ __forceinline__ void load_packed_queries(T* sQ, const FwdParams& f, const PackedQueryRows& q, int batch,
                                                    int tid) {
  constexpr int kPieces = Cfg::kHeadDim / kElementsPer16B;
  for (int item = tid; item < Cfg::kRows * kPieces; item += Cfg::kThreads) {
    const int r = item / kPieces, col = item % kPieces * kElementsPer16B;
    const bool valid = r < q.rows && col < f.shape.headdim;
    const T* src = static_cast<const T*>(f.q.ptr);
    if (valid) src += batch * f.q.batch_stride + q.token(r) * f.q.row_stride + q.head(r) * f.q.head_stride + col;
    arch::cp_async_16(sQ + r * Cfg::kStride + col, src, valid);
  }
}

// With rotary: the CTA's packed query rows loaded, rotated at their positions (the first new
// token's, or each token's own: RotaryArgs) and stored into sQ by the threads themselves; padding
// rows are zero-filled. rotary.cuh's arithmetic, as the append kernel's on the keys.
template <typename T, typename Cfg>
__device__ __forceinline__ void rotate_packed_queries(T* sQ, const FwdParams& f, const RotaryArgs& rotary,
                                                      const PackedQueryRows& q, const KvCacheView& cache, int batch,
                                                      int tid) {
  static_assert(kElementsPer16B == kRotaryPiece, "one rotary piece per 16-byte piece");
  constexpr int kPieces = Cfg::kHeadDim / kRotaryPiece;
  for (int item = tid; item < Cfg::kRows * kPieces; item += Cfg::kThreads) {
    const int r = item / kPieces, piece = item % kPieces;
    T* dst = sQ + r * Cfg::kStride;
    if (r >= q.rows || piece * kRotaryPiece >= f.shape.headdim) {
      *reinterpret_cast<uint4*>(dst + piece * kRotaryPiece) = make_uint4(0u, 0u, 0u, 0u);
      continue;
    }
    const T* src = static_cast<const T*>(f.q.ptr) + batch * f.q.batch_stride + q.token(r) * f.q.row_stride +
                   q.head(r) * f.q.head_stride;
    const T *cos_row, *sin_row;
    rotary_rows<T>(rotary, cache.append_at + (rotary.q_positions_per_token ? q.token(r) : 0), cos_row, sin_row);
    rotate_piece(dst, src, piece, cos_row, sin_row, rotary);
  }
}

// The append kernel, launched just before this one (launch_kvcache_kernels.cuh), writes the new tokens'
// rows: a warp waits for it before it loads a step that reaches them. The steps before the new
// tokens, most of a long cache, stream while it runs.
template <typename Cfg>
__device__ __forceinline__ void wait_if_step_reaches_new_tokens(const KvCacheView& cache, int keys) {
  if (keys + Cfg::kWarpKeys > cache.append_at - cache.first) arch::wait_for_prior_grid();
}

// The A operand of Q.K^T: the CTA's packed query rows. Up to hd 128 a warp holds them as fragments,
// loaded once (32 registers per lane at hd 128); at hd 192 and 256 they would not fit beside O's
// accumulators (ptxas spilled at hd 256), so those read sQ at every step.
template <typename T, typename Cfg, bool kInRegisters = (Cfg::kHeadDim <= 128)>
struct QueryOperand;

template <typename T, typename Cfg>
struct QueryOperand<T, Cfg, true> {
  static constexpr int kSteps = Cfg::kHeadDim / arch::kAtomK;
  arch::AFragment<T> frags[1][kSteps];

  __device__ __forceinline__ void load(const T* sQ, int lane) {
#pragma unroll
    for (int ks = 0; ks < kSteps; ++ks)
      arch::load_a_fragment<arch::Layout::kRowMajorMK>(frags[0][ks], sQ, Cfg::kStride, 0, ks * arch::kAtomK, lane);
  }

  template <typename KView>
  __device__ __forceinline__ void times_keys(float (&scores)[1][Cfg::kNT][arch::kAccRegs], const KView& sK,
                                             int lane) const {
    arch::warp_gemm_rs<1, Cfg::kNT, kSteps, arch::BLayout::kNK>(scores, frags, sK, 0, lane);
  }
};

template <typename T, typename Cfg>
struct QueryOperand<T, Cfg, false> {
  const T* sQ;

  __device__ __forceinline__ void load(const T* queries, int) { sQ = queries; }

  template <typename KView>
  __device__ __forceinline__ void times_keys(float (&scores)[1][Cfg::kNT][arch::kAccRegs], const KView& sK,
                                             int lane) const {
    arch::warp_gemm_ss<1, Cfg::kNT, Cfg::kHeadDim / arch::kAtomK, arch::Layout::kRowMajorMK, arch::BLayout::kNK>(
        scores, sQ, Cfg::kStride, 0, sK, 0, lane);
  }
};

// Whether O needs this step's rescale: whether any row of the warp raised a finite max (a row whose
// max was -inf has O = 0, and a row whose max stayed put has factor exactly 1). Late in a long cache
// a step rarely raises one, and the padding rows of a GQA tile never see a key: then the warp skips
// the rescale (kHeadDim / 2 multiplies per lane on sm80, a sixth of a 16-key step's instructions at
// hd 128).
__device__ __forceinline__ bool output_needs_rescale(const float (&old_max)[arch::kAccRows],
                                                     const OnlineSoftmax<1>& softmax) {
  bool raised = false;
#pragma unroll
  for (int h = 0; h < arch::kAccRows; ++h) raised |= old_max[h] != -INFINITY && softmax.row_max[0][h] != old_max[h];
  return arch::warp_any(raised);
}

// S = Q.K^T of one step, its logits, the online softmax and O += P.V. K and V come as the loader's
// tile views (arch/tile_view.cuh).
template <typename T, typename Cfg, typename KView, typename VView>
__device__ __forceinline__ void attend_step(float (&acc)[1][Cfg::kDT][arch::kAccRegs], OnlineSoftmax<1>& softmax,
                                            const QueryOperand<T, Cfg>& query, const KView& sK, const VView& sV,
                                            const AttentionMask& mask, const ScoreMod (&mods)[arch::kAccRows],
                                            const int (&queries)[arch::kAccRows],
                                            const PackedQueryRows& q, int n0, float scale_log2, int lane) {
  float scores[1][Cfg::kNT][arch::kAccRegs];  // S: (kRows packed rows x kWarpKeys keys)
  arch::zero_accumulators(scores);
  query.times_keys(scores, sK, lane);
  const bool needs_mask = !mask.block_fully_visible(q.token_first, q.token_count, n0, Cfg::kWarpKeys);
  packed_scores_to_logits(scores, mask, mods, queries, needs_mask, n0, lane);
  float old_max[arch::kAccRows], rescale[1][arch::kAccRows];
#pragma unroll
  for (int h = 0; h < arch::kAccRows; ++h) old_max[h] = softmax.row_max[0][h];
  softmax.update_probs(scores, scale_log2, rescale);
  if (output_needs_rescale(old_max, softmax)) OnlineSoftmax<1>::rescale_output(acc, rescale);
  arch::AFragment<T> probs[1][Cfg::kWarpKeys / arch::kAtomK];  // P as A fragments of P.V, per k-step
  arch::accumulators_to_a_fragments<T>(probs, scores);
  // V stays [key][dim] as loaded. Where the arch has no transposing loads (CDNA) that costs four
  // 2-byte LDS reads per operand, as many as storing it transposed would cost in 2-byte writes:
  // each warp reads its own V step exactly once.
  arch::warp_gemm_rs<1, Cfg::kDT, Cfg::kWarpKeys / arch::kAtomK, arch::BLayout::kKN>(acc, probs, sV, 0, lane);
}

// Shared-memory views of the merge at the end of the kernel (reusing the pipeline's buffers).
template <typename Cfg>
struct MergeBuffers {
  float* o;       // (kWarps, kRows, kMergeStride): each warp's unnormalized O rows
  float* max;     // (kWarps, kRows): each warp's row max (logit units)
  float* sum;     // (kWarps, kRows): each warp's row sum
  float* weight;  // (kRows, kWarps): the factor of each warp's O row in the merged, normalized row
  float* lse;     // (kRows): the merged lse (natural log); -inf when the row saw no key

  __device__ __forceinline__ static MergeBuffers at(unsigned char* smem) {
    MergeBuffers m;
    m.o = reinterpret_cast<float*>(smem);
    m.max = m.o + Cfg::kWarps * Cfg::kRows * Cfg::kMergeStride;
    m.sum = m.max + Cfg::kWarps * Cfg::kRows;
    m.weight = m.sum + Cfg::kWarps * Cfg::kRows;
    m.lse = m.weight + Cfg::kRows * Cfg::kWarps;
    return m;
  }
};

// Each warp's O, row max and row sum into the merge buffers; then per row the weights and lse.
template <typename Cfg>
__device__ __forceinline__ void merge_warps(const MergeBuffers<Cfg>& m,
                                            const float (&acc)[1][Cfg::kDT][arch::kAccRegs],
                                            const OnlineSoftmax<1>& softmax, float logit_scale, float logit_scale_log2,
                                            int warp, int lane, int tid) {
#pragma unroll
  for (int h = 0; h < arch::kAccRows; ++h) {
    const float sum = arch::row_sum(softmax.row_sum[0][h]);
    const int row = arch::acc_row(lane, arch::acc_value(h, 0));
    if (arch::is_row_leader(lane)) {
      m.max[warp * Cfg::kRows + row] = softmax.row_max[0][h];
      m.sum[warp * Cfg::kRows + row] = sum;
    }
  }
#pragma unroll
  for (int dt = 0; dt < Cfg::kDT; ++dt)
#pragma unroll
    for (int r = 0; r < arch::kAccRegs; ++r) {
      const int row = arch::acc_row(lane, r), col = dt * arch::kAtomN + arch::acc_col(lane, r);
      m.o[(warp * Cfg::kRows + row) * Cfg::kMergeStride + col] = acc[0][dt][r];
    }
  __syncthreads();
  if (tid < Cfg::kRows) {
    float row_max = -INFINITY;
    for (int w = 0; w < Cfg::kWarps; ++w) row_max = fmaxf(row_max, m.max[w * Cfg::kRows + tid]);
    float scale[Cfg::kWarps], total = 0.f;
    for (int w = 0; w < Cfg::kWarps; ++w) {
      const float warp_max = m.max[w * Cfg::kRows + tid];
      scale[w] = warp_max == -INFINITY ? 0.f : arch::exp2_approx((warp_max - row_max) * logit_scale_log2);
      total += scale[w] * m.sum[w * Cfg::kRows + tid];
    }
    const bool empty = total == 0.f;
    for (int w = 0; w < Cfg::kWarps; ++w) m.weight[tid * Cfg::kWarps + w] = empty ? 0.f : scale[w] / total;
    m.lse[tid] = empty ? -INFINITY : row_max * logit_scale + logf(total);
  }
  __syncthreads();
}

// The merged row r, columns [col, col + 4).
template <typename Cfg>
__device__ __forceinline__ float4 merged_piece(const MergeBuffers<Cfg>& m, int r, int col) {
  float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int w = 0; w < Cfg::kWarps; ++w) {
    const float weight = m.weight[r * Cfg::kWarps + w];
    const float4 x = *reinterpret_cast<const float4*>(m.o + (w * Cfg::kRows + r) * Cfg::kMergeStride + col);
    o.x += weight * x.x;
    o.y += weight * x.y;
    o.z += weight * x.z;
    o.w += weight * x.w;
  }
  return o;
}

// Writes the merged rows: into out / lse with one split (lse +inf for a row that saw no key), else
// into this split's fp32 partials (lse -inf for a row that saw no key in this split).
template <typename T, typename Cfg>
__device__ __forceinline__ void write_merged(const SplitKvParams& p, const MergeBuffers<Cfg>& m,
                                             const SplitKvBlock<Cfg::kRows, Cfg::kWarpKeys, Cfg::kWarps>& b, int tid) {
  const FwdParams& f = p.fwd;
  const int64_t rows_per_split = static_cast<int64_t>(f.shape.batch) * f.shape.heads * f.shape.seqlen_q;
  const int pieces = f.shape.headdim / 4;
  for (int item = tid; item < b.q.rows * pieces; item += Cfg::kThreads) {
    const int r = item / pieces, col = item % pieces * 4;
    const int token = b.q.token(r), head = b.q.head(r);
    const int64_t lse_row = (static_cast<int64_t>(b.batch) * f.shape.heads + head) * f.shape.seqlen_q + token;
    const float4 o = merged_piece(m, r, col);
    if (p.num_splits == 1) {
      T* out = static_cast<T*>(f.out.ptr) + b.batch * f.out.batch_stride + token * f.out.row_stride +
               head * f.out.head_stride;
      store_float4_as(out + col, o);
      if (col == 0) f.lse[lse_row] = m.lse[r] == -INFINITY ? INFINITY : m.lse[r];
    } else {
      const int64_t row = b.split * rows_per_split + lse_row;
      *reinterpret_cast<float4*>(p.out_accum + row * p.headdim_accum + col) = o;
      if (col == 0) p.lse_accum[row] = m.lse[r];
    }
  }
}

// One warp's walk over its key steps (splitkv_schedule.cuh): the loader keeps kStages - 1 steps in
// flight while the warp attends to the oldest. issue_first_steps starts the walk, before the
// queries have landed.
template <typename Cfg, typename Loader>
__device__ __forceinline__ void issue_first_steps(const Loader& loader,
                                                  const SplitKvBlock<Cfg::kRows, Cfg::kWarpKeys, Cfg::kWarps>& b,
                                                  int warp) {
  const int count = b.warp_step_count(warp);
  for (int i = 0; i < Cfg::kStages - 1 && i < count; ++i) {
    wait_if_step_reaches_new_tokens<Cfg>(b.cache, b.warp_step_keys(warp, i));
    loader.issue(i, b.warp_step_keys(warp, i));
    loader.commit();
  }
}

template <typename T, typename Cfg, typename Loader>
__device__ __forceinline__ void attend_key_steps(const Loader& loader, float (&acc)[1][Cfg::kDT][arch::kAccRegs],
                                                 OnlineSoftmax<1>& softmax, const QueryOperand<T, Cfg>& query,
                                                 const SplitKvBlock<Cfg::kRows, Cfg::kWarpKeys, Cfg::kWarps>& b,
                                                 const ScoreMod (&mods)[arch::kAccRows],
                                                 const int (&queries)[arch::kAccRows], float scale_log2,
                                                 int warp, int lane) {
  const int count = b.warp_step_count(warp);
  for (int i = 0; i < count; ++i) {
    const int ahead = i + Cfg::kStages - 1;
    if (ahead < count) {
      wait_if_step_reaches_new_tokens<Cfg>(b.cache, b.warp_step_keys(warp, ahead));
      loader.issue(ahead, b.warp_step_keys(warp, ahead));
    }
    loader.commit();
    const int n0 = b.warp_step_keys(warp, i);
    loader.wait(i, n0);  // step i has landed and is visible to the whole warp
    attend_step<T, Cfg>(acc, softmax, query, loader.k_tile(i), loader.v_tile(i), b.mask, mods, queries, b.q, n0,
                        scale_log2, lane);
    arch::warp_sync();  // every lane is done reading slot i before it is refilled
  }
}

// Loader: splitkv_loaders.cuh's interface; maps is its kernel parameter (NoTensorMaps but for the
// TMA loader).
template <typename T, typename Cfg, typename Loader>
__global__ void FLASH_LAUNCH_BOUNDS_MIN_CTAS(Cfg::kThreads, Cfg::kCtasPerSm)
    splitkv_kernel(const SplitKvParams p, const FLASH_GRID_CONSTANT typename Loader::Maps maps) {
  static_assert(Loader::kStageBytes <= Cfg::kStageElems * 2, "the loader's ring fits Cfg::kRingBytes");
  // Launched as dependent after the append kernel (launch_kvcache_kernels.cuh): its rows are read
  // only after wait_if_step_reaches_new_tokens. The combine kernel may start now and wait for this
  // grid.
  arch::allow_dependent_launch();
  if (!Loader::runs_here()) return;  // launched only where its copies exist (launch_kvcache.cuh)
  extern __shared__ __align__(16) unsigned char smem[];
  const FwdParams& f = p.fwd;
  const int tid = threadIdx.x, lane = tid % arch::kWarpSize, warp = tid / arch::kWarpSize;
  const auto b = SplitKvBlock<Cfg::kRows, Cfg::kWarpKeys, Cfg::kWarps>::current(p);
  unsigned char* ring = smem + warp * Cfg::kStages * Loader::kStageBytes;  // this warp's kStages x (K, V)
  T* sQ = reinterpret_cast<T*>(smem + Cfg::kRingBytes);                     // (kRows, kStride)
  uint64_t* barriers = reinterpret_cast<uint64_t*>(smem + Cfg::kRingBytes + Cfg::kQElems * 2) + warp * Cfg::kStages;

  int queries[arch::kAccRows];
  ScoreMod mods[arch::kAccRows];
#pragma unroll
  for (int h = 0; h < arch::kAccRows; ++h) {
    const int r = arch::acc_row(lane, arch::acc_value(h, 0));
    queries[h] = b.q.token(r);
    mods[h] = ScoreMod::of(f, b.batch, b.q.head(r), b.mask.diagonal_offset());
  }

  const bool rotary = p.rotary.cos != nullptr;
  if (!rotary) load_packed_queries<T, Cfg>(sQ, f, b.q, b.batch, tid);
  arch::cp_async_commit();
  float acc[1][Cfg::kDT][arch::kAccRegs];  // O: (kRows packed rows x kHeadDim)
  arch::zero_accumulators(acc);
  OnlineSoftmax<1> softmax;
  softmax.init();
  const KvStepSource<T, Cfg, Loader::kPaged> source{f, b.cache, b.q.head_k};
  const Loader loader = Loader::make(source, maps, ring, barriers, lane);
  loader.init();
  // The first K/V steps are issued while the queries are in flight; the cp.async loader's wait
  // below also waits for them (its groups cannot be told apart from the queries').
  issue_first_steps<Cfg>(loader, b, warp);
  if (rotary) rotate_packed_queries<T, Cfg>(sQ, f, p.rotary, b.q, b.cache, b.batch, tid);  // under the loads
  arch::cp_async_wait<0>();
  __syncthreads();  // the queries are visible to every warp
  QueryOperand<T, Cfg> query;
  query.load(sQ, lane);
  attend_key_steps<T, Cfg>(loader, acc, softmax, query, b, mods, queries, f.logit_scale_log2, warp, lane);
  arch::cp_async_wait<0>();
  // This grid then completes after the append kernel whatever steps it had, so whatever is ordered
  // after this grid (the combine kernel's wait, the next launch) is ordered after both.
  arch::wait_for_prior_grid();
  __syncthreads();  // every warp is done with the pipeline's buffers
  const auto merge = MergeBuffers<Cfg>::at(smem);
  merge_warps<Cfg>(merge, acc, softmax, f.logit_scale, f.logit_scale_log2, warp, lane, tid);
  write_merged<T, Cfg>(p, merge, b, tid);
}

}  // namespace flash
