// Backward by recomputation on Hopper (sm_90a), with warpgroup MMAs (wgmma), every thread both
// loading and computing: the fallback of the warp-specialized kernel (bwd_kernel_sm90_ws.cuh) and
// the kernel of short causal calls. Same algorithm and arguments as bwd_kernel.cuh; one CTA per
// (block of 64 or 128 keys, head, batch), one or two warpgroups, each owning 64 of the keys; the
// math of a query block is bwd_sm90_step.cuh's. The next kStages - 1 query blocks' Q, dO, lse and
// dsum load (cp.async) during the current one, and thread 0 adds the previous block's dQ tile with
// one bulk reduction under the current block's first MMAs.
#pragma once

#include "bwd_sm90_step.cuh"
#include "tile_io.cuh"

namespace flash {

template <typename T, typename Cfg, typename KeyBlock>
__device__ __forceinline__ void load_query_stage_sm90(const QueryStageSm90<Cfg>& stage, const BwdParams& p,
                                                      const KeyBlock& kb, int m0, int tid) {
  const int rows = min(Cfg::kBlockM, kb.seq.seqlen_q - m0), headdim = p.fwd.shape.headdim;
  arch::load_swizzled_tile_async<Cfg::kBlockM, Cfg::kHeadDim, Cfg::kThreads>(
      stage.q, kb.seq.template q_side<T>(p.fwd.q, m0, kb.head), p.fwd.q.row_stride, rows, headdim, tid);
  arch::load_swizzled_tile_async<Cfg::kBlockM, Cfg::kHeadDim, Cfg::kThreads>(
      stage.dout, kb.seq.template q_side<T>(p.dout, m0, kb.head), p.dout.row_stride, rows, headdim, tid);
  load_query_vectors_async<Cfg, Cfg::kThreads>(stage, p, kb, m0, tid);
}

// kScoreExtras: compiled with dropout, softcap and ALiBi (features.h says why this is a template).
template <typename T, typename Cfg, bool kScoreExtras>
__global__ void __launch_bounds__(Cfg::kThreads) bwd_kernel_sm90(const BwdParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kHeadDim = Cfg::kHeadDim;
  unsigned char* smem = arch::swizzle_aligned_dynamic_smem();
  char* sK = reinterpret_cast<char*>(smem);  // KVTile
  char* sV = sK + Cfg::KVTile::kBytes;       // KVTile
  char* sdS = sV + Cfg::KVTile::kBytes;      // DsTile
  unsigned char* stage_base = reinterpret_cast<unsigned char*>(sdS + Cfg::DsTile::kBytes);
  float* sdQ = reinterpret_cast<float*>(stage_base + Cfg::kStages * Cfg::kStageBytes);  // (kBlockM, kHeadDim)

  const int tid = threadIdx.x;
  const BwdSm90Lanes at = bwd_sm90_lanes<Cfg>(tid);
  const auto kb = BwdKeyBlock<kBlockM, kBlockN>::current(p);
  if (kb.template done_without_queries<T, kHeadDim, Cfg::kThreads>(p, tid)) return;
  const int head = kb.head, steps = kb.query_blocks(), headdim = p.fwd.shape.headdim;
  const ScoreMod mod = kScoreExtras ? kb.score_mod(p) : ScoreMod::none();
  const Dropout dropout = kScoreExtras ? kb.dropout(p) : Dropout::none();

  arch::load_swizzled_tile_async<kBlockN, kHeadDim, Cfg::kThreads>(
      sK, kb.template key_rows<T>(p.fwd.k, kb.head_k), p.fwd.k.row_stride, kb.rows_k, headdim, tid);
  arch::load_swizzled_tile_async<kBlockN, kHeadDim, Cfg::kThreads>(
      sV, kb.template key_rows<T>(p.fwd.v, kb.head_k), p.fwd.v.row_stride, kb.rows_k, headdim, tid);
  // One commit group per query block, empty past the last one, so that "all but the newest
  // kStages - 2 groups" is always "up to the current block".
#pragma unroll
  for (int ahead = 0; ahead < Cfg::kStages - 1; ++ahead) {
    if (ahead < steps)
      load_query_stage_sm90<T, Cfg>(QueryStageSm90<Cfg>::at(stage_base + ahead * Cfg::kStageBytes), p, kb,
                                    kb.query_block_after(kb.m_start, ahead) * kBlockM, tid);
    arch::cp_async_commit();
  }

  BwdSm90Gradients<Cfg> grads;
  arch::zero_accumulators(grads.dk);
  arch::zero_accumulators(grads.dv);

  int m_block = kb.m_start;  // the query blocks, in the order of the walk (dq_order.cuh)
  for (int step = 0; step < steps; ++step, m_block = kb.query_block_after(m_block, 1)) {
    const int m0 = m_block * kBlockM;
    const QueryStageSm90<Cfg> stage =
        QueryStageSm90<Cfg>::at(stage_base + (step % Cfg::kStages) * Cfg::kStageBytes);
    arch::cp_async_wait<Cfg::kStages - 2>();
    arch::fence_proxy_async();
    __syncthreads();  // this block's inputs landed; the previous block's phases are done everywhere
    {  // the stage of the previous block, which every warp is done with, loads block m + kStages - 1
      const int next = step + Cfg::kStages - 1;
      if (next < steps)
        load_query_stage_sm90<T, Cfg>(QueryStageSm90<Cfg>::at(stage_base + (next % Cfg::kStages) * Cfg::kStageBytes),
                                      p, kb, kb.query_block_after(m_block, Cfg::kStages - 1) * kBlockM, tid);
      arch::cp_async_commit();
    }
    // (Issuing the loads above after the S^T / dP^T wgmmas instead measured 4-7% slower: more
    // registers live across them, benchmarks/NOTES.md.)
    // The previous block's dQ tile goes out while the S^T / dP^T MMAs run: with deterministic=True
    // the wait for this key block's turn then stalls warpgroup 0 only where it would wait for its
    // S^T anyway (issued before the MMAs, it stalled their issue).
    auto add_previous_dq = [&] {
      if (tid == 0 && step > 0)
        reduce_dq_tile<Cfg>(p, sdQ, kb.seq, head, kb.query_block_before(m_block) * kBlockM,
                            kb.template dq_turn</*kDeterministic=*/true>(p, kb.query_block_before(m_block)));
    };
    uint32_t dscores_a[1][kBlockM / 16][4];  // dS^T, the A operand of dK's MMAs
    kv_gradients_sm90<T, Cfg, kScoreExtras>(grads, p, kb, mod, dropout, sK, sV, sdS, stage, m0, at, dscores_a,
                                            add_previous_dq);
    // Phase 3; deterministic: the previous block's add, issued under phase 1, is released under
    // the dQ MMAs (waiting for its completion right away stalled warpgroup 0's MMA issue on every
    // block, benchmarks/NOTES.md v8).
    if (tid == 0) arch::bulk_wait_source_read<0>();
    __syncthreads();  // dS^T of both warpgroups is in shared memory; sdQ has been read out
    auto release_previous_dq = [&] {
      if (tid == 0 && step > 0)
        release_dq_tile(kb.template dq_turn</*kDeterministic=*/true>(p, kb.query_block_before(m_block)));
    };
    // Every MMA of the block done on return: the next step's loads overwrite this block's stage.
    dq_part_sm90<T, Cfg, /*kDkInFlight=*/false>(grads, dscores_a, stage, sdS, sK, sdQ, at, release_previous_dq,
                                                [] {});
  }
  __syncthreads();  // the last block's dQ tile is complete
  if (tid == 0) {
    const int last = kb.query_block_before(m_block);  // the loop left m_block one step past the last
    reduce_dq_tile<Cfg>(p, sdQ, kb.seq, head, last * kBlockM, kb.template dq_turn</*kDeterministic=*/true>(p, last));
    release_dq_tile(kb.template dq_turn</*kDeterministic=*/true>(p, last));
    arch::bulk_wait_complete<0>();
  }
  __syncthreads();  // every warpgroup is done reading K, V and dS^T
  store_kv_gradients_sm90<T, Cfg, Cfg::kThreads>(grads, p, kb, dropout, smem, at, tid, [] { __syncthreads(); });
#else
  __trap();  // the launcher selects this kernel only where the sm_90a image is loaded
#endif
}

}  // namespace flash
