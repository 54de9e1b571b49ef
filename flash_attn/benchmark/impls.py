"""The attention implementations compared: ours (and ours on the Triton backend), SDPA's backends,
naive PyTorch, FlexAttention, FlashAttention 4 where it is installed.

Every training forward takes q, k, v as (batch, seqlen, nheads, headdim) and returns the output in
that layout. SDPA-based ones are handed transposed views (batch, nheads, seqlen, headdim), not copies,
and their output is transposed back (a view), so every implementation reads the same memory and the
backward's dout needs no copy. Every decode forward takes q (batch, 1, nheads, headdim) and the cache
k, v (batch, context, nheads_k, headdim) (ours through flash_attn_with_kvcache also cache_seqlens, and
a block_table for a paged cache). Every padded forward takes q, k, v (batch, seqlen, nheads,
headdim), a key padding mask (batch, seqlen), True for kept tokens, and a dropout probability.
"""

import contextlib
import functools
import importlib
import os
import sys
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

import flash_attn
from flash_attn import backend, bert_padding, ops

LABELS = {
    "ours": "ours",
    "ours-kvcache": "ours (kvcache)",
    "ours-paged16": "ours (paged 16)",
    "ours-paged256": "ours (paged 256)",
    "ours-triton": "ours (triton)",
    "flash": "sdpa-flash",
    "sdpa": "sdpa (auto backend)",
    "cudnn": "sdpa-cudnn",
    "efficient": "sdpa-efficient",
    "math": "sdpa-math",
    "naive": "naive",
    "flex": "flex",
    "fa4": "fa4",
}
TRAINING_IMPLS = ("ours", "ours-triton", "flash", "cudnn", "efficient", "math", "naive", "flex", "fa4")
# flex compiles per shape, ours-triton its kernels per (head dim, mask) on first use, fa4 (CuTe DSL) its
# kernels per configuration on first use: all three opt-in
DEFAULT_TRAINING_IMPLS = ("ours", "flash", "cudnn", "efficient", "math", "naive")
# The switch the public functions read per call (flash_attn/backend.py): every attention call to Triton.
TRITON_SWITCH = (("FLASH_ATTENTION_TRITON_AMD_ENABLE", "TRUE"),)
FLEX_RECOMPILE_LIMIT = 256  # above the full set's 72 shapes x 2 masks


def label(name):
    return LABELS.get(name, name)


@dataclass(frozen=True)
class Impl:
    """forward(q, k, v, causal) -> out. backend: the SDPBackend pinned with sdpa_kernel, or None.
    materializes: holds (batch, nheads, seqlen_q, seqlen_k) scores, so its memory is estimated before
    it runs; upcasts: those scores are float32 (SDPA's MATH backend upcasts half inputs);
    environment: (variable, value) pairs set while it is timed (ours-triton's switch)."""

    name: str
    forward: Callable
    backend: object = None
    materializes: bool = False
    upcasts: bool = False
    environment: tuple = ()

    def context(self):
        """The SDPA backend selection or the environment, entered around the timing loop (not per call)
        so its cost stays out of the numbers; backward kernels are chosen by the forward, inside the
        same context."""
        if self.environment:
            return environment(self.environment)
        if self.backend is None:
            return contextlib.nullcontext()
        from torch.nn.attention import sdpa_kernel

        return sdpa_kernel([self.backend])

    def score_element_bytes(self, dtype):
        return 4 if self.upcasts else dtype.itemsize


@contextlib.contextmanager
def environment(pairs):
    """The variables of `pairs` set, and restored (or removed) on exit (also for experiment scripts
    that time a kernel switch read per call)."""
    previous = {name: os.environ.get(name) for name, _ in pairs}
    os.environ.update(dict(pairs))
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _check_ours_ready(q):
    if q.is_cuda and not ops.has_cuda_kernels():
        raise RuntimeError(ops.cuda_kernels_unavailable_reason())


def _check_triton_serves(q):
    """The Triton backend is installed and takes this call (under TRITON_SWITCH; CPU tensors only
    under TRITON_INTERPRET=1), so that the column never times another path under its name."""
    if backend.triton_ops is None:
        raise RuntimeError("triton is not installed: the Triton backend is unavailable")
    if not backend.triton_ops.uses_triton(q):
        raise RuntimeError(f"the Triton backend does not take {q.device.type} tensors here "
                           "(CPU tensors need TRITON_INTERPRET=1)")


def _public_function(name):
    """flash_attn.<name>, or an error that says this version lacks it (the cell shows it)."""
    function = getattr(flash_attn, name, None)
    if function is None:
        raise RuntimeError(f"flash_attn.{name} does not exist in this version")
    return function


def ours_attention(q, k, v, **options):
    """flash_attn_func with any of its keyword options (window_size, dropout_p, deterministic, ...)."""
    _check_ours_ready(q)
    return flash_attn.flash_attn_func(q, k, v, **options)


def ours_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, **options):
    """flash_attn_varlen_func on packed q (total_q, nheads, headdim), k, v (total_k, nheads_k, headdim)."""
    _check_ours_ready(q)
    return _public_function("flash_attn_varlen_func")(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                                      max_seqlen_k, **options)


def ours_forward(q, k, v, causal):
    return ours_attention(q, k, v, causal=causal)


def ours_triton_forward(q, k, v, causal):
    """flash_attn_func on the Triton backend: its Impl sets TRITON_SWITCH around the timing loop, and
    the backward follows the forward's op (flash_attn::triton_bwd)."""
    _check_triton_serves(q)
    return flash_attn.flash_attn_func(q, k, v, causal=causal)


def sdpa_forward(q, k, v, causal, enable_gqa=False, dropout_p=0.0):
    """SDPA on transposed views. Its is_causal is top-left aligned: equal to ours on square problems,
    the only causal ones benchmarked."""
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal, enable_gqa=enable_gqa,
        dropout_p=dropout_p,
    )
    return out.transpose(1, 2)


def naive_forward(q, k, v, causal):
    """matmul -> mask -> softmax -> matmul in the input dtype, as a model written in plain PyTorch does.
    The mask is built inside the call (bottom-right aligned, like ours): part of naive's cost."""
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    scores = torch.matmul(qt, kt.transpose(-2, -1)) * (q.shape[-1] ** -0.5)
    if causal:
        seqlen_q, seqlen_k = q.shape[1], k.shape[1]
        rows = torch.arange(seqlen_q, device=q.device).unsqueeze(1)
        cols = torch.arange(seqlen_k, device=q.device).unsqueeze(0)
        scores = scores.masked_fill(cols > rows + (seqlen_k - seqlen_q), float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs, vt).transpose(1, 2)


@functools.cache
def _compiled_flex():
    """flex_attention compiled with static shapes. Every benchmarked shape is one more recompile, past
    dynamo's default limit of 8, after which it would silently run flex's slow eager path: raise it."""
    from torch.nn.attention.flex_attention import flex_attention

    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):  # the name changed in torch 2.6
        if hasattr(config, name):
            setattr(config, name, max(getattr(config, name), FLEX_RECOMPILE_LIMIT))
    return torch.compile(flex_attention, dynamic=False)


@functools.lru_cache(maxsize=4)
def _causal_block_mask(seqlen_q, seqlen_k, device):
    from torch.nn.attention.flex_attention import create_block_mask

    offset = seqlen_k - seqlen_q
    return create_block_mask(lambda b, h, qi, ki: ki <= qi + offset, None, None, seqlen_q, seqlen_k, device=device)


def flex_forward(q, k, v, causal):
    """FlexAttention compiled for each shape (the first call compiles, inside the timer's warm-up)."""
    mask = _causal_block_mask(q.shape[1], k.shape[1], str(q.device)) if causal else None
    out = _compiled_flex()(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), block_mask=mask)
    return out.transpose(1, 2)


@functools.cache
def _fa4_interface():
    """FlashAttention 4's `flash_attn.cute` (the flash-attn-4 package). Its wheel installs the folder
    flash_attn/cute with no flash_attn/__init__.py, a namespace that this package, also called
    flash_attn, hides: the first flash_attn folder on sys.path holding cute/interface.py joins this
    package's search path, so that `flash_attn.cute` and FA4's own absolute imports resolve to it."""
    for entry in sys.path:
        folder = os.path.join(entry or os.curdir, "flash_attn")
        if os.path.isfile(os.path.join(folder, "cute", "interface.py")):
            if folder not in flash_attn.__path__:
                flash_attn.__path__.append(folder)
            return importlib.import_module("flash_attn.cute")
    raise RuntimeError("FlashAttention 4 is not installed (no flash_attn/cute on sys.path; "
                       "benchmarks/experiments/fa4_peer.sh packs it for the GPU machine)")


def fa4_forward(q, k, v, causal):
    """FlashAttention 4's flash_attn_func (it returns the output and the lse; its backward runs through
    its own autograd.Function)."""
    out, _ = _fa4_interface().flash_attn_func(q, k, v, causal=causal)
    return out


def _sdpa_backend(name):
    from torch.nn.attention import SDPBackend

    return {
        "flash": SDPBackend.FLASH_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "math": SDPBackend.MATH,
    }[name]


def training_impl(name):
    """The Impl called `name` (one of TRAINING_IMPLS)."""
    if name == "ours":
        return Impl(name, ours_forward)
    if name == "ours-triton":
        return Impl(name, ours_triton_forward, environment=TRITON_SWITCH)
    if name == "naive":
        return Impl(name, naive_forward, materializes=True)
    if name == "flex":
        return Impl(name, flex_forward)
    if name == "fa4":
        return Impl(name, fa4_forward)
    if name == "math":
        return Impl(name, sdpa_forward, backend=_sdpa_backend(name), materializes=True, upcasts=True)
    if name in ("flash", "cudnn", "efficient"):
        return Impl(name, sdpa_forward, backend=_sdpa_backend(name))
    raise ValueError(f"unknown implementation {name!r}; known: {', '.join(TRAINING_IMPLS)}")


def kvcache_function():
    """flash_attn.flash_attn_with_kvcache when this version has it, else None."""
    return getattr(flash_attn, "flash_attn_with_kvcache", None)


def ours_kvcache_decode(q, k_cache, v_cache, cache_seqlens, block_table=None):
    """flash_attn_with_kvcache over the first cache_seqlens[b] keys of each sequence ((batch,) int32),
    on a contiguous cache or, with block_table, a paged one; no new tokens."""
    _check_ours_ready(q)
    return kvcache_function()(q, k_cache, v_cache, cache_seqlens=cache_seqlens, block_table=block_table)


def ours_kvcache_append_rotary(q, k_cache, v_cache, k_new, v_new, rotary_cos, rotary_sin, cache_seqlens):
    """A decode step that also appends new tokens: k_new, v_new (batch, seqlen_new, nheads_k, headdim)
    written into the cache at cache_seqlens[b], interleaved rotary applied to q and k_new, causal."""
    _check_ours_ready(q)
    return kvcache_function()(q, k_cache, v_cache, k=k_new, v=v_new, rotary_cos=rotary_cos, rotary_sin=rotary_sin,
                              cache_seqlens=cache_seqlens, causal=True, rotary_interleaved=True)


def ours_decode(q, k_cache, v_cache):
    """Our prefill kernel on one query token: GQA handled natively, no cache layout of its own."""
    return ours_forward(q, k_cache, v_cache, causal=False)


def sdpa_decode_gqa(q, k_cache, v_cache):
    return sdpa_forward(q, k_cache, v_cache, causal=False, enable_gqa=True)


def sdpa_decode_repeated(q, k_repeated, v_repeated):
    """For a backend without enable_gqa: K and V already repeated to q's head count (outside the timing)."""
    return sdpa_forward(q, k_repeated, v_repeated, causal=False)


def repeat_kv(x, nheads):
    """(b, s, nheads_k, d) -> (b, s, nheads, d), each KV head copied for the query heads it serves."""
    return x.repeat_interleave(nheads // x.shape[2], dim=2)


def naive_decode(q, k_cache, v_cache):
    """Grouped-query attention in plain PyTorch: the query heads of one KV head become the rows of one
    matmul, (b, hk, h/hk, d) x (b, hk, d, ctx), with the cache read through permuted views (torch.matmul
    may copy them: part of naive's cost), and no repeated K or V."""
    batch, _, nheads, headdim = q.shape
    nheads_k = k_cache.shape[2]
    qg = q.reshape(batch, nheads_k, nheads // nheads_k, headdim)
    scores = torch.matmul(qg, k_cache.permute(0, 2, 3, 1)) * (headdim**-0.5)
    probs = torch.softmax(scores, dim=-1)
    out = torch.matmul(probs, v_cache.transpose(1, 2))
    return out.reshape(batch, 1, nheads, headdim)


def naive_padded(q, k, v, key_mask, dropout_p):
    """The FlashAttention paper's baseline with a padding mask: scores, padded keys set to -inf,
    softmax, torch dropout, matmul, in the input dtype. Padded queries are computed too: plain
    PyTorch has no way to skip them."""
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    scores = torch.matmul(qt, kt.transpose(-2, -1)) * (q.shape[-1] ** -0.5)
    scores = scores.masked_fill(~key_mask[:, None, None, :], float("-inf"))
    probs = F.dropout(torch.softmax(scores, dim=-1), dropout_p, training=True)
    return torch.matmul(probs, vt).transpose(1, 2)


def _sdpa_key_mask(key_mask):
    """(batch, seqlen) -> (batch, 1, 1, seqlen): SDPA broadcasts it over heads and queries."""
    return key_mask[:, None, None, :]


def sdpa_padded(q, k, v, key_mask, dropout_p):
    """SDPA with the padding mask as attn_mask, on whichever backend SDPA picks (its FlashAttention
    backend takes no mask)."""
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         attn_mask=_sdpa_key_mask(key_mask), dropout_p=dropout_p)
    return out.transpose(1, 2)


def sdpa_padded_backend(q, k, v, key_mask, dropout_p):
    """The backend SDPA picks for sdpa_padded, by name, from torch's private chooser (its only way to
    say which kernel a call will run); 'unknown' where this torch lacks it."""
    try:
        from torch.nn.attention import SDPBackend

        choice = torch._fused_sdp_choice(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         _sdpa_key_mask(key_mask), dropout_p, False)
        return SDPBackend(choice).name
    except Exception:  # noqa: BLE001 - a private function: any failure only loses the label
        return "unknown"


def ours_padded(q, k, v, key_mask, dropout_p):
    """What a model with a padding mask does around flash_attn: unpad, varlen attention, pad back.
    The mask is read once and k, v gathered with its indices, as transformers' flash-attention path
    does; padded queries are dropped too (their output rows are zeros)."""
    batch, seqlen = key_mask.shape
    q_unpad, indices, cu_seqlens, max_seqlen, _ = bert_padding.unpad_input(q, key_mask)
    k_unpad, v_unpad = (bert_padding.index_first_axis(t.flatten(0, 1), indices) for t in (k, v))
    out = ours_varlen(q_unpad, k_unpad, v_unpad, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                      dropout_p=dropout_p)
    return bert_padding.pad_input(out, indices, batch, seqlen)


PADDED_IMPLS = ("naive", "sdpa", "ours")


def padded_impl(name):
    """The Impl called `name` (one of PADDED_IMPLS) for a padded batch with dropout."""
    forwards = {"naive": naive_padded, "sdpa": sdpa_padded, "ours": ours_padded}
    return Impl(name, forwards[name], materializes=name == "naive")
