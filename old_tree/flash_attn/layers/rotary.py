"""Rotary position embeddings: FlashAttention 2's `flash_attn.layers.rotary` API in pure PyTorch.

Same names, arguments and defaults as FlashAttention 2's module, with no Triton or CUDA extension:
it runs on CPU and CUDA tensors alike. The first rotary_dim = 2 * cos.shape[1] features of each head
are rotated, the rest pass through. Non-interleaved (GPT-NeoX) rotates the pairs
(x[i], x[i + rotary_dim / 2]); interleaved (GPT-J) rotates (x[2i], x[2i + 1]). Each pair is rotated
in fp32 (fp64 for fp64 inputs) as two rounded products and one add or subtract,
out1 = x1 * cos - x2 * sin and out2 = x1 * sin + x2 * cos, then cast back to x's dtype.
Token t of sequence b uses row t + seqlen_offsets[b] of cos / sin; a row past the table's end leaves
the token unrotated, as FlashAttention 2's kernel does. The backward rotates the gradient back
(sin negated) and gives cos / sin no gradient.
"""

import numbers
from functools import partial
from typing import Optional, Tuple, Union

import torch

__all__ = [
    "RotaryEmbedding",
    "apply_rotary_at_positions",
    "apply_rotary_emb",
    "apply_rotary_emb_func",
    "apply_rotary_emb_kv_",
    "apply_rotary_emb_qkv_",
    "apply_rotary_emb_torch",
    "rotary_rows",
    "rotate_half",
]


def _require(condition, message):
    if not condition:
        raise ValueError(message)


def _shape(tensor):
    return tuple(tensor.shape)


def rotate_half(x, interleaved=False):
    """(-x2, x1) from the halves (x1, x2) of x's last dim, or from its (even, odd) pairs if interleaved."""
    if not interleaved:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def _repeat_over_pairs(table, interleaved):
    """(..., rotary_dim / 2) -> (..., 1, rotary_dim): each entry for both features of its pair."""
    table = table.repeat_interleave(2, dim=-1) if interleaved else torch.cat((table, table), dim=-1)
    return table.unsqueeze(-2)


def apply_rotary_emb_torch(x, cos, sin, interleaved=False):
    """FlashAttention 2's plain reference, in x's dtype: x (batch, seqlen, nheads, headdim);
    cos, sin (seqlen, rotary_dim / 2) or (batch, seqlen, rotary_dim / 2)."""
    rotary_dim = 2 * cos.shape[-1]
    _require(
        rotary_dim <= x.shape[-1],
        f"rotary_dim = 2 * cos.shape[-1] = {rotary_dim} must be <= headdim = {x.shape[-1]}",
    )
    cos, sin = _repeat_over_pairs(cos, interleaved), _repeat_over_pairs(sin, interleaved)
    x_rot = x[..., :rotary_dim]
    rotated = x_rot * cos + rotate_half(x_rot, interleaved) * sin
    return torch.cat((rotated, x[..., rotary_dim:]), dim=-1)


def rotary_rows(cos, sin, positions):
    """Rows `positions` of cos and sin, shaped (*positions.shape, 1, rotary_dim / 2) to broadcast over
    heads; a position outside [0, seqlen_rotary) gets cos 1 and sin 0 (no rotation)."""
    positions = positions.to(device=cos.device, dtype=torch.int64)
    inside = (positions >= 0) & (positions < cos.shape[0])
    index = torch.where(inside, positions, 0)
    inside = inside.unsqueeze(-1)
    cos_rows = torch.where(inside, cos[index], 1)
    sin_rows = torch.where(inside, sin[index], 0)
    return cos_rows.unsqueeze(-2), sin_rows.unsqueeze(-2)


def _compute_dtype(x):
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _rotated_features(x, cos, sin, positions, interleaved):
    """The first rotary_dim features of x rotated, in x's dtype (products and sums in fp32)."""
    compute_dtype = _compute_dtype(x)
    cos_rows, sin_rows = (rows.to(compute_dtype) for rows in rotary_rows(cos, sin, positions))
    x_rot = x[..., : 2 * cos.shape[-1]].to(compute_dtype)
    x1, x2 = (x_rot[..., 0::2], x_rot[..., 1::2]) if interleaved else x_rot.chunk(2, dim=-1)
    out1 = x1 * cos_rows - x2 * sin_rows
    out2 = x1 * sin_rows + x2 * cos_rows
    if interleaved:
        return torch.stack((out1, out2), dim=-1).flatten(-2).to(x.dtype)
    return torch.cat((out1, out2), dim=-1).to(x.dtype)


def _check_tables(headdim, cos, sin, cos_name="cos", sin_name="sin"):
    _require(
        cos.dim() == 2 and cos.shape[1] > 0,
        f"{cos_name} must be (seqlen_rotary, rotary_dim / 2), got shape {_shape(cos)}",
    )
    _require(
        sin.shape == cos.shape, f"{sin_name} must have {cos_name}'s shape {_shape(cos)}, got {_shape(sin)}"
    )
    rotary_dim = 2 * cos.shape[1]
    _require(
        rotary_dim <= headdim,
        f"rotary_dim = 2 * {cos_name}.shape[1] = {rotary_dim} must be <= headdim = {headdim}",
    )


def apply_rotary_at_positions(x, cos, sin, positions, interleaved=False):
    """x (..., nheads, headdim) with the first rotary_dim features of each token rotated by row
    positions[...] of cos / sin (seqlen_rotary, rotary_dim / 2); positions is an integer tensor
    broadcastable to x.shape[:-2]. Out of place, plain autograd ops."""
    _check_tables(x.shape[-1], cos, sin)
    rotated = _rotated_features(x, cos, sin, positions, interleaved)
    return torch.cat((rotated, x[..., rotated.shape[-1] :]), dim=-1)


def _check_offsets(seqlen_offsets, batch, seqlen, seqlen_rotary):
    """FlashAttention 2's checks; a tensor of offsets is not read, to keep the call free of GPU syncs."""
    if isinstance(seqlen_offsets, torch.Tensor):
        _require(
            seqlen_offsets.shape == (batch,),
            f"seqlen_offsets must be an int or a (batch,) = ({batch},) tensor, "
            f"got shape {_shape(seqlen_offsets)}",
        )
        _require(
            not seqlen_offsets.is_floating_point() and not seqlen_offsets.is_complex(),
            f"seqlen_offsets must be an integer tensor, got {seqlen_offsets.dtype}",
        )
        _require(seqlen <= seqlen_rotary, f"seqlen ({seqlen}) exceeds cos/sin's {seqlen_rotary} rows")
        return
    _require(
        isinstance(seqlen_offsets, numbers.Integral) and seqlen_offsets >= 0,
        f"seqlen_offsets must be a non-negative int or a (batch,) tensor, got {seqlen_offsets!r}",
    )
    _require(
        seqlen_offsets + seqlen <= seqlen_rotary,
        f"seqlen_offsets ({seqlen_offsets}) + seqlen ({seqlen}) exceeds cos/sin's {seqlen_rotary} rows",
    )


def _offset_column(seqlen_offsets, device):
    if isinstance(seqlen_offsets, torch.Tensor):
        return seqlen_offsets.to(device=device, dtype=torch.int64)
    return int(seqlen_offsets)


def _padded_positions(seqlen, seqlen_offsets, device):
    """(seqlen,) for an int offset, (batch, seqlen) for a tensor of offsets."""
    tokens = torch.arange(seqlen, device=device)
    offsets = _offset_column(seqlen_offsets, device)
    return tokens + (offsets[:, None] if isinstance(offsets, torch.Tensor) else offsets)


def _varlen_positions(total_seqlen, seqlen_offsets, cu_seqlens):
    """(total_seqlen,): each packed token's index in its sequence plus the sequence's offset;
    -1 (not rotated) for tokens past cu_seqlens[-1]."""
    cu_seqlens = cu_seqlens.to(torch.int64)
    batch = cu_seqlens.numel() - 1
    tokens = torch.arange(total_seqlen, device=cu_seqlens.device)
    sequence = torch.searchsorted(cu_seqlens[1:], tokens, right=True)
    in_batch = sequence < batch
    sequence = sequence.clamp(max=batch - 1)
    offsets = _offset_column(seqlen_offsets, cu_seqlens.device)
    if isinstance(offsets, torch.Tensor):
        offsets = offsets[sequence]
    return torch.where(in_batch, tokens - cu_seqlens[sequence] + offsets, -1)


def _whole(tensor):
    return tensor, None


def _key_of_kv(kv):
    return None, kv[:, :, 0]


def _query_and_key_of_qkv(qkv, num_heads_q):
    if qkv.dim() == 5:
        return qkv[:, :, 0], qkv[:, :, 1]
    num_heads_k = (qkv.shape[2] - num_heads_q) // 2
    return qkv[:, :, :num_heads_q], qkv[:, :, num_heads_q : num_heads_q + num_heads_k]


def _rotate_parts_(tensor, parts, positions, interleaved, query_tables, key_tables):
    """Rotate in place the query part of `tensor` with query_tables and its key part with key_tables."""
    for part, (cos, sin) in zip(parts(tensor), (query_tables, key_tables)):
        if part is not None:
            part[..., : 2 * cos.shape[-1]] = _rotated_features(part, cos, sin, positions, interleaved)


def _is_grad_leaf_or_view_of_one(tensor):
    root = tensor if tensor._base is None else tensor._base
    return root.is_leaf and root.requires_grad


class _ApplyRotary(torch.autograd.Function):
    """Rotates the query / key parts of a tensor, in place or on a copy; the backward rotates the
    gradient back. In place on a leaf that requires grad works as in FlashAttention 2: the output
    then carries the rotation's graph (marking the leaf dirty would be refused)."""

    @staticmethod
    def forward(ctx, tensor, parts, positions, interleaved, inplace, cos, sin, cos_k, sin_k):
        out = tensor if inplace else tensor.clone()
        _rotate_parts_(out, parts, positions, interleaved, (cos, sin), (cos_k, sin_k))
        if inplace and not _is_grad_leaf_or_view_of_one(tensor):
            ctx.mark_dirty(tensor)
        ctx.save_for_backward(positions, cos, sin, cos_k, sin_k)
        ctx.parts, ctx.interleaved = parts, interleaved
        return out

    @staticmethod
    def backward(ctx, grad_out):
        positions, cos, sin, cos_k, sin_k = ctx.saved_tensors
        grad_in = grad_out.clone()
        _rotate_parts_(grad_in, ctx.parts, positions, ctx.interleaved, (cos, -sin), (cos_k, -sin_k))
        return grad_in, None, None, None, None, None, None, None, None


def apply_rotary_emb(
    x,
    cos,
    sin,
    interleaved=False,
    inplace=False,
    seqlen_offsets: Union[int, torch.Tensor] = 0,
    cu_seqlens: Optional[torch.Tensor] = None,
    max_seqlen: Optional[int] = None,
):
    """Rotate the first rotary_dim = 2 * cos.shape[1] features of x (batch, seqlen, nheads, headdim),
    or of x (total_seqlen, nheads, headdim) packed by cu_seqlens (batch + 1,) with max_seqlen given.
    cos, sin: (seqlen_rotary, rotary_dim / 2). seqlen_offsets: int or (batch,) tensor shifting each
    sequence's rows of cos / sin. inplace: write into x and return x. Returns a tensor like x."""
    _check_tables(x.shape[-1], cos, sin)
    if cu_seqlens is None:
        _require(x.dim() == 4, f"x must be (batch, seqlen, nheads, headdim), got shape {_shape(x)}")
        batch, seqlen = x.shape[:2]
        positions = _padded_positions(seqlen, seqlen_offsets, x.device)
    else:
        _require(x.dim() == 3, f"x must be (total_seqlen, nheads, headdim) with cu_seqlens: {_shape(x)}")
        _require(
            cu_seqlens.dim() == 1 and cu_seqlens.numel() >= 2,
            f"cu_seqlens must be (batch + 1,), got shape {_shape(cu_seqlens)}",
        )
        _require(max_seqlen is not None, "max_seqlen must be given with cu_seqlens")
        batch, seqlen = cu_seqlens.numel() - 1, max_seqlen
        positions = _varlen_positions(x.shape[0], seqlen_offsets, cu_seqlens.to(x.device))
    _check_offsets(seqlen_offsets, batch, seqlen, cos.shape[0])
    return _ApplyRotary.apply(x, _whole, positions, interleaved, inplace, cos, sin, cos, sin)


apply_rotary_emb_func = apply_rotary_emb


def _check_qkv(qkv, num_heads_q):
    if qkv.dim() == 5:
        _require(qkv.shape[2] == 3, f"qkv must be (batch, seqlen, 3, nheads, headdim), got {_shape(qkv)}")
        return
    _require(
        qkv.dim() == 4 and num_heads_q is not None,
        "qkv must be (batch, seqlen, 3, nheads, headdim), or (batch, seqlen, "
        "num_heads_q + 2 * num_heads_k, headdim) with num_heads_q given; "
        f"got shape {_shape(qkv)} and num_heads_q={num_heads_q!r}",
    )
    num_heads_kv = qkv.shape[2] - num_heads_q
    _require(
        num_heads_q > 0 and num_heads_kv > 0 and num_heads_kv % 2 == 0,
        f"num_heads_q ({num_heads_q}) does not split qkv's {qkv.shape[2]} heads "
        "as num_heads_q + 2 * num_heads_k",
    )


def apply_rotary_emb_qkv_(
    qkv,
    cos,
    sin,
    cos_k=None,
    sin_k=None,
    interleaved=False,
    seqlen_offsets: Union[int, torch.Tensor] = 0,
    num_heads_q: Optional[int] = None,
):
    """Rotate q and k of qkv in place and return qkv: qkv (batch, seqlen, 3, nheads, headdim), or
    (batch, seqlen, num_heads_q + 2 * num_heads_k, headdim) with num_heads_q given. cos, sin rotate q;
    cos_k, sin_k (default cos, sin) rotate k; all (seqlen_rotary, rotary_dim / 2)."""
    _check_qkv(qkv, num_heads_q)
    cos_k = cos if cos_k is None else cos_k
    sin_k = sin if sin_k is None else sin_k
    _check_tables(qkv.shape[-1], cos, sin)
    _check_tables(qkv.shape[-1], cos_k, sin_k, "cos_k", "sin_k")
    batch, seqlen = qkv.shape[:2]
    _check_offsets(seqlen_offsets, batch, seqlen, min(cos.shape[0], cos_k.shape[0]))
    positions = _padded_positions(seqlen, seqlen_offsets, qkv.device)
    parts = partial(_query_and_key_of_qkv, num_heads_q=num_heads_q)
    return _ApplyRotary.apply(qkv, parts, positions, interleaved, True, cos, sin, cos_k, sin_k)


def apply_rotary_emb_kv_(
    kv,
    cos,
    sin,
    interleaved=False,
    seqlen_offsets: Union[int, torch.Tensor] = 0,
):
    """Rotate k of kv (batch, seqlen, 2, nheads_k, headdim) in place and return kv;
    cos, sin: (seqlen_rotary, rotary_dim / 2)."""
    _require(
        kv.dim() == 5 and kv.shape[2] == 2,
        f"kv must be (batch, seqlen, 2, nheads_k, headdim), got shape {_shape(kv)}",
    )
    _check_tables(kv.shape[-1], cos, sin)
    batch, seqlen = kv.shape[:2]
    _check_offsets(seqlen_offsets, batch, seqlen, cos.shape[0])
    positions = _padded_positions(seqlen, seqlen_offsets, kv.device)
    return _ApplyRotary.apply(kv, _key_of_kv, positions, interleaved, True, cos, sin, cos, sin)


class RotaryEmbedding(torch.nn.Module):
    """Rotary position embeddings (RoFormer, Su et al.), applied in place to q and k.

    With scale_base, XPos (Sun et al.): q's cos / sin are multiplied by a per-position scale and k's
    divided by it. interleaved: rotate (even, odd) pairs (GPT-J) instead of halves (GPT-NeoX).
    pos_idx_in_fp32: build the position indices in fp32 (else in inv_freq's dtype, as models trained
    in pure bf16 before FlashAttention 2 added the option did).
    """

    def __init__(
        self,
        dim: int,
        base=10000.0,
        interleaved=False,
        scale_base=None,
        pos_idx_in_fp32=True,
        device=None,
    ):
        super().__init__()
        _require(dim > 0 and dim % 2 == 0, f"dim (the rotary dim) must be a positive even int, got {dim!r}")
        self.dim = dim
        self.base = float(base)
        self.pos_idx_in_fp32 = pos_idx_in_fp32
        self.interleaved = interleaved
        self.scale_base = scale_base
        self.register_buffer("inv_freq", self._compute_inv_freq(device), persistent=False)
        scale = self._compute_scale(device) if scale_base is not None else None
        self.register_buffer("scale", scale, persistent=False)
        self._seq_len_cached = 0
        self._cos_cached = None
        self._sin_cached = None
        self._cos_k_cached = None
        self._sin_k_cached = None

    def _pair_index(self, device):
        return torch.arange(0, self.dim, 2, device=device, dtype=torch.float32)

    def _compute_inv_freq(self, device=None):
        return 1.0 / (self.base ** (self._pair_index(device) / self.dim))

    def _compute_scale(self, device=None):
        return (self._pair_index(device) + 0.4 * self.dim) / (1.4 * self.dim)

    def _cache_is_stale(self, seqlen, device, dtype):
        cos = self._cos_cached
        return (
            cos is None
            or seqlen > self._seq_len_cached
            or cos.device != device
            or cos.dtype != dtype
            or (self.training and cos.is_inference())
        )

    def _angles(self, seqlen, device):
        """(seqlen, dim / 2) position * inv_freq, in fp32 unless pos_idx_in_fp32 is False."""
        inv_freq = self.inv_freq
        if self.pos_idx_in_fp32 and inv_freq.dtype != torch.float32:
            inv_freq = self._compute_inv_freq(device)
        positions = torch.arange(seqlen, device=device, dtype=inv_freq.dtype)
        return torch.outer(positions, inv_freq.to(device))

    def _xpos_scale(self, seqlen, device):
        """(seqlen, dim / 2) scale ** ((t - seqlen // 2) / scale_base), in fp32."""
        scale = self.scale if self.scale.dtype == torch.float32 else self._compute_scale(device)
        power = (torch.arange(seqlen, device=device, dtype=torch.float32) - seqlen // 2) / self.scale_base
        return scale.to(device) ** power[:, None]

    def _update_cos_sin_cache(self, seqlen, device=None, dtype=None):
        if not self._cache_is_stale(seqlen, device, dtype):
            return
        self._seq_len_cached = seqlen
        angles = self._angles(seqlen, device)
        cos, sin = torch.cos(angles), torch.sin(angles)
        if self.scale is None:
            self._cos_cached, self._sin_cached = cos.to(dtype), sin.to(dtype)
            return
        scale = self._xpos_scale(seqlen, device)
        self._cos_cached, self._sin_cached = (cos * scale).to(dtype), (sin * scale).to(dtype)
        self._cos_k_cached, self._sin_k_cached = (cos / scale).to(dtype), (sin / scale).to(dtype)

    def _cache_length(self, seqlen, seqlen_offset, max_seqlen):
        if max_seqlen is not None:
            return max_seqlen
        if isinstance(seqlen_offset, torch.Tensor):
            return max(seqlen, self._seq_len_cached)
        return seqlen + seqlen_offset

    def forward(
        self,
        qkv: torch.Tensor,
        kv: Optional[torch.Tensor] = None,
        seqlen_offset: Union[int, torch.Tensor] = 0,
        max_seqlen: Optional[int] = None,
        num_heads_q: Optional[int] = None,
    ) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
        """Rotate in place. kv None: qkv is (batch, seqlen, 3, nheads, headdim), or
        (batch, seqlen, num_heads_q + 2 * num_heads_k, headdim) with num_heads_q; returns qkv.
        Else qkv is q (batch, seqlen, nheads, headdim) and kv (batch, seqlen, 2, nheads_k, headdim);
        returns (q, kv). seqlen_offset: int or (batch,) tensor; with a tensor, pass max_seqlen to size
        the cos / sin cache."""
        cache_length = self._cache_length(qkv.shape[1], seqlen_offset, max_seqlen)
        self._update_cos_sin_cache(cache_length, device=qkv.device, dtype=qkv.dtype)
        cos_k = self._cos_cached if self.scale is None else self._cos_k_cached
        sin_k = self._sin_cached if self.scale is None else self._sin_k_cached
        if kv is None:
            return apply_rotary_emb_qkv_(
                qkv,
                self._cos_cached,
                self._sin_cached,
                cos_k,
                sin_k,
                interleaved=self.interleaved,
                seqlen_offsets=seqlen_offset,
                num_heads_q=num_heads_q,
            )
        q = apply_rotary_emb_func(
            qkv,
            self._cos_cached,
            self._sin_cached,
            interleaved=self.interleaved,
            inplace=True,
            seqlen_offsets=seqlen_offset,
        )
        kv = apply_rotary_emb_kv_(
            kv, cos_k, sin_k, interleaved=self.interleaved, seqlen_offsets=seqlen_offset
        )
        return q, kv
