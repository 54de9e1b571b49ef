"""The Hopper (sm_90a) forward and backward: their arch layer on its own, which kernels run, and the
sm80 kernels that A100-class GPUs run for the same head dims, forced on Hopper with
FLASH_ATTN_DISABLE_SM90=1, and the two Hopper forwards and backwards forced with FLASH_ATTN_SM90_FWD
and FLASH_ATTN_SM90_BWD (ws: the warp-specialized TMA kernels; cpasync: the ones that run on short
hd-64 walks and where no tensor map can be built). The sm90 kernels themselves are checked against the reference by
test_gpu_attention.py, which on an H100/H200 runs them for every head dim they serve (32 to 256,
hd 32 and 96 on the hd 64 and 128 kernels, and those padded to them).
"""

import pytest
import torch

import flash_attn
from feature_checks import Mods, check_dense, check_varlen
from helpers import (CUDA_KERNELS_ONLY, GPU_TEST_MARKS, assert_matches_reference, check_flash_attn, require_kernel,
                     run_flash_attn, run_sm90_layout_check)

pytestmark = [*GPU_TEST_MARKS, CUDA_KERNELS_ONLY]  # the CUDA kernels themselves


def _is_hopper():
    return torch.cuda.get_device_capability() == (9, 0)


@pytest.mark.skipif(not torch.cuda.is_available() or not _is_hopper(), reason="needs an sm_90 GPU")
def test_wgmma_operand_layouts(tmp_path):
    """tests/cuda/wgmma_layouts.cu: K-major, MN-major and register operands against exact products."""
    run_sm90_layout_check("wgmma_layouts.cu", tmp_path)


def _require_exact_kernel(headdim):
    """Skip unless this build has the bf16 kernel of exactly this head dim: which kernel runs is
    decided per compiled head dim, and a build without it pads to a larger one."""
    require_kernel(torch.bfloat16, headdim)
    if (torch.bfloat16, headdim) not in flash_attn.ops.compiled_configs():
        pytest.skip(f"this build pads hd {headdim} to a larger head dim")


def _kernel_names(headdim, causal=False, seqlen=300):
    """Names of the forward and backward kernels that one forward + backward launches."""
    q, k, v = (torch.randn(1, seqlen, 2, headdim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        flash_attn.flash_attn_func(q, k, v, causal=causal).sum().backward()
        torch.cuda.synchronize()
    names = [event.name for event in prof.events()]
    return [n for n in names if "fwd_kernel" in n], [n for n in names if "bwd_kernel" in n]


@pytest.mark.skipif(not torch.cuda.is_available() or not _is_hopper(), reason="needs an sm_90 GPU")
@pytest.mark.parametrize("headdim", [64, 128])
def test_hopper_runs_the_wgmma_kernels(monkeypatch, headdim):
    _require_exact_kernel(headdim)
    forward, backward = _kernel_names(headdim)
    assert forward and all("fwd_kernel_sm90" in name for name in forward), forward
    assert backward and all("bwd_kernel_sm90" in name for name in backward), backward
    # 300 keys: the warp-specialized forward by default at hd 128, the cp.async one at hd 64 (launch_fwd_sm90.cuh)
    assert all(("_ws" in name) == (headdim == 128) for name in forward), forward
    # the warp-specialized backward by default, causal short walks too (launch_bwd_sm90.cuh)
    assert all("bwd_kernel_sm90_ws" in name for name in backward), backward
    _, backward = _kernel_names(headdim, causal=True)
    assert backward and all("bwd_kernel_sm90_ws" in name for name in backward), backward
    monkeypatch.setenv("FLASH_ATTN_SM90_BWD", "cpasync")
    _, backward = _kernel_names(headdim)
    assert backward and all("bwd_kernel_sm90" in name and "_ws" not in name for name in backward), backward
    monkeypatch.setenv("FLASH_ATTN_SM90_FWD", "ws")
    forward, _ = _kernel_names(headdim)
    assert forward and all("fwd_kernel_sm90_ws" in name for name in forward), forward
    monkeypatch.setenv("FLASH_ATTN_SM90_FWD", "cpasync")
    forward, _ = _kernel_names(headdim)
    assert forward and all("fwd_kernel_sm90" in name and "_ws" not in name for name in forward), forward
    monkeypatch.setenv("FLASH_ATTN_DISABLE_SM90", "1")
    forward, backward = _kernel_names(headdim)
    assert forward and not any("sm90" in name for name in forward), forward
    assert backward and not any("sm90" in name for name in backward), backward


@pytest.mark.skipif(not torch.cuda.is_available() or not _is_hopper(), reason="needs an sm_90 GPU")
@pytest.mark.parametrize("headdim", [192, 256])
def test_hopper_large_head_dims_run_the_warp_specialized_forward(monkeypatch, headdim):
    """hd 192 and 256 have a warp-specialized forward only (launch_fwd_sm90.cuh): it runs by default,
    and FLASH_ATTN_SM90_FWD=cpasync or FLASH_ATTN_DISABLE_SM90=1 give the sm80 kernel. The backward
    is the head-split Hopper one (launch_bwd_sm90.cuh), FLASH_ATTN_SM90_BWD=cpasync or
    FLASH_ATTN_DISABLE_SM90=1 giving the sm80 one. The kernel compiled for the head dim must be the
    one asked for (a build without it would pad to a larger one)."""
    _require_exact_kernel(headdim)
    forward, backward = _kernel_names(headdim)
    assert forward and all("fwd_kernel_sm90_ws" in name for name in forward), forward
    assert backward and all("bwd_kernel_sm90_head_split" in name for name in backward), backward
    for variable, value in (("FLASH_ATTN_SM90_FWD", "cpasync"), ("FLASH_ATTN_SM90_BWD", "cpasync"),
                            ("FLASH_ATTN_DISABLE_SM90", "1")):
        with monkeypatch.context() as patch:
            patch.setenv(variable, value)
            forward, backward = _kernel_names(headdim)
            if variable != "FLASH_ATTN_SM90_BWD":
                assert forward and not any("sm90" in name for name in forward), (variable, forward)
            if variable != "FLASH_ATTN_SM90_FWD":
                assert backward and not any("sm90" in name for name in backward), (variable, backward)


@pytest.mark.skipif(not torch.cuda.is_available() or not _is_hopper(), reason="needs an sm_90 GPU")
@pytest.mark.parametrize("headdim,wide", [(96, 128), (32, 64)])
def test_narrow_head_dims_run_the_wider_warp_specialized_kernels(monkeypatch, headdim, wide):
    """hd 96 and 32 run the warp-specialized forward and backward of hd 128 and 64
    (launch_fwd_sm90.cuh, launch_bwd_sm90.cuh: TMA zero-fills the columns past the head dim) by
    default; FLASH_ATTN_SM90_FWD / _BWD=cpasync give the sm80 kernels. The reference
    checks of test_gpu_attention.py and test_gpu_features.py run them (the latter on the kernel of
    hd 96 where a build has no hd 64 / 128 one)."""
    _require_exact_kernel(headdim)
    forward, backward = _kernel_names(headdim)
    assert forward and all(f"FwdWsConfig<{wide}, " in name for name in forward), forward
    assert backward and all(f"BwdWsConfig<{wide}, " in name for name in backward), backward
    monkeypatch.setenv("FLASH_ATTN_SM90_FWD", "cpasync")
    monkeypatch.setenv("FLASH_ATTN_SM90_BWD", "cpasync")
    forward, backward = _kernel_names(headdim)
    assert forward and not any("sm90" in name for name in forward), forward
    assert backward and not any("sm90" in name for name in backward), backward


@pytest.mark.skipif(not torch.cuda.is_available() or not _is_hopper(), reason="needs an sm_90 GPU")
@pytest.mark.parametrize("headdim,wide_steps,last_short", [(192, 112, 1024), (256, 80, 1024)])
def test_short_causal_walks_take_64_key_steps(monkeypatch, headdim, wide_steps, last_short):
    """hd 192 / 256 causal calls up to last_short keys run the plain warp-specialized forward on 64-key
    steps (FwdWsTile::short_steps_type in launch_fwd_sm90.cuh), other calls its wider-step kernel;
    FLASH_ATTN_SM90_FWD_SHORT_STEPS=1 / 0 forces either."""
    _require_exact_kernel(headdim)
    short, wide = f"FwdWsConfig<{headdim}, 64, ", f"FwdWsConfig<{headdim}, {wide_steps}, "
    cases = {(True, 300): short, (True, last_short): short, (True, last_short + 1): wide, (False, 300): wide}
    for (causal, seqlen), config in cases.items():
        forward, _ = _kernel_names(headdim, causal, seqlen)
        assert forward and all(config in name for name in forward), (causal, seqlen, forward)
    for value, config in (("1", short), ("0", wide)):
        monkeypatch.setenv("FLASH_ATTN_SM90_FWD_SHORT_STEPS", value)
        for causal in (False, True):
            forward, _ = _kernel_names(headdim, causal)
            assert forward and all(config in name for name in forward), (value, causal, forward)


# (batch, seqlen_q, seqlen_k, nheads, nheads_k, mods): several tiles per CTA, uneven tails, GQA.
STEP_CASES = [(2, 1000, 1000, 16, 4, Mods(causal=True)), (3, 700, 500, 8, 8, Mods()),
              (2, 513, 1024, 8, 2, Mods(causal=True)), (2, 1024, 700, 4, 4, Mods(causal=True))]


@pytest.mark.skipif(not torch.cuda.is_available() or not _is_hopper(), reason="needs an sm_90 GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("short_steps", ["1", "0"])
@pytest.mark.parametrize("batch,seqlen_q,seqlen_k,nheads,nheads_k,mods", STEP_CASES)
@pytest.mark.parametrize("headdim", [192, 256])
def test_plain_forwards_forced(monkeypatch, headdim, short_steps, dtype, batch, seqlen_q, seqlen_k, nheads, nheads_k,
                               mods):
    """Both plain hd 192 / 256 forwards (64-key steps and the wider ones) forced, causal or not,
    against the reference."""
    require_kernel(dtype, headdim)
    monkeypatch.setenv("FLASH_ATTN_SM90_FWD_SHORT_STEPS", short_steps)
    check_dense(mods, batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, dtype, "cuda")


@pytest.mark.skipif(not torch.cuda.is_available() or not _is_hopper(), reason="needs an sm_90 GPU")
@pytest.mark.parametrize("short_steps", ["1", "0"])
@pytest.mark.parametrize("headdim", [192, 256])
def test_plain_forwards_forced_varlen(monkeypatch, headdim, short_steps):
    require_kernel(torch.bfloat16, headdim)
    monkeypatch.setenv("FLASH_ATTN_SM90_FWD_SHORT_STEPS", short_steps)
    lengths = _varlen_lengths(37, seed=11)
    check_varlen(Mods(causal=True), lengths, lengths, 8, 2, headdim, torch.bfloat16, "cuda")


@pytest.mark.parametrize("headdim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_scores_rising_along_the_walk(dtype, causal, headdim):
    """Key blocks whose scores rise block by block in the order the Hopper forwards walk them (the
    last block first), by less and by more than the lag that lazy rescaling lets a row's max keep
    (2^8 in the exponent's base 2: softmax.cuh, update_probs), in all by far more than fp32's
    exponent range (2^195 at hd 128): the steps that rescale O (and the row sums on the tensor core)
    and those that keep the stale max. q and k share a direction u whose weight in k grows toward
    key 0."""
    require_kernel(dtype, headdim)
    seqlen, block = 1024, 128
    u = torch.ones(headdim, device="cuda")
    weights = torch.tensor([12.0, 6.0, 2.0, 1.0, 0.6, 0.3, 0.1, 0.0], device="cuda")  # per 128-key block
    k_weight = weights.repeat_interleave(block)[:seqlen]
    new = lambda: torch.randn(2, seqlen, 4, headdim, device="cuda")  # noqa: E731
    q = (new() + u).to(dtype).requires_grad_()
    k = (new() + k_weight[None, :, None, None] * u).to(dtype).requires_grad_()
    v = new().to(dtype).requires_grad_()
    dout = torch.randn_like(q)
    ours = run_flash_attn(q, k, v, dout, causal)
    assert_matches_reference(ours, q, k, v, dout, causal)


SM80_CASES = [(64, 239, 300, 4, 4, False), (64, 1023, 1024, 4, 2, True), (128, 113, 203, 4, 1, True),
              (128, 1024, 1023, 4, 4, False), (59, 300, 239, 2, 2, True), (111, 128, 217, 2, 2, False),
              (256, 239, 300, 4, 2, True), (200, 300, 239, 2, 2, False), (96, 1023, 1024, 3, 1, True),
              (32, 300, 239, 2, 2, False)]  # hd 96 / 32: dq_accum rows of 128 / 64 columns (params.h)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("headdim,seqlen_q,seqlen_k,nheads,nheads_k,causal", SM80_CASES)
def test_sm80_kernels_on_any_gpu(monkeypatch, dtype, headdim, seqlen_q, seqlen_k, nheads, nheads_k, causal):
    """The forward and backward A100-class GPUs run for head dims 64 and 128 (on Hopper the wgmma ones run)."""
    require_kernel(dtype, headdim)
    monkeypatch.setenv("FLASH_ATTN_DISABLE_SM90", "1")
    check_flash_attn(2, seqlen_q, seqlen_k, nheads, nheads_k, headdim, dtype, causal, "cuda")


@pytest.mark.skipif(not torch.cuda.is_available() or not _is_hopper(), reason="needs an sm_90 GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("headdim,seqlen_q,seqlen_k,nheads,nheads_k,causal", SM80_CASES)
@pytest.mark.parametrize("choice", ["ws", "cpasync"])
@pytest.mark.parametrize("kernel_pass", ["FWD", "BWD"])
def test_sm90_kernels_forced(monkeypatch, kernel_pass, choice, dtype, headdim, seqlen_q, seqlen_k, nheads, nheads_k,
                             causal):
    """Each Hopper forward (FLASH_ATTN_SM90_FWD) and backward (FLASH_ATTN_SM90_BWD) forced, whatever the
    default would pick for the shape."""
    require_kernel(dtype, headdim)
    monkeypatch.setenv(f"FLASH_ATTN_SM90_{kernel_pass}", choice)
    check_flash_attn(2, seqlen_q, seqlen_k, nheads, nheads_k, headdim, dtype, causal, "cuda")


# (headdim, batch, seqlen, nheads, nheads_k): 300-1000 query tiles, more than any GPU's SMs, so each CTA
# of the persistent grid walks several tiles and the rings and Q's barrier go through many phases.
PERSISTENT_CASES = [(128, 4, 1000, 16, 4), (64, 3, 777, 32, 8), (128, 2, 2048, 24, 24), (256, 2, 1000, 16, 4),
                    (192, 3, 700, 8, 8), (96, 2, 1000, 16, 4)]


@pytest.mark.skipif(not torch.cuda.is_available() or not _is_hopper(), reason="needs an sm_90 GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("headdim,batch,seqlen,nheads,nheads_k", PERSISTENT_CASES)
@pytest.mark.parametrize("grid", ["default", "tiles"])
def test_ws_forward_walks_many_tiles(monkeypatch, grid, dtype, headdim, batch, seqlen, nheads, nheads_k):
    """The warp-specialized forward on non-causal dense shapes, where its default grid is persistent,
    against the reference; and the same with one CTA per tile (FLASH_ATTN_SM90_FWD_GRID=tiles)."""
    require_kernel(dtype, headdim)
    monkeypatch.setenv("FLASH_ATTN_SM90_FWD", "ws")
    monkeypatch.setenv("FLASH_ATTN_SM90_FWD_GRID", grid)
    check_flash_attn(batch, seqlen, seqlen, nheads, nheads_k, headdim, dtype, False, "cuda")


@pytest.mark.skipif(not torch.cuda.is_available() or not _is_hopper(), reason="needs an sm_90 GPU")
@pytest.mark.parametrize("headdim", [64, 128, 256])
def test_ws_forward_persistent_with_options(monkeypatch, headdim):
    """The persistent grid on the options kernel: dropout and softcap (the tiles still all have the same
    work), against the reference with the keep mask of return_attn_probs."""
    require_kernel(torch.bfloat16, headdim)
    monkeypatch.setenv("FLASH_ATTN_SM90_FWD", "ws")
    check_dense(Mods(softcap=20.0, dropout_p=0.15), 3, 900, 900, 16, 8, headdim, torch.bfloat16, "cuda")


# Uneven tiles: the warp-specialized forward's default grid (one CTA per SM) walks them in the
# heaviest-first order (causal, window) or the packed one (varlen) of query_tile_scheduler.cuh;
# "tiles" gives one CTA per tile.
# (headdim, batch, seqlen, nheads, nheads_k, mods): more tiles than SMs in each case; on a 132-SM
# GPU the heaviest-first order has 2 to 7 groups of (batch, head) pairs (about one stride of tiles
# each), alternating direction, the last one partial (4 groups of 17, 17, 17 and 13 pairs in the
# first case, six of 7 and one of 6 in the second).
UNEVEN_DENSE_CASES = [(128, 4, 1000, 16, 4, Mods(causal=True)), (128, 3, 2500, 16, 2, Mods(causal=True)),
                      (64, 3, 777, 32, 8, Mods(causal=True)),
                      (128, 2, 1500, 8, 8, Mods(causal=True, window_size=(300, 0))),
                      (64, 2, 1200, 24, 2, Mods(window_size=(200, 100), softcap=10.0)),
                      (256, 2, 1500, 16, 2, Mods(causal=True, alibi="batch"))]


@pytest.mark.skipif(not torch.cuda.is_available() or not _is_hopper(), reason="needs an sm_90 GPU")
@pytest.mark.parametrize("headdim,batch,seqlen,nheads,nheads_k,mods", UNEVEN_DENSE_CASES)
@pytest.mark.parametrize("grid", ["default", "tiles"])
def test_ws_forward_walks_uneven_tiles(monkeypatch, grid, headdim, batch, seqlen, nheads, nheads_k, mods):
    require_kernel(torch.bfloat16, headdim)
    monkeypatch.setenv("FLASH_ATTN_SM90_FWD", "ws")
    monkeypatch.setenv("FLASH_ATTN_SM90_FWD_GRID", grid)
    check_dense(mods, batch, seqlen, seqlen, nheads, nheads_k, headdim, torch.bfloat16, "cuda")


# Causal tiles of the three-consumer forward (hd 64, and hd 32 on its kernel) end at the sequence's
# end (FwdQueryBlock::at's end_aligned): the first tile starts 0, 64 or 128 rows before the
# sequence and writes none of those rows. (seqlen_q, seqlen_k): shifts of 64 (512, 100 / 600, 700 /
# 300, 300 / 900), 128 (1024, 1000, 777) and 0 (576); rows that see no key (seqlen_q > seqlen_k: the
# first tiles, the shifted one among them, write zeros and lse +inf); one tile only (100 queries).
END_ALIGNED_SHAPES = [(512, 512), (1024, 1024), (1000, 1000), (777, 777), (576, 576), (700, 300), (300, 900),
                      (100, 600), (1000, 100)]


@pytest.mark.skipif(not torch.cuda.is_available() or not _is_hopper(), reason="needs an sm_90 GPU")
@pytest.mark.parametrize("headdim", [64, 32])
@pytest.mark.parametrize("seqlen_q,seqlen_k", END_ALIGNED_SHAPES)
@pytest.mark.parametrize("mods", [Mods(causal=True), Mods(causal=True, softcap=15.0, dropout_p=0.1)],
                         ids=["plain", "extras"])
@pytest.mark.parametrize("grid", ["default", "tiles"])
def test_end_aligned_causal_tiles(monkeypatch, grid, mods, seqlen_q, seqlen_k, headdim):
    require_kernel(torch.bfloat16, headdim)
    monkeypatch.setenv("FLASH_ATTN_SM90_FWD", "ws")
    monkeypatch.setenv("FLASH_ATTN_SM90_FWD_GRID", grid)
    check_dense(mods, 2, seqlen_q, seqlen_k, 6, 2, headdim, torch.bfloat16, "cuda")


def _varlen_lengths(count, seed):
    """`count` sequence lengths from 0 to 1500, 0 and 1 among them: a packed walk whose warp scan
    takes several loads (more than 32 sequences) and skips sequences without tiles."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 1500, (count,), generator=generator).tolist()
    lengths[3], lengths[count - 5], lengths[count - 4] = 0, 1, 0
    return lengths


@pytest.mark.skipif(not torch.cuda.is_available() or not _is_hopper(), reason="needs an sm_90 GPU")
@pytest.mark.parametrize("headdim", [64, 128, 256])
@pytest.mark.parametrize("mods", [Mods(), Mods(causal=True), Mods(causal=True, window_size=(100, 0))],
                         ids=["full", "causal", "window"])
@pytest.mark.parametrize("count", [37, 70])
def test_ws_forward_walks_packed_varlen(monkeypatch, headdim, mods, count):
    """Varlen in the packed order (no tile past a sequence's end), keys as long as queries or not."""
    require_kernel(torch.bfloat16, headdim)
    monkeypatch.setenv("FLASH_ATTN_SM90_FWD", "ws")
    lengths_q = _varlen_lengths(count, seed=count)
    lengths_k = lengths_q if mods.causal else _varlen_lengths(count, seed=count + 1)
    check_varlen(mods, lengths_q, lengths_k, 8, 2, headdim, torch.bfloat16, "cuda")


@pytest.mark.skipif(not torch.cuda.is_available() or not _is_hopper(), reason="needs an sm_90 GPU")
@pytest.mark.parametrize("headdim", [64, 128])
def test_ws_forward_schedules_agree_bitwise(monkeypatch, headdim):
    """A tile's arithmetic does not depend on which CTA runs it: the persistent walk over the packed
    varlen order and one CTA per tile give identical outputs and lse."""
    require_kernel(torch.bfloat16, headdim)
    monkeypatch.setenv("FLASH_ATTN_SM90_FWD", "ws")
    lengths = _varlen_lengths(50, seed=7)
    total = sum(lengths)
    q, k, v = (torch.randn(total, 8, headdim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda", dtype=torch.int32)
    results = {}
    for grid in ("default", "tiles"):
        monkeypatch.setenv("FLASH_ATTN_SM90_FWD_GRID", grid)
        results[grid] = flash_attn.flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths), causal=True,
                                                          return_attn_probs=True)[:2]
    for persistent, one_per_tile in zip(results["default"], results["tiles"]):
        assert torch.equal(persistent, one_per_tile)
