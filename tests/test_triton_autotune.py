"""FLASH_ATTENTION_TRITON_AMD_AUTOTUNE="TRUE" (flash_attn/triton/tuning.py): the Triton kernels
autotune over their config lists, cache the winner per shape key, and compute the same attention
with every listed config; without the variable the fixed tiles run and no autotuner is consulted.

On the GPU the lists are the GPU's and do_bench times them; under Triton's interpreter (machines
without CUDA) each list has two tiles timed with the host clock, and test_every_listed_tile_is_correct
runs the GPU lists' tiles one at a time for their results (the interpreter ignores num_warps and
num_stages, so there it checks the block sizes; on a GPU the whole configs, compiled).
"""

import pytest
import torch

triton = pytest.importorskip("triton", reason="triton is not installed")

import flash_attn
from helpers import Results, assert_matches_reference

triton_backend = pytest.importorskip("flash_attn.triton", reason="triton is not installed")
from flash_attn.triton import attention, kvcache, tuning  # noqa: E402 - after the skip above

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.float32 if DEVICE == "cpu" else torch.float16
COMPUTE_DTYPE = torch.float64 if DTYPE == torch.float32 else torch.float32
ATTENTION_LAUNCHERS = ("_forward_kernel", "_dkdv_kernel", "_dq_kernel")


@pytest.fixture
def autotune(monkeypatch):
    """The variable on (and the Triton backend under the interpreter without a GPU), every
    autotuner's cache emptied for the test; returns the autotuners by launcher name."""
    monkeypatch.setenv(tuning.AUTOTUNE_VARIABLE, "TRUE")
    monkeypatch.setenv("FLASH_ATTENTION_TRITON_AMD_ENABLE", "TRUE")
    tuners = {name: getattr(attention, name).tuned for name in ATTENTION_LAUNCHERS}
    tuners["kvcache"] = kvcache._attention_kernel.tuned
    for tuner in tuners.values():
        monkeypatch.setattr(tuner, "cache", {})
    return tuners


def _dense_call(batch=2, seqlen_q=70, seqlen_k=75, nheads=4, nheads_k=2, headdim=32, causal=True):
    """flash_attn_func forward and backward through the switch, checked against the reference."""
    q, k, v, dout = (torch.randn(batch, s, h, headdim, dtype=DTYPE, device=DEVICE)
                     for s, h in ((seqlen_q, nheads), (seqlen_k, nheads_k), (seqlen_k, nheads_k), (seqlen_q, nheads)))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse, _ = flash_attn.flash_attn_func(*leaves, causal=causal, return_attn_probs=True)
    ours = Results(out, lse, *torch.autograd.grad(out, leaves, dout))
    assert_matches_reference(ours, q, k, v, dout, causal, None, COMPUTE_DTYPE)


def test_autotune_times_the_configs_and_caches_per_shape(autotune):
    """The first call of a shape times the list (each kernel's cache gets its key), the same shape
    again reuses the choice (no new timing), another seqlen_q tunes anew; results stay right."""
    _dense_call()
    for name in ATTENTION_LAUNCHERS:
        tuner = autotune[name]
        assert len(tuner.cache) == 1 and len(tuner.configs_timings) >= 2, name
        assert tuner.best_config in tuner.configs
    timings = {name: autotune[name].configs_timings for name in ATTENTION_LAUNCHERS}
    _dense_call()
    assert all(autotune[name].configs_timings is timings[name] for name in ATTENTION_LAUNCHERS)
    _dense_call(seqlen_q=40)
    assert all(len(autotune[name].cache) == 2 for name in ATTENTION_LAUNCHERS)


def test_autotune_key_leaves_out_the_batch(autotune):
    """Varlen batches of other sizes and total lengths with the same max_seqlen share one key, so a
    training loop over varying batches does not tune again at every step."""
    for lengths in ([10, 20], [5, 20, 3, 1]):
        cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32, device=DEVICE)
        q, k, v = (torch.randn(sum(lengths), 2, 32, dtype=DTYPE, device=DEVICE) for _ in range(3))
        flash_attn.flash_attn_varlen_func(q, k, v, cu, cu, 20, 20)
    assert len(autotune["_forward_kernel"].cache) == 1


def test_autotune_kvcache(autotune):
    """flash_attn_with_kvcache's attention kernel tunes its key block (BLOCK_N) too, and stays right."""
    from kvcache_checks import KvCase, check_kvcache

    check_kvcache(KvCase(batch=2, nheads=4, nheads_k=2, headdim=32, capacity=100, seqlen_q=2, seqlen_new=2,
                         causal=True, dtype=DTYPE, num_splits=2), DEVICE)
    assert len(autotune["kvcache"].cache) == 1 and len(autotune["kvcache"].configs_timings) >= 2


def test_without_the_variable_no_autotuner_runs(autotune, monkeypatch):
    monkeypatch.delenv(tuning.AUTOTUNE_VARIABLE)
    _dense_call()
    assert all(not tuner.cache for tuner in autotune.values())


def _single_config(tile):
    """An autotuner over one tile: triton.autotune then runs it untimed, with its warps and stages."""
    return lambda kernel: triton.autotune(configs=[tile.config()], key=[])(kernel)


LIST_LENGTH = max(len(tuning.FORWARD_TILES), len(tuning.DKDV_TILES), len(tuning.DQ_TILES), len(tuning.KVCACHE_TILES))


@pytest.mark.parametrize("index", range(LIST_LENGTH))
def test_every_listed_tile_is_correct(autotune, monkeypatch, index):
    """Config `index` of each GPU list (wrapping around the shorter ones): forward, backward and the
    kvcache kernel forced onto it compute the reference's results."""
    from kvcache_checks import KvCase, check_kvcache

    lists = {"_forward_kernel": tuning.FORWARD_TILES, "_dkdv_kernel": tuning.DKDV_TILES,
             "_dq_kernel": tuning.DQ_TILES}
    for name, tiles in lists.items():
        launcher = getattr(attention, name)
        monkeypatch.setattr(launcher, "tuned", _single_config(tiles[index % len(tiles)])(launcher.kernel))
    kv_tile = tuning.KVCACHE_TILES[index % len(tuning.KVCACHE_TILES)]
    monkeypatch.setattr(kvcache._attention_kernel, "tuned", _single_config(kv_tile)(kvcache._attention_kernel.kernel))
    _dense_call(seqlen_q=70, seqlen_k=140)
    check_kvcache(KvCase(batch=1, nheads=2, nheads_k=1, headdim=32, capacity=150, seqlen_q=3, seqlen_new=3,
                         causal=True, dtype=DTYPE, num_splits=2), DEVICE)


def test_prune_keeps_the_tiles_that_fit():
    """Above head dim 128 only tiles of at most 64 rows stay; a head dim no tile fits keeps the smallest."""
    configs = [tile.config() for tile in tuning.FORWARD_TILES]
    kept = tuning._fitting(configs, {}, BLOCK_D=256)
    assert kept and all(max(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]) <= 64 for c in kept)
    assert len(tuning._fitting(configs, {}, BLOCK_D=64)) == len(configs)
    assert [c.kwargs["BLOCK_N"] for c in tuning._fitting(configs, {}, BLOCK_D=4096)] == [32]
