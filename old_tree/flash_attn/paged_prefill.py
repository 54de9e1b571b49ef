"""flash_attn_varlen_func with block_table (paged prefill): packed queries against a paged KV cache,
forward only, as in FlashAttention 2.

k and v are the paged caches (num_pages, page_size, nheads_k, headdim); sequence b attends to the
first cu_seqlens_k[b + 1] - cu_seqlens_k[b] positions of its pages block_table[b]. It runs on the
kvcache op (split-KV kernel) with the queries left-padded to (batch, max_seqlen_q): sequence b's
queries occupy the last len_q(b) rows, so with the op's seqlen_q = max_seqlen_q the bottom-right
aligned mask, window and ALiBi distances are exactly those of the sequence's own lengths
(row t' = t + max_seqlen_q - len_q sees key j iff j <= t' + len_k - max_seqlen_q + right = t + len_k - len_q +
right). The padding rows are computed and dropped. No host synchronization: the index maps are
built on the device from cu_seqlens.
"""

import torch

from . import backend, validation, validation_kvcache


def _padded_rows(cu_seqlens_q, max_seqlen_q, total_q):
    """(rows (batch, max_seqlen_q) int64 packed row of each padded slot, valid (batch, max_seqlen_q))."""
    starts, lengths = cu_seqlens_q[:-1].long(), (cu_seqlens_q[1:] - cu_seqlens_q[:-1]).long()
    slots = torch.arange(max_seqlen_q, device=cu_seqlens_q.device).view(1, -1)
    padding = (max_seqlen_q - lengths).view(-1, 1)
    valid = slots >= padding
    rows = (starts.view(-1, 1) + slots - padding).clamp(0, max(total_q - 1, 0))
    return rows, valid


def check_paged_varlen(q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, block_table,
                       dropout_p):
    validation.check_tensor("q", q, 3, "(total_q, nheads, headdim)")
    validation.check_cu_seqlens(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, q)
    batch = cu_seqlens_q.shape[0] - 1
    validation_kvcache.check_kvcache_tensors(q.unsqueeze(0), k_cache, v_cache, None, None, block_table,
                                             cache_names=("k", "v"))
    validation_kvcache.check_block_table(block_table, batch, q.device, k_cache, cache_name="k")
    if dropout_p != 0:
        raise ValueError(f"flash_attn: dropout_p must be 0 with block_table (paged prefill is forward-only inference, "
                         f"as in FlashAttention 2), got {dropout_p!r}")


def paged_varlen_forward(q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, block_table, softmax_scale,
                         window, softcap, alibi_slopes):
    """(out (total_q, nheads, headdim), lse (nheads, total_q)); rows outside every sequence get 0 and +inf."""
    total_q, nheads, headdim = q.shape
    if total_q == 0:
        return q.new_zeros(q.shape), torch.full((nheads, 0), float("inf"), device=q.device)
    rows, valid = _padded_rows(cu_seqlens_q, max_seqlen_q, total_q)
    q_padded = torch.where(valid.view(*valid.shape, 1, 1), q[rows], 0)
    lengths_k = (cu_seqlens_k[1:] - cu_seqlens_k[:-1]).to(torch.int32)
    out_padded, lse_padded = backend.op_for(q, "fwd_kvcache")(
        q_padded, k_cache, v_cache, None, None, None, None, lengths_k, None, None, block_table, softmax_scale,
        window[0], window[1], softcap, False, alibi_slopes, 0)
    # Scatter the valid slots back; the padding slots land in a spare last row.
    targets = torch.where(valid, rows, total_q).view(-1)
    out = q.new_zeros((total_q + 1, nheads, out_padded.shape[-1]))
    out[targets] = out_padded.reshape(-1, nheads, out_padded.shape[-1])
    lse = torch.full((nheads, total_q + 1), float("inf"), device=q.device)
    lse[:, targets] = lse_padded.permute(1, 0, 2).reshape(nheads, -1)
    return out[:total_q], lse[:, :total_q]
