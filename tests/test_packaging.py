"""The package imports, exposes its API, registers its ops and reports its build (CPU, runs in CI;
on the GPU machine the same tests check the built extension)."""

import re

import pytest
import torch

import flash_attn
import flash_attn.ops
from helpers import opcheck_both_ops

PUBLIC_FUNCTIONS = ("flash_attn_func", "flash_attn_kvpacked_func", "flash_attn_qkvpacked_func", "flash_attn_varlen_func",
                    "flash_attn_varlen_kvpacked_func", "flash_attn_varlen_qkvpacked_func", "flash_attn_with_kvcache")


def test_version_and_public_names():
    assert re.fullmatch(r"\d+\.\d+\.\d+([.+-]?\w+)*", flash_attn.__version__)
    assert set(flash_attn.__all__) == set(PUBLIC_FUNCTIONS) | {"__version__"}
    for name in flash_attn.__all__:
        assert getattr(flash_attn, name) is not None
    for name in PUBLIC_FUNCTIONS:
        assert callable(getattr(flash_attn, name)) and getattr(flash_attn, name).__doc__


def test_flash_attn_interface_module_path():
    """FA2's module path: `from flash_attn.flash_attn_interface import ...` finds the same functions."""
    import flash_attn.flash_attn_interface as fai

    for name in PUBLIC_FUNCTIONS:
        assert getattr(fai, name) is getattr(flash_attn, name)


def test_signatures_match_flash_attention_2():
    """Argument names, order and defaults as in FlashAttention 2 (2.6+)."""
    import inspect

    options = ["dropout_p=0.0", "softmax_scale=None", "causal=False", "window_size=(-1, -1)", "softcap=0.0",
               "alibi_slopes=None", "deterministic=False", "return_attn_probs=False"]
    expected = {
        "flash_attn_func": ["q", "k", "v"] + options,
        "flash_attn_qkvpacked_func": ["qkv"] + options,
        "flash_attn_kvpacked_func": ["q", "kv"] + options,
        "flash_attn_varlen_func": ["q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k"]
        + options + ["block_table=None"],
        "flash_attn_varlen_qkvpacked_func": ["qkv", "cu_seqlens", "max_seqlen"] + options,
        "flash_attn_varlen_kvpacked_func": ["q", "kv", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q",
                                            "max_seqlen_k"] + options,
        "flash_attn_with_kvcache": ["q", "k_cache", "v_cache", "k=None", "v=None", "rotary_cos=None",
                                    "rotary_sin=None", "cache_seqlens=None", "cache_batch_idx=None",
                                    "cache_leftpad=None", "block_table=None", "softmax_scale=None", "causal=False",
                                    "window_size=(-1, -1)", "softcap=0.0", "rotary_interleaved=True",
                                    "alibi_slopes=None", "num_splits=0", "return_softmax_lse=False"],
    }
    for name, parameters in expected.items():
        assert [str(p) for p in inspect.signature(getattr(flash_attn, name)).parameters.values()] == parameters


def test_ops_are_registered():
    for op in (torch.ops.flash_attn.fwd, torch.ops.flash_attn.bwd):
        assert isinstance(op.default, torch._ops.OpOverload)
    assert "softmax_scale" in str(torch.ops.flash_attn.fwd.default._schema)
    assert torch._C._dispatch_has_kernel_for_dispatch_key("flash_attn::fwd", "CPU")
    assert torch._C._dispatch_has_kernel_for_dispatch_key("flash_attn::bwd", "CPU")


OPCHECK_CASES = {  # name: kwargs of opcheck_both_ops
    "plain": dict(nheads_k=4, window=(-1, -1)),
    "causal_gqa": dict(nheads_k=2, window=(-1, 0)),
    "window_softcap_alibi": dict(nheads_k=2, window=(2, 1), softcap=3.0, alibi=True),
    "varlen_causal": dict(nheads_k=2, window=(-1, 0), varlen=True, alibi=True),
    # dropout draws a new mask per call, so only the checks that compare no values across calls
    "dropout": dict(nheads_k=2, window=(-1, 0), dropout_p=0.2, test_utils=("test_schema", "test_faketensor")),
}


@pytest.mark.parametrize("case", OPCHECK_CASES)
def test_opcheck_cpu(case):
    opcheck_both_ops("cpu", **OPCHECK_CASES[case])


def test_build_report():
    """has_cuda_kernels / cuda_kernels_unavailable_reason / compiled_configs tell one consistent story."""
    if flash_attn.ops.has_cuda_kernels():
        assert flash_attn.ops.cuda_kernels_unavailable_reason() is None
        configs = flash_attn.ops.compiled_configs()
        assert configs, "the extension was built with no (dtype, headdim) at all"
        for dtype, headdim in configs:
            assert dtype in (torch.float16, torch.bfloat16) and isinstance(headdim, int)
            assert headdim % 8 == 0 and 8 <= headdim <= 256
        assert torch._C._dispatch_has_kernel_for_dispatch_key("flash_attn::fwd", "CUDA")
        assert torch._C._dispatch_has_kernel_for_dispatch_key("flash_attn::bwd", "CUDA")
    else:
        reason = flash_attn.ops.cuda_kernels_unavailable_reason()
        assert isinstance(reason, str) and "flash_attn._C" in reason
        assert flash_attn.ops.compiled_configs() == set()
        with pytest.raises(RuntimeError, match="flash_attn._C could not be imported"):
            flash_attn.ops.set_poison_outputs(True)
