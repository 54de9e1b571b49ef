"""S_dmask: the attention probabilities with the dropout pattern, as FlashAttention 2 returns them
from `return_attn_probs=True` with dropout, for testing.

FlashAttention 2's kernel writes, for each block of block_n keys it visits (last block first),
exp(s - m) with s the final score and m the running row maximum over the blocks visited so far,
i.e. over keys from that block to the end of the row; dropped entries are negated, masked ones are
0, and the tensor is (batch, nheads, seqlen_q rounded up to 128, seqlen_k rounded up to 128). Its
test suite undoes exactly that scaling (normalize_flash_attn_S, with FA2's block sizes), so the same
convention is reproduced here: block_n follows FA2's table for the head dim and dropout.

Our kernels do not write these probabilities: they are recomputed here in fp32 from q and k, and
the dropout pattern is the kernels' own (torch.ops.flash_attn.dropout_keep_mask runs the same
Philox code as the forward on CUDA, flash_attn.dropout on CPU). Memory is O(seqlen_q * seqlen_k).
"""

from typing import Optional

import torch
import torch.nn.functional as F

from . import reference
from .validation import cuda_capability

_ROUND = 128


def fa2_block_n(headdim, device):
    """FlashAttention 2's key-block width with dropout (its kernels' tile table, which its tests
    mirror as _get_block_size_n): by head dim, with sm86/sm89 differing at 129..160."""
    if headdim <= 32:
        return 128
    if headdim <= 96 or headdim > 160:
        return 64
    if headdim <= 128:
        return 32
    is_sm8x = device.type == "cuda" and (8, 0) < tuple(cuda_capability(device)) < (9, 0)
    return 64 if is_sm8x else 32


def _running_max_probs(scores, block_n):
    """exp(s - m_block) with m_block the max of s over keys from the element's block to the row end
    (the order FA2's kernel visits blocks); 0 where s is -inf."""
    if scores.numel() == 0:
        return scores
    blocks = scores.split(block_n, dim=-1)
    block_max = torch.stack([b.amax(dim=-1) for b in blocks], dim=-1)  # (..., n_blocks)
    suffix_max = torch.cummax(block_max.flip(-1), dim=-1).values.flip(-1)
    probs = [torch.exp(b - m.unsqueeze(-1).masked_fill(m.unsqueeze(-1) == float("-inf"), 0.0))
             for b, m in zip(blocks, suffix_max.unbind(-1))]
    return torch.cat(probs, dim=-1).masked_fill(scores == float("-inf"), 0.0)


def _sequence_probs(q, k, softmax_scale, options, block_n):
    """(b, h, sq, sk) signed probabilities of dense q (b, sq, h, d), k (b, sk, hk, d)."""
    seqlen_q, seqlen_k, nheads = q.shape[1], k.shape[1], q.shape[2]
    qf = q.float()
    kf = k.float().repeat_interleave(nheads // k.shape[2], dim=2)
    rows, cols = torch.arange(seqlen_q, device=q.device), torch.arange(seqlen_k, device=q.device)
    scores, _ = reference.scores_and_capped(qf, kf, rows, cols, seqlen_q, seqlen_k, softmax_scale, options)
    return _running_max_probs(scores, block_n)


def _signed(probs, keep):
    return torch.where(keep, probs, -probs)


def dropout_attention_probs(q, k, varlen, softmax_scale, window, softcap, alibi_slopes, dropout_p, rng_state,
                            headdim):
    """S_dmask for the forward that returned rng_state. q, k dense (b, s, h, d) with varlen None,
    or (total, h, d) with varlen = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)."""
    cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k = varlen or (None, None, q.shape[1], k.shape[1])
    return torch.ops.flash_attn.attention_probs(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                                softmax_scale, window[0], window[1], softcap, alibi_slopes, dropout_p,
                                                rng_state, headdim)


# An op, so that torch.compile(fullgraph=True) sees one opaque call: varlen reads cu_seqlens on the
# host, which a traced graph cannot.
@torch.library.custom_op("flash_attn::attention_probs", mutates_args=())
def _attention_probs(q: torch.Tensor, k: torch.Tensor, cu_seqlens_q: Optional[torch.Tensor],
                     cu_seqlens_k: Optional[torch.Tensor], max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float,
                     window_left: int, window_right: int, softcap: float, alibi_slopes: Optional[torch.Tensor],
                     dropout_p: float, rng_state: torch.Tensor, headdim: int) -> torch.Tensor:
    options = reference.ScoreOptions(window=(window_left, window_right), softcap=softcap, alibi_slopes=alibi_slopes)
    block_n = fa2_block_n(headdim, q.device)
    nheads = q.shape[-2]
    batch = q.shape[0] if cu_seqlens_q is None else cu_seqlens_q.shape[0] - 1
    keep = torch.ops.flash_attn.dropout_keep_mask(rng_state, batch, nheads, max_seqlen_q, max_seqlen_k, dropout_p)
    if cu_seqlens_q is None:
        dense = _signed(_sequence_probs(q, k, softmax_scale, options, block_n), keep)
    else:
        dense = torch.zeros(batch, nheads, max_seqlen_q, max_seqlen_k, dtype=torch.float32, device=q.device)
        bounds_q, bounds_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
        for b in range(batch):
            q_b = q[bounds_q[b]:bounds_q[b + 1]][:max_seqlen_q].unsqueeze(0)
            k_b = k[bounds_k[b]:bounds_k[b + 1]][:max_seqlen_k].unsqueeze(0)
            sq, sk = q_b.shape[1], k_b.shape[1]
            probs = _sequence_probs(q_b, k_b, softmax_scale, options.for_sequence(b), block_n)
            dense[b, :, :sq, :sk] = _signed(probs[0], keep[b, :, :sq, :sk])
    return F.pad(dense, (0, -max_seqlen_k % _ROUND, 0, -max_seqlen_q % _ROUND)).to(q.dtype)


@_attention_probs.register_fake
def _attention_probs_fake(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, window_left,
                          window_right, softcap, alibi_slopes, dropout_p, rng_state, headdim):
    batch = q.shape[0] if cu_seqlens_q is None else cu_seqlens_q.shape[0] - 1
    rounded = lambda n: -(-n // _ROUND) * _ROUND  # noqa: E731
    return q.new_empty((batch, q.shape[-2], rounded(max_seqlen_q), rounded(max_seqlen_k)))
