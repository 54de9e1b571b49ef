"""The CUDA fp8 (e4m3) forward on Hopper (flash_attn::fwd_fp8, csrc/torch/ops_fp8.cpp), FlashAttention
3's FP8 API: its arch pieces on their own (tests/cuda/wgmma_fp8_layouts.cu), the op against an fp64
reference of the dequantized inputs with the fp8 rule of fp8_checks.py (RMSE, outputs poisoned),
the public functions' choice between it and the Triton backend, torch.compile, and its errors.
"""

import pytest
import torch

import flash_attn
from flash_attn import backend
from fp8_checks import (FP8, assert_fp8_close, assert_long_tail_kept, chained_accumulator_bits, long_tail_inputs,
                        quantize, references)
from helpers import CUDA_KERNELS_ONLY, GPU_TEST_MARKS, run_sm90_layout_check

def _fp8_headdims():
    if not torch.cuda.is_available() or not flash_attn.ops.has_cuda_kernels():
        return ()
    return flash_attn.ops.fp8_forward_headdims(torch.cuda.current_device())


pytestmark = GPU_TEST_MARKS + [
    CUDA_KERNELS_ONLY,  # the CUDA fp8 forward; tests/test_triton_fp8.py checks the Triton one
    pytest.mark.skipif(not _fp8_headdims(), reason="needs an sm_90a GPU and a build with the fp8 forward"),
]


def test_e4m3_operand_layouts(tmp_path):
    """tests/cuda/wgmma_fp8_layouts.cu: the e4m3 S product and P.V through the permuted V, exactly."""
    run_sm90_layout_check("wgmma_fp8_layouts.cu", tmp_path)


def _accumulator_bits(headdim):
    """The lse allowance's bits for this kernel: it accumulates S over its head dim's k-steps of 32
    inside the tensor core (a chain of wgmma with scale-d): fp8_checks.chained_accumulator_bits of
    the kernel's head dim. Measured (H100, hd 128, inputs quantized from randn * 2): lse off by up
    to 2^-12.45 * scale * sum |q k| (the Triton backend's fp8 forward passes with fp8_checks' 2^-13
    on such inputs)."""
    return chained_accumulator_bits(min(d for d in _fp8_headdims() if d >= headdim))


def _inputs(batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, magnitude=1.0):
    """Quantized q, k, v (float8_e4m3fn, CPU) and their float32 (batch, nheads_k) descales."""
    new = lambda s, h: torch.randn(batch, s, h, headdim) * magnitude  # noqa: E731
    quantized = [quantize(x, nheads_k) for x in (new(seqlen_q, nheads), new(seqlen_k, nheads_k),
                                                  new(seqlen_k, nheads_k))]
    return [x8 for x8, _ in quantized], [d for _, d in quantized]


def _run_op(q8, k8, v8, descales, causal=False, window_size=(-1, -1)):
    """flash_attn::fwd_fp8 on the GPU, outputs poisoned: (out, lse) on the CPU."""
    left, right = window_size
    if causal:
        right = 0
    cuda = [t.cuda() for t in (q8, k8, v8)]
    scales = [None if d is None else d.cuda() for d in descales]
    out, lse = torch.ops.flash_attn.fwd_fp8(*cuda, *scales, None, None, q8.shape[1], k8.shape[1],
                                            q8.shape[-1] ** -0.5, left, right, 0.0, None)
    return out.cpu(), lse.cpu()


# (batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, causal, window_size)
CASES = {
    "hd128": (2, 300, 300, 4, 4, 128, False, (-1, -1)),
    "hd128_causal_gqa": (2, 257, 300, 8, 2, 128, True, (-1, -1)),
    "hd128_window": (1, 400, 400, 2, 2, 128, False, (64, 32)),
    "hd128_one_query_mqa": (3, 1, 1000, 4, 1, 128, False, (-1, -1)),
    "hd128_few_keys": (1, 40, 5, 2, 2, 128, False, (-1, -1)),
    "hd128_long_causal": (1, 1024, 2048, 2, 2, 128, True, (-1, -1)),
    "hd64_on_hd128": (1, 200, 333, 2, 1, 64, False, (-1, -1)),
    "hd96_on_hd128": (1, 129, 129, 2, 2, 96, True, (-1, -1)),
    "hd256": (2, 200, 250, 2, 2, 256, True, (-1, -1)),
    "hd192_on_hd256": (1, 150, 300, 4, 2, 192, False, (-1, -1)),
}


@pytest.mark.parametrize("name", CASES)
def test_fp8_forward(name, cuda_test_setup):
    batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, causal, window_size = CASES[name]
    if not any(headdim <= d for d in _fp8_headdims()):
        pytest.skip(f"no fp8 kernel for head dim {headdim} in this build")
    (q8, k8, v8), descales = _inputs(batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, magnitude=2.0)
    out, lse = _run_op(q8, k8, v8, descales, causal, window_size)
    assert_fp8_close(out, lse, *references(q8, k8, v8, descales, headdim ** -0.5, causal, window_size,
                                           accumulator_bits=_accumulator_bits(headdim)))


@pytest.mark.parametrize("causal", [False, True])
def test_fp8_scores_rising_along_the_walk(causal, cuda_test_setup):
    """Key blocks whose scores rise block by block in the order the kernel walks them (the last block
    first), by a little and by far more than fp32's exponent range (2^128 over the earlier max):
    each step's rescale of O and of the row sum. q and k share a direction u whose weight in k grows
    toward key 0. (A softmax that let the max lag, benchmarks/NOTES.md v30, failed the rule on the
    one-query case instead: the dominant probability stopped being exactly 1 in e4m3.)"""
    headdim, seqlen, block = 128, 1024, 128
    u = torch.ones(headdim)
    weights = torch.tensor([12.0, 6.0, 2.0, 1.0, 0.6, 0.3, 0.1, 0.0])  # per 128-key block, walked right to left
    k_weight = weights.repeat_interleave(block)[:seqlen]
    q = torch.randn(1, seqlen, 2, headdim) + u
    k = torch.randn(1, seqlen, 2, headdim) + k_weight[None, :, None, None] * u
    v = torch.randn(1, seqlen, 2, headdim)
    quantized = [quantize(x, 2) for x in (q, k, v)]
    (q8, k8, v8), descales = [x8 for x8, _ in quantized], [d for _, d in quantized]
    out, lse = _run_op(q8, k8, v8, descales, causal)
    assert_fp8_close(out, lse, *references(q8, k8, v8, descales, headdim ** -0.5, causal,
                                           accumulator_bits=_accumulator_bits(headdim)))


def test_fp8_keeps_a_long_tail(cuda_test_setup):
    """Rows with a peak key and a long tail of keys 8 nats below it (fp8_checks.long_tail_inputs):
    P scaled by 2^8 (Sm90ForwardRows::kProbScaleLog2) keeps the tail in P . V. (P in [0, 1], as the
    rule's pt and the Triton kernel before the scale, loses it; this kernel before the scale was not
    run on these inputs.)"""
    (q8, k8, v8), descales = long_tail_inputs()
    out, lse = _run_op(q8, k8, v8, descales)
    assert_long_tail_kept(out, lse, q8, k8, v8, descales)


def test_fp8_without_descales_is_descale_one(cuda_test_setup):
    q8, k8, v8 = (torch.randn(2, 70, 2, 128).to(FP8) for _ in range(3))
    out, lse = _run_op(q8, k8, v8, (None, None, None), causal=True)
    ones = [torch.ones(2, 2) for _ in range(3)]
    assert_fp8_close(out, lse, *references(q8, k8, v8, ones, 128 ** -0.5, True,
                                           accumulator_bits=_accumulator_bits(128)))


def test_fp8_strided_inputs(cuda_test_setup):
    """q, k, v as views into one packed (batch, seqlen, 3, heads, headdim) tensor."""
    qkv = torch.randn(2, 100, 3, 2, 128).to(FP8)
    q8, k8, v8 = qkv.unbind(2)
    descales = [torch.ones(2, 2) for _ in range(3)]
    cuda = qkv.cuda().unbind(2)
    out, lse = torch.ops.flash_attn.fwd_fp8(*cuda, None, None, None, None, None, 100, 100, 128 ** -0.5, -1, -1, 0.0,
                                            None)
    assert_fp8_close(out.cpu(), lse.cpu(), *references(q8, k8, v8, descales, 128 ** -0.5, False,
                                                       accumulator_bits=_accumulator_bits(128)))


def test_public_functions_choose_the_cuda_kernel(monkeypatch):
    """flash_attn_func sends dense fp8 calls without softcap / ALiBi to flash_attn::fwd_fp8, the
    others (and every call under FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE) to the Triton backend."""
    q = torch.randn(1, 8, 2, 128, device="cuda").to(FP8)
    assert backend.fp8_forward_op(q) is torch.ops.flash_attn.fwd_fp8.default
    assert backend.fp8_forward_op(q, softcap=5.0) is torch.ops.flash_attn.triton_fwd_fp8.default
    assert backend.fp8_forward_op(q, varlen=True) is torch.ops.flash_attn.triton_fwd_fp8.default
    assert backend.fp8_forward_op(q[..., :40]) is torch.ops.flash_attn.triton_fwd_fp8.default  # not a multiple of 16
    monkeypatch.setenv("FLASH_ATTENTION_TRITON_AMD_ENABLE", "TRUE")
    assert backend.fp8_forward_op(q) is torch.ops.flash_attn.triton_fwd_fp8.default


def test_public_function_and_compile(cuda_test_setup):
    """flash_attn_func's result is the op's; torch.compile(fullgraph=True) traces the choice and the op."""
    (q8, k8, v8), descales = _inputs(1, 130, 130, 4, 2, 128)
    args = [t.cuda() for t in (q8, k8, v8)]
    kwargs = dict(zip(("q_descale", "k_descale", "v_descale"), [d.cuda() for d in descales]), causal=True)
    out, lse, _ = flash_attn.flash_attn_func(*args, return_attn_probs=True, **kwargs)
    op_out, op_lse = _run_op(q8, k8, v8, descales, causal=True)
    assert torch.equal(out.cpu(), op_out) and torch.equal(lse.cpu(), op_lse)
    compiled = torch.compile(flash_attn.flash_attn_func, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(*args, **kwargs), out)


def test_fp8_has_no_backward():
    q8, k8, v8 = (torch.randn(1, 16, 1, 128).to(FP8).cuda().requires_grad_() for _ in range(3))
    out = flash_attn.flash_attn_func(q8, k8, v8)
    with pytest.raises(NotImplementedError, match="no backward .FlashAttention 3 has no fp8 backward"):
        out.float().sum().backward()


OP_ERRORS = {  # name: (change to the call's arguments, message)
    "varlen": (dict(cu_seqlens_q=True), "takes dense batches; varlen fp8 runs the Triton backend"),
    "softcap": (dict(softcap=5.0), "has no softcap or alibi_slopes"),
    "bf16": (dict(dtype=torch.bfloat16), "takes float8_e4m3fn q, k and v"),
    "headdim": (dict(headdim=40), "head dims that are multiples of 16"),
    "descale_shape": (dict(q_descale=torch.ones(2, 1)), r"q_descale must be a float32 \(batch, nheads_k\)"),
}


@pytest.mark.parametrize("name", OP_ERRORS)
def test_op_errors(name):
    change, message = OP_ERRORS[name]
    headdim, dtype = change.get("headdim", 128), change.get("dtype", FP8)
    q, k, v = (torch.randn(1, 8, 2, headdim, device="cuda").to(dtype) for _ in range(3))
    cu = torch.tensor([0, 8], dtype=torch.int32, device="cuda") if change.get("cu_seqlens_q") else None
    q_descale = change.get("q_descale")
    with pytest.raises(RuntimeError, match=message):
        torch.ops.flash_attn.fwd_fp8(q, k, v, None if q_descale is None else q_descale.cuda(), None, None, cu, cu, 8, 8,
                                     0.1, -1, -1, change.get("softcap", 0.0), None)
