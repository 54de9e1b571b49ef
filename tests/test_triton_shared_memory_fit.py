"""Fixed launches that the GPU refuses for shared memory take smaller options (flash_attn/triton/
shared_memory_fit.py). No GPU here or on the GPU machine refuses a tile (Hopper has room for every
one), so the refusals are simulated: a stand-in for launch_kernel raises Triton's OutOfResources for
options past a made-up budget, as Triton does when it loads a kernel, and launches the rest for real
(under the interpreter on machines without a GPU). Outputs and gradients are checked against the
fp64 reference."""

import pytest
import torch

triton = pytest.importorskip("triton", reason="triton is not installed")
from triton.runtime.errors import OutOfResources  # noqa: E402 - after the skip above

from flash_attn.reference import attention_ref  # noqa: E402
from flash_attn.triton import attention as triton_attention, kvcache, poison, shared_memory_fit, tuning  # noqa: E402
import flash_attn.triton as triton_backend  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BUDGET = 2048  # made-up shared memory: BLOCK_M x BLOCK_N x num_stages at most this


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    if DEVICE == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    previous = poison.set_poison_outputs(True)
    triton_attention.clear_plans()
    monkeypatch.setattr(shared_memory_fit, "_fitted", {})
    yield
    poison.set_poison_outputs(previous)
    triton_attention.clear_plans()


def _refusing(monkeypatch, refused):
    """Replaces launch_kernel with one that refuses options where refused(options) holds and launches
    the rest; returns the list of (kernel name, options) it was asked for."""
    asked, launch = [], shared_memory_fit.launch_kernel

    def launch_or_refuse(kernel, grid, args, options, bound=None):
        asked.append((kernel.fn.__name__, dict(options)))
        if refused(options):
            raise OutOfResources(2 * BUDGET, BUDGET, "shared memory")
        launch(kernel, grid, args, options, bound)

    monkeypatch.setattr(shared_memory_fit, "launch_kernel", launch_or_refuse)
    return asked


def _over_budget(options):
    return options["BLOCK_M"] * options["BLOCK_N"] * options.get("num_stages", 3) > BUDGET


def _blocks(options):
    return options["BLOCK_M"], options["BLOCK_N"], options.get("num_warps"), options.get("num_stages")


def test_smaller_launches_drop_stages_then_halve_the_larger_block():
    options = dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=2, maxnreg=128, CAUSAL=True)
    tried = list(shared_memory_fit.smaller_launches(options, shared_memory_fit.ATTENTION_BLOCKS))
    assert tried[0] == {**options, "num_stages": 1}  # the same tile, register cap included
    assert [_blocks(t)[:2] for t in tried[1::2]] == [(64, 64), (32, 64), (32, 32), (16, 32), (16, 16)]
    assert [_blocks(t)[2:] for t in tried[1:]] == [(4, 2), (4, 1)] * 5
    assert all("maxnreg" not in t and t["CAUSAL"] for t in tried[1:])


def test_smaller_launches_keep_fp8_key_blocks_of_32():
    options = dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=1, IS_FP8=True)
    fp8_blocks = triton_attention._forward_shrinkable(fp8=True, host_described=False)
    assert triton_attention._forward_shrinkable(fp8=False, host_described=True) == {}
    tried = list(shared_memory_fit.smaller_launches(options, fp8_blocks))
    assert [_blocks(t) for t in tried] == [(32, 64, 4, 1), (32, 32, 4, 1), (16, 32, 4, 1)]


def test_smaller_launches_keep_fixed_blocks():
    options = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_D=128)  # a launch naming no stages: Triton's default
    stages = shared_memory_fit.DEFAULT_STAGES
    assert list(shared_memory_fit.smaller_launches(options)) == [{**options, "num_stages": fewer}
                                                                 for fewer in range(stages - 1, 0, -1)]
    keys_only = list(shared_memory_fit.smaller_launches(options, kvcache.KVCACHE_SHRINKABLE))
    assert [_blocks(t)[:2] for t in keys_only[stages - 1::stages]] == [(64, 32), (64, 16)]
    assert all(t["BLOCK_M"] == 64 and t["BLOCK_D"] == 128 for t in keys_only)


@pytest.mark.parametrize("causal", [False, True])
def test_refused_tiles_shrink_and_stay_correct(monkeypatch, causal):
    """Forward and backward with 64 x 64 tiles of 3 stages (the tile variables), refused down to
    32 x 64 with one stage (the forward and dQ halve BLOCK_M on the tie; dK / dV too), in fp32
    against fp64; the second call launches the remembered options at once."""
    for variable in (tuning.FORWARD_TILE_VARIABLE, tuning.DKDV_TILE_VARIABLE, tuning.DQ_TILE_VARIABLE):
        monkeypatch.setenv(variable, "64,64,4,3")
    asked = _refusing(monkeypatch, _over_budget)
    batch, seqlen_q, seqlen_k, nheads, headdim = 2, 70, 100, 2, 32

    def check():
        q = torch.randn(batch, seqlen_q, nheads, headdim, device=DEVICE, requires_grad=True)
        k, v = (torch.randn(batch, seqlen_k, nheads, headdim, device=DEVICE, requires_grad=True) for _ in range(2))
        dout = torch.randn_like(q)
        window = (-1, 0) if causal else (-1, -1)
        out, lse = triton_backend.forward(q, k, v, headdim ** -0.5, window)
        grads = triton_backend.backward(dout, q, k, v, out, lse, headdim ** -0.5, window)
        expected, _ = attention_ref(q, k, v, causal=causal, compute_dtype=torch.float64)
        torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)
        for got, want in zip(grads, torch.autograd.grad(expected, (q, k, v), dout.double())):
            torch.testing.assert_close(got.double(), want.double(), atol=1e-4, rtol=1e-4)

    check()
    tried = {}
    for name, options in asked:
        tried.setdefault(name, []).append(_blocks(options))
    assert tried["attention_forward_kernel"] == [(64, 64, 4, 3), (64, 64, 4, 2), (64, 64, 4, 1), (32, 64, 4, 3),
                                                 (32, 64, 4, 2), (32, 64, 4, 1)]
    assert tried["attention_backward_dkdv_kernel"] == tried["attention_backward_dq_kernel"] == tried[
        "attention_forward_kernel"]
    asked.clear()
    triton_attention.clear_plans()
    check()
    assert [_blocks(options) for name, options in asked] == [(32, 64, 4, 1)] * 3  # forward, dK / dV, dQ: no refusal


def test_a_launch_nothing_fits_raises_the_first_refusal(monkeypatch):
    asked = _refusing(monkeypatch, lambda options: "BLOCK_N" in options)
    q, k, v = (torch.randn(1, 40, 2, 32, device=DEVICE) for _ in range(3))
    with pytest.raises(OutOfResources, match="shared memory"):
        triton_backend.forward(q, k, v, 32 ** -0.5)
    forward = [_blocks(options) for name, options in asked if "forward" in name]
    assert forward[-1][:2] == (16, 16) and forward[-1][3] == 1  # every smaller launch was tried first


def test_other_refusals_pass_through(monkeypatch):
    def refuse_threads(kernel, grid, args, options, bound=None):
        raise OutOfResources(2048, 1024, "threads")

    monkeypatch.setattr(shared_memory_fit, "launch_kernel", refuse_threads)
    q, k, v = (torch.randn(1, 40, 2, 32, device=DEVICE) for _ in range(3))
    with pytest.raises(OutOfResources, match="threads"):
        triton_backend.forward(q, k, v, 32 ** -0.5)
    assert shared_memory_fit._fitted == {}


def test_refused_kvcache_tiles_halve_the_key_block(monkeypatch):
    """The split-KV attention kernel refused down to 16-key blocks (its query block fixes the grid and
    stays): the same appends and outputs as reference_kvcache, with splits the host counted in
    64-key blocks."""
    from kvcache_checks import KvCase, check_kvcache

    monkeypatch.setenv("FLASH_ATTENTION_TRITON_AMD_ENABLE", "TRUE")
    asked = _refusing(monkeypatch, lambda options: options["BLOCK_N"] > 16)
    case = KvCase(batch=2, nheads=4, nheads_k=2, headdim=32, capacity=100, seqlen_q=2, seqlen_new=2, causal=True,
                  num_splits=3, dtype=torch.float32)
    check_kvcache(case, DEVICE)
    tried = [_blocks(options)[:2] for name, options in asked if name == "kvcache_attention_kernel"]
    assert tried[0] == (16, 64) and tried[-1] == (16, 16) and {m for m, n in tried} == {16}
