"""The fp8 e4m3 forward (FlashAttention 3's FP8 API) on the Triton backend: flash_attn_func and
flash_attn_varlen_func with float8_e4m3fn q, k, v and q_descale / k_descale / v_descale, against
an fp64 reference of the dequantized inputs with the fp8 rule of fp8_checks.py (RMSE), plus its
errors: no backward, no dropout, descales only with fp8, the shapes FlashAttention 3 checks.

Runs on the GPU where there is one (sm89 or newer), else in Triton's interpreter: Triton 3.9's
interpreter loads e4m3 tensors and multiplies them correctly, but its fp32 -> fp8 conversion
carries a rounding overflow into the wrong bit and its fp32 -> bfloat16 conversion truncates, so
the kernel rounds to the target grid first there (fp8_kernels.py); test_casts_match_torch checks
that this rounding and, on a GPU, the hardware conversions give torch's values.
"""

import pytest
import torch

triton = pytest.importorskip("triton", reason="triton is not installed")
import triton.language as tl  # noqa: E402 - after the skip above

import flash_attn
from feature_checks import make_cu_seqlens
from fp8_checks import FP8, assert_fp8_close, assert_long_tail_kept, long_tail_inputs, quantize, references

triton_backend = pytest.importorskip("flash_attn.triton", reason="triton is not installed")
from flash_attn.triton.fp8_kernels import E4M3_P_SCALE_LOG2, _output, _pv_operand  # noqa: E402 - after the skip above
from triton_checks import assert_descriptors_match_pointers, recorded_descriptors  # noqa: E402 - after the skip above

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(DEVICE == "cuda" and torch.cuda.get_device_capability() < (8, 9),
                                reason="fp8 needs a GPU of compute capability 8.9 or newer")


@pytest.fixture(autouse=True)
def _triton_switch_on(monkeypatch):
    """Every call here runs the Triton backend: on a Hopper GPU the dense fp8 calls would otherwise go
    to the CUDA fp8 forward, which test_gpu_fp8.py checks."""
    monkeypatch.setenv("FLASH_ATTENTION_TRITON_AMD_ENABLE", "TRUE")


def _inputs(batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, magnitude=1.0):
    """Quantized q, k, v (float8_e4m3fn, on DEVICE) and their descales, from randn * magnitude."""
    new = lambda s, h: torch.randn(batch, s, h, headdim) * magnitude  # noqa: E731
    quantized = [quantize(x, nheads_k) for x in (new(seqlen_q, nheads), new(seqlen_k, nheads_k),
                                                  new(seqlen_k, nheads_k))]
    tensors = [x8 for x8, _ in quantized]
    descales = [d for _, d in quantized]
    return tensors, descales


def _on_device(tensors):
    return [t.to(DEVICE) for t in tensors]


# (batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, causal, window_size, softcap, alibi)
DENSE_CASES = {
    "causal_gqa_hd64": (2, 70, 75, 4, 2, 64, True, (-1, -1), 0.0, False),
    "window_softcap_alibi_mqa_hd40": (1, 90, 60, 2, 1, 40, False, (20, 10), 8.0, True),
    "hd128_seqlen_q_1": (2, 1, 130, 2, 2, 128, False, (-1, -1), 0.0, False),
    # head dims past 128 (block_d 256: the wide-head tiles of attention.py)
    "causal_mqa_hd256": (1, 40, 70, 2, 1, 256, True, (-1, -1), 0.0, False),
    "softcap_hd192": (1, 33, 65, 1, 1, 192, False, (-1, -1), 5.0, False),
}


@pytest.mark.parametrize("name", DENSE_CASES)
def test_fp8_dense(name):
    batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, causal, window_size, softcap, alibi = DENSE_CASES[name]
    (q8, k8, v8), descales = _inputs(batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim)
    slopes = (torch.rand(nheads) * 0.3 + 0.05) if alibi else None
    options = dict(causal=causal, window_size=window_size, softcap=softcap)
    out, lse, _ = flash_attn.flash_attn_func(
        *_on_device((q8, k8, v8)), **options, alibi_slopes=None if slopes is None else slopes.to(DEVICE),
        return_attn_probs=True, **dict(zip(("q_descale", "k_descale", "v_descale"), _on_device(descales))))
    assert_fp8_close(out.cpu(), lse.cpu(),
                     *references(q8, k8, v8, descales, headdim ** -0.5, alibi_slopes=slopes, **options))


@pytest.mark.parametrize("name", ["window_both_sides", "causal_more_queries"])
def test_fp8_walk_of_small_tiles(monkeypatch, name):
    """32 x 32 tiles (the smallest an fp8 P . V takes; FP8_FORWARD_TILE_VARIABLE): walks of masked,
    whole and masked key blocks (kernels._full_key_blocks), the whole ones without the mask."""
    seqlen_q, seqlen_k, causal, window_size = {"window_both_sides": (100, 160, False, (60, 30)),
                                               "causal_more_queries": (150, 70, True, (-1, -1))}[name]
    monkeypatch.setenv(triton_backend.tuning.FP8_FORWARD_TILE_VARIABLE, "32,32,4,3")
    (q8, k8, v8), descales = _inputs(1, seqlen_q, seqlen_k, 2, 1, 64)
    options = dict(causal=causal, window_size=window_size)
    out, lse, _ = flash_attn.flash_attn_func(
        *_on_device((q8, k8, v8)), **options, return_attn_probs=True,
        **dict(zip(("q_descale", "k_descale", "v_descale"), _on_device(descales))))
    assert_fp8_close(out.cpu(), lse.cpu(), *references(q8, k8, v8, descales, 64 ** -0.5, **options))


@pytest.mark.parametrize("shape", [(2, 100, 3, 96), (150, 2, 128)], ids=["dense_hd96", "varlen_hd128"])
def test_keys_contiguous_copies_v(shape):
    """attention.keys_contiguous (the fp8 forward's V, fp8_kernels.keys_contiguous_kernel): the same
    values with the keys contiguous, for a key count that ends inside a 64-key program and a head
    dim below its power-of-two block; v a strided view (every other head of a wider tensor)."""
    wide = torch.randn(*shape[:-2], 2 * shape[-2], shape[-1]).to(FP8).to(DEVICE)
    v = wide[..., ::2, :]
    copied = triton_backend.attention.keys_contiguous(v)
    assert copied.shape == v.shape and copied.stride(-3) == 1  # keys: the first dim (varlen) or the second
    assert copied.stride(-1) % 16 == 0  # a (head, dim)'s keys 16-byte aligned rows apart: TMA-addressable
    assert torch.equal(copied.view(torch.uint8).cpu(), v.view(torch.uint8).cpu())


FP8_DESCRIPTOR_CASES = {  # (batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, causal)
    "causal_gqa_keys_not_16": (2, 70, 75, 4, 2, 64, True),  # V's copy padded to 80 keys a row
    "hd128_more_keys": (1, 40, 130, 2, 2, 128, False),
    "causal_mqa_hd32": (2, 33, 33, 2, 1, 32, True),
}


@pytest.mark.parametrize("name", FP8_DESCRIPTOR_CASES)
def test_fp8_host_descriptors_match_the_pointer_loads(monkeypatch, name):
    """The fp8 forward with q, k, out and V's keys-contiguous copy through host-made descriptors
    (tuning.DESCRIPTORS_VARIABLE 2; its blocks of the copy are a head's dims by keys, transposed for
    P . V) gives the pointer loads' out and lse bit for bit: rows past the sequence and keys past
    the copy's (unpadded) length read as 0. Asked for device-made descriptors (1), which the kernel
    has none of for V's copy, the call takes the pointer loads. One tile for all three (host-made
    descriptors would otherwise take FP8_HOST_TILE, and another tile sums in another order)."""
    batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, causal = FP8_DESCRIPTOR_CASES[name]
    monkeypatch.setenv(triton_backend.tuning.FP8_FORWARD_TILE_VARIABLE, "64,128,4,3")
    (q8, k8, v8), descales = _inputs(batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim)
    kernels = triton_backend.kernels
    out, lse = assert_descriptors_match_pointers(
        monkeypatch, *_on_device((q8, k8, v8)), headdim ** -0.5,
        [kernels.HOST_DESCRIPTORS.value, kernels.POINTER_BLOCKS.value], asked=("2", "1"),
        window=(-1, 0) if causal else (-1, -1), descales=torch.stack(_on_device(descales)))
    assert_fp8_close(out.cpu(), lse.cpu(), *references(q8, k8, v8, descales, headdim ** -0.5, causal=causal))


def test_fp8_descriptor_table():
    """FP8_HOST_DESCRIPTOR_KEYS: host-made descriptors at hd 128 (pointers the fallback), pointers at
    other padded head dims; on them the fp8 forward takes FP8_HOST_TILE, else its pointer tiles."""
    attention = triton_backend.attention
    host, pointers = triton_backend.kernels.HOST_DESCRIPTORS.value, triton_backend.kernels.POINTER_BLOCKS.value
    for causal in (False, True):
        assert attention._fp8_descriptors(128, causal, 4096) == (host, pointers)
        assert attention._fp8_descriptors(64, causal, 4096) == (pointers, pointers)
        assert attention._fp8_tile(causal, 4096, host_descriptors=True) == attention.FP8_HOST_TILE
    assert attention._fp8_tile(False, 4096) == attention.FP8_FORWARD_TILE


@pytest.mark.skipif(DEVICE != "cuda" or torch.version.hip is not None or torch.cuda.get_device_capability()[0] < 9,
                    reason="the fp8 descriptor defaults are for NVIDIA GPUs with TMA")
def test_fp8_descriptors_by_default(monkeypatch):
    """Without the descriptors variable a dense fp8 call at hd 128 takes host-made descriptors, one at
    hd 96 (a head dim narrower than its block) the pointer loads, and a varlen one at hd 128 too."""
    monkeypatch.delenv(triton_backend.tuning.DESCRIPTORS_VARIABLE, raising=False)
    chosen = recorded_descriptors(monkeypatch)
    ones = torch.ones(3, 1, 2, device=DEVICE)
    for headdim in (128, 96):
        q = torch.randn(1, 256, 2, headdim, device=DEVICE).to(FP8)
        triton_backend.forward(q, q, q, headdim ** -0.5, window=(-1, 0), descales=ones)
    packed = torch.randn(256, 2, 128, device=DEVICE).to(FP8)
    cu = make_cu_seqlens([256], DEVICE)
    triton_backend.forward(packed, packed, packed, 128 ** -0.5, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=256,
                           max_seqlen_k=256, descales=ones)
    kernels = triton_backend.kernels
    assert chosen == [kernels.HOST_DESCRIPTORS.value, kernels.POINTER_BLOCKS.value, kernels.POINTER_BLOCKS.value]


def test_fp8_keeps_a_long_tail():
    """Rows with a peak key and a long tail of keys 8 nats below it (fp8_checks.long_tail_inputs):
    P scaled by 2^8 (fp8_kernels.E4M3_P_SCALE_LOG2) keeps the tail in P . V; P in [0, 1] lost it."""
    (q8, k8, v8), descales = long_tail_inputs()
    out, lse, _ = flash_attn.flash_attn_func(
        *_on_device((q8, k8, v8)), return_attn_probs=True,
        **dict(zip(("q_descale", "k_descale", "v_descale"), _on_device(descales))))
    assert_long_tail_kept(out.cpu(), lse.cpu(), q8, k8, v8, descales)


def test_fp8_without_descales_is_descale_one():
    """None descales mean 1.0 (FlashAttention 3's default): inputs already in e4m3's range; head
    dim 16 (the kernel's head block is then 32, tl.dot's smallest for 8-bit operands)."""
    q8, k8, v8 = (torch.randn(1, 40, 2, 16).to(FP8) for _ in range(3))
    out, lse, _ = flash_attn.flash_attn_func(*_on_device((q8, k8, v8)), causal=True, return_attn_probs=True)
    ones = [torch.ones(1, 2) for _ in range(3)]
    assert_fp8_close(out.cpu(), lse.cpu(), *references(q8, k8, v8, ones, 0.25, causal=True))


def test_fp8_varlen():
    """Packed sequences of lengths 0, 1, 37 and 64 (GQA, causal), descales per sequence; each sequence
    against the references run on it alone, the rows outside every sequence left at zero."""
    lengths, nheads, nheads_k, headdim = [0, 1, 37, 64], 4, 2, 32
    sequences = [_inputs(1, n, n, nheads, nheads_k, headdim, magnitude=1.0 + b) for b, n in enumerate(lengths)]
    packed = [torch.cat([tensors[i][0] for tensors, _ in sequences]) for i in range(3)]
    descales = [torch.cat([d[i] for _, d in sequences]) for i in range(3)]
    cu = make_cu_seqlens(lengths, DEVICE)
    out, lse, _ = flash_attn.flash_attn_varlen_func(
        *_on_device(packed), cu, cu, max(lengths), max(lengths), causal=True, return_attn_probs=True,
        **dict(zip(("q_descale", "k_descale", "v_descale"), _on_device(descales))))
    out, lse, starts = out.cpu(), lse.cpu(), cu.tolist()
    for b, ((q8, k8, v8), seq_descales) in enumerate(sequences):
        if lengths[b] == 0:
            continue
        rows = slice(starts[b], starts[b + 1])
        assert_fp8_close(out[rows].unsqueeze(0), lse[:, rows].unsqueeze(0),
                         *references(q8, k8, v8, seq_descales, headdim ** -0.5, causal=True))


def test_fp8_under_torch_compile():
    """torch.compile(fullgraph=True) traces the fp8 op through its fake kernel and runs the same kernel."""
    (q8, k8, v8), descales = _inputs(1, 33, 33, 2, 1, 32)
    args = _on_device((q8, k8, v8))
    kwargs = dict(zip(("q_descale", "k_descale", "v_descale"), _on_device(descales)), causal=True)
    compiled = torch.compile(flash_attn.flash_attn_func, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(*args, **kwargs), flash_attn.flash_attn_func(*args, **kwargs), atol=0, rtol=0)


@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
def test_fp8_opcheck(varlen):
    """torch.library.opcheck of flash_attn::triton_fwd_fp8: fake kernel, autograd registration, AOT
    dispatch. (opcheck's test_schema is left out: it multiplies the inputs, which torch cannot do
    in float8_e4m3fn.)"""
    q, k, v = (torch.randn(1, 20, 2, 32).to(FP8).to(DEVICE) for _ in range(3))
    descale = torch.rand(1, 2, device=DEVICE) + 0.5
    args = (q, k, v, descale, descale, None, None, None, 20, 20, 0.2, -1, 0, 0.0, None)
    if varlen:
        cu = torch.tensor([0, 7, 20], dtype=torch.int32, device=DEVICE)
        args = (q[0], k[0], v[0], None, torch.ones(2, 2, device=DEVICE), None, cu, cu, 13, 13, 0.2, 5, -1, 5.0, None)
    torch.library.opcheck(torch.ops.flash_attn.triton_fwd_fp8.default, args,
                          test_utils=("test_faketensor", "test_autograd_registration", "test_aot_dispatch_dynamic"))


def test_fp8_has_no_backward():
    q8, k8, v8 = (torch.randn(1, 16, 1, 32).to(FP8).to(DEVICE).requires_grad_() for _ in range(3))
    out = flash_attn.flash_attn_func(q8, k8, v8)
    with pytest.raises(NotImplementedError, match="no backward .FlashAttention 3 has no fp8 backward"):
        out.float().sum().backward()


FP8_ERRORS = {  # name: (arguments to the call over fp8 tensors (1, 8, 2, 32), exception, message)
    "descale_with_bf16": (dict(dtype=torch.bfloat16, q_descale=torch.ones(1, 2)), ValueError,
                          "q_descale applies to float8_e4m3fn inputs only"),
    "descale_shape": (dict(k_descale=torch.ones(2, 1)), ValueError,
                      r"k_descale must have shape \(batch, nheads_k\) = \(1, 2\), got \(2, 1\)"),
    "descale_dtype": (dict(v_descale=torch.ones(1, 2, dtype=torch.float16)), TypeError,
                      "v_descale must be float32"),
    "dropout": (dict(dropout_p=0.1), ValueError, "dropout_p must be 0 with float8_e4m3fn"),
    "k_not_fp8": (dict(k_dtype=torch.bfloat16), TypeError, "k has dtype torch.bfloat16 but q has torch.float8_e4m3fn"),
}


@pytest.mark.parametrize("name", FP8_ERRORS)
def test_fp8_errors(name):
    options, exception, message = FP8_ERRORS[name]
    options = dict(options)
    dtype, k_dtype = options.pop("dtype", FP8), options.pop("k_dtype", None)
    q, k, v = (torch.randn(1, 8, 2, 32).to(dtype).to(DEVICE) for _ in range(3))
    if k_dtype is not None:
        k = k.to(k_dtype)
    options = {key: value.to(DEVICE) if isinstance(value, torch.Tensor) else value for key, value in options.items()}
    with pytest.raises(exception, match=message):
        flash_attn.flash_attn_func(q, k, v, **options)


@pytest.mark.skipif(DEVICE != "cpu", reason="CPU tensors outside the interpreter")
def test_fp8_cpu_tensors_need_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q = torch.randn(1, 8, 2, 32).to(FP8)
    with pytest.raises(TypeError, match="float8_e4m3fn inputs run the Triton backend, which needs GPU tensors"):
        flash_attn.flash_attn_func(q, q, q)


def test_fp8_kvcache_is_refused():
    q = torch.randn(1, 1, 2, 32).to(FP8).to(DEVICE)
    cache = torch.randn(1, 16, 2, 32).to(FP8).to(DEVICE)
    with pytest.raises(TypeError, match="q has dtype torch.float8_e4m3fn"):
        flash_attn.flash_attn_with_kvcache(q, cache, cache.clone())


@triton.jit
def _cast_kernel(P, X, P8, X16, N: tl.constexpr, INTERPRETER_ROUNDING: tl.constexpr):
    offsets = tl.arange(0, N)
    tl.store(P8 + offsets, _pv_operand(tl.load(P + offsets), tl.float8e4nv, INTERPRETER_ROUNDING))
    tl.store(X16 + offsets, _output(tl.load(X + offsets), tl.bfloat16, INTERPRETER_ROUNDING))


def _probabilities_to_cast(n):
    """n values in [0, 256] (P's range, fp8_kernels.E4M3_P_SCALE_LOG2): every e4m3 value there, the
    exact ties between neighbours, the smallest tie (rounds to 0), a value just below 2^-6 (the
    subnormal edge), and random ones spread over the exponents 2^-12..2^8."""
    grid = torch.arange(0, 127, dtype=torch.uint8).view(FP8).float()  # every e4m3 value in [0, 448)
    grid = grid[grid <= 2 ** E4M3_P_SCALE_LOG2.value]
    ties = (grid[1:] + grid[:-1]) / 2
    edges = torch.tensor([2.0 ** -10, 0.0155])
    spread = 2.0 ** (torch.rand(n - grid.numel() - ties.numel() - edges.numel()) * 20 - 12)
    return torch.cat([grid, ties, edges, spread])


def _bf16_ties(x):
    """The midpoints between each bfloat16 value of x and its neighbour one unit further from 0 (exact in fp32)."""
    low = x.bfloat16().float()
    high = (low.view(torch.int32) + 65536).view(torch.float32)
    return (low + high) / 2


@pytest.mark.parametrize("interpreter_rounding", [True] + ([False] if DEVICE == "cuda" else []),
                         ids=lambda r: "rounded_first" if r else "hardware_cast")
def test_casts_match_torch(interpreter_rounding):
    """The fp8 kernel's two narrowing casts give torch's values (round to nearest even) bit for bit:
    P to e4m3, and the output to bfloat16 (randn values and exact ties). Under the interpreter only
    the rounded-first path runs (its own casts are what the rounding works around); on a GPU both."""
    n = 4096
    p = _probabilities_to_cast(n).to(DEVICE)
    x = torch.randn(n)
    x[:64] = _bf16_ties(x[:64])
    x = x.to(DEVICE)
    p8, x16 = torch.empty(n, dtype=FP8, device=DEVICE), torch.empty(n, dtype=torch.bfloat16, device=DEVICE)
    _cast_kernel[(1,)](p, x, p8, x16, N=n, INTERPRETER_ROUNDING=interpreter_rounding)
    assert torch.equal(p8.view(torch.uint8).cpu(), p.cpu().to(FP8).view(torch.uint8))
    assert torch.equal(x16.view(torch.int16).cpu(), x.cpu().bfloat16().view(torch.int16))
