"""flash_attn.modules.mha.MHA against plain PyTorch attention built from the same weights.

The reference (plain_mha below) is FA2's MHA semantics written out in plain PyTorch, with its own
rotary and ALiBi code, one sequence at a time: the valid tokens of a padded sample, or one slice
of a cu_seqlens batch. The tolerance rule of docs/TESTING.md: ref is plain_mha in fp64 on the same
weights and inputs, pt is plain_mha in the test dtype, and ours must be within 2 * max|pt - ref|
(3x for gradients) plus the fp32 rounding floor. CPU cases run everywhere (the CPU path of the
attention functions); the CUDA cases skip without a GPU and the extension.
"""

import math

import pytest
import torch
import torch.nn.functional as F

import flash_attn.ops
from flash_attn.modules.mha import MHA, get_alibi_slopes
from flash_attn.utils.generation import InferenceParams
from helpers import GRAD_FACTOR, OUT_FACTOR, assert_fa_close, require_kernel

F64 = torch.float64
EMBED, HEADS = 64, 4  # head dim 16

_NO_GPU = not torch.cuda.is_available() or not flash_attn.ops.has_cuda_kernels()
_CUDA = pytest.mark.skipif(_NO_GPU, reason="needs a CUDA GPU and the flash_attn._C extension")
DEVICE_DTYPES = [
    pytest.param("cpu", torch.float32, id="cpu-fp32"),
    pytest.param("cpu", torch.bfloat16, id="cpu-bf16"),
    pytest.param("cuda", torch.bfloat16, id="cuda-bf16", marks=_CUDA),
    pytest.param("cuda", torch.float16, id="cuda-fp16", marks=_CUDA),
]
FP32_AND_GPU = [p for p in DEVICE_DTYPES if p.id != "cpu-bf16"]


# ---- the reference ---------------------------------------------------------------------------------

def leaf_params(module, dtype):
    """The module's parameters as fresh leaves in dtype, by name."""
    return {name: p.detach().to(dtype).requires_grad_() for name, p in module.named_parameters()}


def project(m, params, x, x_kv=None, mixer_subset=None):
    """q (..., h, d), k and v (..., hk, d) from m's packing: q heads, then k heads, then v heads."""
    def linear(name, t):
        return F.linear(t, params[f"{name}.weight"], params.get(f"{name}.bias"))

    h, hk, d = m.num_heads, m.num_heads_kv, m.head_dim
    if m.cross_attn:
        q = linear("Wq", x if mixer_subset is None else x[:, mixer_subset]).unflatten(-1, (h, d))
        kv = linear("Wkv", x if x_kv is None else x_kv).unflatten(-1, (2, hk, d))
        return q, kv[..., 0, :, :], kv[..., 1, :, :]
    qkv = linear("Wqkv", x).unflatten(-1, (h + 2 * hk, d))
    return qkv[..., :h, :], qkv[..., h:h + hk, :], qkv[..., h + hk:, :]


def rotate(m, x, positions, is_key):
    """x (..., seq, heads, d) with its first rotary_emb_dim features rotated at positions (..., seq):
    angles t * base ** (-2i / dim), halves (GPT-NeoX) or (even, odd) pairs (GPT-J); XPos multiplies
    q's cos / sin by scale ** (t / scale_base) and divides k's (any centre gives the same scores)."""
    dim = m.rotary_emb_dim
    if dim == 0:
        return x
    rotary = m.rotary_emb
    pair = torch.arange(0, dim, 2, dtype=F64, device=x.device)
    angles = positions.to(F64)[..., None] * rotary.base ** (-pair / dim)
    cos, sin = angles.cos(), angles.sin()
    if rotary.scale_base is not None:
        factor = ((pair + 0.4 * dim) / (1.4 * dim)) ** (positions.to(F64)[..., None] / rotary.scale_base)
        factor = 1 / factor if is_key else factor
        cos, sin = cos * factor, sin * factor
    cos, sin = (t.unsqueeze(-2).to(x.dtype) for t in (cos, sin))
    part = x[..., :dim]
    x1, x2 = (part[..., 0::2], part[..., 1::2]) if rotary.interleaved else part.chunk(2, dim=-1)
    r1, r2 = x1 * cos - x2 * sin, x1 * sin + x2 * cos
    rotated = torch.stack((r1, r2), dim=-1).flatten(-2) if rotary.interleaved else torch.cat((r1, r2), dim=-1)
    return torch.cat((rotated, x[..., dim:]), dim=-1)


def attend(m, q, k, v, causal):
    """One sequence: q (sq, h, d), k, v (sk, hk, d) -> (sq, h, d); FA2's bottom-right aligned causal
    mask and window, ALiBi -slope * |i + sk - sq - j|; a row with no visible key gives 0."""
    sq, sk, h = q.shape[0], k.shape[0], q.shape[1]
    k, v = (t.repeat_interleave(h // t.shape[1], dim=1) for t in (k, v))
    scale = m.softmax_scale if m.softmax_scale is not None else 1 / math.sqrt(q.shape[-1])
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    i = torch.arange(sq, device=q.device)[:, None] + sk - sq
    j = torch.arange(sk, device=q.device)[None, :]
    if m.alibi_slopes is not None:
        slopes = torch.tensor(get_alibi_slopes(h), dtype=q.dtype, device=q.device)
        scores = scores - slopes[:, None, None] * (i - j).abs().to(q.dtype)
    left, right = m.window_size
    right = 0 if causal else right
    visible = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    if right >= 0:
        visible &= j <= i + right
    if left >= 0:
        visible &= j >= i - left
    probs = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1).nan_to_num(0.0)
    return torch.einsum("hqk,khd->qhd", probs, v)


def plain_mha(m, params, x, x_kv=None, key_padding_mask=None, cu_seqlens=None, causal=None, mixer_subset=None):
    """FA2's MHA forward, one sequence at a time. key_padding_mask: each sample is its valid tokens
    (queries too for self-attention), padded outputs 0 before out_proj; cu_seqlens: x is (total,
    embed) and each slice a sequence."""
    causal = m.causal if causal is None else causal
    q, k, v = project(m, params, x, x_kv, mixer_subset)
    if cu_seqlens is not None:
        bounds = cu_seqlens.tolist()
        positions = torch.cat([torch.arange(e - s, device=x.device) for s, e in zip(bounds[:-1], bounds[1:])])
        q, k = rotate(m, q, positions, False), rotate(m, k, positions, True)
        context = torch.cat([attend(m, q[s:e], k[s:e], v[s:e], causal) for s, e in zip(bounds[:-1], bounds[1:])])
    else:
        positions = torch.arange(x.shape[1], device=x.device)
        q, k = rotate(m, q, positions, False), rotate(m, k, positions, True)
        context = torch.stack([_attend_sample(m, q[b], k[b], v[b], key_padding_mask, b, causal)
                               for b in range(q.shape[0])])
    return F.linear(context.flatten(-2), params["out_proj.weight"], params.get("out_proj.bias"))


def _attend_sample(m, q, k, v, key_padding_mask, b, causal):
    if key_padding_mask is None:
        return attend(m, q, k, v, causal)
    keys = key_padding_mask[b].bool()
    if m.cross_attn:
        return attend(m, q, k[keys], v[keys], causal)
    context = torch.zeros_like(q)
    context[keys] = attend(m, q[keys], k[keys], v[keys], causal)
    return context


def check_against_plain(m, out, inputs, dout=None, grads=None, **kwargs):
    """ours (out, and with dout the gradients `grads` {name: ours} of x and parameters) against
    plain_mha in fp64 (ref) and in the inputs' dtype (pt). inputs: {name: tensor} of plain_mha's
    tensor arguments, in the test dtype."""
    results = {}
    for dtype in (F64, out.dtype):
        params = leaf_params(m, dtype)
        leaves = {name: (t.detach().to(dtype).requires_grad_() if t.is_floating_point() else t)
                  for name, t in inputs.items()}
        result = plain_mha(m, params, **leaves, **kwargs)
        found = {"out": result.detach()}
        if dout is not None:
            wrt = {**{n: t for n, t in leaves.items() if t.requires_grad}, **params}
            found.update(zip(wrt, torch.autograd.grad(result, list(wrt.values()), dout.to(dtype), allow_unused=True)))
        results[dtype] = found
    ref, pt = results[F64], results[out.dtype]
    assert_fa_close("out", out, ref["out"], pt["out"], OUT_FACTOR)
    for name, grad in (grads or {}).items():
        assert_fa_close(name, grad, ref[name], pt[name], GRAD_FACTOR)


def new_mha(device, dtype, **kwargs):
    if device == "cuda":  # a build for some dtypes / head dims only skips the others
        require_kernel(dtype, EMBED // HEADS)
    return MHA(EMBED, HEADS, device=device, dtype=dtype, **kwargs)


def run_with_grads(m, x, dout, **forward_kwargs):
    """ours forward and backward: out, and {name: grad} for x and m's parameters."""
    x = x.detach().requires_grad_()
    out = m(x, **forward_kwargs)
    names = ["x", *(n for n, _ in m.named_parameters())]
    grads = torch.autograd.grad(out, [x, *m.parameters()], dout)
    return out, dict(zip(names, grads))


# ---- the module against the reference --------------------------------------------------------------

FORWARD_CASES = {
    "plain": dict(),
    "causal": dict(causal=True),
    "gqa_causal": dict(num_heads_kv=2, causal=True),
    "mqa": dict(num_heads_kv=1),
    "rotary_causal": dict(rotary_emb_dim=16, causal=True, num_heads_kv=2),
    "rotary_partial_interleaved_xpos": dict(rotary_emb_dim=8, rotary_emb_interleaved=True,
                                            rotary_emb_scale_base=64.0, causal=True),
    "alibi_causal": dict(use_alibi=True, causal=True, num_heads_kv=2),
    "window": dict(window_size=(2, 1)),
    "window_causal_alibi_rotary": dict(window_size=(3, -1), causal=True, use_alibi=True, rotary_emb_dim=16),
    "no_bias_scale": dict(qkv_proj_bias=False, out_proj_bias=False, softmax_scale=0.3),
}


@pytest.mark.parametrize("device, dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("case", FORWARD_CASES)
def test_forward_and_gradients(case, device, dtype):
    m = new_mha(device, dtype, **FORWARD_CASES[case])
    x = torch.randn(2, 7, EMBED, device=device, dtype=dtype)
    dout = torch.randn(2, 7, EMBED, device=device, dtype=dtype)
    out, grads = run_with_grads(m, x, dout)
    assert out.shape == x.shape and out.dtype == dtype
    check_against_plain(m, out, {"x": x}, dout, grads)


@pytest.mark.parametrize("device, dtype", FP32_AND_GPU)
@pytest.mark.parametrize("case", ["causal_rotary_alibi", "window_gqa"])
def test_key_padding_mask(case, device, dtype):
    """Samples with 7, 1, 4 (scattered) and 0 valid tokens: outputs against the reference on the
    valid tokens; padded positions are exactly out_proj's bias."""
    kwargs = dict(causal=True, rotary_emb_dim=16, use_alibi=True) if case == "causal_rotary_alibi" else \
        dict(window_size=(1, 2), num_heads_kv=2)
    m = new_mha(device, dtype, **kwargs)
    x = torch.randn(4, 7, EMBED, device=device, dtype=dtype)
    mask = torch.tensor([[1] * 7, [1, 0, 0, 0, 0, 0, 0], [0, 1, 1, 0, 1, 0, 1], [0] * 7], device=device).bool()
    dout = torch.randn_like(x)
    out, grads = run_with_grads(m, x, dout, key_padding_mask=mask)
    assert torch.equal(out[~mask], m.out_proj.bias.detach().expand_as(out[~mask]))
    check_against_plain(m, out, {"x": x}, dout, grads, key_padding_mask=mask)


@pytest.mark.parametrize("device, dtype", FP32_AND_GPU)
def test_cu_seqlens(device, dtype):
    """A packed batch of sequences of 5, 1, 0 and 9 tokens, rotary positions restarting per sequence
    (FA2 refuses rotary with cu_seqlens; ours applies it per sequence)."""
    m = new_mha(device, dtype, num_heads_kv=2, causal=True, rotary_emb_dim=16, use_alibi=True)
    cu_seqlens = torch.tensor([0, 5, 6, 6, 15], dtype=torch.int32, device=device)
    x = torch.randn(15, EMBED, device=device, dtype=dtype)
    dout = torch.randn_like(x)
    out, grads = run_with_grads(m, x, dout, cu_seqlens=cu_seqlens, max_seqlen=9)
    check_against_plain(m, out, {"x": x}, dout, grads, cu_seqlens=cu_seqlens)


@pytest.mark.parametrize("device, dtype", FP32_AND_GPU)
def test_cross_attention(device, dtype):
    """Queries from x (5 tokens), keys from x_kv (8 tokens) with a padding mask, GQA, causal aligned
    to each sample's valid keys (bottom-right), then the same with mixer_subset."""
    m = new_mha(device, dtype, cross_attn=True, num_heads_kv=2, causal=True, use_alibi=True)
    x = torch.randn(3, 5, EMBED, device=device, dtype=dtype)
    x_kv = torch.randn(3, 8, EMBED, device=device, dtype=dtype)
    mask = torch.tensor([[1] * 8, [1] * 3 + [0] * 5, [1] * 6 + [0] * 2], device=device).bool()
    out = m(x, x_kv=x_kv, key_padding_mask=mask)
    check_against_plain(m, out, {"x": x, "x_kv": x_kv}, key_padding_mask=mask)
    subset = torch.tensor([0, 3], device=device)
    out = m(x, x_kv=x_kv, mixer_subset=subset)
    assert out.shape == (3, 2, EMBED)
    check_against_plain(m, out, {"x": x, "x_kv": x_kv}, mixer_subset=subset)


@pytest.mark.parametrize("device, dtype", FP32_AND_GPU)
def test_cross_attention_cu_seqlens(device, dtype):
    """cross_attn with packed x and x_kv: cu_seqlens / max_seqlen for x, cu_seqlens_k / max_seqlen_k
    (FA2's inner-attention keywords) for x_kv."""
    m = new_mha(device, dtype, cross_attn=True)
    cu_q = torch.tensor([0, 3, 7], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, 6, 8], dtype=torch.int32, device=device)
    x, x_kv = torch.randn(7, EMBED, device=device, dtype=dtype), torch.randn(8, EMBED, device=device, dtype=dtype)
    out = m(x, x_kv=x_kv, cu_seqlens=cu_q, max_seqlen=4, cu_seqlens_k=cu_k, max_seqlen_k=6)
    for (start, end), (start_k, end_k) in (((0, 3), (0, 6)), ((3, 7), (6, 8))):
        check_against_plain(m, out[None, start:end], {"x": x[None, start:end], "x_kv": x_kv[None, start_k:end_k]})


# ---- generation with inference_params --------------------------------------------------------------

DECODE_CASES = {
    "gqa": dict(num_heads_kv=2),
    "rotary16_in_kernel": dict(rotary_emb_dim=16, num_heads_kv=2),
    "rotary8_interleaved": dict(rotary_emb_dim=8, rotary_emb_interleaved=True),
    "rotary_xpos": dict(rotary_emb_dim=16, rotary_emb_scale_base=64.0),
    "alibi_window": dict(use_alibi=True, window_size=(4, -1), num_heads_kv=1),
}


@pytest.mark.parametrize("device, dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("case", DECODE_CASES)
def test_incremental_decoding(case, device, dtype):
    """A 5-token prompt, then steps of 1, 2 and 1 tokens through the KV cache: the outputs put
    together match the full causal forward's reference on the 9 tokens."""
    m = new_mha(device, dtype, causal=True, layer_idx=3, **DECODE_CASES[case]).eval()
    x = torch.randn(2, 9, EMBED, device=device, dtype=dtype)
    params = InferenceParams(max_seqlen=12, max_batch_size=2)
    outs = []
    with torch.no_grad():
        for start, end in ((0, 5), (5, 6), (6, 8), (8, 9)):
            outs.append(m(x[:, start:end], inference_params=params))
            params.seqlen_offset = end
    assert params.key_value_memory_dict[3].shape == (2, 12, 2, m.num_heads_kv, m.head_dim)
    check_against_plain(m, torch.cat(outs, dim=1), {"x": x})


@pytest.mark.parametrize("device, dtype", FP32_AND_GPU)
@pytest.mark.parametrize("rotary_dim", [16, 8])
def test_lengths_per_sample(rotary_dim, device, dtype):
    """Per-sample cache lengths: sample 0 has a 4-token prompt, sample 1 a 3-token one (its 4th
    prompt row is filler, overwritten by its next token); two decode steps follow, each sample at
    its own position."""
    m = new_mha(device, dtype, causal=True, layer_idx=0, rotary_emb_dim=rotary_dim, num_heads_kv=2).eval()
    tokens = [torch.randn(6, EMBED, device=device, dtype=dtype), torch.randn(5, EMBED, device=device, dtype=dtype)]
    filler = torch.randn(1, EMBED, device=device, dtype=dtype)
    lengths = torch.zeros(2, dtype=torch.int32, device=device)
    params = InferenceParams(max_seqlen=8, max_batch_size=2, lengths_per_sample=lengths)
    with torch.no_grad():
        prompt = m(torch.stack((tokens[0][:4], torch.cat((tokens[1][:3], filler)))), inference_params=params)
        outs = [[prompt[0]], [prompt[1, :3]]]
        lengths.copy_(torch.tensor([4, 3]))
        for step in range(2):
            out = m(torch.stack([t[n + step:n + step + 1] for t, n in zip(tokens, (4, 3))]), inference_params=params)
            outs[0].append(out[0])
            outs[1].append(out[1])
            lengths += 1
    for sample in range(2):
        check_against_plain(m, torch.cat(outs[sample])[None], {"x": tokens[sample][None]})


@pytest.mark.parametrize("device, dtype", FP32_AND_GPU)
def test_preallocated_cache_and_batch_offset(device, dtype):
    """A cache from allocate_inference_cache, NaN-filled, with batch_size_offset 1: only rows 1 and
    2 are written, and decoding from them matches the reference."""
    m = new_mha(device, dtype, causal=True, layer_idx=0).eval()
    cache = m.allocate_inference_cache(3, 6).fill_(float("nan"))
    assert cache.shape == (3, 6, 2, HEADS, EMBED // HEADS) and cache.dtype == dtype
    params = InferenceParams(max_seqlen=6, max_batch_size=3, batch_size_offset=1, key_value_memory_dict={0: cache})
    x = torch.randn(2, 5, EMBED, device=device, dtype=dtype)
    with torch.no_grad():
        prompt = m(x[:, :4], inference_params=params)
        params.seqlen_offset = 4
        step = m(x[:, 4:], inference_params=params)
    assert cache[0].isnan().all() and not cache[1:, :5].isnan().any() and cache[:, 5:].isnan().all()
    check_against_plain(m, torch.cat((prompt, step), dim=1), {"x": x})


# ---- options, module behaviour, errors -------------------------------------------------------------

def test_get_alibi_slopes():
    """Powers of two: 2 ** (-8 (h + 1) / n); otherwise the paper's interleaving (FA2's values)."""
    assert get_alibi_slopes(8) == [2.0 ** -(h + 1) for h in range(8)]
    assert get_alibi_slopes(1) == [2.0 ** -8]
    assert get_alibi_slopes(6) == [2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8, 2.0 ** -1, 2.0 ** -3]


def test_state_dict_matches_flash_attention_2():
    """FA2's parameter names and shapes, so its checkpoints load: Wqkv packs q, k, v heads."""
    m = MHA(EMBED, HEADS, num_heads_kv=2, rotary_emb_dim=8, use_alibi=True)
    assert {k: tuple(v.shape) for k, v in m.state_dict().items()} == {
        "Wqkv.weight": (EMBED + 2 * 2 * 16, EMBED), "Wqkv.bias": (EMBED + 2 * 2 * 16,),
        "out_proj.weight": (EMBED, EMBED), "out_proj.bias": (EMBED,)}
    cross = MHA(EMBED, HEADS, cross_attn=True, qkv_proj_bias=False)
    assert set(cross.state_dict()) == {"Wq.weight", "Wkv.weight", "out_proj.weight", "out_proj.bias"}


def test_use_flash_attn_and_causal_override():
    """use_flash_attn True and False run the same attention; forward(causal=...) overrides the
    module's causal as FA2's inner attention does."""
    m = new_mha("cpu", torch.float32, use_flash_attn=True)
    x = torch.randn(2, 6, EMBED)
    twin = new_mha("cpu", torch.float32, use_flash_attn=False)
    twin.load_state_dict(m.state_dict())
    assert torch.equal(m(x), twin(x))
    causal_twin = new_mha("cpu", torch.float32, causal=True)
    causal_twin.load_state_dict(m.state_dict())
    assert torch.equal(m(x, causal=True), causal_twin(x))


def test_dropout_return_residual_and_checkpointing():
    """Training mode drops (eval does not); with the same seed, checkpointing recomputes the same
    dropout mask in the backward, so gradients equal those without it; return_residual gives x."""
    plain = new_mha("cpu", torch.float32, dropout=0.3, causal=True)
    checkpointed = new_mha("cpu", torch.float32, dropout=0.3, causal=True, checkpointing=True, return_residual=True)
    checkpointed.load_state_dict(plain.state_dict())
    x, dout = torch.randn(2, 8, EMBED), torch.randn(2, 8, EMBED)
    results = []
    for m in (plain, checkpointed):
        torch.manual_seed(7)
        out, grads = run_with_grads(m, x, dout) if m is plain else _run_residual(m, x, dout)
        results.append((out, grads))
    assert torch.equal(results[0][0], results[1][0])
    for name, grad in results[0][1].items():
        assert torch.equal(grad, results[1][1][name]), name
    eval_out = plain.eval()(x)
    assert not torch.allclose(eval_out, results[0][0])
    no_dropout = new_mha("cpu", torch.float32, causal=True).eval()
    no_dropout.load_state_dict(plain.state_dict())
    assert torch.equal(eval_out, no_dropout(x))


def _run_residual(m, x, dout):
    x = x.detach().requires_grad_()
    out, residual = m(x)
    assert residual is x
    names = ["x", *(n for n, _ in m.named_parameters())]
    return out, dict(zip(names, torch.autograd.grad(out, [x, *m.parameters()], dout)))


def test_inference_params_reset():
    lengths = torch.tensor([3, 4], dtype=torch.int32)
    params = InferenceParams(max_seqlen=8, max_batch_size=2, seqlen_offset=5, lengths_per_sample=lengths)
    params.reset(16, 4)
    assert (params.max_seqlen, params.max_batch_size, params.seqlen_offset) == (16, 4, 0)
    assert lengths.tolist() == [0, 0]


CONSTRUCTOR_ERRORS = [
    (dict(dwconv=True), NotImplementedError, "dwconv"),
    (dict(fused_bias_fc=True), NotImplementedError, "fused_bias_fc"),
    (dict(num_heads=3), ValueError, "divisible by num_heads"),
    (dict(num_heads_kv=3), ValueError, "num_heads_kv"),
    (dict(embed_dim=2 * 264, num_heads=2), ValueError, "head dim"),
    (dict(rotary_emb_dim=7), ValueError, "rotary_emb_dim"),
    (dict(rotary_emb_dim=32), ValueError, "rotary_emb_dim"),
    (dict(rotary_emb_dim=8, cross_attn=True), NotImplementedError, "rotary_emb_dim"),
    (dict(rotary_emb_dim=8, rotary_emb_scale_base=-1.0), ValueError, "rotary_emb_scale_base"),
    (dict(window_size=(-2, 0)), ValueError, "window_size"),
    (dict(dropout=1.0), ValueError, "dropout"),
    (dict(softmax_scale=0.0), ValueError, "softmax_scale"),
]


@pytest.mark.parametrize("kwargs, error, match", CONSTRUCTOR_ERRORS)
def test_constructor_errors(kwargs, error, match):
    args = {"embed_dim": EMBED, "num_heads": HEADS, **kwargs}
    with pytest.raises(error, match=match):
        MHA(**args)


def test_forward_errors():
    m, cross = MHA(EMBED, HEADS, causal=True), MHA(EMBED, HEADS, cross_attn=True)
    x = torch.randn(2, 5, EMBED)
    cu = torch.tensor([0, 5, 10], dtype=torch.int32)
    cases = [
        (lambda: m(x, dropout_p=0.1), TypeError, "dropout_p"),
        (lambda: m(x.flatten(0, 1), cu_seqlens=cu), ValueError, "max_seqlen"),
        (lambda: m(x, key_padding_mask=torch.ones(2, 4, dtype=torch.bool)), ValueError, "key_padding_mask"),
        (lambda: m(x.flatten(0, 1), cu_seqlens=cu, max_seqlen=5, key_padding_mask=torch.ones(10)), ValueError,
         "key_padding_mask"),
        (lambda: m(x, x_kv=x), ValueError, "cross_attn"),
        (lambda: m(x, inference_params=InferenceParams(8, 2)), ValueError, "layer_idx"),
        (lambda: m(torch.randn(2, 5, EMBED + 1)), ValueError, "embed_dim"),
        (lambda: cross(x.flatten(0, 1), x_kv=x.flatten(0, 1), cu_seqlens=cu, max_seqlen=5), ValueError,
         "cu_seqlens_k"),
    ]
    for call, error, match in cases:
        with pytest.raises(error, match=match):
            call()
    decoder = MHA(EMBED, HEADS, causal=True, layer_idx=0)
    with pytest.raises(ValueError, match="max_seqlen"):
        decoder(x, inference_params=InferenceParams(max_seqlen=4, max_batch_size=2))
    with pytest.raises(ValueError, match="max_batch_size"):
        decoder(x, inference_params=InferenceParams(max_seqlen=8, max_batch_size=1))
