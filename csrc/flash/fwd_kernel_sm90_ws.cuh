// Forward on Hopper (sm_90a), warp-specialized (issue #13; FlashAttention 3's design, written
// here): one producer warpgroup and kConsumers math warpgroups of 64 query rows each.
//   Producer: one thread loads Q once and K/V blocks into kStages-slot rings with TMA
//     (sm90_tma.cuh), each slot guarded by a "full" mbarrier (bytes landed) and an "empty" one (every
//     consumer warpgroup is done reading it); K[i+1] goes out before V[i], the order they are needed.
//     It gives its registers to the consumers (setmaxnreg).
//   Consumers: the algorithm and the step of fwd_kernel_sm90.cuh (S[i] and P.V[i-1] issued
//     together, the softmax of block i under P.V[i-1]), with no __syncthreads: a warpgroup waits on
//     the full barriers of its operands and hands slots back as soon as its MMAs retire.
//   Ping-pong: the consumers issue their MMAs in turn (WarpgroupTurns), so while one warpgroup runs
//     its softmax the tensor core works on the other's MMAs rather than both softmaxes meeting
//     at the exponential unit at once (not at 16-bit hd 192 / 256: FwdWsConfig::kTakeTurns).
//   Tiles: a CTA walks query tiles blockIdx.x, + gridDim.x, ... of the order that
//     query_tile_scheduler.cuh gives (natural for equal tiles, heaviest first by groups for causal
//     and windowed ones, packed for varlen); the launcher gives one CTA per SM. Across tiles the rings
//     keep turning; Q has its own full/empty pair, released after a tile's last S, so the producer
//     loads the next tile's Q and first K while the math warpgroups finish the last P.V and the
//     epilogue (O staged in its own shared-memory tile where it fits: hd 96-128 and hd 192's
//     score-extras kernel; stored straight from the accumulators at hd 64, 192 and 256:
//     FwdWsConfig::kStageO).
// Element types (fwd_sm90_operands.cuh): fp16 / bf16, or e4m3 (the fp8 forward: bf16 O, descales,
// V transposed; dense batches only, the op says). Mask, score modifiers, dropout, softmax and the
// sequence view are the pieces the other kernels use. Varlen: a TMA box cannot stop at a sequence's end, so K/V rows past it are the next
// sequence's (or zeros past the tensor); the mask gives their scores probability 0, as with the
// zero-filled rows of the cp.async kernel. Rows past the tensor's extent arrive as zeros.
#pragma once

#include <type_traits>

#include "arch/sm90_swizzled_tile.cuh"
#include "arch/sm90_tma.cuh"
#include "arch/sm90_wgmma.cuh"
#include "common.cuh"
#include "dropout.cuh"
#include "fragment_scores.cuh"
#include "fwd_kernel_sm90.cuh"
#include "fwd_query_block.cuh"
#include "fwd_sm90_operands.cuh"
#include "mask.cuh"
#include "params.h"
#include "query_tile_scheduler.cuh"
#include "ring_position.cuh"
#include "softmax.cuh"

namespace flash {

template <int kHeadDim_, int kBlockN_, int kConsumers_, int kStages_, int kElementBytes_ = 2>
struct FwdWsConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kElementBytes = kElementBytes_;  // of q, k, v: 2 (fp16, bf16) or 1 (e4m3)
  static constexpr int kBlockN = kBlockN_;        // keys per step: the N of the S wgmma
  static constexpr int kConsumers = kConsumers_;  // math warpgroups, 64 query rows each
  static constexpr int kStages = kStages_;        // slots of the K ring and of the V ring
  static constexpr int kBlockM = 64 * kConsumers;
  static constexpr int kThreads = (kConsumers + 1) * arch::kWarpgroupThreads;
  // Registers per thread after the reallocation; the totals fill the 64K register file exactly
  // (FA3's split: 24 / 240 with two consumers, 32 / 160 with three).
  static constexpr int kProducerRegs = kConsumers == 2 ? 24 : 32;
  static constexpr int kConsumerRegs = kConsumers == 2 ? 240 : 160;
  static_assert(kProducerRegs * arch::kWarpgroupThreads + kConsumerRegs * kConsumers * arch::kWarpgroupThreads <=
                    65536,
                "register file");
  // Operand tiles are laid out in 16-bit columns (arch/sm90_swizzled_tile.cuh): a row of kHeadDim
  // e4m3 elements is kHeadDim / 2 of them, which TMA and the wgmma descriptors move as bytes alike.
  static constexpr int kRowCols = kHeadDim * kElementBytes / 2;
  using QTile = arch::SwizzledTile<kBlockM, kRowCols>;
  using KVTile = arch::SwizzledTile<kBlockN, kRowCols>;
  // V as P.V's B operand: 16-bit V is read MN-major from its key rows; 8-bit wgmma reads K-major
  // operands only, so e4m3 V arrives transposed: head-dim rows of kBlockN keys.
  using VTile = std::conditional_t<kElementBytes == 2, KVTile, arch::SwizzledTile<kHeadDim, kBlockN / 2>>;
  using OTile = arch::SwizzledTile<kBlockM, kHeadDim>;  // O staged in its 16-bit output type
  static_assert(VTile::kBytes == KVTile::kBytes, "K and V slots of one size");
  static constexpr int kBarriers = 2 + 4 * kStages;  // Q full / empty; K full / empty; V full / empty
  // Whether each consumer walks only the key blocks its own rows see (steps_seen_by): with three
  // consumers (hd 64: 192-row tiles over 128-key blocks) the tile's first rows see up to a block
  // less than its last under a causal mask. With two the bookkeeping cost more than it could save:
  // at hd 256 ptxas spilled in the step loop (11 local loads per step), at hd 192 the loop grew
  // by 6%.
  static constexpr bool kConsumerKeyRanges = kConsumers > 2;
  // Whether the consumers take turns at issuing their MMAs (WarpgroupTurns). At 16-bit hd 192 / 256
  // a step's MMAs are long next to its softmax (112 or 80 keys against a 192- or 256-wide head), and
  // FA3 drops its scheduler barrier there (hopper/, UseSchedulerBarrier: kHeadDim <= 128 for 16-bit,
  // >= 128 for fp8): both consumers then issue as soon as they are ready.
  // Measured without turns (H200, bf16, two rounds): hd 192 0.5-2.5% faster in 7 of 8 cells (512 to
  // 16k, causal and not), hd 256 unchanged within noise (benchmarks/NOTES.md v31).
  static constexpr bool kTakeTurns = kElementBytes == 1 || kHeadDim <= 128;
  // Whether P reaches P.V through shared memory (PTile, an SS wgmma; Sm90ForwardRows::store_probs)
  // rather than as the MMA's register operand: for e4m3 with three consumers, whose 160 registers
  // hold S (kBlockN / 2) and O (kHeadDim / 2) but not P's kBlockN / 8 pinned under the P.V as well
  // (at hd 128 with 128-key steps and P in registers ptxas spilled 400 B, 12 local loads and stores a
  // step, and serialized every wgmma: benchmarks/NOTES.md v33).
  static constexpr bool kPInShared = kElementBytes == 1 && kConsumers == 3;
  static_assert(!kPInShared || kTakeTurns, "the turn barrier is what orders a warpgroup's P stores before its P.V");
  // P's rows, K-major (keys), where kPInShared; elsewhere one unused 64-column block (a step of
  // 112 or 80 keys is no whole 128-byte row).
  using PTile = arch::SwizzledTile<kBlockM, kPInShared ? kBlockN * kElementBytes / 2 : 64>;
  static constexpr int kPBytes = kPInShared ? PTile::kBytes : 0;
  // Row sums on the tensor core (Sm90ForwardRows::kSumsByMma: P.V over 8 more columns, of ones) at
  // 16-bit hd 64 and 128: each V slot is followed by a block of ones laid out as one more 64-column
  // block of V (kBlockN rows of 128 bytes, written once per CTA), which P.V's N = hd + 8 reads as
  // V's columns hd..hd+7. Shared memory: hd 64 Q 24 + K 32 + V 64 = 120 KiB; hd 128 Q 32 + K 64 + V
  // 96 + O 32 = 224 of the 227. Not at hd 192 (no room) nor 256 (N = 264 is past wgmma's 256).
  static constexpr bool kRowSumsByMma = kElementBytes == 2 && (kHeadDim == 64 || kHeadDim == 128);
  static constexpr int kOnesBytes = kRowSumsByMma ? kBlockN * arch::kSwizzleRowBytes : 0;
  static constexpr int kVSlotBytes = KVTile::kBytes + kOnesBytes;
  static constexpr int kOOffset = QTile::kBytes + kStages * (KVTile::kBytes + kVSlotBytes);  // O staging, an OTile
  // The epilogue stages O in a shared tile of its own (whole-line stores, under the next tile's
  // loads) where it fits beside Q and the rings, from hd 96 up; otherwise O goes straight from the
  // accumulators to global memory (16-byte chunks, arch::store_accumulator_rows). hd 256 has no room
  // (Q and two slots of K and V take 192 of the 227 KiB with 64-key steps, 224 with 80). hd 64 has,
  // but its direct stores measured 1-6% faster at 512-1k keys and within 2% from 2k; at hd 192 they
  // were 4-11% faster at 512-1k causal, at hd 128 within 2% there, and both 2-4% slower at 8k
  // (H200, bf16, benchmarks/NOTES.md v26).
  static constexpr bool kStageO =
      kHeadDim > 64 && kOOffset + OTile::kBytes + kPBytes + kBarriers * 8 <= arch::kMaxSmemBytesPerBlock;
  static constexpr int kPOffset = kOOffset + (kStageO ? OTile::kBytes : 0);  // P, a PTile (kPInShared)
  static constexpr int kBarrierOffset = kPOffset + kPBytes;
  // Causal tiles end at the sequence's end (FwdQueryBlock::at's end_aligned) with three consumers:
  // a 192-row tile over 512 keys leaves 128 rows for the third, over 1k 64, and aligned at the
  // start that part tile is the one that walks every key (4 of 4 steps at 512, 8 of 8 at 1k, with
  // a consumer or two idle throughout); at the end it is the first tile, 1 step. Tile-steps per head
  // 9 -> 8 at 512, 32 -> 27 at 1k. Not with O staged: its TMA store takes the warpgroup's rows
  // from the tile's first row.
  static constexpr bool kEndAlignedCausal = kConsumers == 3 && !kStageO;
  static constexpr int kConsumerThreads = kConsumers * arch::kWarpgroupThreads;
  static constexpr int kSmemBytes = kBarrierOffset + kBarriers * 8;
  static_assert(kSmemBytes <= arch::kMaxSmemBytesPerBlock, "Hopper's shared memory per block");
  static_assert(kBlockN % (32 / kElementBytes) == 0 && kRowCols % 64 == 0 && (kElementBytes == 2 || kBlockN % 128 == 0),
                "whole wgmma k-steps and 64-column (128-byte) TMA boxes, for e4m3 V's key rows too");
  static_assert(kBlockM <= 256 && kBlockN <= 256, "TMA boxes hold at most 256 rows");
};

// Shared memory: Q, the K ring, the V ring, O if staged (all 1024-byte aligned), then the mbarriers.
template <typename Cfg>
struct FwdWsSmem {
  char* base;

  __device__ __forceinline__ char* q() const { return base; }
  __device__ __forceinline__ char* k(int slot) const { return base + Cfg::QTile::kBytes + slot * Cfg::KVTile::kBytes; }
  __device__ __forceinline__ char* v(int slot) const { return k(Cfg::kStages) + slot * Cfg::kVSlotBytes; }
  __device__ __forceinline__ char* o() const { return base + Cfg::kOOffset; }
  __device__ __forceinline__ char* p() const { return base + Cfg::kPOffset; }

  // The blocks of ones after the V slots (Cfg::kRowSumsByMma), by every thread of the CTA, before
  // the barrier that precedes the first MMA; fenced for the tensor core's reads.
  template <typename T>
  __device__ __forceinline__ void fill_ones(int tid) const {
    if constexpr (Cfg::kOnesBytes > 0) {
      constexpr uint32_t kOne = std::is_same_v<T, __half> ? 0x3C00u : 0x3F80u;  // 1.0 in fp16 / bf16
      static_assert(std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>, "16-bit P.V only");
      constexpr uint32_t pair = kOne | (kOne << 16);
      const uint4 chunk = make_uint4(pair, pair, pair, pair);
      for (int slot = 0; slot < Cfg::kStages; ++slot)
        for (int offset = tid * 16; offset < Cfg::kOnesBytes; offset += Cfg::kThreads * 16)
          *reinterpret_cast<uint4*>(v(slot) + Cfg::KVTile::kBytes + offset) = chunk;
      arch::fence_proxy_async();
    }
  }
  __device__ __forceinline__ uint64_t* barrier(int index) const {
    return reinterpret_cast<uint64_t*>(base + Cfg::kBarrierOffset) + index;
  }
  __device__ __forceinline__ uint64_t* q_full() const { return barrier(0); }
  __device__ __forceinline__ uint64_t* q_empty() const { return barrier(1); }
  __device__ __forceinline__ uint64_t* k_full(int slot) const { return barrier(2 + slot); }
  __device__ __forceinline__ uint64_t* k_empty(int slot) const { return barrier(2 + Cfg::kStages + slot); }
  __device__ __forceinline__ uint64_t* v_full(int slot) const { return barrier(2 + 2 * Cfg::kStages + slot); }
  __device__ __forceinline__ uint64_t* v_empty(int slot) const { return barrier(2 + 3 * Cfg::kStages + slot); }

  // One thread, before any other touches them.
  __device__ __forceinline__ void init_barriers() const {
    arch::mbarrier_init(q_full(), 1);
    arch::mbarrier_init(q_empty(), Cfg::kConsumers);
    for (int slot = 0; slot < Cfg::kStages; ++slot) {
      arch::mbarrier_init(k_full(slot), 1);
      arch::mbarrier_init(v_full(slot), 1);
      arch::mbarrier_init(k_empty(slot), Cfg::kConsumers);  // one arrival per consumer warpgroup
      arch::mbarrier_init(v_empty(slot), Cfg::kConsumers);
    }
    arch::fence_mbarrier_init();
  }
};

// The producer thread, per tile: Q once its slot is free, then K[0], then K[i+1] and V[i] for each
// step i. `ring` counts the key blocks of the earlier tiles (the rings' positions), tile_parity the
// tiles with keys (Q's phase). e4m3 V is transposed: its block is a column range, from key 0 of a
// dense batch entry.
template <typename Cfg, typename Maps, typename QueryBlock>
__device__ __forceinline__ void produce_fwd_tile(const FwdWsSmem<Cfg>& s, const Maps& maps, const QueryBlock& qb,
                                                 int ring, uint32_t tile_parity) {
  using KVTile = typename Cfg::KVTile;
  const int batch = qb.seq.batch_index, n_blocks = qb.key_blocks(), n_last = qb.n_end - 1;
  const int q_row = static_cast<int>(qb.seq.q_row0) + qb.m0, k_row0 = static_cast<int>(qb.seq.k_row0);
  arch::mbarrier_wait_parity(s.q_empty(), tile_parity ^ 1);
  arch::mbarrier_arrive_expect_bytes(s.q_full(), Cfg::QTile::kBytes);
  arch::tma_load_swizzled_tile<Cfg::kBlockM, Cfg::kRowCols>(s.q(), &maps.q, q_row, qb.head, batch, s.q_full());
  // Waits for the slot's previous occupant to be released (a fresh barrier counts as released:
  // the wait for the phase before its first one returns at once), then loads block i of K or V.
  auto load = [&](bool is_v, int i) {
    const RingPosition<Cfg::kStages> at(ring + i);
    arch::mbarrier_wait_parity(is_v ? s.v_empty(at.slot) : s.k_empty(at.slot), at.parity ^ 1);
    uint64_t* full = is_v ? s.v_full(at.slot) : s.k_full(at.slot);
    arch::mbarrier_arrive_expect_bytes(full, KVTile::kBytes);
    const int key0 = (n_last - i) * Cfg::kBlockN;
    if constexpr (Cfg::kElementBytes == 1) {
      if (is_v) {
        arch::tma_load_swizzled_tile_from<Cfg::kHeadDim, Cfg::kBlockN / 2>(s.v(at.slot), &maps.v, key0 / 2, 0,
                                                                            qb.head_k, batch, full);
        return;
      }
    }
    arch::tma_load_swizzled_tile<Cfg::kBlockN, Cfg::kRowCols>(is_v ? s.v(at.slot) : s.k(at.slot),
                                                              is_v ? &maps.v : &maps.k, k_row0 + key0, qb.head_k,
                                                              batch, full);
  };
  load(false, 0);
  for (int i = 0; i < n_blocks; ++i) {
    if (i + 1 < n_blocks) load(false, i + 1);
    load(true, i);
  }
}

// The consumers take turns at issuing their MMAs: warpgroup c waits on named barrier 1 + c, which
// warpgroup c - 1 (cyclically) arrives on once it has issued. Every warpgroup of a CTA runs the
// same number of rounds (the same tiles); the last one's arrive at `start` lets warpgroup 0 begin,
// and warpgroup 0's wait at `finish` takes the last one's final arrive, so every barrier phase
// gets exactly its 2 x 128 threads.
// kEnabled false (FwdWsConfig::kTakeTurns) makes the turns no-ops: every consumer issues when ready.
template <int kConsumers, bool kEnabled = true>
struct WarpgroupTurns {
  int consumer;
  static constexpr int kThreads = 2 * arch::kWarpgroupThreads;

  __device__ __forceinline__ void start() const {
    if (kEnabled && consumer == kConsumers - 1) arch::named_barrier_arrive(1, kThreads);
  }
  __device__ __forceinline__ void wait() const {
    if (kEnabled) arch::named_barrier_sync(1 + consumer, kThreads);
  }
  __device__ __forceinline__ void pass() const {
    if (kEnabled) arch::named_barrier_arrive(1 + (consumer + 1) % kConsumers, kThreads);
  }
  __device__ __forceinline__ void finish() const {
    if (consumer == 0) wait();
  }
  // Barrier ids after the turns' ones: one per consumer for its own epilogue.
  __device__ __forceinline__ int own_barrier() const { return 1 + kConsumers + consumer; }
};

template <typename Cfg>
using TurnsOf = WarpgroupTurns<Cfg::kConsumers, Cfg::kTakeTurns>;

// A consumer warpgroup's epilogue: its 64 rows of O (normalized accumulators) to global memory.
// Staged (Cfg::kStageO): through this warpgroup's rows of the O tile, once its store of the
// previous tile has read them, then for dense batches (maps.o_by_tma) one TMA store a 64-column
// block by the warpgroup's first thread, which the next tile's steps do not wait for (the copy
// loop below took 4-8% of the fp8 hd 256 forward's samples at 4k, ncu, benchmarks/NOTES.md
// v30); varlen tiles by coalesced 16-byte stores of every thread. Otherwise straight from the
// accumulators. The first thread's stores are waited for in finish_output_stores. rows_q: the rows
// below it are written (0: none, for a warpgroup whose rows lie before the sequence).
template <typename T, typename Cfg, typename Maps, typename QueryBlock>
__device__ __forceinline__ void write_output_rows(const FwdParams& p, const Maps& maps, const FwdWsSmem<Cfg>& s,
                                                  const QueryBlock& qb, const float (&acc)[1][Cfg::kHeadDim / 8][4],
                                                  const TurnsOf<Cfg>& turns, int rows_q, int group_tid) {
  constexpr int kHeadNT = Cfg::kHeadDim / 8;
  const int lane = group_tid % arch::kWarpSize, group_row0 = turns.consumer * 64;
  const int warp_row0 = group_row0 + (group_tid / arch::kWarpSize) * 16;
  if constexpr (Cfg::kStageO) {
    static_assert(!Cfg::kEndAlignedCausal, "the staged store writes the tile's rows from its first");
    const bool by_tma = maps.o_by_tma;
    if (by_tma && group_tid == 0) arch::bulk_wait_source_read<0>();  // the previous tile's store has read the rows
    arch::named_barrier_sync(turns.own_barrier(), arch::kWarpgroupThreads);  // (or every thread's copy, below)
    arch::store_accumulators_swizzled<typename Cfg::OTile, kHeadNT, T>(s.o(), warp_row0, acc, lane);
    if (by_tma) arch::fence_proxy_async();  // the rows, visible to the TMA engine
    arch::named_barrier_sync(turns.own_barrier(), arch::kWarpgroupThreads);
    if (!by_tma) {
      arch::copy_swizzled_rows_to_global<typename Cfg::OTile, 64, Cfg::kHeadDim, arch::kWarpgroupThreads>(
          qb.template out<T>(p), p.out.row_stride, s.o(), group_row0, rows_q, p.shape.headdim, group_tid);
    } else if (group_tid == 0) {
      arch::tma_store_swizzled_rows<Cfg::kBlockM, Cfg::kHeadDim, 64>(
          &maps.o, s.o(), group_row0, static_cast<int>(qb.seq.q_row0) + qb.m0 + group_row0, qb.head,
          qb.seq.batch_index);
      arch::bulk_commit();
    }
  } else {
    arch::store_accumulator_rows<kHeadNT, T>(qb.template out<T>(p), p.out.row_stride, warp_row0, acc, lane, rows_q,
                                             p.shape.headdim);
  }
}

// One consumer warpgroup on one tile: 64 query rows of the block, its part of the key walk (the
// steps its rows see, FwdQueryBlock::steps_seen_by, where Cfg::kConsumerKeyRanges; at hd 64, 192-row
// tiles over 128-key blocks, a 512-key causal walk needs 20 of its 27 consumer steps), and their
// output. Every consumer takes one MMA turn per step of the tile and one
// more (key_blocks() + 1 in all, so that the turns stay paired) and releases every K and V slot of
// the tile once; on a step it does not compute it takes the turn without issuing and releases the
// slots once they are filled (a release counts toward the slot's current phase, and only the fill
// proves that phase is this step's: every consumer's release of the slot's previous occupant came
// before it). Its last P.V goes out in the turn after its last step, so that its V slot is free
// for the steps below it that it skips. group_tid: the thread's index within its warpgroup
// (0..127); ring and tile_parity as for the producer. benchmarks/experiments/ws_forward_protocol.py
// models this protocol and checks it under random interleavings.
template <typename T, typename Cfg, bool kScoreExtras, typename Maps, typename QueryBlock>
__device__ __forceinline__ void consume_fwd_tile(const FwdParams& p, const Maps& maps, const FwdWsSmem<Cfg>& s,
                                                 const QueryBlock& qb, const TurnsOf<Cfg>& turns,
                                                 int group_tid, int ring, uint32_t tile_parity) {
  constexpr int kBlockN = Cfg::kBlockN, kStages = Cfg::kStages;
  const int lane = group_tid % arch::kWarpSize, warp_in_group = group_tid / arch::kWarpSize;
  const bool releases = group_tid == 0;  // the thread that hands this warpgroup's slots back
  const int m0 = qb.m0, rows_q = qb.rows_q;
  const int n_blocks = qb.key_blocks(), n_last = qb.n_end - 1;
  const AttentionMask& mask = qb.mask;
  const ScoreMod mod = qb.template score_mod<kScoreExtras>(p);
  const Dropout dropout = qb.template dropout<kScoreExtras>(p);
  const TileScales scales = tile_scales<T>(p, maps, qb.seq.batch, qb.head_k, dropout.keep_scale);
  const int group_row0 = turns.consumer * 64;
  const int warp_row0 = group_row0 + warp_in_group * 16;
  // The score-extras kernel walks whole tiles: with ranges its hd 64 step loop grew 1200 -> 1455
  // instructions and 10 -> 15 local loads (sm_90a, ptxas).
  const int group_rows = qb.rows_of(group_row0, 64);
  const int rows_written = group_rows > 0 ? rows_q : 0;  // none where the rows lie before the sequence
  const IndexRange own =
      Cfg::kConsumerKeyRanges && !kScoreExtras ? qb.steps_seen_by(group_row0, group_rows) : IndexRange{0, n_blocks};

  auto wait_filled = [&](bool is_v, int i) {
    const RingPosition<kStages> at(ring + i);
    arch::mbarrier_wait_parity(is_v ? s.v_full(at.slot) : s.k_full(at.slot), at.parity);
  };
  // Step i's K slot back, and Q after the tile's last step.
  auto release_k = [&](int i) {
    if (!releases) return;
    arch::mbarrier_arrive(s.k_empty(RingPosition<kStages>(ring + i).slot));
    if (i == n_blocks - 1) arch::mbarrier_arrive(s.q_empty());
  };
  auto release_v = [&](int i) {
    if (releases) arch::mbarrier_arrive(s.v_empty(RingPosition<kStages>(ring + i).slot));
  };
  // The bookkeeping of a step this warpgroup does not compute, after its turn.
  auto release_unused = [&](int i) {
    wait_filled(false, i);
    release_k(i);
    wait_filled(true, i);
    release_v(i);
  };
  auto skip_step = [&](int i) {
    turns.wait();
    turns.pass();
    release_unused(i);
  };

  Sm90ForwardRows<T, Cfg, kScoreExtras> rows;
  rows.init();
  // At step i: retires P.V[i-2] and hands its V slot back, then converts P[i-1].
  auto retire_and_convert = [&](int i) {
    rows.retire();
    if (i - 2 >= own.first) release_v(i - 2);
    rows.convert(dropout);
    if constexpr (Cfg::kPInShared) rows.store_probs(s.p(), warp_row0, lane);  // P.V[i-2] has read the tile
  };
  // Issues P.V over the V slot sV: P from its registers, or from the P tile.
  auto issue_output = [&](const char* sV) {
    if constexpr (Cfg::kPInShared)
      rows.issue_output_from_shared(s.p(), group_row0, sV);
    else
      rows.issue_output(sV);
  };

  arch::mbarrier_wait_parity(s.q_full(), tile_parity);
  // Step i handles key block n_last - i. The first step has no P.V: a separate instantiation (see
  // fwd_kernel_sm90.cuh: a conditional issue makes ptxas serialize every wgmma).
  const IndexRange unmasked = qb.unmasked_steps(group_row0, group_rows);
  auto step = [&](auto is_first, auto mask_kind, int i) {
    constexpr bool kFirst = decltype(is_first)::value;
    const int n_block = n_last - i;
    const RingPosition<kStages> at(ring + i);
    if constexpr (!kFirst) retire_and_convert(i);
    wait_filled(false, i);
    if constexpr (!kFirst) wait_filled(true, i - 1);
    turns.wait();  // (with P in shared memory: also every warp of this warpgroup has stored its rows)
    issue_scores_sm90<T, Cfg>(rows.scores, s.q(), s.k(at.slot), group_row0);
    if constexpr (!kFirst) issue_output(s.v(RingPosition<kStages>(ring + i - 1).slot));
    turns.pass();
    if constexpr (kScoreExtras) {  // dropout's random bytes, while S's MMAs run
      if (dropout.enabled)
        rows.drop_tests = drop_tests_fwd<1, kBlockN / 8>(dropout, m0 + warp_row0, n_block * kBlockN, lane);
    }
    rows.template wait_scores<kFirst ? 0 : 1>();  // P.V[i-1] may still run, under the softmax
    release_k(i);
    const bool needs_mask = step_needs_mask(mask_kind, mask, m0, rows_q, n_block * kBlockN, kBlockN);
    rows.scores_to_probs(scales.logit_log2, mask, mod, needs_mask, m0, warp_row0, n_block, lane);
  };
  for (int i = 0; i < own.first; ++i) skip_step(i);
  if (own.first < own.end) {
    walk_steps<!kScoreExtras>(own.first, own.end, unmasked, step);
    retire_and_convert(own.end);
    wait_filled(true, own.end - 1);
    turns.wait();  // step own.end's turn, or the tile's extra one
    issue_output(s.v(RingPosition<kStages>(ring + own.end - 1).slot));
    turns.pass();
    rows.retire_output();
    release_v(own.end - 1);
    if (own.end < n_blocks) release_unused(own.end);
    for (int i = own.end + 1; i < n_blocks; ++i) skip_step(i);
    if (own.end < n_blocks) {  // the tile's extra turn
      turns.wait();
      turns.pass();
    }
  } else {
    turns.wait();  // the tile's extra turn
    turns.pass();
  }
  rows.finalize(scales.logit, scales.output, qb.lse(p), warp_row0, rows_written, lane);
  write_output_rows<FwdOutputOf<T>, Cfg>(p, maps, s, qb, rows.output(), turns, rows_written, group_tid);
}

// After a consumer warpgroup's last tile: its first thread waits until its TMA stores of O are
// complete, before the CTA's shared memory goes away.
template <typename Cfg>
__device__ __forceinline__ void finish_output_stores(int group_tid) {
  if constexpr (Cfg::kStageO) {
    if (group_tid == 0) arch::bulk_wait_complete<0>();
  }
}

// The CTA's work, for the kernels below: maps is the kernel's tensor-map parameter.
template <typename T, typename Cfg, bool kScoreExtras, typename Maps>
__device__ __forceinline__ void fwd_ws_cta(const FwdParams& p, const Maps& maps, const QueryTileOrder& order) {
  using QueryBlock = FwdQueryBlock<Cfg::kBlockM, Cfg::kBlockN>;
  const FwdWsSmem<Cfg> s{reinterpret_cast<char*>(arch::swizzle_aligned_dynamic_smem())};
  const int tid = threadIdx.x, warpgroup = tid / arch::kWarpgroupThreads;
  record_rng_state(p.dropout, tid);
  if (tid == 0) {
    arch::prefetch_tensor_map(&maps.q);
    arch::prefetch_tensor_map(&maps.k);
    arch::prefetch_tensor_map(&maps.v);
    s.init_barriers();
  }
  if constexpr (!kScoreExtras) s.template fill_ones<T>(tid);  // the score-extras kernel sums with FADDs
  __syncthreads();  // the barriers are initialized and the ones written; the last CTA-wide barrier
  // Both roles walk the same tiles (query_tile_scheduler.cuh; `tiles` bounds every order) and skip
  // the same ones: no queries, or (consumers write those rows) no keys.
  const int tiles = query_tile_count<Cfg::kBlockM>(p);
  QueryTileWalk<Cfg::kBlockM> walk;
  int ring = 0;
  uint32_t tile_parity = 0;
  if (warpgroup == 0) {
    arch::release_registers_to<Cfg::kProducerRegs>();
    if (tid != 0) return;
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
      const QueryTileCoord at = walk.locate(p, order, tile);
      if (!at.valid()) break;
      const auto qb = QueryBlock::at(p, at.m_block, at.head, at.batch, Cfg::kEndAlignedCausal);
      if (qb.rows_q <= 0 || qb.key_blocks() == 0) continue;
      produce_fwd_tile<Cfg>(s, maps, qb, ring, tile_parity);
      ring += qb.key_blocks();
      tile_parity ^= 1;
    }
    return;
  }
  arch::claim_registers_to<Cfg::kConsumerRegs>();
  // The consumer index as a warp-uniform value keeps the step's operand descriptors in uniform
  // registers (arch::warp_uniform); without it ptxas copies them there from per-thread registers
  // before the wgmmas (R2UR). Session 20 left hd 192 / 256 without it (16-bit: ptxas then spilled 21
  // per-tile values, NOTES.md v25); in session 37 their plain kernels spill nothing with it, and it
  // took 40-74 R2UR out of those step loops: fp8 hd 256 ran 5-14% faster, 16-bit hd 192 2-9% and
  // hd 256 0-6% (H200, NOTES.md v42 items 2-3).
  const int consumer = warpgroup - 1;
  const TurnsOf<Cfg> turns{arch::warp_uniform(consumer)};
  turns.start();
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const QueryTileCoord at = walk.locate(p, order, tile);
    if (!at.valid()) break;
    const auto qb = QueryBlock::at(p, at.m_block, at.head, at.batch, Cfg::kEndAlignedCausal);
    if (qb.rows_q <= 0) continue;
    if (qb.key_blocks() == 0) {
      qb.template write_rows_without_keys<FwdOutputOf<T>, Cfg::kHeadDim, Cfg::kConsumerThreads>(
          p, tid - arch::kWarpgroupThreads);
      continue;
    }
    consume_fwd_tile<T, Cfg, kScoreExtras>(p, maps, s, qb, turns, tid % arch::kWarpgroupThreads, ring, tile_parity);
    ring += qb.key_blocks();
    tile_parity ^= 1;
  }
  finish_output_stores<Cfg>(tid % arch::kWarpgroupThreads);
  turns.finish();
}

// kScoreExtras: compiled with dropout, softcap and ALiBi (features.h says why this is a template).
template <typename T, typename Cfg, bool kScoreExtras>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    fwd_kernel_sm90_ws(const __grid_constant__ FwdParams p, const __grid_constant__ FwdTensorMaps maps,
                       const QueryTileOrder order) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  fwd_ws_cta<T, Cfg, kScoreExtras>(p, maps, order);
#else
  __trap();  // the launcher selects this kernel only where the sm_90a image is loaded
#endif
}

// The fp8 forward (launch_fwd_fp8.cuh): e4m3 operands, no score extras.
template <typename Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    fwd_fp8_kernel_sm90_ws(const __grid_constant__ FwdParams p, const __grid_constant__ FwdFp8TensorMaps maps,
                           const QueryTileOrder order) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  fwd_ws_cta<arch::Fp8E4m3, Cfg, false>(p, maps, order);
#else
  __trap();  // the launcher selects this kernel only where the sm_90a image is loaded
#endif
}

}  // namespace flash
