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

import torch
import torch.nn.functional as F

from . import reference

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
    is_sm8x = device.type == "cuda" and tuple(torch.cuda.get_device_capability(device)) > (8, 0) \
        and torch.cuda.get_device_capability(device)[0] == 8
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
    options = reference.ScoreOptions(window=window, softcap=softcap, alibi_slopes=alibi_slopes)
    block_n = fa2_block_n(headdim, q.device)
    nheads = q.shape[-2]
    if varlen is None:
        batch, seqlen_q, seqlen_k = q.shape[0], q.shape[1], k.shape[1]
    else:
        cu_seqlens_q, cu_seqlens_k, seqlen_q, seqlen_k = varlen
        batch = cu_seqlens_q.shape[0] - 1
    keep = torch.ops.flash_attn.dropout_keep_mask(rng_state, batch, nheads, seqlen_q, seqlen_k, dropout_p)
    dense = torch.zeros(batch, nheads, seqlen_q, seqlen_k, dtype=torch.float32, device=q.device)
    if varlen is None:
        dense = _signed(_sequence_probs(q, k, softmax_scale, options, block_n), keep)
    else:
        bounds_q, bounds_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
        for b in range(batch):
            q_b = q[bounds_q[b]:bounds_q[b + 1]][:seqlen_q].unsqueeze(0)
            k_b = k[bounds_k[b]:bounds_k[b + 1]][:seqlen_k].unsqueeze(0)
            sq, sk = q_b.shape[1], k_b.shape[1]
            probs = _sequence_probs(q_b, k_b, softmax_scale, options.for_sequence(b), block_n)
            dense[b, :, :sq, :sk] = _signed(probs[0], keep[b, :, :sq, :sk])
    pad_q, pad_k = -seqlen_q % _ROUND, -seqlen_k % _ROUND
    return F.pad(dense, (0, pad_k, 0, pad_q)).to(q.dtype)
