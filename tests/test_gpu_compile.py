"""The CUDA ops under PyTorch's machinery: torch.library.opcheck, torch.compile(fullgraph=True) of each
public function (forward and backward, inductor), and CUDA graph capture / replay of the forward.
Outputs are poisoned with NaN before every kernel (fixture cuda_test_setup)."""

import pytest
import torch

import flash_attn
import flash_attn.ops
from feature_checks import Mods, check_dense, check_varlen
from helpers import CUDA_KERNELS_ONLY, GPU_TEST_MARKS, check_public, make_qkv, opcheck_both_ops, require_kernel

pytestmark = GPU_TEST_MARKS

OPCHECK_CASES = {  # name: kwargs of helpers.opcheck_both_ops
    "bf16_hd64_causal": dict(nheads_k=4, window=(-1, 0), headdim=64),
    "fp16_hd128_gqa": dict(nheads_k=2, window=(-1, -1), dtype=torch.float16, headdim=128),
    "hd64_window_softcap_alibi": dict(nheads_k=2, window=(40, 7), softcap=20.0, alibi=True, headdim=64),
    "hd128_varlen_causal": dict(nheads_k=2, window=(-1, 0), varlen=True, headdim=128),
    "hd96_sm80_kernel_varlen_window": dict(nheads_k=1, window=(30, 30), varlen=True, headdim=96),
    # dropout draws a new mask per call, so only the checks that compare no values across calls
    "hd64_dropout": dict(nheads_k=2, window=(-1, 0), dropout_p=0.2, headdim=64,
                         test_utils=("test_schema", "test_faketensor")),
}


@CUDA_KERNELS_ONLY
@pytest.mark.parametrize("case", OPCHECK_CASES)
def test_opcheck(case):
    """opcheck on both CUDA ops: schema, autograd registration, fake kernels (shapes, strides, dtypes
    equal the real outputs'), and AOT dispatch with dynamic shapes; k, v strided slices."""
    kwargs = OPCHECK_CASES[case]
    require_kernel(kwargs.get("dtype", torch.bfloat16), kwargs["headdim"])
    opcheck_both_ops("cuda", seqlen_q=113, seqlen_k=203, **kwargs)


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


@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
def test_compile_fullgraph_with_options(varlen):
    """torch.compile(fullgraph=True, inductor) of the public functions with every option at once."""
    require_kernel(torch.bfloat16, 64)
    torch._dynamo.reset()
    mods = Mods(causal=True, window_size=(50, -1), softcap=15.0, alibi="batch", dropout_p=0.1, deterministic=True)
    compiled = {name: torch.compile(getattr(flash_attn, name), fullgraph=True)
                for name in ("flash_attn_func", "flash_attn_varlen_func")}
    original = {name: getattr(flash_attn, name) for name in compiled}
    try:
        for name, fn in compiled.items():
            setattr(flash_attn, name, fn)
        if varlen:
            check_varlen(mods, [100, 1, 0, 250], [120, 1, 7, 250], 4, 2, 64, torch.bfloat16, "cuda")
        else:
            check_dense(mods, 2, 113, 203, 4, 2, 64, torch.bfloat16, "cuda")
    finally:
        for name, fn in original.items():
            setattr(flash_attn, name, fn)


@CUDA_KERNELS_ONLY
def test_cuda_graph_replay_with_dropout():
    """The forward with dropout captured in a CUDA graph: each replay draws a new mask from the
    generator's graph-safe offset, records it in rng_state, and its output is the reference's for
    that mask (dropout_keep_mask of the recorded rng_state)."""
    require_kernel(torch.bfloat16, 64)
    from flash_attn.reference import attention_ref

    q, k, v, _ = make_qkv(1, 130, 170, 2, 2, 64, torch.bfloat16, "cuda")
    run = lambda: torch.ops.flash_attn.fwd(q, k, v, None, None, 130, 170, 0.25, 0.125, -1, 0, 0.0, None,  # noqa: E731
                                           False)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out, _, static_rng = run()
    states = []
    for _ in range(2):
        graph.replay()
        torch.cuda.synchronize()
        states.append(static_rng.clone())
        keep = torch.ops.flash_attn.dropout_keep_mask(static_rng, 1, 2, 130, 170, 0.25)
        ref, _ = attention_ref(q, k, v, causal=True, softmax_scale=0.125, dropout_p=0.25, dropout_mask=keep)
        pt, _ = attention_ref(q, k, v, causal=True, softmax_scale=0.125, upcast=False, dropout_p=0.25,
                              dropout_mask=keep)
        assert (static_out.float() - ref).abs().max() <= 2 * (pt.float() - ref).abs().max() + 1e-6
    assert not torch.equal(states[0], states[1]), "two replays used the same Philox offset"
