// Forward on Hopper (sm_90a), with warpgroup MMAs (wgmma). Same algorithm and arguments as
// fwd_kernel.cuh: one CTA per (block of 64 x kWarpgroups queries, head, batch), each warpgroup
// owning 64 query rows, walking the visible key blocks from the last one down (the causal
// blocks that need masking first). Step i of each warpgroup:
//   1. retires P.V[i-2], rescales O and converts P[i-1] to the A-fragment layout (dropout zeroes
//      its dropped entries there, two per instruction)
//   2. issues S[i] = Q.K[i]^T                (64 queries x kBlockN, A and B from shared memory)
//   3. issues O += P[i-1].V[i-1]              (A = P in registers)
//   4. draws dropout's random bytes of block i (they do not depend on S) while S[i] runs, then
//      waits for S[i] only, and runs the logits (score modifiers, mask) and the online softmax of
//      block i while step 3 still runs on the tensor core.
// So the exponentials of one block overlap the P.V MMAs of the previous one, and P never leaves
// registers. K has two shared-memory slots and V three; block i + 1's K and block i's V load
// (cp.async) while block i's MMAs run. Shared memory uses the 128-byte swizzled layout of
// arch/sm90_swizzled_tile.cuh (whole-line global reads: with the no-swizzle core-matrix layout the
// loads doubled the L2 tag lookups, which ncu showed as the limit); Q is K-major for S, K
// K-major, V MN-major (keys are its rows) for O.
#pragma once

#include <type_traits>

#include "arch/sm90_fp8.cuh"
#include "arch/sm90_swizzled_tile.cuh"
#include "arch/sm90_wgmma.cuh"
#include "common.cuh"
#include "dropout.cuh"
#include "fragment_scores.cuh"
#include "fwd_query_block.cuh"
#include "fwd_sm90_operands.cuh"
#include "mask.cuh"
#include "params.h"
#include "softmax.cuh"
#include "tile_io.cuh"

namespace flash {

template <int kHeadDim_, int kBlockN_, int kWarpgroups_, int kCtasPerSm_ = 1>
struct FwdSm90Config {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockN = kBlockN_;  // keys per step: the N of the S wgmma
  static constexpr int kWarpgroups = kWarpgroups_;
  // CTAs resident per SM (the register cap that follows from it is the compiler's): two let one
  // CTA's loads, barriers and epilogue overlap the other's MMAs.
  static constexpr int kCtasPerSm = kCtasPerSm_;
  static constexpr int kBlockM = 64 * kWarpgroups;  // queries per CTA, 64 per warpgroup (wgmma M)
  static constexpr int kThreads = kWarpgroups * arch::kWarpgroupThreads;
  // K/V tiles load with the threads of at most two warpgroups: a loader pass covers
  // threads / (hd / 8) rows, which must divide kBlockN.
  static constexpr int kKvLoadThreads = kWarpgroups >= 2 ? 2 * arch::kWarpgroupThreads : kThreads;
  using QTile = arch::SwizzledTile<kBlockM, kHeadDim>;
  using KVTile = arch::SwizzledTile<kBlockN, kHeadDim>;
  static constexpr int kSmemBytes = QTile::kBytes + 5 * KVTile::kBytes;  // Q, two K slots, three V slots
  // The epilogue stages O row-major (padded) over the operand tiles.
  static constexpr int kEpilogueStride = padded_stride<kHeadDim>();
  static_assert(kBlockM * kEpilogueStride * 2 <= kSmemBytes, "O staging fits");
  static_assert(kBlockN % 16 == 0 && kHeadDim % 16 == 0, "whole wgmma k-steps");
};

// Shared-memory slots of the kernel: Q, then K[0], K[1], V[0], V[1], V[2] (computed, not stored in
// arrays: an array indexed by the step would live in local memory).
template <typename Cfg>
struct FwdSm90Smem {
  char* base;

  __device__ __forceinline__ char* q() const { return base; }
  __device__ __forceinline__ char* k(int slot) const { return base + Cfg::QTile::kBytes + slot * Cfg::KVTile::kBytes; }
  __device__ __forceinline__ char* v(int slot) const { return k(2 + slot); }
};

template <typename Cfg, typename T>
__device__ __forceinline__ void load_kv_tile_sm90(char* tile, const T* gmem, int64_t row_stride, int n_block,
                                                  int seqlen_k, int headdim, int tid) {
  if (tid >= Cfg::kKvLoadThreads) return;
  const int n0 = n_block * Cfg::kBlockN;
  arch::load_swizzled_tile_async<Cfg::kBlockN, Cfg::kHeadDim, Cfg::kKvLoadThreads>(tile, gmem + n0 * row_stride,
                                                                                  row_stride, seqlen_k - n0, headdim, tid);
}

// Issues S (this warpgroup's 64 queries from q_row0 x kBlockN keys) = Q.K^T as one wgmma group
// (k-steps of 32 bytes: 16 elements of 16 bits, 32 of e4m3).
template <typename T, typename Cfg>
__device__ __forceinline__ void issue_scores_sm90(float (&scores)[1][Cfg::kBlockN / 8][4], const char* sQ,
                                                  const char* sK, int q_row0) {
  arch::wgmma_fence_operand(scores[0]);
  arch::wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < Cfg::QTile::kKSteps; ++ks)
    arch::Wgmma<T, Cfg::kBlockN>::template ss<false, false>(scores[0], Cfg::QTile::k_major(sQ, q_row0, ks),
                                                             Cfg::KVTile::k_major(sK, 0, ks), ks > 0);
  arch::wgmma_commit();
}

// P.V's k-steps over kBlockN keys: 16 keys for 16-bit P, 32 for e4m3.
template <typename T, int kBlockN>
constexpr int kPvSteps = kBlockN * static_cast<int>(sizeof(T)) / 32;

// Issues O (64 queries x head dim) += P (registers, 64 x kBlockN) . V as one wgmma group. 16-bit V
// is read MN-major (kBlockN key rows x head dim); e4m3 V is Cfg::VTile, transposed (head-dim rows
// of kBlockN keys in arch/sm90_fp8.cuh's order), read K-major. An accumulator one 8-column block
// wider than the head dim (Sm90ForwardRows::kSumsByMma) also reads the 8 columns after V's head
// dim: the block of ones that follows the V slot, laid out as one more of its 64-column blocks.
template <typename T, typename Cfg, int kAccNT>
__device__ __forceinline__ void issue_output_sm90(float (&acc)[1][kAccNT][4],
                                                  const uint32_t (&probs)[1][kPvSteps<T, Cfg::kBlockN>][4],
                                                  const char* sV) {
  static_assert(kAccNT * 8 == Cfg::kHeadDim || (kAccNT * 8 == Cfg::kHeadDim + 8 && !kIsFp8<T>), "O (+ row sums)");
  arch::wgmma_fence_operand(acc[0]);
  arch::wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < kPvSteps<T, Cfg::kBlockN>; ++ks) {
    if constexpr (kIsFp8<T>)
      arch::Wgmma<T, Cfg::kHeadDim>::template rs<false>(acc[0], probs[0][ks], Cfg::VTile::k_major(sV, 0, ks), true);
    else
      arch::Wgmma<T, kAccNT * 8>::template rs<true>(acc[0], probs[0][ks], Cfg::KVTile::mn_major(sV, 0, ks), true);
  }
  arch::wgmma_commit();
}

// Whether a forward configuration sums P's rows on the tensor core (Cfg::kRowSumsByMma; false for
// configurations without the member).
template <typename Cfg, typename = void>
struct RowSumsByMma : std::false_type {};
template <typename Cfg>
struct RowSumsByMma<Cfg, std::void_t<decltype(Cfg::kRowSumsByMma)>> : std::bool_constant<Cfg::kRowSumsByMma> {};

// One warp's 16 query rows of a Hopper forward (both kernels): O, the online softmax, S / P of the
// latest block and dropout's bytes for it, and the steps the kernels take on them between MMAs.
// Only the score-extras kernel (kScoreExtras) has dropout, so only it needs steps of whole 32-key
// pairs of dropout tiles (dropout.cuh).
// Row sums on the tensor core (kSumsByMma, where the configuration has Cfg::kRowSumsByMma): the
// accumulator has one 8-column block past O, and P.V reads 8 columns of ones into it, so that the
// MMA that adds P's products into O adds P's row sums there (each of the 8 columns holds the sum),
// rescaled with O. That drops the softmax's FADDs, 62 of a 128-key step's ~470 instructions at hd
// 64 / ~530 at hd 128 (sm_90a), for 8 more columns of P.V. Both must be one accumulator array: with
// the sums in an array of their own ptxas serialized every wgmma (C7511, insufficient registers
// for the wgmma pipeline). The sum is then of P as rounded for the MMA (16-bit), the same P that
// O adds up, where the FADDs summed it unrounded: lse moves by the mean rounding error of a row,
// ~2^-9 / sqrt(keys) relative. Not with dropout (kScoreExtras): the denominator is the sum of P
// before its drops, while P.V takes P after them.
template <typename T, typename Cfg, bool kScoreExtras>
struct Sm90ForwardRows {
  static constexpr int kScoreNT = Cfg::kBlockN / 8, kHeadNT = Cfg::kHeadDim / 8;
  static constexpr bool kSumsByMma = RowSumsByMma<Cfg>::value && !kScoreExtras && !kIsFp8<T>;
  // Lazy rescaling (OnlineSoftmax::update_probs): a row's max lags by up to 2^8 for 16-bit P, which
  // holds values up to 256 with its usual relative precision; e4m3 P keeps the exact max (its
  // largest value must stay exactly 1: rounded, it cost one-query rows their accuracy, v30).
  static constexpr int kMaxLagLog2 = kIsFp8<T> ? 0 : 8;
  // e4m3 P is scaled by 2^8 (its largest value exactly 256, below e4m3's 448): a row's small
  // probabilities then stay normal numbers down to 2^-14 of its max instead of flushing to 0 below
  // 2^-10 (softmax.cuh). 16-bit P has the range already.
  static constexpr int kProbScaleLog2 = kIsFp8<T> ? 8 : 0;
  using Softmax = OnlineSoftmax<1, kProbScaleLog2>;
  float acc[1][kHeadNT + (kSumsByMma ? 1 : 0)][4];  // O rows of this warp (16 x head dim), then the row sums
  Softmax softmax;
  float scores[1][kScoreNT][4];             // S rows of this warp (16 x kBlockN), then P until converted
  float rescale[1][2];                      // O's pending rescale from the latest softmax
  uint32_t probs[1][kPvSteps<T, Cfg::kBlockN>][4];  // P of the previous block, the A operand of its P.V
  struct NoDropTests {};
  std::conditional_t<kScoreExtras, FwdDropTests<1, kScoreNT>, NoDropTests> drop_tests;  // of the latest block

  __device__ __forceinline__ void init() {
    arch::zero_accumulators(acc);
    softmax.init();
  }

  // O without the row sums' block: the view the epilogues store (its leading kHeadNT blocks).
  __device__ __forceinline__ float (&output())[1][kHeadNT][4] {
    return reinterpret_cast<float(&)[1][kHeadNT][4]>(acc);
  }

  // Issues O += P.V of the latest converted block, and its row sums where kSumsByMma (sV's slot is
  // then followed by a block of ones).
  __device__ __forceinline__ void issue_output(const char* sV) { issue_output_sm90<T, Cfg>(acc, probs, sV); }

  // The same from P in shared memory (store_probs; e4m3 only): this warpgroup's 64 rows of the
  // PTile sP from row0, an SS wgmma.
  __device__ __forceinline__ void issue_output_from_shared(const char* sP, int row0, const char* sV) {
    static_assert(kIsFp8<T>, "e4m3 P");
    arch::wgmma_fence_operand(acc[0]);
    arch::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kPvSteps<T, Cfg::kBlockN>; ++ks)
      arch::Wgmma<T, Cfg::kHeadDim>::template ss<false, false>(acc[0], Cfg::PTile::k_major(sP, row0, ks),
                                                                Cfg::VTile::k_major(sV, 0, ks), true);
    arch::wgmma_commit();
  }

  // P of the latest converted block (convert) into the warp's 16 rows from row0 of the PTile sP,
  // fenced for the tensor core's reads (the caller then synchronizes the warpgroup).
  __device__ __forceinline__ void store_probs(char* sP, int row0, int lane) {
    arch::store_e4m3_a_fragments_swizzled<typename Cfg::PTile>(sP, row0, probs, lane);
    arch::fence_proxy_async();
  }

  // Waits for every wgmma group of the warpgroup, the last P.V included, before the epilogue.
  __device__ __forceinline__ void retire_output() {
    arch::wgmma_wait<0>();
    arch::wgmma_fence_operand(acc[0]);
  }

  // Waits for every wgmma group of the warpgroup (at step i: P.V[i-2]; S[i-1] is already done).
  // The kernels do this at the start of step i rather than the end of step i-1: ptxas moves a
  // wgmma wait to the top of its basic block, so at the end of step i-1 it would land before the
  // softmax and serialize the exponentials after the P.V MMAs; the loop edge keeps them apart.
  __device__ __forceinline__ void retire() {
    retire_output();
    arch::wgmma_fence_operand(probs);
  }

  // Rescales O for the latest block and converts its P to the A operand of its P.V (dropout
  // zeroes the dropped entries there, two per instruction; e4m3 P has no dropout).
  __device__ __forceinline__ void convert(const Dropout& dropout) {
    Softmax::rescale_output_where_needed(acc, rescale);
    if constexpr (kIsFp8<T>)
      arch::accumulators_to_e4m3_a_fragments(probs, scores);
    else
      arch::accumulators_to_a_fragments<T>(probs, scores);
    if constexpr (kScoreExtras) {
      if (dropout.enabled) drop_packed_probs(probs, drop_tests);
    }
  }

  // Waits until at most kPending wgmma groups run: S of the latest block is done.
  template <int kPending>
  __device__ __forceinline__ void wait_scores() {
    arch::wgmma_wait<kPending>();
    arch::wgmma_fence_operand(scores[0]);
  }

  // S of key block n_block for the warp's rows from m0 + row0 become probabilities: score
  // modifiers, the mask where needs_mask (walk_steps says which steps need it), online softmax with
  // the logits scaled by scale_log2 (base 2).
  __device__ __forceinline__ void scores_to_probs(float scale_log2, const AttentionMask& mask, const ScoreMod& mod,
                                                  bool needs_mask, int m0, int row0, int n_block, int lane) {
    scores_to_logits</*kRowsAreKeys=*/false>(scores, mask, mod, needs_mask, m0 + row0, n_block * Cfg::kBlockN, lane);
    softmax.template update_probs<!kSumsByMma, kMaxLagLog2>(scores, scale_log2, rescale);
    arch::wgmma_fence_operand(scores[0]);
  }

  // After the last P.V: normalizes O (times output_scale: dropout's 1 / keep_prob, or fp8's
  // v_descale) and writes the lse (of logits scaled by logit_scale) of the warp's rows (row0..,
  // relative to the block) below rows_q.
  __device__ __forceinline__ void finalize(float logit_scale, float output_scale, float* lse, int row0, int rows_q,
                                           int lane) {
    float row_lse[1][2];
    if constexpr (kSumsByMma) {
      const float row_sums[1][2] = {{acc[0][kHeadNT][arch::acc_value(0, 0)], acc[0][kHeadNT][arch::acc_value(1, 0)]}};
      softmax.finalize_with_sums(output(), row_sums, logit_scale, output_scale, row_lse);
    } else {
      softmax.finalize(acc, logit_scale, output_scale, row_lse);
    }
    if (lane % 4 == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = row0 + arch::acc_row(lane, 2 * h);
        if (row < rows_q) lse[row] = row_lse[0][h];
      }
    }
  }
};

// How a step treats the mask: not at all, always, or after a runtime test of its block.
enum class StepMask { kNone, kApply, kTest };
template <StepMask kMask>
using StepMaskTag = std::integral_constant<StepMask, kMask>;

// Runs a warpgroup's steps [begin, end) of a tile, step(is_first, StepMaskTag, i): the first as
// the step without a P.V before it. kSplit: each step takes the mask only outside `unmasked` (the
// steps whose key blocks the warpgroup's rows see whole: FwdQueryBlock::unmasked_steps). Masked
// steps come first (the causal diagonal) and last (a window's left edge), so three loops keep the
// mask's code out of the middle one, which most steps run. With one loop and a runtime test the
// mask loop sat in every step's code, and growing it by 172 instructions (hd 128) made the
// non-causal forward 3-7% slower, though a non-causal step skips that loop (H200, NOTES.md v27). The
// flags are uniform over the warpgroup: its four warps must issue the same wgmma instructions.
// Without kSplit (the score-extras kernels, where the extra step instantiations made ptxas spill
// and serialize the wgmmas) every step tests its block.
template <bool kSplit, typename Step>
__device__ __forceinline__ void walk_steps(int begin, int end, IndexRange unmasked, Step&& step) {
  if (begin >= end) return;
  if constexpr (!kSplit) {
    step(std::true_type{}, StepMaskTag<StepMask::kTest>{}, begin);
    for (int i = begin + 1; i < end; ++i) step(std::false_type{}, StepMaskTag<StepMask::kTest>{}, i);
  } else {
    if (unmasked.contains(begin))
      step(std::true_type{}, StepMaskTag<StepMask::kNone>{}, begin);
    else
      step(std::true_type{}, StepMaskTag<StepMask::kApply>{}, begin);
    const int plain_begin = max(begin + 1, min(unmasked.first, end));
    const int plain_end = max(plain_begin, min(unmasked.end, end));
    int i = begin + 1;
    for (; i < plain_begin; ++i) step(std::false_type{}, StepMaskTag<StepMask::kApply>{}, i);
    for (; i < plain_end; ++i) step(std::false_type{}, StepMaskTag<StepMask::kNone>{}, i);
    for (; i < end; ++i) step(std::false_type{}, StepMaskTag<StepMask::kApply>{}, i);
  }
}

// Whether a step of this kind on key block [n0, n0 + block_n) takes the mask; kTest asks whether the
// block cuts any row of the tile, rows [m0, m0 + rows_q) (in the score-extras kernels a test
// against walk_steps' `unmasked` kept two more registers live in the step loop: 3 local loads a
// step at hd 256).
template <StepMask kMask>
__device__ __forceinline__ bool step_needs_mask(StepMaskTag<kMask>, const AttentionMask& mask, int m0, int rows_q,
                                                int n0, int block_n) {
  if constexpr (kMask == StepMask::kTest) return !mask.block_fully_visible(m0, rows_q, n0, block_n);
  return kMask == StepMask::kApply;
}

// kScoreExtras: compiled with dropout, softcap and ALiBi (features.h says why this is a template).
template <typename T, typename Cfg, bool kScoreExtras>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kCtasPerSm) fwd_kernel_sm90(const FwdParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kHeadDim = Cfg::kHeadDim;
  constexpr int kHeadNT = kHeadDim / 8;
  unsigned char* smem = arch::swizzle_aligned_dynamic_smem();
  const FwdSm90Smem<Cfg> s{reinterpret_cast<char*>(smem)};

  const int tid = threadIdx.x, lane = tid % arch::kWarpSize;
  const int warpgroup = arch::warp_uniform(tid / arch::kWarpgroupThreads);
  const int warp_in_group = arch::warp_uniform((tid / arch::kWarpSize) % 4);
  const int group_row0 = warpgroup * 64;                  // this warpgroup's queries in the block
  const int warp_row0 = group_row0 + warp_in_group * 16;  // this warp's accumulator rows
  record_rng_state(p.dropout, tid);
  const auto qb = FwdQueryBlock<kBlockM, kBlockN>::current(p);
  if (qb.template done_without_keys<T, kHeadDim, Cfg::kThreads>(p, tid)) return;
  const int m0 = qb.m0, rows_q = qb.rows_q, seqlen_k = qb.seq.seqlen_k, headdim = p.shape.headdim;
  const int n_blocks = qb.key_blocks(), n_last = qb.n_end - 1;
  const AttentionMask& mask = qb.mask;
  const ScoreMod mod = qb.template score_mod<kScoreExtras>(p);
  const Dropout dropout = qb.template dropout<kScoreExtras>(p);
  const T* k = qb.seq.template k_side<T>(p.k, 0, qb.head_k);
  const T* v = qb.seq.template k_side<T>(p.v, 0, qb.head_k);

  arch::load_swizzled_tile_async<kBlockM, kHeadDim, Cfg::kThreads>(
      s.q(), qb.seq.template q_side<T>(p.q, m0, qb.head), p.q.row_stride, rows_q, headdim, tid);
  load_kv_tile_sm90<Cfg>(s.k(0), k, p.k.row_stride, n_last, seqlen_k, headdim, tid);
  arch::cp_async_commit();

  Sm90ForwardRows<T, Cfg, kScoreExtras> rows;
  rows.init();

  // Step i handles key block n_last - i; its K sits in slot i % 2, its V in slot i % 3.
  // Step 0 has no P.V to issue. It is a separate instantiation rather than a branch: with the P.V
  // issue conditional, ptxas cannot tell which wgmma group `wait<1>` leaves pending and
  // serializes every wgmma of the kernel (warning C7514).
  const IndexRange unmasked = qb.unmasked_steps(group_row0, min(64, rows_q - group_row0));
  auto step = [&](auto is_first, auto mask_kind, int i) {
    constexpr bool kFirst = decltype(is_first)::value;
    const int n_block = n_last - i;
    if constexpr (!kFirst) {
      rows.retire();
      rows.convert(dropout);
    }
    arch::cp_async_wait<0>();
    arch::fence_proxy_async();
    __syncthreads();  // K[i] and V[i-1] landed; every warpgroup retired S[i-1] and P.V[i-2]

    issue_scores_sm90<T, Cfg>(rows.scores, s.q(), s.k(i % 2), group_row0);
    if constexpr (!kFirst) rows.issue_output(s.v((i - 1) % 3));
    // The loads go out behind the MMAs: K[i+1] into the slot S[i-1] read, V[i] into P.V[i-3]'s
    // (three V slots: P.V[i-2] may still be reading its slot in another warpgroup).
    if (n_block > qb.n_begin)
      load_kv_tile_sm90<Cfg>(s.k((i + 1) % 2), k, p.k.row_stride, n_block - 1, seqlen_k, headdim, tid);
    load_kv_tile_sm90<Cfg>(s.v(i % 3), v, p.v.row_stride, n_block, seqlen_k, headdim, tid);
    arch::cp_async_commit();

    // Dropout's random bytes do not depend on S: drawn here, while S's MMAs run.
    if constexpr (kScoreExtras) {
      if (dropout.enabled)
        rows.drop_tests = drop_tests_fwd<1, kBlockN / 8>(dropout, m0 + warp_row0, n_block * kBlockN, lane);
    }
    rows.template wait_scores<kFirst ? 0 : 1>();  // P.V[i-1] may still run, under the softmax
    const bool needs_mask = step_needs_mask(mask_kind, mask, m0, rows_q, n_block * kBlockN, kBlockN);
    rows.scores_to_probs(p.logit_scale_log2, mask, mod, needs_mask, m0, warp_row0, n_block, lane);
  };
  walk_steps<!kScoreExtras>(0, n_blocks, unmasked, step);
  rows.retire();
  rows.convert(dropout);
  arch::cp_async_wait<0>();
  arch::fence_proxy_async();
  __syncthreads();  // the last V landed
  rows.issue_output(s.v((n_blocks - 1) % 3));
  rows.retire_output();
  rows.finalize(p.logit_scale, dropout.keep_scale, qb.lse(p), warp_row0, rows_q, lane);
  // Epilogue: O through shared memory (row-major, padded) for coalesced stores.
  T* sO = reinterpret_cast<T*>(smem);
  __syncthreads();  // every warpgroup is done reading Q, K and V
  arch::store_accumulators<1, kHeadNT, T>(sO, Cfg::kEpilogueStride, warp_row0, 0, rows.output(), lane);
  __syncthreads();
  store_tile<kBlockM, kHeadDim, Cfg::kThreads>(qb.template out<T>(p), p.out.row_stride, sO, rows_q, headdim, tid);
#else
  __trap();  // the launcher selects this kernel only where the sm_90a image is loaded
#endif
}

}  // namespace flash
