"""MHA: FlashAttention 2's multi-head attention module (`flash_attn.modules.mha.MHA`), on our kernels.

Same constructor arguments, parameter names (Wqkv, or Wq and Wkv with cross_attn; out_proj) and
forward arguments as FA2's, so FA2 models and checkpoints load unchanged. The projection is packed
as FA2 packs it: Wqkv's output is q (num_heads heads), then k and v (num_heads_kv heads each).

Where FA2 has two code paths (use_flash_attn=True: its kernels, fp16 / bf16 on CUDA only;
use_flash_attn=False: plain PyTorch attention), ours has one: the attention always runs through
flash_attn's public functions, which serve CUDA and CPU tensors in fp16, bf16 and fp32. So every
option works whatever use_flash_attn says: key_padding_mask (run as variable-length attention on the
valid tokens), cu_seqlens, ALiBi, sliding windows, rotary with cu_seqlens (FA2 refuses it), and the
KV cache (flash_attn_with_kvcache). What FA2 implements with code this package does not have
(dwconv, fused_bias_fc's fused dense layers) raises NotImplementedError naming the argument.
"""

import math
import numbers

import torch
import torch.nn as nn
import torch.utils.checkpoint

from ..layers.rotary import RotaryEmbedding, apply_rotary_emb
from ..validation import MAX_HEADDIM
from . import inference_cache
from .alibi import get_alibi_slopes
from .inner_attention import AttentionOptions, dense_attention, padded_attention, varlen_attention

__all__ = ["MHA", "get_alibi_slopes"]

# Forward keyword arguments FA2's MHA passes on to its inner attention modules.
_INNER_KWARGS = ("causal", "cu_seqlens_k", "max_seqlen_k")


def _require(condition, message, error=ValueError):
    if not condition:
        raise error(f"MHA: {message}")


def _is_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_not_implemented(dwconv, fused_bias_fc):
    _require(not dwconv, "dwconv=True (a depthwise convolution over q, k, v) is not implemented in this package",
             NotImplementedError)
    _require(not fused_bias_fc, "fused_bias_fc=True needs FlashAttention 2's fused dense layers "
             "(flash_attn.ops.fused_dense), which this package does not have; nn.Linear is used with False",
             NotImplementedError)


def _check_heads(embed_dim, num_heads, num_heads_kv):
    _require(_is_int(embed_dim) and embed_dim > 0, f"embed_dim must be a positive int, got {embed_dim!r}")
    _require(_is_int(num_heads) and num_heads > 0, f"num_heads must be a positive int, got {num_heads!r}")
    _require(embed_dim % num_heads == 0, f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads})")
    _require(_is_int(num_heads_kv) and 0 < num_heads_kv and num_heads % num_heads_kv == 0,
             f"num_heads_kv must be a positive int dividing num_heads ({num_heads}), got {num_heads_kv!r}")
    head_dim = embed_dim // num_heads
    _require(head_dim <= MAX_HEADDIM, f"embed_dim / num_heads = {head_dim} is the head dim, at most {MAX_HEADDIM} "
             "for the attention kernels")


def _check_attention_options(dropout, softmax_scale, window_size):
    _require(isinstance(dropout, numbers.Real) and not isinstance(dropout, bool) and 0.0 <= dropout < 1.0,
             f"dropout must be a float in [0, 1), got {dropout!r}")
    _require(softmax_scale is None or (isinstance(softmax_scale, numbers.Real) and math.isfinite(softmax_scale)
                                       and softmax_scale > 0),
             f"softmax_scale must be None (1 / sqrt(head dim)) or a positive float, got {softmax_scale!r}")
    _require(isinstance(window_size, (tuple, list)) and len(window_size) == 2
             and all(_is_int(w) and w >= -1 for w in window_size),
             f"window_size must be a pair (left, right) of ints >= -1 (-1: unbounded), got {window_size!r}")


def _check_rotary(rotary_emb_dim, head_dim, cross_attn, scale_base):
    _require(_is_int(rotary_emb_dim) and rotary_emb_dim >= 0 and rotary_emb_dim % 2 == 0
             and rotary_emb_dim <= head_dim,
             f"rotary_emb_dim must be an even int in [0, head dim = {head_dim}], got {rotary_emb_dim!r}")
    _require(not (rotary_emb_dim > 0 and cross_attn), "rotary_emb_dim > 0 with cross_attn=True is not supported "
             "(as in FlashAttention 2: queries and keys come from different sequences)", NotImplementedError)
    _require(scale_base is None or (isinstance(scale_base, numbers.Real) and scale_base > 0),
             f"rotary_emb_scale_base must be None or a positive number (XPos), got {scale_base!r}")


class MHA(nn.Module):
    """Multi-head self-attention and cross-attention, with MQA / GQA (num_heads_kv), rotary
    embeddings, ALiBi, sliding windows, dropout, padded and variable-length batches and a KV cache
    for generation (inference_params)."""

    def __init__(self, embed_dim, num_heads, num_heads_kv=None, cross_attn=False, qkv_proj_bias=True,
                 out_proj_bias=True, dropout=0.0, softmax_scale=None, causal=False, layer_idx=None, dwconv=False,
                 rotary_emb_dim=0, rotary_emb_base=10000.0, rotary_emb_scale_base=None,
                 rotary_emb_interleaved=False, use_alibi=False, window_size=(-1, -1), fused_bias_fc=False,
                 use_flash_attn=False, return_residual=False, checkpointing=False, device=None, dtype=None):
        """num_heads_kv: heads of k and v (None: num_heads); fewer gives MQA / GQA. return_residual:
        forward returns (out, x), for post-norm blocks that fuse the residual. checkpointing:
        recompute the attention in the backward instead of keeping its inputs. use_flash_attn: kept
        for FA2 compatibility; both values run our attention (module docstring)."""
        super().__init__()
        num_heads_kv = num_heads if num_heads_kv is None else num_heads_kv
        _check_not_implemented(dwconv, fused_bias_fc)
        _check_heads(embed_dim, num_heads, num_heads_kv)
        _check_attention_options(dropout, softmax_scale, window_size)
        head_dim = embed_dim // num_heads
        _check_rotary(rotary_emb_dim, head_dim, cross_attn, rotary_emb_scale_base)
        self.embed_dim, self.num_heads, self.num_heads_kv, self.head_dim = embed_dim, num_heads, num_heads_kv, head_dim
        self.cross_attn, self.causal, self.layer_idx, self.dwconv = cross_attn, causal, layer_idx, dwconv
        self.dropout, self.softmax_scale, self.window_size = float(dropout), softmax_scale, tuple(window_size)
        self.rotary_emb_dim, self.use_flash_attn = rotary_emb_dim, use_flash_attn
        self.return_residual, self.checkpointing = return_residual, checkpointing
        if rotary_emb_dim > 0:
            self.rotary_emb = RotaryEmbedding(rotary_emb_dim, base=rotary_emb_base, interleaved=rotary_emb_interleaved,
                                              scale_base=rotary_emb_scale_base, device=device)
        slopes = torch.tensor(get_alibi_slopes(num_heads), device=device) if use_alibi else None
        self.register_buffer("alibi_slopes", slopes, persistent=False)
        factory = {"device": device, "dtype": dtype}
        kv_dim = 2 * num_heads_kv * head_dim
        if cross_attn:
            self.Wq = nn.Linear(embed_dim, embed_dim, bias=qkv_proj_bias, **factory)
            self.Wkv = nn.Linear(embed_dim, kv_dim, bias=qkv_proj_bias, **factory)
        else:
            self.Wqkv = nn.Linear(embed_dim, embed_dim + kv_dim, bias=qkv_proj_bias, **factory)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=out_proj_bias, **factory)

    def allocate_inference_cache(self, batch_size, max_seqlen, dtype=None):
        """A (batch_size, max_seqlen, 2, num_heads_kv, head_dim) cache for key_value_memory_dict[layer_idx]."""
        weight = self.out_proj.weight
        return torch.empty(batch_size, max_seqlen, 2, self.num_heads_kv, self.head_dim,
                           dtype=weight.dtype if dtype is None else dtype, device=weight.device)

    def forward(self, x, x_kv=None, key_padding_mask=None, cu_seqlens=None, max_seqlen=None, mixer_subset=None,
                inference_params=None, **kwargs):
        """x: (batch, seqlen, embed_dim), or (total, embed_dim) with cu_seqlens (batch + 1,) int32 and
        max_seqlen (int). x_kv: the keys' input for cross_attn (None: x). key_padding_mask: (batch,
        seqlen) True for valid tokens; outputs at padded positions are out_proj(0). mixer_subset: with
        cross_attn, an index of x's positions that get queries (FA2's ViT uses it for the CLS token).
        inference_params: generation state (flash_attn.utils.generation.InferenceParams), needs
        layer_idx. kwargs, as FA2 passes them to its inner attention: causal (overrides the
        module's), cu_seqlens_k and max_seqlen_k (cross_attn with cu_seqlens and x_kv).
        Returns out like x, or (out, x) with return_residual."""
        unknown = sorted(set(kwargs) - set(_INNER_KWARGS))
        _require(not unknown, f"unexpected keyword arguments {unknown}; accepted besides the named ones: "
                 f"{list(_INNER_KWARGS)}", TypeError)
        causal = bool(self.causal if kwargs.get("causal") is None else kwargs["causal"])
        self._check_input(x, x_kv, key_padding_mask, cu_seqlens, max_seqlen, mixer_subset, inference_params, kwargs)
        options = AttentionOptions(self.dropout if self.training else 0.0, self.softmax_scale, causal,
                                   self.window_size, None if self.alibi_slopes is None else self.alibi_slopes.float())
        if self.cross_attn:
            q, kv = self._project_cross(x, x_kv, mixer_subset)
        else:
            qkv = self.Wqkv(x).unflatten(-1, (self.num_heads + 2 * self.num_heads_kv, self.head_dim))
            kernel_rotates = self._kernel_rotates(inference_params, x.shape[1] if x.dim() == 3 else 0, causal)
            q, kv = self._split(qkv if kernel_rotates else self._rotate(qkv, cu_seqlens, max_seqlen, inference_params))
        if inference_params is not None:
            context = self._attend_with_cache(q, kv, inference_params, options)
        else:
            cu_seqlens_k = kwargs.get("cu_seqlens_k", cu_seqlens)
            max_seqlen_k = kwargs.get("max_seqlen_k", max_seqlen)
            context = self._attend(q, kv, key_padding_mask, (cu_seqlens, cu_seqlens_k, max_seqlen, max_seqlen_k),
                                   options)
        out = self.out_proj(context.flatten(-2))
        return (out, x) if self.return_residual else out

    def _check_input(self, x, x_kv, key_padding_mask, cu_seqlens, max_seqlen, mixer_subset, inference_params,
                     kwargs):
        """The combinations FA2 supports, and shapes, checked before any work."""
        _require(isinstance(x, torch.Tensor) and x.dim() == (2 if cu_seqlens is not None else 3)
                 and x.shape[-1] == self.embed_dim,
                 f"x must be (batch, seqlen, embed_dim), or (total, embed_dim) with cu_seqlens, embed_dim = "
                 f"{self.embed_dim}; got {tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
        _require((cu_seqlens is None) == (max_seqlen is None), "cu_seqlens and max_seqlen must be given together")
        _require(cu_seqlens is None or key_padding_mask is None,
                 "key_padding_mask cannot be combined with cu_seqlens (a packed batch has no padding)")
        _require(self.cross_attn or (x_kv is None and mixer_subset is None),
                 "x_kv and mixer_subset need cross_attn=True")
        _require(self.cross_attn or ("cu_seqlens_k" not in kwargs and "max_seqlen_k" not in kwargs),
                 "cu_seqlens_k and max_seqlen_k need cross_attn=True (self-attention uses cu_seqlens)")
        _require(mixer_subset is None or cu_seqlens is None, "mixer_subset cannot be combined with cu_seqlens")
        has_kv_lengths = "cu_seqlens_k" in kwargs and "max_seqlen_k" in kwargs
        _require(cu_seqlens is None or x_kv is None or has_kv_lengths,
                 "cross-attention with cu_seqlens and x_kv needs cu_seqlens_k and max_seqlen_k")
        if key_padding_mask is not None:
            keys = x if x_kv is None else x_kv
            _require(isinstance(key_padding_mask, torch.Tensor) and tuple(key_padding_mask.shape) == keys.shape[:2],
                     f"key_padding_mask must be a (batch, seqlen_k) = {tuple(keys.shape[:2])} tensor, got "
                     f"{getattr(key_padding_mask, 'shape', type(key_padding_mask).__name__)}")
        if inference_params is not None:
            self._check_inference(x, key_padding_mask, cu_seqlens, inference_params)

    def _check_inference(self, x, key_padding_mask, cu_seqlens, inference_params):
        _require(self.layer_idx is not None, "inference_params needs layer_idx (the cache's key) in the constructor")
        _require(key_padding_mask is None and cu_seqlens is None,
                 "inference_params cannot be combined with key_padding_mask or cu_seqlens (use lengths_per_sample)")
        end = inference_params.seqlen_offset + x.shape[1]
        _require(inference_params.lengths_per_sample is not None or end <= inference_params.max_seqlen,
                 f"seqlen_offset ({inference_params.seqlen_offset}) + seqlen ({x.shape[1]}) exceeds "
                 f"inference_params.max_seqlen ({inference_params.max_seqlen})")

    def _project_cross(self, x, x_kv, mixer_subset):
        q = self.Wq(x if mixer_subset is None else x[:, mixer_subset])
        kv = self.Wkv(x if x_kv is None else x_kv)
        return q.unflatten(-1, (self.num_heads, self.head_dim)), kv.unflatten(-1, (2, self.num_heads_kv, self.head_dim))

    def _split(self, qkv):
        """q (..., num_heads, head_dim) and kv (..., 2, num_heads_kv, head_dim): views of qkv."""
        return qkv[..., :self.num_heads, :], qkv[..., self.num_heads:, :].unflatten(-2, (2, self.num_heads_kv))

    def _kernel_rotates(self, inference_params, seqlen, causal):
        """Whether flash_attn_with_kvcache rotates q and the new keys (one fused step, as FA2 does).
        Its kernels take rotary dims that are multiples of 16 and no XPos scale, and place the
        queries at their own positions only with causal attention (else all at the cache length),
        so other cases rotate here first."""
        return (inference_params is not None and not inference_cache.is_prompt(inference_params)
                and self.rotary_emb_dim > 0 and self.rotary_emb_dim % 16 == 0
                and self.rotary_emb.scale is None and (causal or seqlen == 1))

    def _rotate(self, qkv, cu_seqlens, max_seqlen, inference_params):
        """qkv with q and k rotated (in place for dense inputs, as FA2), positions counted from the
        cache's length in generation and from each sequence's start with cu_seqlens."""
        if self.rotary_emb_dim == 0:
            return qkv
        if cu_seqlens is not None:
            return self._rotate_varlen(qkv, cu_seqlens, max_seqlen)
        offset, table_rows = 0, None
        if inference_params is not None:
            lengths = inference_params.lengths_per_sample
            offset = inference_params.seqlen_offset if lengths is None else lengths
            table_rows = inference_params.max_seqlen
        return self.rotary_emb(qkv, seqlen_offset=offset, max_seqlen=table_rows, num_heads_q=self.num_heads)

    def _rotate_varlen(self, qkv, cu_seqlens, max_seqlen):
        """Packed qkv (total, heads, head_dim): apply_rotary_emb on q and k with cu_seqlens."""
        rotary = self.rotary_emb
        rotary._update_cos_sin_cache(max_seqlen, device=qkv.device, dtype=qkv.dtype)
        cos_k = rotary._cos_cached if rotary.scale is None else rotary._cos_k_cached
        sin_k = rotary._sin_cached if rotary.scale is None else rotary._sin_k_cached
        h, hk = self.num_heads, self.num_heads_kv
        rotate = dict(interleaved=rotary.interleaved, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen)
        q = apply_rotary_emb(qkv[:, :h], rotary._cos_cached, rotary._sin_cached, **rotate)
        k = apply_rotary_emb(qkv[:, h:h + hk], cos_k, sin_k, **rotate)
        return torch.cat((q, k, qkv[:, h + hk:]), dim=1)

    def _attend(self, q, kv, key_padding_mask, varlen, options):
        """Attention without a cache: varlen (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)."""
        cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k = varlen
        if cu_seqlens_q is not None:
            def attend(q, kv):
                return varlen_attention(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, options)
        elif key_padding_mask is not None:
            def attend(q, kv):
                return padded_attention(q, kv, key_padding_mask, options, mask_covers_queries=not self.cross_attn)
        else:
            def attend(q, kv):
                return dense_attention(q, kv, options)
        if self.checkpointing:
            return torch.utils.checkpoint.checkpoint(attend, q, kv, use_reentrant=False)
        return attend(q, kv)

    def _attend_with_cache(self, q, kv, inference_params, options):
        """Generation: the prompt is written to the cache and attended densely; later steps append
        and attend in one flash_attn_with_kvcache call (inference_cache.py)."""
        cache = inference_cache.layer_cache(inference_params, self.layer_idx, kv)
        rows = inference_cache.batch_rows(cache, inference_params, q.shape[0])
        inference_cache.check_room(cache, inference_params, kv.shape[1])
        if inference_cache.is_prompt(inference_params):
            inference_cache.write_prompt(rows, kv)
            return dense_attention(q, kv, options)
        rotary = None
        if self._kernel_rotates(inference_params, q.shape[1], options.causal):
            self.rotary_emb._update_cos_sin_cache(cache.shape[1], device=q.device, dtype=q.dtype)
            rotary = (self.rotary_emb._cos_cached, self.rotary_emb._sin_cached, self.rotary_emb.interleaved)
        return inference_cache.append_and_attend(q, kv, rows, inference_params, options, rotary)
