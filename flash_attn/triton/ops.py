"""The Triton backend as torch.library ops with flash_attn::fwd / bwd / fwd_kvcache's schemas
(flash_attn/ops.py): flash_attn::triton_fwd, triton_bwd and triton_fwd_kvcache, with the same fake
kernels and autograd formula, so that the public functions reach it through the dispatcher
(flash_attn/backend.py chooses) and torch.compile traces it. flash_attn::triton_fwd_fp8 is the fp8
forward (fp8.py), with the descales in its schema and an autograd formula that raises.

The public functions choose it (`uses_triton`): for every call when FLASH_ATTENTION_TRITON_AMD_ENABLE
is "TRUE" (FlashAttention's switch for its Triton backend), and for float32 CUDA tensors otherwise
(the CUDA kernels take float16 / bfloat16 only). CPU tensors go to it only under Triton's
interpreter (TRITON_INTERPRET=1); otherwise they keep the CPU path.
"""

import os

import torch

from .. import ops as flash_ops
from . import attention, dropout_mask, fp8, kvcache

torch.library.define("flash_attn::triton_fwd", flash_ops.FWD_SCHEMA)
torch.library.define("flash_attn::triton_bwd", flash_ops.BWD_SCHEMA)
torch.library.define("flash_attn::triton_fwd_kvcache", flash_ops.FWD_KVCACHE_SCHEMA)
torch.library.define("flash_attn::triton_fwd_fp8", flash_ops.FWD_FP8_SCHEMA)

if not flash_ops.has_cuda_kernels():  # else the extension registers its own CUDA kernel of the op
    torch.library.impl("flash_attn::dropout_keep_mask", "CUDA")(dropout_mask.keep_mask)


def _window_and_options(window_left, window_right, softcap, alibi_slopes, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                        max_seqlen_k, dropout_p, rng_state):
    return dict(window=(window_left, window_right), softcap=softcap, alibi_slopes=alibi_slopes,
                cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                max_seqlen_k=max_seqlen_k, dropout_p=dropout_p, rng_state=rng_state)


def _rng_state(dropout_p, device):
    """[seed, offset] of a forward's dropout masks: a seed drawn from torch's generator of q's device
    (so torch.manual_seed reproduces a run), offset 0; zeros without dropout, as the CUDA op records."""
    state = torch.zeros(2, dtype=torch.int64, device=device)
    if dropout_p > 0:
        state[0] = torch.randint(0, 2**62, (1,), dtype=torch.int64, device=device)[0]
    return state


@torch.library.impl("flash_attn::triton_fwd", "CompositeExplicitAutograd")
def _triton_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
                window_left, window_right, softcap, alibi_slopes, deterministic):
    rng_state = _rng_state(dropout_p, q.device)
    out, lse = attention.forward(q, k, v, softmax_scale, **_window_and_options(
        window_left, window_right, softcap, alibi_slopes, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
        dropout_p, rng_state))
    return out, lse, rng_state


@torch.library.impl("flash_attn::triton_bwd", "CompositeExplicitAutograd")
def _triton_bwd(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                softmax_scale, window_left, window_right, softcap, alibi_slopes, rng_state, deterministic):
    # deterministic needs nothing here: the backward kernels add no gradient with atomics
    return attention.backward(dout, q, k, v, out, lse, softmax_scale, **_window_and_options(
        window_left, window_right, softcap, alibi_slopes, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
        dropout_p, rng_state))


@torch.library.impl("flash_attn::triton_fwd_kvcache", "CompositeExplicitAutograd")
def _triton_fwd_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                        cache_leftpad, block_table, softmax_scale, window_left, window_right, softcap,
                        rotary_interleaved, alibi_slopes, num_splits):
    return kvcache.forward_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                                   cache_leftpad, block_table, softmax_scale, (window_left, window_right), softcap,
                                   rotary_interleaved, alibi_slopes, num_splits)


@torch.library.impl("flash_attn::triton_fwd_fp8", "CompositeExplicitAutograd")
def _triton_fwd_fp8(q, k, v, q_descale, k_descale, v_descale, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                    softmax_scale, window_left, window_right, softcap, alibi_slopes):
    return fp8.forward_fp8(q, k, v, q_descale, k_descale, v_descale, softmax_scale, (window_left, window_right),
                           softcap, alibi_slopes, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)


torch.library.register_fake("flash_attn::triton_fwd_fp8")(flash_ops.fwd_fp8_fake)
torch.library.register_autograd("flash_attn::triton_fwd_fp8", flash_ops.fp8_backward,
                                setup_context=lambda ctx, inputs, output: None)
torch.library.register_fake("flash_attn::triton_fwd")(flash_ops.fwd_fake)
torch.library.register_fake("flash_attn::triton_fwd_kvcache")(flash_ops.fwd_kvcache_fake)
torch.library.register_fake("flash_attn::triton_bwd")(flash_ops.bwd_fake)
torch.library.register_autograd("flash_attn::triton_fwd", flash_ops.backward_through(torch.ops.flash_attn.triton_bwd),
                                setup_context=flash_ops.fwd_setup_context)


def _below_autograd(op, *inputs):
    """op(*inputs) with the autograd dispatch keys excluded: what the op's registered Autograd kernel
    does itself when no input records gradients (torch._library's forward_no_grad, a redispatch
    below autograd), without that kernel's Python (75 -> 61 us for the op call on a 2-core CPU host,
    launches stubbed; not measured on a GPU host: benchmarks/NOTES.md "Triton backend (#9), session
    29"). The call still goes through the dispatcher, so dispatch modes, profilers and fake tensors
    see the op."""
    with torch._C._AutoDispatchBelowAutograd():
        return op(*inputs)


class _EagerForward(torch.autograd.Function):
    """flash_attn::triton_fwd with its autograd formula (the one registered above), for eager calls
    that record gradients. The op's registered autograd wrapper calls torch._library.utils.fill_defaults
    on every such call, which rebuilds the schema's argument list once per argument: ~50-100 us of
    Python, a large part of a short call's host time (benchmarks/NOTES.md "Triton backend (#9),
    session 25"). Inside forward the op runs below its Autograd kernel (_below_autograd). torch.compile
    traces the op itself."""

    @staticmethod
    def forward(ctx, *inputs):
        output = _below_autograd(torch.ops.flash_attn.triton_fwd.default, *inputs)
        flash_ops.fwd_setup_context(ctx, inputs, output)
        ctx.mark_non_differentiable(output[2])  # rng_state
        return output

    backward = staticmethod(flash_ops.backward_through(torch.ops.flash_attn.triton_bwd))


def forward(*inputs):
    """flash_attn::triton_fwd on fwd's arguments: under torch.compile the op; eager, through
    _EagerForward where the call records gradients for q, k or v, else below autograd."""
    op = torch.ops.flash_attn.triton_fwd.default
    if torch.compiler.is_compiling():
        return op(*inputs)
    if torch.is_grad_enabled() and any(t.requires_grad for t in inputs[:3]):
        return _EagerForward.apply(*inputs)
    return _below_autograd(op, *inputs)


ENABLE_VARIABLE = "FLASH_ATTENTION_TRITON_AMD_ENABLE"


def runs_on(q):
    """Whether this backend can run on q's device: a GPU, or the CPU under Triton's interpreter."""
    return q.device.type != "cpu" or os.environ.get("TRITON_INTERPRET") == "1"


def uses_triton(q):
    """Whether a call on q runs this backend (see the module's docstring)."""
    if not runs_on(q):
        return False
    if os.environ.get(ENABLE_VARIABLE, "").upper() == "TRUE":
        return True
    return q.is_cuda and q.dtype == torch.float32
