"""Bad inputs raise a clear error naming the argument, before any kernel runs (CPU, runs in CI)."""

import pytest
import torch

import flash_attn
from flash_attn import validation

BF16 = torch.bfloat16


def qkv(q_shape=(2, 8, 4, 16), kv_shape=(2, 8, 4, 16), dtype=BF16, **overrides):
    """Valid q, k, v; `overrides` replaces one of them by name."""
    tensors = {"q": torch.randn(q_shape, dtype=dtype), "k": torch.randn(kv_shape, dtype=dtype),
               "v": torch.randn(kv_shape, dtype=dtype)}
    tensors.update(overrides)
    return tensors["q"], tensors["k"], tensors["v"]


BAD_INPUTS = {  # name: (q, k, v, exception, message pattern)
    "k_on_other_device": (*qkv(k=torch.randn(2, 8, 4, 16, dtype=BF16, device="meta")), ValueError,
                          r"k is on meta but q is on cpu"),
    "v_on_other_device": (*qkv(v=torch.randn(2, 8, 4, 16, dtype=BF16, device="meta")), ValueError,
                          r"v is on meta but q is on cpu"),
    "q_fp64": (*qkv(dtype=torch.float64), TypeError,
               r"q has dtype torch.float64; supported dtypes are float32, float16 and bfloat16"),
    "q_int": (*qkv(q=torch.ones(2, 8, 4, 16, dtype=torch.int32)), TypeError, r"q has dtype torch.int32"),
    "k_fp16_q_bf16": (*qkv(k=torch.randn(2, 8, 4, 16, dtype=torch.float16)), TypeError,
                      r"k has dtype torch.float16 but q has torch.bfloat16"),
    "v_fp32_q_bf16": (*qkv(v=torch.randn(2, 8, 4, 16)), TypeError, r"v has dtype torch.float32 but q"),
    "q_rank_3": (*qkv(q=torch.randn(8, 4, 16, dtype=BF16)), ValueError, r"q must have 4 dims"),
    "k_rank_5": (*qkv(k=torch.randn(2, 8, 4, 16, 1, dtype=BF16)), ValueError, r"k must have 4 dims"),
    "v_rank_3": (*qkv(v=torch.randn(8, 4, 16, dtype=BF16)), ValueError, r"v must have 4 dims"),
    "k_v_seqlen_differ": (*qkv(v=torch.randn(2, 9, 4, 16, dtype=BF16)), ValueError,
                          r"k and v must have the same shape"),
    "k_v_heads_differ": (*qkv(v=torch.randn(2, 8, 2, 16, dtype=BF16)), ValueError, r"k and v must have the same"),
    "batch_mismatch": (*qkv(kv_shape=(3, 8, 4, 16)), ValueError, r"k has batch 3 but q has batch 2"),
    "headdim_mismatch": (*qkv(kv_shape=(2, 8, 4, 24)), ValueError, r"k and v have headdim 24 but q has headdim 16"),
    "headdim_257": (*qkv(q_shape=(2, 8, 4, 257), kv_shape=(2, 8, 4, 257)), ValueError,
                    r"headdim 257 is not supported; it must be between 1 and 256"),
    "headdim_0": (*qkv(q_shape=(2, 8, 4, 0), kv_shape=(2, 8, 4, 0)), ValueError, r"headdim 0 is not supported"),
    "nheads_not_multiple": (*qkv(kv_shape=(2, 8, 3, 16)), ValueError,
                            r"nheads of q \(4\) must be a multiple of nheads of k/v \(3\)"),
    "nheads_k_zero": (*qkv(kv_shape=(2, 8, 0, 16)), ValueError, r"nheads of q \(4\) must be a multiple"),
    "q_last_dim_strided": (*qkv(q=torch.randn(2, 8, 4, 32, dtype=BF16)[..., ::2]), ValueError,
                           r"q must have a contiguous last dimension"),
    "k_last_dim_strided": (*qkv(k=torch.randn(2, 8, 4, 32, dtype=BF16)[..., ::2]), ValueError,
                           r"k must have a contiguous last dimension"),
    "v_last_dim_strided": (*qkv(v=torch.randn(2, 16, 4, 8, dtype=BF16).transpose(1, 3)), ValueError,
                           r"v must have a contiguous last dimension"),
    "q_not_a_tensor": (*qkv(q=[[1.0]]), TypeError, r"q must be a torch.Tensor, got list"),
    "v_not_a_tensor": (*qkv(v=None), TypeError, r"v must be a torch.Tensor, got NoneType"),
}


@pytest.mark.parametrize("case", BAD_INPUTS, ids=str)
def test_bad_inputs_raise_naming_the_argument(case):
    q, k, v, exception, message = BAD_INPUTS[case]
    with pytest.raises(exception, match=message):
        flash_attn.flash_attn_func(q, k, v)


BAD_OPTIONS = {  # name: (kwargs, exception, message pattern); q has batch 2, 4 heads
    "dropout_negative": (dict(dropout_p=-0.1), ValueError, r"dropout_p must be a float in \[0, 1\), got -0.1"),
    "dropout_one": (dict(dropout_p=1.0), ValueError, r"dropout_p must be a float in \[0, 1\)"),
    "dropout_tensor": (dict(dropout_p=torch.tensor(0.1)), ValueError, r"dropout_p must be a float"),
    "window_one_entry": (dict(window_size=(4,)), ValueError, r"window_size must be a pair \(left, right\)"),
    "window_below_minus_one": (dict(window_size=(-2, 0)), ValueError, r"window_size must be a pair .* >= -1"),
    "window_float": (dict(window_size=(1.5, 0)), ValueError, r"window_size must be a pair \(left, right\) of ints"),
    "softcap_negative": (dict(softcap=-1.0), ValueError, r"softcap must be a finite float >= 0"),
    "softcap_inf": (dict(softcap=float("inf")), ValueError, r"softcap must be a finite float >= 0"),
    "deterministic_str": (dict(deterministic="yes"), TypeError, r"deterministic must be a bool"),
    "alibi_fp16": (dict(alibi_slopes=torch.ones(4, dtype=torch.float16)), TypeError,
                   r"alibi_slopes must be float32, got torch.float16"),
    "alibi_list": (dict(alibi_slopes=[1.0] * 4), TypeError, r"alibi_slopes must be a torch.Tensor, got list"),
    "alibi_wrong_heads": (dict(alibi_slopes=torch.ones(3)), ValueError,
                          r"alibi_slopes must have shape \(nheads,\) = \(4,\) or \(batch, nheads\) = \(2, 4\), "
                          r"got \(3,\)"),
    "alibi_wrong_batch": (dict(alibi_slopes=torch.ones(3, 4)), ValueError, r"alibi_slopes must have shape"),
    "alibi_other_device": (dict(alibi_slopes=torch.ones(4, device="meta")), ValueError,
                           r"alibi_slopes is on meta but q is on cpu"),
}
PUBLIC_CALLS = {  # name: call(kwargs) on valid CPU inputs
    "flash_attn_func": lambda **kw: flash_attn.flash_attn_func(*qkv(), **kw),
    "flash_attn_qkvpacked_func": lambda **kw: flash_attn.flash_attn_qkvpacked_func(
        torch.randn(2, 8, 3, 4, 16, dtype=BF16), **kw),
    "flash_attn_kvpacked_func": lambda **kw: flash_attn.flash_attn_kvpacked_func(
        torch.randn(2, 8, 4, 16, dtype=BF16), torch.randn(2, 8, 2, 2, 16, dtype=BF16), **kw),
}


@pytest.mark.parametrize("function", PUBLIC_CALLS)
@pytest.mark.parametrize("case", BAD_OPTIONS)
def test_bad_options_raise_naming_the_argument(case, function):
    kwargs, exception, message = BAD_OPTIONS[case]
    with pytest.raises(exception, match=message):
        PUBLIC_CALLS[function](**kwargs)


def varlen_call(total_q=10, total_k=12, **overrides):
    """flash_attn_varlen_func on valid (2-sequence) CPU inputs, with `overrides` replacing arguments."""
    args = dict(q=torch.randn(total_q, 4, 16, dtype=BF16), k=torch.randn(total_k, 2, 16, dtype=BF16),
                v=torch.randn(total_k, 2, 16, dtype=BF16), cu_seqlens_q=torch.tensor([0, 4, 10], dtype=torch.int32),
                cu_seqlens_k=torch.tensor([0, 5, 12], dtype=torch.int32), max_seqlen_q=6, max_seqlen_k=7)
    args.update(overrides)
    return flash_attn.flash_attn_varlen_func(**args)


BAD_VARLEN = {  # name: (overrides, exception, message pattern)
    "cu_seqlens_q_int64": (dict(cu_seqlens_q=torch.tensor([0, 4, 10])), TypeError,
                           r"cu_seqlens_q must be int32, got torch.int64"),
    "cu_seqlens_k_2d": (dict(cu_seqlens_k=torch.zeros(1, 3, dtype=torch.int32)), ValueError,
                        r"cu_seqlens_k must have shape \(batch \+ 1,\)"),
    "cu_seqlens_k_none": (dict(cu_seqlens_k=None), TypeError, r"cu_seqlens_k must be a torch.Tensor"),
    "cu_seqlens_mismatch": (dict(cu_seqlens_k=torch.tensor([0, 12], dtype=torch.int32)), ValueError,
                            r"cu_seqlens_q \(3,\) and cu_seqlens_k \(2,\) must both have batch \+ 1 entries"),
    "cu_seqlens_other_device": (dict(cu_seqlens_q=torch.zeros(3, dtype=torch.int32, device="meta")), ValueError,
                                r"cu_seqlens_q is on meta but q is on cpu"),
    "max_seqlen_negative": (dict(max_seqlen_q=-1), ValueError, r"max_seqlen_q must be a non-negative int, got -1"),
    "max_seqlen_tensor": (dict(max_seqlen_k=torch.tensor(7)), ValueError, r"max_seqlen_k must be a non-negative int"),
    "q_rank_4": (dict(q=torch.randn(1, 10, 4, 16, dtype=BF16)), ValueError,
                 r"q must have 3 dims \(total_tokens, nheads, headdim\)"),
    "alibi_batch_mismatch": (dict(alibi_slopes=torch.ones(3, 4)), ValueError,
                             r"alibi_slopes must have shape \(nheads,\) = \(4,\) or \(batch, nheads\) = \(2, 4\)"),
    "block_table_unpaged_k": (dict(block_table=torch.zeros(2, 1, dtype=torch.int32)), ValueError,
                              r"k must have 4 dims \(num_pages, page_size, nheads_k, headdim\)"),
    "block_table_int64": (dict(block_table=torch.zeros(2, 1, dtype=torch.int64), k=torch.randn(3, 16, 2, 16, dtype=BF16),
                               v=torch.randn(3, 16, 2, 16, dtype=BF16)), TypeError, r"block_table must be int32"),
    "block_table_dropout": (dict(block_table=torch.zeros(2, 1, dtype=torch.int32), dropout_p=0.1,
                                 k=torch.randn(3, 16, 2, 16, dtype=BF16), v=torch.randn(3, 16, 2, 16, dtype=BF16)),
                            ValueError, r"dropout_p must be 0 with block_table"),
    "block_table_page_size": (dict(block_table=torch.zeros(2, 1, dtype=torch.int32),
                                   k=torch.randn(3, 8, 2, 16, dtype=BF16), v=torch.randn(3, 8, 2, 16, dtype=BF16)),
                              ValueError, r"page size \(k.shape\[1\]\) must be a multiple of 16"),
}


@pytest.mark.parametrize("case", BAD_VARLEN)
def test_bad_varlen_inputs(case):
    overrides, exception, message = BAD_VARLEN[case]
    with pytest.raises(exception, match=message):
        varlen_call(**overrides)


def test_bad_varlen_packed_inputs():
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"qkv must have shape \(total_tokens, 3, nheads, headdim\)"):
        flash_attn.flash_attn_varlen_qkvpacked_func(torch.randn(8, 2, 4, 16, dtype=BF16), cu, 5)
    with pytest.raises(ValueError, match=r"kv must have shape \(total_tokens, 2, nheads, headdim\)"):
        flash_attn.flash_attn_varlen_kvpacked_func(torch.randn(8, 4, 16, dtype=BF16), torch.randn(8, 4, 16, dtype=BF16),
                                                   cu, cu, 5, 5)


@pytest.mark.parametrize("function", PUBLIC_CALLS)
def test_defaults_spelled_out_are_accepted(function):
    """FA2 callers pass the defaults explicitly, window_size often as a list."""
    out = PUBLIC_CALLS[function](dropout_p=0.0, window_size=[-1, -1], softcap=0.0, alibi_slopes=None,
                                 deterministic=False)
    assert out.shape == (2, 8, 4, 16)


BAD_PACKED = {  # name: (call, exception, message pattern)
    "qkv_rank_4": (lambda: flash_attn.flash_attn_qkvpacked_func(torch.randn(2, 8, 12, 16, dtype=BF16)),
                   ValueError, r"qkv must have shape \(batch, seqlen, 3, nheads, headdim\), got \(2, 8, 12, 16\)"),
    "qkv_packed_2": (lambda: flash_attn.flash_attn_qkvpacked_func(torch.randn(2, 8, 2, 4, 16, dtype=BF16)),
                     ValueError, r"qkv must have shape \(batch, seqlen, 3, nheads, headdim\)"),
    "qkv_not_tensor": (lambda: flash_attn.flash_attn_qkvpacked_func((1, 2, 3)), TypeError,
                       r"qkv must be a torch.Tensor, got tuple"),
    "kv_packed_3": (lambda: flash_attn.flash_attn_kvpacked_func(torch.randn(2, 8, 4, 16, dtype=BF16),
                                                                torch.randn(2, 8, 3, 4, 16, dtype=BF16)),
                    ValueError, r"kv must have shape \(batch, seqlen, 2, nheads, headdim\)"),
    "kv_rank_4": (lambda: flash_attn.flash_attn_kvpacked_func(torch.randn(2, 8, 4, 16, dtype=BF16),
                                                              torch.randn(2, 8, 8, 16, dtype=BF16)),
                  ValueError, r"kv must have shape"),
    "kvpacked_q_rank_3": (lambda: flash_attn.flash_attn_kvpacked_func(torch.randn(8, 4, 16, dtype=BF16),
                                                                      torch.randn(2, 8, 2, 4, 16, dtype=BF16)),
                          ValueError, r"q must have 4 dims"),
    "kvpacked_heads": (lambda: flash_attn.flash_attn_kvpacked_func(torch.randn(2, 8, 4, 16, dtype=BF16),
                                                                   torch.randn(2, 8, 2, 3, 16, dtype=BF16)),
                       ValueError, r"must be a multiple of nheads of k/v \(3\)"),
}


@pytest.mark.parametrize("case", BAD_PACKED)
def test_bad_packed_inputs(case):
    call, exception, message = BAD_PACKED[case]
    with pytest.raises(exception, match=message):
        call()


@pytest.mark.parametrize("capability,ok", [((7, 5), False), ((7, 0), False), ((6, 1), False), ((8, 0), True),
                                           ((8, 6), True), ((9, 0), True), ((10, 0), True)])
def test_cuda_capability(monkeypatch, capability, ok):
    """sm80 or newer; older GPUs get a RuntimeError naming their capability. (No fake CUDA tensor
    exists on a CPU machine, so the check is called directly with a faked capability.)"""
    monkeypatch.setattr(validation, "_cuda_capability", lambda index: capability)
    if ok:
        validation.check_cuda_capability(torch.device("cuda", 0))
    else:
        with pytest.raises(RuntimeError, match=rf"compute capability {capability[0]}\.{capability[1]}; "
                                               r"flash_attn needs sm80 \(Ampere\) or newer"):
            validation.check_cuda_capability(torch.device("cuda", 0))


def test_cuda_capability_is_queried_per_device(monkeypatch):
    seen = []
    monkeypatch.setattr(validation, "_cuda_capability", lambda index: seen.append(index) or (9, 0))
    validation.check_cuda_capability(torch.device("cuda", 1))
    assert seen == [1]


@pytest.mark.parametrize("softmax_scale", [0.0, -0.125, float("inf"), float("nan")])
def test_softmax_scale_must_be_positive_and_finite(softmax_scale):
    with pytest.raises(ValueError, match=r"softmax_scale must be a positive finite number"):
        flash_attn.flash_attn_func(*qkv(), softmax_scale=softmax_scale)
