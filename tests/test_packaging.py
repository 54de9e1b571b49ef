"""The package imports, exposes its API, registers its ops and reports its build (CPU, runs in CI;
on the GPU machine the same tests check the built extension)."""

import re

import pytest
import torch

import flash_attn
import flash_attn.ops
from helpers import make_qkv

OPCHECK_UTILS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def test_version_and_public_names():
    assert re.fullmatch(r"\d+\.\d+\.\d+([.+-]?\w+)*", flash_attn.__version__)
    assert set(flash_attn.__all__) == {"flash_attn_func", "flash_attn_kvpacked_func", "flash_attn_qkvpacked_func",
                                       "__version__"}
    for name in flash_attn.__all__:
        assert getattr(flash_attn, name) is not None
    for name in ("flash_attn_func", "flash_attn_kvpacked_func", "flash_attn_qkvpacked_func"):
        assert callable(getattr(flash_attn, name)) and getattr(flash_attn, name).__doc__


def test_ops_are_registered():
    for op in (torch.ops.flash_attn.fwd, torch.ops.flash_attn.bwd):
        assert isinstance(op.default, torch._ops.OpOverload)
    assert "softmax_scale" in str(torch.ops.flash_attn.fwd.default._schema)
    assert torch._C._dispatch_has_kernel_for_dispatch_key("flash_attn::fwd", "CPU")
    assert torch._C._dispatch_has_kernel_for_dispatch_key("flash_attn::bwd", "CPU")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("nheads_k", [4, 2])
def test_opcheck_cpu(causal, nheads_k):
    """torch.library.opcheck runs test_schema, test_autograd_registration, test_faketensor and
    test_aot_dispatch_dynamic on both ops, including non-contiguous (packed-slice) inputs."""
    q, k, v, dout = make_qkv(2, 5, 7, 4, nheads_k, 16, torch.bfloat16, "cpu")
    kv = torch.stack((k, v), dim=2)  # k, v below are slices of it: non-contiguous, like kvpacked
    k, v = kv.unbind(2)
    args = [t.requires_grad_() for t in (q, k.detach(), v.detach())] + [0.25, causal]
    result = torch.library.opcheck(torch.ops.flash_attn.fwd.default, args, test_utils=OPCHECK_UTILS)
    assert set(result.values()) == {"SUCCESS"}, result
    out, lse = torch.ops.flash_attn.fwd(*args)
    bwd_args = (dout, q.detach(), k.detach(), v.detach(), out.detach(), lse.detach(), 0.25, causal)
    result = torch.library.opcheck(torch.ops.flash_attn.bwd.default, bwd_args, test_utils=OPCHECK_UTILS)
    assert set(result.values()) == {"SUCCESS"}, result


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
