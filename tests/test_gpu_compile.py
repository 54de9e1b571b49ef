"""The CUDA ops under PyTorch's machinery: torch.library.opcheck, torch.compile(fullgraph=True) of each
public function (forward and backward, inductor), and CUDA graph capture / replay of the forward.
Outputs are poisoned with NaN before every kernel (fixture cuda_test_setup)."""

import pytest
import torch

import flash_attn
import flash_attn.ops
from helpers import GPU_TEST_MARKS, check_public, make_qkv, require_kernel

pytestmark = GPU_TEST_MARKS

OPCHECK_UTILS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


@pytest.mark.parametrize("dtype,headdim,nheads_k,causal,packed", [
    (torch.bfloat16, 64, 4, True, False),
    (torch.float16, 128, 2, False, False),
    (torch.bfloat16, 64, 4, False, True),  # q, k, v slices of one qkv tensor: strided, not contiguous
])
def test_opcheck(dtype, headdim, nheads_k, causal, packed):
    """opcheck on both CUDA ops: schema, autograd registration, fake kernels (shapes, strides, dtypes
    equal the real outputs'), and AOT dispatch with dynamic shapes."""
    require_kernel(dtype, headdim)
    q, k, v, dout = make_qkv(2, 113, 203 if not packed else 113, 4, nheads_k, headdim, dtype, "cuda")
    if packed:
        q, k, v = torch.stack((q, k, v), dim=2).unbind(2)
    args = [t.detach().requires_grad_() for t in (q, k, v)] + [headdim ** -0.5, causal]
    result = torch.library.opcheck(torch.ops.flash_attn.fwd.default, args, test_utils=OPCHECK_UTILS)
    assert set(result.values()) == {"SUCCESS"}, result
    out, lse = torch.ops.flash_attn.fwd(*args)
    bwd_args = (dout, *(t.detach() for t in (q, k, v, out, lse)), headdim ** -0.5, causal)
    result = torch.library.opcheck(torch.ops.flash_attn.bwd.default, bwd_args, test_utils=OPCHECK_UTILS)
    assert set(result.values()) == {"SUCCESS"}, result


@pytest.mark.parametrize("function,headdim,seqlen_k,nheads_k", [("func", 59, 203, 2), ("qkvpacked", 64, 113, 4),
                                                                ("kvpacked", 128, 203, 1)])
def test_compile_fullgraph(function, headdim, seqlen_k, nheads_k):
    """torch.compile(fullgraph=True) with inductor: forward bitwise equal to eager, forward and backward
    within the tolerance rule of the reference."""
    require_kernel(torch.bfloat16, headdim)
    torch._dynamo.reset()
    check_public(function, 2, 113, seqlen_k, 4, nheads_k, headdim, torch.bfloat16, True, "cuda",
                 compile_backend="inductor")


@pytest.mark.parametrize("headdim,causal", [(64, True), (59, False)])
def test_cuda_graph_replay(headdim, causal):
    """Capture flash_attn_func's forward (padding included for 59) in a CUDA graph, then replay it on new
    values copied into the captured inputs: bitwise equal to eager each time."""
    require_kernel(torch.bfloat16, headdim)
    q, k, v, _ = make_qkv(2, 239, 203, 4, 2, headdim, torch.bfloat16, "cuda")
    run = lambda: flash_attn.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)[:2]  # noqa: E731
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up off the capture stream, as torch.cuda.graphs asks
        run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out, static_lse = run()
    for _ in range(2):
        for t in (q, k, v):
            t.copy_(torch.randn_like(t))
        graph.replay()
        out, lse = run()
        assert torch.equal(static_out, out) and torch.equal(static_lse, lse)
