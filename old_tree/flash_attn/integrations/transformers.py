"""Hugging Face transformers: our attention as an attention implementation of transformers models.

    from flash_attn.integrations.transformers import register
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation=register())

register() adds attention_forward to transformers' AttentionInterface (what every attention layer
calls) and padding_mask to its AttentionMaskInterface (what the model builds as that layer's
attention_mask) under NAME. The name has no "flash" in it on purpose: transformers reads any such
name as its own FlashAttention integration and then imports the flash-attn package by version, or a
hub kernel. `attn_implementation="flash_attention_2"` is not offered: transformers admits it only for
flash-attn >= 2.3.3 by version number, and this package does not claim that API level.

What a layer hands us: query (batch, heads, seqlen_q, headdim) and key / value (batch, heads_kv,
seqlen_k, headdim), the cached keys included during generation. A padded batch runs as
variable-length attention on the valid tokens (keys and queries unpadded, outputs at padded query
positions 0), as transformers' FlashAttention path does; packed sequences (cu_seq_lens_* keywords,
or position_ids that restart) run variable-length too; everything else runs dense. Causal attention
is FlashAttention's bottom-right aligned one, which is what a decode step over a cache needs.
"""

import os

import torch

from ..bert_padding import index_first_axis, pad_input, unpad_input
from ..interface import flash_attn_func, flash_attn_varlen_func

NAME = "fa_ours"


def register(name=NAME):
    """Register our attention and mask functions with transformers under `name`; returns the name
    (for attn_implementation=...). Raises ImportError without transformers."""
    if "flash" in name:
        raise ValueError(f"register: transformers treats a name containing 'flash' ({name!r}) as its own "
                         "FlashAttention integration and would not call ours; choose another")
    from transformers import AttentionInterface, AttentionMaskInterface

    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, padding_mask)
    return name


def padding_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None, attention_mask=None,
                 device="cpu", **kwargs):
    """The layer's attention_mask: the 2D padding mask (batch, keys) when a token is padding or
    when the key tensors are longer than the tokens seen (a static cache, whose unwritten tail must
    be cut), else None. Causality and sliding windows are not in it: the kernels apply them."""
    if attention_mask is not None:
        attention_mask = attention_mask[:, -kv_length:].bool()
        full = attention_mask.shape[1] == kv_length and bool(attention_mask.all())
        return None if full else attention_mask
    seen = int(q_offset) + q_length
    if seen < kv_length:
        return torch.ones(batch_size, seen, dtype=torch.bool, device=device)
    return None


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, sliding_window=None,
                      softcap=None, is_causal=None, s_aux=None, position_ids=None, cu_seq_lens_q=None,
                      cu_seq_lens_k=None, max_length_q=None, max_length_k=None, **kwargs):
    """transformers' attention-function signature; returns (output (batch, seqlen_q, heads, headdim),
    None): attention weights are never materialized."""
    if s_aux is not None:
        raise NotImplementedError(f"{NAME}: attention sinks (s_aux) are not supported by flash_attn")
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    value_dim = v.shape[-1]
    if value_dim != q.shape[-1]:  # e.g. MLA: v's head dim is smaller; the kernels need one head dim
        v = torch.nn.functional.pad(v, (0, q.shape[-1] - value_dim))
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    options = _options(dropout, scaling, causal, sliding_window, softcap, k.shape[1], kwargs)
    if attention_mask is not None:
        out = _padded(q, k, v, attention_mask, options)
    elif all(t is not None for t in (cu_seq_lens_q, cu_seq_lens_k, max_length_q, max_length_k)):
        out = _packed(q, k, v, (cu_seq_lens_q, cu_seq_lens_k, max_length_q, max_length_k), options)
    elif _restarts(position_ids, q.shape[0]):
        out = _packed(q, k, v, _lengths_from_positions(position_ids), options)
    else:
        out = flash_attn_func(q, k, v, **options)
    return out[..., :value_dim], None


def _options(dropout, scaling, causal, sliding_window, softcap, seqlen_k, kwargs):
    """FA2 keywords from transformers' names: sliding_window counts the query's own token, so a
    window of w keys is FA2's (w - 1) to each side (right is 0 under causal)."""
    window = (-1, -1)
    if sliding_window is not None and seqlen_k > sliding_window:
        window = (sliding_window - 1, sliding_window - 1)
    deterministic = kwargs.get("deterministic")
    if deterministic is None:
        deterministic = os.environ.get("FLASH_ATTENTION_DETERMINISTIC", "0") == "1"
    return dict(dropout_p=dropout, softmax_scale=scaling, causal=bool(causal), window_size=window,
                softcap=0.0 if softcap is None else softcap, deterministic=bool(deterministic))


def _padded(q, k, v, mask, options):
    """Unpad keys by the mask (batch, keys) and queries by its last seqlen_q columns (queries are the
    newest tokens; left padding), attend per sequence, pad the output back with zeros."""
    batch, seqlen_q = q.shape[:2]
    k, v = k[:, :mask.shape[1]], v[:, :mask.shape[1]]  # a static cache's keys run past the tokens seen
    k_packed, indices_k, cu_seqlens_k, max_seqlen_k, _ = unpad_input(k, mask)
    v_packed = index_first_axis(v.flatten(0, 1), indices_k)
    q_packed, indices_q, cu_seqlens_q, max_seqlen_q, _ = unpad_input(q, mask[:, -seqlen_q:])
    out = flash_attn_varlen_func(q_packed, k_packed, v_packed, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                 max_seqlen_k, **options)
    return pad_input(out, indices_q, batch, seqlen_q)


def _packed(q, k, v, lengths, options):
    """Sequences packed back to back in the batch's rows: (cu_seqlens_q, cu_seqlens_k, max_q, max_k)."""
    cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k = lengths
    batch, seqlen_q = q.shape[:2]
    out = flash_attn_varlen_func(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu_seqlens_q.to(torch.int32),
                                 cu_seqlens_k.to(torch.int32), int(max_seqlen_q), int(max_seqlen_k), **options)
    return out.unflatten(0, (batch, seqlen_q))


def _restarts(position_ids, batch):
    """A batch of one whose position_ids restart: several sequences packed into one row (padding-free
    training, e.g. DataCollatorWithFlattening). Reads the positions, hence one device sync."""
    if position_ids is None or batch != 1 or position_ids.shape[-1] == 1:
        return False
    row = position_ids.reshape(-1)
    return not bool((row == torch.arange(row.numel(), device=row.device) + row.min()).all())


def _lengths_from_positions(position_ids):
    """cu_seqlens where positions fall back to their minimum (each sequence's first token)."""
    row = position_ids.reshape(-1)
    starts = (row == row.min()).nonzero().flatten().to(torch.int32)
    cu_seqlens = torch.cat((starts, torch.tensor([row.numel()], dtype=torch.int32, device=row.device)))
    max_seqlen = int(cu_seqlens.diff().max())
    return cu_seqlens, cu_seqlens, max_seqlen, max_seqlen
