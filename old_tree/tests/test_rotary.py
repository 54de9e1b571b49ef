"""flash_attn.layers.rotary against an independent complex-number rotation (CPU, runs in CI)."""

import pytest
import torch

from flash_attn.layers.rotary import (
    RotaryEmbedding,
    apply_rotary_at_positions,
    apply_rotary_emb,
    apply_rotary_emb_func,
    apply_rotary_emb_kv_,
    apply_rotary_emb_qkv_,
    apply_rotary_emb_torch,
)

F64 = torch.float64
BATCH, SEQLEN, NHEADS, HEADDIM = 3, 9, 2, 16


def angle_table(seqlen_rotary, rotary_dim, base=10000.0):
    """(seqlen_rotary, rotary_dim / 2) float64 angles t * base ** (-2i / rotary_dim)."""
    inv_freq = base ** (-torch.arange(0, rotary_dim, 2, dtype=F64) / rotary_dim)
    return torch.outer(torch.arange(seqlen_rotary, dtype=F64), inv_freq)


def cos_sin(seqlen_rotary, rotary_dim, dtype=F64):
    angles = angle_table(seqlen_rotary, rotary_dim)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def complex_rotation(x, angles, positions, interleaved):
    """x (..., nheads, headdim) with its first rotary_dim features, read as complex numbers
    (halves as real / imaginary parts, or (even, odd) pairs when interleaved), times
    exp(i * angles[positions]); positions broadcasts to x.shape[:-2]."""
    half = angles.shape[-1]
    x_rot = x[..., : 2 * half].to(F64)
    if interleaved:
        z = torch.view_as_complex(x_rot.unflatten(-1, (half, 2)).contiguous())
    else:
        z = torch.complex(x_rot[..., :half], x_rot[..., half:])
    phase = angles[positions].unsqueeze(-2)
    z = z * torch.polar(torch.ones_like(phase), phase)
    pairs = torch.view_as_real(z) if interleaved else torch.stack((z.real, z.imag), dim=-2)
    return torch.cat((pairs.flatten(-2), x[..., 2 * half :].to(F64)), dim=-1)


def assert_close_f64(actual, expected):
    torch.testing.assert_close(actual, expected, rtol=1e-12, atol=1e-12)


def padded_positions(batch, seqlen, offsets):
    """(batch, seqlen) row of each token: t + offset (int or per-sequence list)."""
    offsets = torch.as_tensor(offsets).reshape(-1, 1)
    return (torch.arange(seqlen) + offsets).expand(batch, seqlen)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rotary_dim", [2, 8, 10, HEADDIM])
def test_matches_complex_rotation(interleaved, rotary_dim):
    x = torch.randn(BATCH, SEQLEN, NHEADS, HEADDIM, dtype=F64)
    cos, sin = cos_sin(SEQLEN, rotary_dim)
    out = apply_rotary_emb(x, cos, sin, interleaved=interleaved)
    positions = padded_positions(BATCH, SEQLEN, 0)
    expected = complex_rotation(x, angle_table(SEQLEN, rotary_dim), positions, interleaved)
    assert_close_f64(out, expected)
    assert out.dtype == x.dtype and out.shape == x.shape


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_features_past_rotary_dim_pass_through(interleaved, dtype):
    x = torch.randn(BATCH, SEQLEN, NHEADS, HEADDIM).to(dtype)
    cos, sin = cos_sin(SEQLEN, 6, dtype)
    out = apply_rotary_emb(x, cos, sin, interleaved=interleaved)
    assert torch.equal(out[..., 6:], x[..., 6:])
    assert not torch.equal(out[:, 1:, :, :6], x[:, 1:, :, :6])


@pytest.mark.parametrize("interleaved", [False, True])
def test_rotation_is_fp32_products_then_one_add(interleaved):
    """The exact arithmetic a CUDA kernel reproduces: x1 * cos - x2 * sin, x1 * sin + x2 * cos, each
    product rounded to fp32, then cast to the input dtype."""
    x = torch.randn(BATCH, SEQLEN, NHEADS, HEADDIM, dtype=torch.float16)
    cos, sin = cos_sin(SEQLEN, 12, torch.float16)
    out = apply_rotary_emb(x, cos, sin, interleaved=interleaved)
    x1, x2 = (x[..., 0:12:2], x[..., 1:12:2]) if interleaved else (x[..., :6], x[..., 6:12])
    x1, x2 = x1.float(), x2.float()
    c, s = cos.float()[:, None], sin.float()[:, None]
    out1 = (x1 * c - x2 * s).half()
    out2 = (x1 * s + x2 * c).half()
    rotated = torch.stack((out1, out2), -1).flatten(-2) if interleaved else torch.cat((out1, out2), -1)
    assert torch.equal(out[..., :12], rotated)


@pytest.mark.parametrize("interleaved", [False, True])
def test_seqlen_offsets_int_and_tensor(interleaved):
    x = torch.randn(BATCH, SEQLEN, NHEADS, HEADDIM, dtype=F64)
    seqlen_rotary = SEQLEN + 7
    cos, sin = cos_sin(seqlen_rotary, 8)
    angles = angle_table(seqlen_rotary, 8)
    out = apply_rotary_emb(x, cos, sin, interleaved=interleaved, seqlen_offsets=7)
    expected = complex_rotation(x, angles, padded_positions(BATCH, SEQLEN, 7), interleaved)
    assert_close_f64(out, expected)
    offsets = [0, 7, 3]
    seqlen_offsets = torch.tensor(offsets, dtype=torch.int32)
    out = apply_rotary_emb(x, cos, sin, interleaved=interleaved, seqlen_offsets=seqlen_offsets)
    expected = complex_rotation(x, angles, padded_positions(BATCH, SEQLEN, offsets), interleaved)
    assert_close_f64(out, expected)


def test_rows_past_the_table_are_not_rotated():
    """As FlashAttention 2's kernel: with tensor offsets, a row past cos's end leaves the token as is."""
    x = torch.randn(2, 4, NHEADS, HEADDIM, dtype=F64)
    cos, sin = cos_sin(5, HEADDIM)
    out = apply_rotary_emb(x, cos, sin, seqlen_offsets=torch.tensor([0, 3]))
    assert torch.equal(out[1, 2:], x[1, 2:])
    assert not torch.equal(out[1, :2], x[1, :2])


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("tensor_offsets", [False, True])
def test_varlen_equals_padded(interleaved, tensor_offsets):
    seqlens = [5, 1, SEQLEN, 3]
    batch = len(seqlens)
    offsets = torch.tensor([2, 0, 4, 1]) if tensor_offsets else 2
    x_padded = torch.randn(batch, SEQLEN, NHEADS, HEADDIM, dtype=F64)
    cos, sin = cos_sin(SEQLEN + 4, 10)
    padded_out = apply_rotary_emb(x_padded, cos, sin, interleaved=interleaved, seqlen_offsets=offsets)
    valid = torch.arange(SEQLEN)[None, :] < torch.tensor(seqlens)[:, None]
    cu_seqlens = torch.tensor([0, *torch.tensor(seqlens).cumsum(0).tolist()], dtype=torch.int32)
    out = apply_rotary_emb(
        x_padded[valid],
        cos,
        sin,
        interleaved=interleaved,
        seqlen_offsets=offsets,
        cu_seqlens=cu_seqlens,
        max_seqlen=max(seqlens),
    )
    assert torch.equal(out, padded_out[valid])


@pytest.mark.parametrize("interleaved", [False, True])
def test_inplace_writes_into_x_and_returns_it(interleaved):
    x = torch.randn(BATCH, SEQLEN, NHEADS, HEADDIM, dtype=torch.bfloat16)
    cos, sin = cos_sin(SEQLEN, 10, torch.bfloat16)
    expected = apply_rotary_emb(x, cos, sin, interleaved=interleaved)
    out = apply_rotary_emb(x, cos, sin, interleaved=interleaved, inplace=True)
    assert out.data_ptr() == x.data_ptr()
    assert torch.equal(x, expected)


def inverse_rotation(grad, rotary_dim, offsets, interleaved):
    """grad rotated by -theta, the gradient of sum(out * grad) with respect to x."""
    batch, seqlen = grad.shape[:2]
    angles = -angle_table(seqlen + max(torch.as_tensor(offsets).reshape(-1).tolist()), rotary_dim)
    return complex_rotation(grad, angles, padded_positions(batch, seqlen, offsets), interleaved)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("offsets", [0, [1, 0, 4]])
def test_gradient_is_the_inverse_rotation(interleaved, inplace, offsets):
    x = torch.randn(BATCH, SEQLEN, NHEADS, HEADDIM, dtype=F64, requires_grad=True)
    grad = torch.randn(BATCH, SEQLEN, NHEADS, HEADDIM, dtype=F64)
    cos, sin = cos_sin(SEQLEN + 4, 12)
    seqlen_offsets = offsets if isinstance(offsets, int) else torch.tensor(offsets)
    out = apply_rotary_emb(
        x, cos, sin, interleaved=interleaved, inplace=inplace, seqlen_offsets=seqlen_offsets
    )
    (out * grad).sum().backward()
    assert_close_f64(x.grad, inverse_rotation(grad, 12, offsets, interleaved))


def test_inplace_on_a_view_updates_the_graph_of_its_base():
    leaf = torch.randn(BATCH, SEQLEN, 2, NHEADS, HEADDIM, dtype=F64, requires_grad=True)
    grad = torch.randn(BATCH, SEQLEN, NHEADS, HEADDIM, dtype=F64)
    cos, sin = cos_sin(SEQLEN, HEADDIM)
    both = leaf * 1
    apply_rotary_emb(both[:, :, 0], cos, sin, inplace=True)
    (both[:, :, 0] * grad).sum().backward()
    assert_close_f64(leaf.grad[:, :, 0], inverse_rotation(grad, HEADDIM, 0, False))
    assert torch.equal(leaf.grad[:, :, 1], torch.zeros_like(grad))


def test_apply_rotary_at_positions_takes_any_rows():
    x = torch.randn(BATCH, SEQLEN, NHEADS, HEADDIM, dtype=F64)
    cos, sin = cos_sin(20, 8)
    positions = torch.randint(0, 20, (BATCH, SEQLEN))
    out = apply_rotary_at_positions(x, cos, sin, positions, interleaved=True)
    expected = complex_rotation(x, angle_table(20, 8), positions, True)
    assert_close_f64(out, expected)


def test_torch_reference_agrees():
    x = torch.randn(BATCH, SEQLEN, NHEADS, HEADDIM, dtype=F64)
    cos, sin = cos_sin(SEQLEN, 10)
    for interleaved in (False, True):
        expected = apply_rotary_emb(x, cos, sin, interleaved)
        assert_close_f64(apply_rotary_emb_torch(x, cos, sin, interleaved), expected)
    assert apply_rotary_emb_func is apply_rotary_emb


@pytest.mark.parametrize("interleaved", [False, True])
def test_qkv_packed_rotates_q_and_k_in_place(interleaved):
    qkv = torch.randn(BATCH, SEQLEN, 3, NHEADS, HEADDIM, dtype=F64)
    original = qkv.clone()
    cos, sin = cos_sin(SEQLEN + 2, 8)
    cos_k, sin_k = 0.5 * cos, 0.5 * sin
    out = apply_rotary_emb_qkv_(qkv, cos, sin, cos_k, sin_k, interleaved=interleaved, seqlen_offsets=2)
    assert out.data_ptr() == qkv.data_ptr()
    positions = padded_positions(BATCH, SEQLEN, 2)
    expected_q = complex_rotation(original[:, :, 0], angle_table(SEQLEN + 2, 8), positions, interleaved)
    assert_close_f64(qkv[:, :, 0], expected_q)
    expected_k = apply_rotary_at_positions(original[:, :, 1], cos_k, sin_k, positions, interleaved)
    assert_close_f64(qkv[:, :, 1], expected_k)
    assert torch.equal(qkv[:, :, 2], original[:, :, 2])


def test_qkv_num_heads_q_layout_and_gradient():
    num_heads_q, num_heads_k = 4, 2
    leaf = torch.randn(BATCH, SEQLEN, num_heads_q + 2 * num_heads_k, HEADDIM, dtype=F64, requires_grad=True)
    grad = torch.randn_like(leaf)
    cos, sin = cos_sin(SEQLEN, 10)
    qkv = apply_rotary_emb_qkv_(leaf * 1, cos, sin, num_heads_q=num_heads_q)
    positions = padded_positions(BATCH, SEQLEN, 0)
    heads_qk = num_heads_q + num_heads_k
    expected = complex_rotation(leaf[:, :, :heads_qk].detach(), angle_table(SEQLEN, 10), positions, False)
    assert_close_f64(qkv[:, :, :heads_qk], expected)
    assert torch.equal(qkv[:, :, heads_qk:], leaf[:, :, heads_qk:])
    (qkv * grad).sum().backward()
    assert_close_f64(leaf.grad[:, :, :heads_qk], inverse_rotation(grad[:, :, :heads_qk], 10, 0, False))
    assert torch.equal(leaf.grad[:, :, heads_qk:], grad[:, :, heads_qk:])


def test_kv_rotates_k_only():
    kv = torch.randn(BATCH, SEQLEN, 2, NHEADS, HEADDIM, dtype=F64)
    original = kv.clone()
    cos, sin = cos_sin(SEQLEN + 5, HEADDIM)
    out = apply_rotary_emb_kv_(kv, cos, sin, interleaved=True, seqlen_offsets=torch.tensor([5, 0, 1]))
    assert out.data_ptr() == kv.data_ptr()
    positions = padded_positions(BATCH, SEQLEN, [5, 0, 1])
    expected_k = complex_rotation(original[:, :, 0], angle_table(SEQLEN + 5, HEADDIM), positions, True)
    assert_close_f64(kv[:, :, 0], expected_k)
    assert torch.equal(kv[:, :, 1], original[:, :, 1])


def module_tables(dim, seqlen, base=10000.0):
    """The module's fp32 cos / sin: fp32 positions times fp32 inv_freq."""
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    angles = torch.outer(torch.arange(seqlen, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


@pytest.mark.parametrize("interleaved", [False, True])
def test_rotary_embedding_packed_qkv(interleaved):
    rotary = RotaryEmbedding(8, interleaved=interleaved)
    qkv = torch.randn(BATCH, SEQLEN, 3, NHEADS, HEADDIM)
    original = qkv.clone()
    out = rotary(qkv, seqlen_offset=3)
    assert out is qkv or out.data_ptr() == qkv.data_ptr()
    assert rotary._seq_len_cached == SEQLEN + 3
    cos, sin = module_tables(8, SEQLEN + 3)
    positions = padded_positions(BATCH, SEQLEN, 3)
    for index in (0, 1):
        expected = apply_rotary_at_positions(original[:, :, index], cos, sin, positions, interleaved)
        assert torch.equal(qkv[:, :, index], expected)
    assert torch.equal(qkv[:, :, 2], original[:, :, 2])


def test_rotary_embedding_separate_q_and_kv_with_tensor_offsets():
    rotary = RotaryEmbedding(HEADDIM, base=500.0)
    q = torch.randn(BATCH, SEQLEN, 4, HEADDIM, dtype=torch.float16)
    kv = torch.randn(BATCH, SEQLEN, 2, NHEADS, HEADDIM, dtype=torch.float16)
    q0, kv0 = q.clone(), kv.clone()
    offsets = torch.tensor([0, 6, 2])
    q_out, kv_out = rotary(q, kv, seqlen_offset=offsets, max_seqlen=SEQLEN + 6)
    assert q_out.data_ptr() == q.data_ptr() and kv_out.data_ptr() == kv.data_ptr()
    assert rotary._cos_cached.dtype == torch.float16
    assert rotary._cos_cached.shape == (SEQLEN + 6, HEADDIM // 2)
    cos, sin = (t.half() for t in module_tables(HEADDIM, SEQLEN + 6, base=500.0))
    positions = padded_positions(BATCH, SEQLEN, offsets.tolist())
    assert torch.equal(q, apply_rotary_at_positions(q0, cos, sin, positions))
    assert torch.equal(kv[:, :, 0], apply_rotary_at_positions(kv0[:, :, 0], cos, sin, positions))
    assert torch.equal(kv[:, :, 1], kv0[:, :, 1])


def test_rotary_embedding_num_heads_q_layout():
    rotary = RotaryEmbedding(HEADDIM)
    qkv = torch.randn(BATCH, SEQLEN, 6 + 2 * 3, HEADDIM)
    original = qkv.clone()
    rotary(qkv, num_heads_q=6)
    cos, sin = module_tables(HEADDIM, SEQLEN)
    expected = apply_rotary_at_positions(original[:, :, :9], cos, sin, padded_positions(BATCH, SEQLEN, 0))
    assert torch.equal(qkv[:, :, :9], expected)
    assert torch.equal(qkv[:, :, 9:], original[:, :, 9:])


def test_rotary_embedding_xpos_scales_q_up_and_k_down():
    dim, scale_base = 8, 16.0
    rotary = RotaryEmbedding(dim, scale_base=scale_base)
    qkv = torch.randn(BATCH, SEQLEN, 3, NHEADS, HEADDIM)
    original = qkv.clone()
    rotary(qkv)
    cos, sin = module_tables(dim, SEQLEN)
    t = torch.arange(SEQLEN, dtype=torch.float32)
    power = (t[:, None] - SEQLEN // 2) / scale_base
    scale = ((torch.arange(0, dim, 2) + 0.4 * dim) / (1.4 * dim)) ** power
    positions = padded_positions(BATCH, SEQLEN, 0)
    expected_q = apply_rotary_at_positions(original[:, :, 0], cos * scale, sin * scale, positions)
    expected_k = apply_rotary_at_positions(original[:, :, 1], cos / scale, sin / scale, positions)
    torch.testing.assert_close(qkv[:, :, 0], expected_q)
    torch.testing.assert_close(qkv[:, :, 1], expected_k)
    assert torch.equal(qkv[:, :, 2], original[:, :, 2])


def test_rotary_embedding_cache_grows_and_keeps_dtype():
    rotary = RotaryEmbedding(HEADDIM)
    rotary(torch.randn(1, 4, 3, NHEADS, HEADDIM))
    assert rotary._seq_len_cached == 4
    rotary(torch.randn(1, 3, 3, NHEADS, HEADDIM))
    assert rotary._seq_len_cached == 4
    rotary(torch.randn(1, 3, 3, NHEADS, HEADDIM, dtype=torch.bfloat16), seqlen_offset=5)
    assert rotary._seq_len_cached == 8 and rotary._cos_cached.dtype == torch.bfloat16


ZERO_OFFSETS = torch.zeros(BATCH, dtype=torch.int64)
CU_ONE_SEQUENCE = torch.tensor([0, SEQLEN], dtype=torch.int32)
ERROR_CASES = {
    "rotary_dim > headdim": (lambda x, c, s: apply_rotary_emb(x, *cos_sin(SEQLEN, 2 * HEADDIM)), "headdim"),
    "sin shape": (lambda x, c, s: apply_rotary_emb(x, c, s[:, :2]), "sin"),
    "cos not 2-D": (lambda x, c, s: apply_rotary_emb(x, c[None], s[None]), "cos"),
    "cos empty": (lambda x, c, s: apply_rotary_emb(x, c[:, :0], s[:, :0]), "cos"),
    "int offset past cos": (lambda x, c, s: apply_rotary_emb(x, c, s, seqlen_offsets=1), "seqlen_offsets"),
    "negative offset": (lambda x, c, s: apply_rotary_emb(x, c, s, seqlen_offsets=-1), "seqlen_offsets"),
    "offsets shape": (
        lambda x, c, s: apply_rotary_emb(x, c, s, seqlen_offsets=ZERO_OFFSETS[:2]),
        "seqlen_offsets",
    ),
    "float offsets": (
        lambda x, c, s: apply_rotary_emb(x, c, s, seqlen_offsets=ZERO_OFFSETS.double()),
        "seqlen_offsets",
    ),
    "seqlen past cos": (
        lambda x, c, s: apply_rotary_emb(x, c[:4], s[:4], seqlen_offsets=ZERO_OFFSETS),
        "seqlen",
    ),
    "x not 4-D": (lambda x, c, s: apply_rotary_emb(x[0], c, s), "x"),
    "varlen without max_seqlen": (
        lambda x, c, s: apply_rotary_emb(x[0], c, s, cu_seqlens=CU_ONE_SEQUENCE),
        "max_seqlen",
    ),
    "qkv shape": (lambda x, c, s: apply_rotary_emb_qkv_(x, c, s), "qkv"),
    "num_heads_q": (lambda x, c, s: apply_rotary_emb_qkv_(x, c, s, num_heads_q=1), "num_heads_q"),
    "sin_k shape": (
        lambda x, c, s: apply_rotary_emb_qkv_(torch.stack((x, x, x), 2), c, s, c[:, :2], s),
        "sin_k",
    ),
    "kv shape": (lambda x, c, s: apply_rotary_emb_kv_(x, c, s), "kv"),
    "odd rotary dim": (lambda x, c, s: RotaryEmbedding(7), "dim"),
}


@pytest.mark.parametrize("case", ERROR_CASES)
def test_errors_name_the_argument(case):
    call, name = ERROR_CASES[case]
    x = torch.randn(BATCH, SEQLEN, NHEADS, HEADDIM)
    with pytest.raises(ValueError, match=name):
        call(x, *cos_sin(SEQLEN, 8, torch.float32))


def test_signatures_match_flash_attention_2():
    """Argument names, order and defaults as in FlashAttention 2's flash_attn.layers.rotary."""
    import inspect

    expected = {
        apply_rotary_emb: "x, cos, sin, interleaved=False, inplace=False, seqlen_offsets=0, cu_seqlens=None, "
        "max_seqlen=None",
        apply_rotary_emb_qkv_: "qkv, cos, sin, cos_k=None, sin_k=None, interleaved=False, seqlen_offsets=0, "
        "num_heads_q=None",
        apply_rotary_emb_kv_: "kv, cos, sin, interleaved=False, seqlen_offsets=0",
        apply_rotary_emb_torch: "x, cos, sin, interleaved=False",
        RotaryEmbedding.__init__: "self, dim, base=10000.0, interleaved=False, scale_base=None, "
        "pos_idx_in_fp32=True, device=None",
        RotaryEmbedding.forward: "self, qkv, kv=None, seqlen_offset=0, max_seqlen=None, num_heads_q=None",
    }
    for function, arguments in expected.items():
        parameters = inspect.signature(function).parameters.values()
        actual = ", ".join(p.name if p.default is p.empty else f"{p.name}={p.default!r}" for p in parameters)
        assert actual == arguments, function.__qualname__
