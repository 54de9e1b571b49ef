"""The benchmark's own logic, on CPU: FLOP and byte formulas, shape rules, the quick/full plans, ratios
with error cells, every suite run end to end on tiny CPU shapes with a stand-in timer, result writing
(JSON, markdown, plots), and the no-GPU path of `python -m flash_attn.benchmark`.

The speedup suite's dropout+mask series and the features suite also run with stand-ins for our
functions (materialized attention that records the options it was called with), so their plumbing is
checked whatever state the library's own functions are in; one test runs them on the library itself
once it has flash_attn_varlen_func."""

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import flash_attn
from flash_attn.benchmark import cells as cells_lib
from flash_attn.benchmark import decode, env, features, impls, measure, report, suites
from flash_attn.benchmark import plan as plan_lib
from flash_attn.benchmark.cells import ERROR, OK, OOM, SKIPPED, Cell, Row, Suite
from flash_attn.reference import window_keep_mask
from flash_attn.benchmark.cli import main
from flash_attn.benchmark.shapes import (
    AttnShape,
    attention_flops,
    format_seqlen,
    gb_per_s,
    kv_cache_bytes,
    materialized_peak_bytes,
    mixed_lengths,
    padding_lengths,
    pairs_flops,
    parse_seqlen,
    score_pairs,
    tflops_per_s,
    training_shape,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
FAKE_MS = 0.5
MIB = 2**20
GIB = 2**30


# ---- shapes and formulas ----

def test_training_shape_follows_hidden_2048_and_16k_tokens():
    assert training_shape(2048, 64) == AttnShape(8, 2048, 2048, 32, 32, 64)
    assert training_shape(16384, 128) == AttnShape(1, 16384, 16384, 16, 16, 128)
    assert training_shape(512, 256) == AttnShape(32, 512, 512, 8, 8, 256)
    assert training_shape(32768, 64).batch == 1  # never a batch of 0
    with pytest.raises(ValueError):
        training_shape(1024, 96)  # 2048 is not a multiple of 96


def test_flops_forward_causal_and_backward_factors():
    shape = AttnShape(2, 1024, 1024, 16, 16, 128)
    forward = 4 * 2 * 1024 * 1024 * 16 * 128
    assert attention_flops(shape, False, "fwd") == forward
    assert attention_flops(shape, True, "fwd") == forward / 2
    assert attention_flops(shape, False, "bwd") == 2.5 * forward
    assert attention_flops(shape, True, "bwd") == 2.5 * forward / 2
    assert attention_flops(shape, False, "fwd+bwd") == 3.5 * forward
    assert attention_flops(shape, True, "fwd+bwd") == 3.5 * forward / 2
    assert tflops_per_s(1e12, 1000.0) == pytest.approx(1.0)
    assert tflops_per_s(2e12, 4.0) == pytest.approx(500.0)


def test_every_training_shape_does_the_same_work_per_token_and_seqlen():
    """batch * seqlen is constant, so forward FLOPs grow linearly with seqlen at a fixed headdim."""
    flops = [attention_flops(training_shape(s, 128), False) for s in (512, 1024, 2048)]
    assert flops[1] == 2 * flops[0] and flops[2] == 2 * flops[1]


def test_decode_bytes_agree_with_the_peer_table():
    nbytes = kv_cache_bytes(batch=1, context=8192, nheads_k=8, headdim=128, element_size=2)
    assert nbytes == 2 * 8192 * 8 * 128 * 2
    assert gb_per_s(nbytes, 0.0226) == pytest.approx(1487, rel=0.01)  # PEERS.md: cudnn, (1, 8k), 22.6 µs


def test_materialized_estimate_agrees_with_measured_naive_peak():
    estimate = materialized_peak_bytes(AttnShape(8, 8192, 8192, 16, 16, 64), score_element_bytes=2)
    assert estimate / MIB == pytest.approx(65664, rel=0.01)  # PEERS.md: naive at 8k


def test_seqlen_text():
    assert [parse_seqlen(t) for t in ("512", "2k", "16K", " 128k ")] == [512, 2048, 16384, 131072]
    assert [format_seqlen(s) for s in (128, 1024, 16384, 1536)] == ["128", "1k", "16k", "1536"]


def _brute_force_pairs(seqlen_q, seqlen_k, window):
    """Score elements kept by FlashAttention 2's bottom-right aligned window mask, counted on the mask."""
    return int(window_keep_mask(seqlen_q, seqlen_k, window, "cpu").sum())


@pytest.mark.parametrize("seqlen_q,seqlen_k", [(7, 7), (5, 9), (9, 5), (1, 12)])
@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (0, 0), (2, 0), (3, 1), (-1, 2), (4, -1)])
def test_score_pairs_count_the_mask_exactly(seqlen_q, seqlen_k, window):
    assert score_pairs(seqlen_q, seqlen_k, window) == _brute_force_pairs(seqlen_q, seqlen_k, window)


def test_unmasked_flops_at_the_feature_shapes():
    assert score_pairs(16384, 16384) == 16384**2
    assert score_pairs(16384, 16384, (-1, 0)) == 16384 * 16385 // 2  # the diagonal counts
    # a 4096-key window at 16k: 4096 ragged rows, then 4097 keys per query
    window = score_pairs(16384, 16384, (4096, 0))
    assert window == 4096 * 4097 // 2 + (16384 - 4096) * 4097
    assert score_pairs(16384, 16384, (-1, 0)) / window == pytest.approx(2.29, abs=0.01)
    shape = AttnShape(2, 1024, 1024, 16, 16, 128)
    for name in ("fwd", "bwd", "fwd+bwd"):
        assert pairs_flops(2 * score_pairs(1024, 1024), 16, 128, name) == attention_flops(shape, False, name)


def test_random_lengths_of_varlen_and_padded_batches():
    lengths = mixed_lengths(8, 16384, 128, 4096, seed=0)
    assert len(lengths) == 8 and sum(lengths) == 16384 and all(128 <= n <= 4096 for n in lengths)
    assert min(lengths) < 1024 and max(lengths) > 3072  # mixed: short and long sequences
    assert mixed_lengths(8, 16384, 128, 4096, seed=0) == lengths
    assert mixed_lengths(8, 16384, 128, 4096, seed=1) != lengths
    assert mixed_lengths(2, 8192, 128, 4096, seed=0) == [4096, 4096]
    assert mixed_lengths(1, 300, 128, 4096, seed=0) == [300]
    for impossible in ((8, 1000, 128, 4096), (2, 9000, 128, 4096)):
        with pytest.raises(ValueError):
            mixed_lengths(*impossible, seed=0)
    kept = padding_lengths(64, 512, seed=0)
    assert all(256 <= n <= 512 for n in kept) and len(set(kept)) > 1
    assert padding_lengths(64, 512, seed=0) == kept


# ---- plans ----

def test_quick_plan():
    plan = plan_lib.build_plan(quick=True)
    assert plan.suites == plan_lib.SUITES
    assert set(plan.suites) == {"speed", "speedup", "memory", "decode", "features"}
    assert {c.dtype for c in plan.speed} == {"bf16"}
    assert {c.headdim for c in plan.speed} == {64, 128}
    points = {(c.headdim, c.causal, c.seqlen) for c in plan.speed}
    assert (128, False, 16384) in points
    assert (128, True, 16384) not in points and (64, False, 16384) not in points
    assert len(plan.speed) == 2 * 2 * 3 + 1
    assert max(plan.memory_seqlens) == 8192 and min(plan.memory_seqlens) == 128
    assert min(plan.speedup_seqlens) == 128 and max(plan.speedup_seqlens) >= 4096
    assert plan.decode == ((1, 8192), (8, 8192), (32, 4096), (64, 16384), (1, 131072))
    assert "flex" not in plan.impls and "ours" in plan.impls
    assert plan.materialized_cap_bytes < float("inf")
    assert plan.speedup_dropout_p == 0.1


def test_feature_plan_has_the_shapes_of_the_targets():
    plan = plan_lib.build_plan(quick=True)
    shapes = plan.features
    assert shapes.varlen_dense.batch * shapes.varlen_dense.seqlen_q == 16384
    assert (shapes.varlen_dense.nheads, shapes.varlen_dense.headdim) == (16, 128)
    assert shapes.varlen_lengths == (128, 4096)
    assert shapes.window == AttnShape(1, 16384, 16384, 16, 16, 128) and shapes.window_left == 4096
    assert shapes.dropout == AttnShape(2, 8192, 8192, 16, 16, 128) and shapes.dropout_p == 0.1
    assert [(s.seqlen_q, s.headdim) for s in shapes.deterministic] == [(8192, 128), (2048, 64)]
    assert shapes.overhead_seqlens == (128, 256, 512, 1024) and plan.speedup_shape == (8, 12, 64)
    assert plan_lib.build_plan(quick=False).features == shapes  # cheap: the same in both sets


def test_full_plan_and_overrides():
    full = plan_lib.build_plan(quick=False)
    assert len(full.speed) == 2 * 3 * 6 * 2
    assert full.materialized_cap_bytes == float("inf")
    custom = plan_lib.build_plan(quick=True, suites=("speed",), dtypes=("fp16",), headdims=(128,),
                                 seqlens=(1024, 4096))
    assert [(c.dtype, c.headdim, c.causal, c.seqlen) for c in custom.speed] == [
        ("fp16", 128, False, 1024), ("fp16", 128, False, 4096), ("fp16", 128, True, 1024), ("fp16", 128, True, 4096)]
    assert custom.memory_seqlens == (1024, 4096) and custom.suites == ("speed",)


@pytest.mark.parametrize("kwargs", [{"suites": ("bogus",)}, {"dtypes": ("fp8",)}, {"impls": ("ours", "bogus")},
                                    {"headdims": (96,)}])
def test_plan_rejects_unknown_names(kwargs):
    with pytest.raises(ValueError):
        plan_lib.build_plan(**kwargs)


# ---- cells and ratios ----

def _suite(rows, higher_is_better=True):
    suite = Suite("t", "T", "TFLOP/s", higher_is_better, columns=["ours", "flash", "cudnn", "naive"],
                  ours=["ours"], config_keys=["seqlen"], rows=rows)
    cells_lib.compute_ratios(suite)
    return suite


def test_ratio_against_best_peer_skips_error_and_oom_cells():
    row = Row({"seqlen": 1024}, {"ours": Cell(OK, 400.0), "flash": Cell(OK, 300.0),
                                 "cudnn": Cell(ERROR, note="RuntimeError: no kernel"), "naive": Cell(OOM)})
    _suite([row])
    assert row.ratios["best_peer"] == "flash"
    assert row.ratios["ours_over_best_peer"] == pytest.approx(400 / 300)
    assert row.ratios["ours_over_reference"] == pytest.approx(400 / 300)


def test_ratio_picks_fastest_peer_and_handles_lower_is_better():
    fast = Row({"seqlen": 1}, {"ours": Cell(OK, 400.0), "flash": Cell(OK, 300.0), "cudnn": Cell(OK, 500.0),
                               "naive": Cell(OK, 50.0)})
    _suite([fast])
    assert fast.ratios["best_peer"] == "cudnn"
    assert fast.ratios["ours_over_best_peer"] == pytest.approx(0.8)
    memory = Row({"seqlen": 1}, {"ours": Cell(OK, 10.0), "flash": Cell(OK, 20.0), "cudnn": Cell(SKIPPED),
                                 "naive": Cell(OK, 1000.0)})
    _suite([memory], higher_is_better=False)
    assert memory.ratios["best_peer"] == "flash"
    assert memory.ratios["ours_over_best_peer"] == pytest.approx(2.0)


def test_no_ratio_when_ours_or_every_peer_failed():
    ours_failed = Row({"seqlen": 1}, {"ours": Cell(ERROR, note="x"), "flash": Cell(OK, 1.0),
                                      "cudnn": Cell(OK, 2.0), "naive": Cell(OK, 3.0)})
    peers_failed = Row({"seqlen": 1}, {"ours": Cell(OK, 1.0), "flash": Cell(ERROR, note="x"),
                                       "cudnn": Cell(OOM), "naive": Cell(SKIPPED)})
    _suite([ours_failed, peers_failed])
    assert ours_failed.ratios["ours_over_best_peer"] is None
    assert peers_failed.ratios["best_peer"] is None and peers_failed.ratios["ours_over_best_peer"] is None
    assert "—" in report.suite_table(_suite([ours_failed, peers_failed]))


def test_cell_text():
    assert cells_lib.format_cell(Cell(OK, 123.456)) == "123.5"
    assert cells_lib.format_cell(Cell(OOM, note="estimated 80 GiB")) == "OOM"
    assert cells_lib.format_cell(Cell(SKIPPED)) == "skip"
    text = cells_lib.format_cell(Cell(ERROR, note="RuntimeError: a | b\nsecond line " + "x" * 200))
    assert text.startswith("error: a / b") and "\n" not in text and "RuntimeError" not in text
    assert len(text) <= len("error: ") + cells_lib.SHORT_ERROR_CHARS


# ---- the suites, end to end on CPU with stand-in measurements ----

def _cpu_bench(free_bytes=64 * GIB, cap_bytes=64 * GIB, progress=None):
    def timer(fn):
        fn()  # runs the real call, so a broken implementation fails here as it would on the GPU
        return FAKE_MS

    def peak_bytes(step):
        step()
        return 3 * MIB

    return measure.Bench(torch.device("cpu"), timer, peak_bytes, lambda: free_bytes, cap_bytes,
                         progress or (lambda line: None))


TINY_FEATURES = plan_lib.FeaturePlan(
    varlen_dense=AttnShape(4, 16, 16, 2, 2, 16), varlen_lengths=(4, 28), window=AttnShape(1, 48, 48, 2, 2, 16),
    window_left=8, dropout=AttnShape(1, 32, 32, 2, 2, 16), deterministic=(AttnShape(1, 32, 32, 2, 2, 16),),
    overhead_seqlens=(16, 32))


def _tiny_plan(**overrides):
    plan = plan_lib.build_plan(quick=True, seqlens=(32,), headdims=(32,))
    plan.hidden, plan.tokens = 64, 64
    plan.speedup_shape = plan.memory_shape = (2, 2, 32)
    plan.decode_heads, plan.decode = (4, 2, 32), ((1, 48),)
    plan.decode_copy_min_bytes = MIB  # the copy reference's buffer: 256 MiB on the GPU, small here
    plan.features = TINY_FEATURES
    for key, value in overrides.items():
        setattr(plan, key, value)
    return plan


def test_speed_suite_on_cpu():
    lines = []
    suite = suites.run_speed(_cpu_bench(progress=lines.append), _tiny_plan())
    assert len(suite.rows) == 2 * 3  # (non-causal, causal) x (fwd, bwd, fwd+bwd)
    assert len(lines) == 2 and lines[0].startswith("[speed 1/2]")
    for row in suite.rows:
        assert set(row.cells) == set(suite.columns)
        shape = AttnShape(row.config["batch"], 32, 32, row.config["nheads"], row.config["nheads"], 32)
        expected = tflops_per_s(attention_flops(shape, row.config["causal"], row.config["pass"]), FAKE_MS)
        for name in ("ours", "flash", "math", "naive"):
            assert row.cells[name].status == OK, (name, row.cells[name].note)
            assert row.cells[name].value == pytest.approx(expected)
        assert all(cell.status in (OK, ERROR) for cell in row.cells.values())
        assert row.ratios["ours_over_best_peer"] == pytest.approx(1.0)
    fwd = [row for row in suite.rows if row.config["pass"] == "fwd"]
    assert all(row.extra["ours_max_abs_diff"] < 0.05 for row in fwd)  # ours and sdpa-flash agree
    assert set(suite.noise["times_ms"]) >= {"ours fwd", "ours bwd", "ours fwd+bwd"}
    assert suite.noise["max_spread_pct"] == 0.0


def test_a_failing_peer_is_recorded_and_the_run_goes_on(monkeypatch):
    def broken(q, k, v, causal):
        raise RuntimeError("boom | bad\nsecond line")

    monkeypatch.setattr(impls, "naive_forward", broken)
    suite = suites.run_speed(_cpu_bench(), _tiny_plan())
    for row in suite.rows:
        assert row.cells["naive"].status == ERROR and "boom" in row.cells["naive"].note
        assert row.cells["ours"].status == OK
    table = report.suite_table(suite)
    assert "error: boom / bad" in table and "second line" not in table


def test_out_of_memory_is_an_oom_cell(monkeypatch):
    def too_big(q, k, v, causal):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(impls, "naive_forward", too_big)
    suite = suites.run_speed(_cpu_bench(), _tiny_plan())
    assert all(row.cells["naive"].status == OOM for row in suite.rows)


def test_materializing_peers_are_estimated_before_they_run():
    no_room = suites.run_speed(_cpu_bench(free_bytes=0), _tiny_plan())
    assert all(row.cells[name].status == OOM for row in no_room.rows for name in ("naive", "math"))
    assert all(row.cells["ours"].status == OK for row in no_room.rows)  # streaming ones run regardless
    over_cap = suites.run_speed(_cpu_bench(), _tiny_plan(materialized_cap_bytes=0))
    assert all(row.cells[name].status == SKIPPED for row in over_cap.rows for name in ("naive", "math"))


needs_triton = pytest.mark.skipif(impls.backend.triton_ops is None, reason="triton is not installed")


def _triton_plan():
    """The tiny plan with the ours-triton column, in fp16: Triton's interpreter misreads bf16 tensors."""
    return _tiny_plan(impls=("ours", "ours-triton", "flash"), speed=plan_lib.speed_configs(True, ("fp16",), (32,),
                                                                                           (32,)))


@needs_triton
@pytest.mark.skipif(torch.cuda.is_available(), reason="runs the Triton backend on CPU tensors, which only Triton's "
                    "interpreter does (conftest.py chooses it on machines without CUDA)")
def test_speed_suite_has_an_ours_triton_column(monkeypatch):
    """ours-triton runs the public functions on the Triton backend (its forward and backward counted;
    Triton's interpreter on CPU), gets its own output check against the first peer, is not a peer of
    ours, and leaves the switch as it found it."""
    from flash_attn.triton import attention

    monkeypatch.delenv("FLASH_ATTENTION_TRITON_AMD_ENABLE", raising=False)
    calls = []
    for name in ("forward", "backward"):
        real = getattr(attention, name)
        monkeypatch.setattr(attention, name,
                            lambda *a, _real=real, _name=name, **kw: calls.append(_name) or _real(*a, **kw))
    suite = suites.run_speed(_cpu_bench(), _triton_plan())
    assert suite.columns == ["ours", "ours-triton", "flash"] and suite.peers == ["flash"]
    for row in suite.rows:
        assert row.cells["ours-triton"].status == OK, row.cells["ours-triton"].note
        assert row.ratios["best_peer"] == "flash"
    fwd = [row for row in suite.rows if row.config["pass"] == "fwd"]
    assert all(row.extra["ours_triton_max_abs_diff"] < 0.01 and row.extra["ours_max_abs_diff"] < 0.01 for row in fwd)
    assert "forward" in calls and "backward" in calls
    assert "FLASH_ATTENTION_TRITON_AMD_ENABLE" not in os.environ
    table = report.suite_table(suite)
    assert "ours (triton)" in table and "max abs diff, ours (triton) vs first peer" in table


@needs_triton
def test_ours_triton_never_times_another_path(monkeypatch):
    """Where the Triton backend cannot take the tensors (CPU tensors outside the interpreter), the
    column is an error, not the CPU path's time under Triton's name."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    suite = suites.run_speed(_cpu_bench(), _triton_plan())
    assert all(row.cells["ours-triton"].status == ERROR and "Triton backend does not take cpu tensors"
               in row.cells["ours-triton"].note for row in suite.rows)
    assert all(row.cells["ours"].status == OK for row in suite.rows)


FAKE_FA4_INTERFACE = """
import torch
from flash_attn.cute import scale  # an absolute import inside the package, as FA4's own modules do


def flash_attn_func(q, k, v, causal=False):
    qt, kt, vt = (x.transpose(1, 2).float() for x in (q, k, v))
    scores = qt @ kt.transpose(-2, -1) * scale.of(q)
    if causal:
        scores = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(1), float("-inf"))
    out = torch.softmax(scores, dim=-1) @ vt
    return out.transpose(1, 2).to(q.dtype), torch.logsumexp(scores, dim=-1)
"""


@pytest.fixture
def fake_fa4(tmp_path, monkeypatch):
    """A stand-in FlashAttention 4 laid out as its wheel installs it: flash_attn/cute with no
    flash_attn/__init__.py, on sys.path behind this package."""
    package = tmp_path / "flash_attn" / "cute"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("from .interface import flash_attn_func\n")
    (package / "interface.py").write_text(FAKE_FA4_INTERFACE)
    (package / "scale.py").write_text("def of(q):\n    return q.shape[-1] ** -0.5\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(flash_attn, "__path__", list(flash_attn.__path__))
    impls._fa4_interface.cache_clear()
    yield
    impls._fa4_interface.cache_clear()
    for name in [name for name in sys.modules if name.startswith("flash_attn.cute")]:
        del sys.modules[name]


def test_speed_suite_has_an_fa4_column(fake_fa4):
    """fa4 finds FlashAttention 4's flash_attn/cute beside this package of the same name, runs its
    forward and backward, and is a peer of ours."""
    suite = suites.run_speed(_cpu_bench(), _tiny_plan(impls=("ours", "fa4", "flash")))
    assert suite.columns == ["ours", "fa4", "flash"] and suite.peers == ["fa4", "flash"]
    for row in suite.rows:
        assert row.cells["fa4"].status == OK, row.cells["fa4"].note
    fwd = [row for row in suite.rows if row.config["pass"] == "fwd"]
    assert all(row.extra["ours_max_abs_diff"] < 0.01 for row in fwd)
    assert sys.modules["flash_attn.cute"].__file__.startswith(str(Path(flash_attn.__path__[-1])))


def test_fa4_column_says_when_it_is_not_installed(monkeypatch):
    monkeypatch.setattr(flash_attn, "__path__", list(flash_attn.__path__))
    monkeypatch.setattr(sys, "path", [entry for entry in sys.path if not
                                      os.path.isfile(os.path.join(entry or os.curdir, "flash_attn", "cute",
                                                                  "interface.py"))])
    impls._fa4_interface.cache_clear()
    suite = suites.run_speed(_cpu_bench(), _tiny_plan(impls=("ours", "fa4")))
    impls._fa4_interface.cache_clear()
    assert all(row.cells["fa4"].status == ERROR and "FlashAttention 4 is not installed" in row.cells["fa4"].note
               for row in suite.rows)


def test_speedup_memory_and_decode_suites_on_cpu():
    bench, plan = _cpu_bench(), _tiny_plan()
    speedup = suites.run_speedup(bench, plan)
    assert [row.config["series"] for row in speedup.rows] == ["plain", "causal", "dropout+mask"]
    assert [row.config["causal"] for row in speedup.rows] == [False, True, False]
    assert all(row.extra["speedup_ours"] == pytest.approx(1.0) for row in speedup.rows[:2])
    masked = speedup.rows[2]
    assert masked.cells["naive"].status == OK and masked.cells["sdpa"].status == OK
    if hasattr(flash_attn, "flash_attn_varlen_func"):
        assert masked.cells["ours"].status == OK, masked.cells["ours"].note
    else:
        assert masked.cells["ours"].status == ERROR and "flash_attn_varlen_func" in masked.cells["ours"].note
    memory = suites.run_memory(bench, plan)
    assert all(row.cells["ours"].value == pytest.approx(3.0) for row in memory.rows)
    assert all(row.extra["reduction_vs_naive"] == pytest.approx(1.0) for row in memory.rows)
    decode = suites.run_decode(bench, plan)
    row = decode.rows[0]
    nbytes = kv_cache_bytes(1, 48, 2, 32, 2)
    assert row.cells["ours"].value == pytest.approx(gb_per_s(nbytes, FAKE_MS))
    assert row.cells["naive"].status == OK and row.cells["math"].status == OK
    assert all(cell.status in (OK, ERROR) for cell in row.cells.values())
    assert row.extra["copy_GBps"] == pytest.approx(gb_per_s(2 * MIB, FAKE_MS))  # max(K+V, 1 MiB), read + write
    if impls.kvcache_function() is None:
        assert any("flash_attn_with_kvcache" in note for note in decode.notes)
    else:
        assert decode.columns[:4] == ["ours-kvcache", "ours-paged16", "ours-paged256", "ours"]
        assert all(row.cells[name].status == OK for name in decode.columns[:4]), row.cells


# ---- the decode suite's paged caches, copy reference and append+rotary step ----

needs_kvcache = pytest.mark.skipif(impls.kvcache_function() is None,
                                   reason="flash_attn_with_kvcache does not exist in this version")
DECODE_EXTRA_KEYS = ["copy_GBps", "ours_vs_copy", "ours_vs_cudnn", "paged16_vs_contiguous", "append_rotary_us"]


@pytest.mark.parametrize("context,page_size", [(48, 16), (40, 16), (48, 256), (512, 256)])
def test_paged_layout_puts_each_row_in_its_shuffled_page(context, page_size):
    cache = torch.randn(3, context, 2, 8)
    pages_per_sequence = -(-context // page_size)
    block_table = decode.shuffled_block_table(3, pages_per_sequence, seed=0, device="cpu")
    assert block_table.dtype == torch.int32
    assert sorted(block_table.flatten().tolist()) == list(range(3 * pages_per_sequence))
    pages = decode.paged_layout(cache, page_size, block_table)
    assert pages.shape == (3 * pages_per_sequence, page_size, 2, 8)
    gathered = pages[block_table.long()].flatten(1, 2)  # (batch, pages_per_sequence * page_size, 2, 8)
    torch.testing.assert_close(gathered[:, :context], cache, rtol=0, atol=0)
    assert (gathered[:, context:] == 0).all()


def test_block_table_is_shuffled():
    block_table = decode.shuffled_block_table(2, 6, seed=0, device="cpu")
    assert block_table.flatten().tolist() != list(range(12))


def test_rotary_tables_have_a_row_per_position():
    cos, sin = decode.rotary_tables(49, 32, torch.bfloat16, "cpu")
    assert cos.shape == sin.shape == (49, 16) and cos.dtype == torch.bfloat16
    assert (cos[0] == 1).all() and (sin[0] == 0).all()
    torch.testing.assert_close(cos.float() ** 2 + sin.float() ** 2, torch.ones(49, 16), atol=2e-2, rtol=0)


def _timed(us):
    return Cell(OK, 1.0, us / 1000)


def test_decode_extra_columns_from_the_cells():
    cells = {"ours-kvcache": Cell(OK, 1500.0, 0.010), "cudnn": _timed(30), "ours-paged16": _timed(20)}
    copy = Cell(OK, 3000.0, 0.5)
    extra = decode.decode_extra(cells, copy, _timed(14))
    assert list(extra)[:1] == ["copy_GBps"] and set(DECODE_EXTRA_KEYS) <= set(extra)
    assert extra["copy_GBps"] == 3000.0 and extra["ours_vs_copy"] == pytest.approx(0.5)
    assert extra["ours_vs_cudnn"] == pytest.approx(3.0)  # sdpa-cudnn µs / ours µs
    assert extra["paged16_vs_contiguous"] == pytest.approx(0.5)  # ours kvcache µs / paged16 µs
    assert extra["append_rotary_us"] == pytest.approx(4.0) and extra["append_rotary_step_us"] == pytest.approx(14)
    failed = decode.decode_extra({**cells, "cudnn": Cell(ERROR, note="x"), "ours-paged16": Cell(OOM)},
                                 Cell(OOM, note="out of memory"), Cell(ERROR, note="boom"))
    assert all(failed[key] is None for key in DECODE_EXTRA_KEYS)
    assert decode.decode_extra({"ours": Cell(OK, 1.0, 0.01)}, copy, None) == {"copy_GBps": 3000.0}


@pytest.fixture
def recorded_kvcache_calls(monkeypatch):
    """flash_attn_with_kvcache (its CPU path) wrapped to record each call's arguments; SDPA's backends
    unpinned so every peer, sdpa-cudnn included, has a value on CPU."""
    calls, real = [], impls.kvcache_function()

    def recording(q, k_cache, v_cache, **options):
        calls.append({"k_cache": k_cache.shape, **options})
        return real(q, k_cache, v_cache, **options)

    monkeypatch.setattr(impls, "kvcache_function", lambda: recording)
    monkeypatch.setattr(impls, "training_impl", lambda name: impls.Impl(name, impls.sdpa_forward))
    return calls


def _calls(calls, page_size=None, appended=False):
    return [call for call in calls if (call.get("block_table") is not None) == (page_size is not None)
            and (page_size is None or call["k_cache"][1] == page_size) and (call.get("k") is not None) == appended]


@needs_kvcache
def test_decode_suite_measures_paged_caches_copy_and_append_rotary(recorded_kvcache_calls):
    batch, context = 2, 96
    suite = suites.run_decode(_cpu_bench(), _tiny_plan(decode=((batch, context),)))
    assert suite.columns == ["ours-kvcache", "ours-paged16", "ours-paged256", "ours", "flash", "cudnn",
                             "efficient", "math", "naive"]
    assert suite.ours == suite.columns[:4]
    assert [key for key, _, _ in suite.extra_columns] == DECODE_EXTRA_KEYS
    row = suite.rows[0]
    nbytes = kv_cache_bytes(batch, context, 2, 32, 2)
    for name in suite.columns:
        assert row.cells[name].status == OK, (name, row.cells[name].note)
        assert row.cells[name].value == pytest.approx(gb_per_s(nbytes, FAKE_MS))  # the same bytes, paged or not
    copy_bytes = 2 * MIB
    assert row.extra["copy_GBps"] == pytest.approx(gb_per_s(copy_bytes, FAKE_MS))
    assert row.extra["ours_vs_copy"] == pytest.approx(nbytes / copy_bytes)
    assert row.extra["ours_vs_cudnn"] == pytest.approx(1.0) and row.extra["paged16_vs_contiguous"] == pytest.approx(1.0)
    assert row.extra["append_rotary_us"] == pytest.approx(0.0)
    assert row.extra["append_rotary_step_us"] == pytest.approx(FAKE_MS * 1000)
    assert row.ratios["ours"] == "ours-kvcache"

    calls = recorded_kvcache_calls
    contiguous = _calls(calls)
    assert contiguous and all(call["k_cache"] == (batch, context, 2, 32) for call in contiguous)
    for call in contiguous:
        seqlens = call["cache_seqlens"]
        assert seqlens.dtype == torch.int32 and seqlens.tolist() == [context] * batch
    for page_size in (16, 256):
        paged = _calls(calls, page_size)
        pages = batch * -(-context // page_size)
        assert paged and all(call["k_cache"] == (pages, page_size, 2, 32) for call in paged)
        assert all(call["cache_seqlens"].tolist() == [context] * batch for call in paged)
        block_table = paged[0]["block_table"]
        assert block_table.dtype == torch.int32 and block_table.shape == (batch, pages // batch)
        assert sorted(block_table.flatten().tolist()) == list(range(pages))
    assert _calls(calls, 16)[0]["block_table"].flatten().tolist() != list(range(12))  # pages out of order
    appended = _calls(calls, appended=True)
    assert appended
    for call in appended:
        assert call["k"].shape == call["v"].shape == (batch, 1, 2, 32)
        assert call["rotary_cos"].shape == call["rotary_sin"].shape == (context + 1, 16)
        assert call["rotary_cos"].dtype == torch.bfloat16
        assert call["cache_seqlens"].tolist() == [context - 1] * batch
        assert call["causal"] is True and call["rotary_interleaved"] is True

    text = report.suite_markdown(suite)
    for header in ("ours (paged 16)", "ours (paged 256)", "copy GB/s (read+write)", "ours kvcache GB/s / copy GB/s",
                   "sdpa-cudnn µs / ours kvcache µs", "ours kvcache µs / paged16 µs", "append+rotary extra µs"):
        assert f"| {header} |" in text.splitlines()[2]
    assert "dst.copy_(src)" in text and "random permutation of the pages" in text
    assert "cache_seqlens = context - 1" in text and "rotary_interleaved=True" in text
    assert len({line.count("|") for line in report.suite_table(suite).splitlines()}) == 1


@needs_kvcache
def test_paged_decode_reads_the_same_keys_as_the_contiguous_cache():
    problem = decode.decode_problem(2, 80, (4, 2, 32), torch.bfloat16, "cpu")
    contiguous = impls.ours_kvcache_decode(problem.q, problem.k_cache, problem.v_cache, problem.cache_seqlens)
    for page_size in decode.PAGE_SIZES:
        k_pages, v_pages, block_table = decode.paged_problem(problem, page_size)
        paged = impls.ours_kvcache_decode(problem.q, k_pages, v_pages, problem.cache_seqlens, block_table)
        torch.testing.assert_close(paged, contiguous)


@needs_kvcache
def test_a_failing_append_step_leaves_its_column_empty_and_says_why(monkeypatch):
    def broken(*args):
        raise RuntimeError("append kernel missing")

    monkeypatch.setattr(impls, "ours_kvcache_append_rotary", broken)
    suite = suites.run_decode(_cpu_bench(), _tiny_plan())
    row = suite.rows[0]
    assert row.extra["append_rotary_us"] is None and row.extra["copy_GBps"] is not None
    assert row.cells["ours-kvcache"].status == OK
    failures = [note for note in suite.notes if note.startswith("append+rotary step at b=1 ctx=48")]
    assert len(failures) == 1 and "append kernel missing" in failures[0]  # once, though the row ran twice


def test_decode_suite_without_flash_attn_with_kvcache(monkeypatch):
    monkeypatch.setattr(impls, "kvcache_function", lambda: None)
    suite = suites.run_decode(_cpu_bench(), _tiny_plan())
    assert suite.columns[0] == "ours" and not any(name.startswith("ours-") for name in suite.columns)
    assert [key for key, _, _ in suite.extra_columns] == ["copy_GBps"]
    assert list(suite.rows[0].extra) == ["copy_GBps"] and suite.rows[0].extra["copy_GBps"] > 0
    assert any("flash_attn_with_kvcache does not exist" in note for note in suite.notes)
    assert not any("append+rotary" in note for note in suite.notes)


# ---- stand-ins for our functions: materialized attention that records how it was called ----

def _reference_attention(q, k, v, causal=False, window_size=(-1, -1), dropout_p=0.0, **_):
    """Attention on (batch, seqlen, nheads, headdim) with FlashAttention 2's bottom-right aligned
    causal and window masks, and torch dropout."""
    seqlen_q, seqlen_k = q.shape[1], k.shape[1]
    keep = window_keep_mask(seqlen_q, seqlen_k, (window_size[0], 0 if causal else window_size[1]), "cpu")
    scores = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float()) * q.shape[-1] ** -0.5
    probs = torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1)
    probs = torch.nn.functional.dropout(probs, dropout_p, training=True)
    return torch.einsum("bhqk,bkhd->bqhd", probs, v.float()).to(q.dtype)


@pytest.fixture
def stand_in_ours(monkeypatch):
    """Replaces ours_attention and ours_varlen; returns the list of (function, options) calls."""
    calls = []

    def attention(q, k, v, **options):
        calls.append(("attention", options))
        return _reference_attention(q, k, v, **options)

    def varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, **options):
        calls.append(("varlen", {**options, "cu_seqlens_q": cu_seqlens_q.tolist(), "max_seqlen_q": max_seqlen_q}))
        bounds_q, bounds_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
        outs = [_reference_attention(q[None, a:b], k[None, c:d], v[None, c:d], **options)[0]
                for a, b, c, d in zip(bounds_q[:-1], bounds_q[1:], bounds_k[:-1], bounds_k[1:], strict=True)]
        return torch.cat(outs)

    monkeypatch.setattr(impls, "ours_attention", attention)
    monkeypatch.setattr(impls, "ours_varlen", varlen)
    return calls


def test_padded_forwards_agree_on_the_kept_tokens(stand_in_ours):
    """naive, SDPA and ours (unpad -> varlen -> pad) compute the same attention over the kept keys."""
    q, k, v = (torch.randn(3, 16, 2, 8, requires_grad=True) for _ in range(3))
    key_mask = torch.arange(16) < torch.tensor([16, 9, 12]).unsqueeze(1)
    naive = impls.naive_padded(q, k, v, key_mask, 0.0)
    torch.testing.assert_close(impls.sdpa_padded(q, k, v, key_mask, 0.0), naive)
    ours = impls.ours_padded(q, k, v, key_mask, 0.0)
    torch.testing.assert_close(ours[key_mask], naive[key_mask])
    assert (ours[~key_mask] == 0).all()  # padded queries dropped, as a model's unpadded path does
    dk = torch.autograd.grad(ours, k, torch.randn_like(ours))[0]
    assert (dk[~key_mask] == 0).all() and (dk[key_mask] != 0).any()
    assert stand_in_ours[0][1]["cu_seqlens_q"] == [0, 16, 25, 37]
    assert impls.sdpa_padded_backend(q, k, v, key_mask, 0.1) != ""


def test_speedup_dropout_mask_series(stand_in_ours):
    plan = _tiny_plan(speedup_seqlens=(16, 32))
    suite = suites.run_speedup(_cpu_bench(), plan)
    assert [(row.config["series"], row.config["seqlen"]) for row in suite.rows] == [
        ("plain", 16), ("plain", 32), ("causal", 16), ("causal", 32), ("dropout+mask", 16), ("dropout+mask", 32)]
    for row in suite.rows:
        masked = row.config["series"] == "dropout+mask"
        assert row.config["padding_mask"] == masked and row.config["dropout_p"] == (0.1 if masked else 0.0)
        assert set(row.cells) == ({"naive", "sdpa", "ours"} if masked else {"naive", "flash", "ours"})
        assert all(cell.status == OK for cell in row.cells.values()), row.cells
        assert row.extra["speedup_ours"] == pytest.approx(1.0) and row.extra["speedup_sdpa"] == pytest.approx(1.0)
        if masked:
            assert row.cells["sdpa"].note.startswith("SDPA picked ")
            assert row.ratios["ours_over_reference"] is None  # no sdpa-flash in this series
    varlen_calls = [options for name, options in stand_in_ours if name == "varlen"]
    assert varlen_calls and all(options["dropout_p"] == 0.1 for options in varlen_calls)
    kept = padding_lengths(2, 32, plan.padding_seed)
    assert {"cu_seqlens_q": [0, kept[0], sum(kept)], "max_seqlen_q": max(kept)}.items() <= varlen_calls[-1].items()
    text = report.suite_markdown(suite)
    assert "those columns come with those features" not in text
    assert "flash_attn_varlen_func" in text and "SDPA picked" in text
    assert len({line.count("|") for line in report.suite_table(suite).splitlines()}) == 1


def _rows_of(suite, case, pass_name):
    return [row for row in suite.rows if row.config["case"] == case and row.config["pass"] == pass_name]


def test_features_suite_on_cpu(stand_in_ours):
    lines = []
    plan = _tiny_plan()
    suite = suites.RUNNERS["features"](_cpu_bench(progress=lines.append), plan)
    assert [(row.config["case"], row.config["pass"]) for row in suite.rows] == [
        ("varlen", "fwd"), ("varlen", "bwd"), ("window", "fwd"), ("window", "bwd"), ("dropout", "fwd"),
        ("dropout", "bwd"), ("dropout (sdpa-flash)", "fwd"), ("dropout (sdpa-flash)", "bwd"),
        ("dropout (sdpa-cudnn)", "fwd"), ("dropout (sdpa-cudnn)", "bwd"), ("deterministic", "bwd"),
        ("host overhead", "fwd+bwd"), ("host overhead", "fwd+bwd")]
    assert len(lines) == 8 and lines[0].startswith("[features 1/8] varlen")
    # SDPA on the CPU has no cuDNN backend and no flash kernel with dropout: those peer cells are errors
    # here (on the GPU they run); every other cell runs
    peer_rows = [row for row in suite.rows if row.config["case"].startswith("dropout (")]
    assert all(row.cells["baseline"].status == OK for row in peer_rows if "flash" in row.config["case"])
    assert all(cell.status == OK for row in suite.rows if row not in peer_rows for cell in row.cells.values())
    # unmasked FLOPs: varlen per sequence, the window per query row
    lengths = mixed_lengths(4, 64, 4, 28, seed=0)
    varlen_fwd = _rows_of(suite, "varlen", "fwd")[0]
    expected = tflops_per_s(4.0 * sum(n * n for n in lengths) * 2 * 16, FAKE_MS)
    assert varlen_fwd.cells["feature"].value == pytest.approx(expected)
    assert varlen_fwd.cells["baseline"].value == pytest.approx(tflops_per_s(4.0 * 4 * 16 * 16 * 2 * 16, FAKE_MS))
    window_bwd = _rows_of(suite, "window", "bwd")[0]
    expected = tflops_per_s(pairs_flops(score_pairs(48, 48, (8, 0)), 2, 16, "bwd"), FAKE_MS)
    assert window_bwd.cells["feature"].value == pytest.approx(expected)
    # with the same stand-in time on both sides every time ratio is 1
    assert varlen_fwd.extra["ratio"] == pytest.approx(sum(n * n for n in lengths) / (4 * 16 * 16))
    assert window_bwd.extra["result"] == "1.00" and window_bwd.extra["meets_target"] == "NO"
    assert _rows_of(suite, "dropout", "bwd")[0].extra["result"] == "+0.0%"
    assert all(row.extra["meets_target"] == "yes" for row in suite.rows if row.config["case"] != "window"
               and row.config["case"] != "varlen" and row not in peer_rows)
    assert [row.extra["target"] for row in suite.rows[::2]] == ["≥ 0.95", "≥ 3.00", "≤ +15.0%", "≤ +15.0%",
                                                                "≤ +15.0%", "≥ 0.85", "≥ 1.00"]


def test_host_bound_cells_are_timed_back_to_back(stand_in_ours):
    """The speedup suite and the features suite's host-overhead rows time steps with bench.step_timer
    (back to back); every other cell with bench.timer (L2 flushed per run)."""
    bench = _cpu_bench()
    bench.step_timer = lambda fn: (fn(), 2 * FAKE_MS)[1]
    speedup = suites.run_speedup(bench, _tiny_plan())
    assert all(cell.ms == pytest.approx(2 * FAKE_MS) for row in speedup.rows for cell in row.cells.values())
    suite = suites.RUNNERS["features"](bench, _tiny_plan())
    for row in suite.rows:
        expected = 2 * FAKE_MS if row.config["case"] == "host overhead" else FAKE_MS
        assert all(cell.ms == pytest.approx(expected) for cell in row.cells.values() if cell.status == OK), row.config


def _together_timer(groups):
    """A stand-in for Timer.back_to_back_together: runs each entry's step once in its context, appends
    the number of entries to groups, and returns FAKE_MS, 2 FAKE_MS, ... in entry order, so each cell
    shows which place it had."""
    def together(entries):
        groups.append(len(entries))
        for context_factory, fn in entries:
            with context_factory():
                fn()
        return [FAKE_MS * (index + 1) for index in range(len(entries))]

    return together


def test_host_bound_steps_are_timed_together(stand_in_ours):
    """The speedup suite's rows and the host-overhead rows time their implementations in one
    measurement (bench.steps_together_timer), each cell from its own entry's time."""
    groups = []
    bench = _cpu_bench()
    bench.steps_together_timer = _together_timer(groups)
    speedup = suites.run_speedup(bench, _tiny_plan())
    assert groups == [3, 3, 3, 3]  # the first configuration twice (noise estimate), then one per series
    for row in speedup.rows:
        names = ["naive", "sdpa", "ours"] if row.config["series"] == "dropout+mask" else ["naive", "flash", "ours"]
        assert [row.cells[name].ms for name in names] == pytest.approx([FAKE_MS, 2 * FAKE_MS, 3 * FAKE_MS])
        assert all(row.cells[name].value == row.cells[name].ms for name in names)  # still ms
        assert row.extra["speedup_ours"] == pytest.approx(1 / 3)
    assert speedup.rows[2].cells["sdpa"].note.startswith("SDPA picked ")
    groups.clear()
    suite = suites.RUNNERS["features"](bench, _tiny_plan())
    assert groups == [2, 2]  # the host-overhead rows; the first configuration (varlen) is not one of them
    for row in _rows_of(suite, "host overhead", "fwd+bwd"):
        ours, sdpa = row.cells["feature"], row.cells["baseline"]
        assert (ours.ms, sdpa.ms) == pytest.approx((FAKE_MS, 2 * FAKE_MS))
        assert ours.value == pytest.approx(2 * sdpa.value)  # TFLOP/s, as before
        assert row.extra["result"] == "2.00" and row.extra["meets_target"] == "yes"


def test_a_failing_probe_leaves_the_others_timed_together(monkeypatch):
    def broken(q, k, v, causal):
        raise RuntimeError("naive is broken")

    monkeypatch.setattr(impls, "naive_forward", broken)
    groups = []
    bench = _cpu_bench()
    bench.steps_together_timer = _together_timer(groups)
    suite = suites.run_speedup(bench, _tiny_plan(speedup_seqlens=(16,)))
    plain, causal = suite.rows[:2]
    for row in (plain, causal):
        assert row.cells["naive"].status == ERROR and "naive is broken" in row.cells["naive"].note
        assert (row.cells["flash"].ms, row.cells["ours"].ms) == pytest.approx((FAKE_MS, 2 * FAKE_MS))
    assert groups[:3] == [2, 2, 2]


def test_a_failing_together_measurement_falls_back_to_cells_timed_alone(stand_in_ours):
    def together(entries):
        raise RuntimeError("interleaving broke")

    bench = _cpu_bench()
    bench.steps_together_timer = together
    speedup = suites.run_speedup(bench, _tiny_plan())
    assert [row.config["series"] for row in speedup.rows] == ["plain", "causal", "dropout+mask"]
    for row in speedup.rows:
        assert all(cell.status == OK and cell.ms == pytest.approx(FAKE_MS) for cell in row.cells.values()), row.cells
        assert all("timed alone, the together measurement failed: RuntimeError: interleaving broke" in cell.note
                   for cell in row.cells.values())
        assert row.extra["speedup_ours"] == pytest.approx(1.0)
    assert speedup.rows[2].cells["sdpa"].note.startswith("SDPA picked ")
    suite = suites.RUNNERS["features"](bench, _tiny_plan())
    rows = _rows_of(suite, "host overhead", "fwd+bwd")
    assert len(rows) == 2
    for row in rows:
        assert all(cell.status == OK and cell.ms == pytest.approx(FAKE_MS) and "timed alone" in cell.note
                   for cell in row.cells.values())
        assert row.extra["result"] == "1.00"


# ---- interleaved back-to-back timing, on a fake clock ----

def test_rotated_rounds_rotate_the_order():
    order = []
    blocks = [lambda index=index: order.append(index) or float(index) for index in range(3)]
    means = measure._rotated_rounds(blocks, 4)
    assert order == [0, 1, 2, 1, 2, 0, 2, 0, 1, 0, 1, 2]
    assert means == [[0.0] * 4, [1.0] * 4, [2.0] * 4]


class _FakeCuda:
    """torch.cuda.Event and synchronize on a fake clock that the entries' calls advance. An entry's
    first call inside its context costs SWITCH_MS more (the switch between implementations); the log
    holds every context entry and exit, call, event record and synchronize, in order."""

    SWITCH_MS = 100.0

    def __init__(self, monkeypatch):
        self.now, self.log, self.active, self.first = 0.0, [], None, False
        fake = self

        class Event:
            def __init__(self, enable_timing=False):
                self.time = None

            def record(self):
                fake.log.append("record")
                self.time = fake.now

            def elapsed_time(self, end):
                return end.time - self.time

        monkeypatch.setattr(torch.cuda, "Event", Event)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda: self.log.append("sync"))

    def entry(self, name, ms):
        @contextlib.contextmanager
        def context():
            self.log.append(f"enter {name}")
            self.active, self.first = name, True
            yield
            self.log.append(f"exit {name}")
            self.active = None

        def fn():
            assert self.active == name, f"{name} called inside {self.active}'s context"
            self.log.append(f"call {name}")
            self.now += ms + (self.SWITCH_MS if self.first else 0.0)
            self.first = False

        return context, fn


def _blocks(log):
    """The log after the warm-ups, split into blocks (from a context's entry to its exit)."""
    blocks, current = [], None
    for item in log:
        if item.startswith("enter "):
            current = [item]
        elif current is not None:
            current.append(item)
            if item.startswith("exit "):
                blocks.append(current)
                current = None
    return blocks


def test_interleaved_blocks_rotate_and_time_each_entry_in_its_context(monkeypatch):
    cuda = _FakeCuda(monkeypatch)
    entries = [cuda.entry("a", 1.0), cuda.entry("b", 2.0), cuda.entry("c", 4.0)]
    rep_ms = 7 * 40.0  # 40 ms per block: 40 calls of a, 20 of b, 10 of c
    assert measure._interleaved_back_to_back_ms(entries, 10.0, rep_ms) == pytest.approx([1.0, 2.0, 4.0])
    blocks = _blocks(cuda.log)
    warm_ups, timed = blocks[:3], blocks[3:]
    assert [block[0] for block in warm_ups] == ["enter a", "enter b", "enter c"]
    names = [block[0].removeprefix("enter ") for block in timed]
    rounds = [names[i:i + 3] for i in range(0, len(names), 3)]
    assert len(rounds) == measure.BACK_TO_BACK_BLOCKS
    assert rounds == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]] * 2 + [["a", "b", "c"]]
    for name, block in zip(names, timed, strict=True):
        calls = {"a": 40, "b": 20, "c": 10}[name]
        # the context entered once, one untimed call, the queue drained around the timed calls
        assert block == ([f"enter {name}", f"call {name}", "sync", "record"] + [f"call {name}"] * calls
                         + ["record", "sync", f"exit {name}"])


def test_bench_times_entries_alone_without_a_together_timer():
    entered = []

    def context(name):
        @contextlib.contextmanager
        def enter():
            entered.append(name)
            yield

        return enter

    bench = _cpu_bench()
    bench.step_timer = lambda fn: fn()
    assert bench.time_steps_together([(context("a"), lambda: 1.0), (context("b"), lambda: 2.0)]) == [1.0, 2.0]
    assert entered == ["a", "b"]
    assert measure.cuda_bench(measure.Timer(), 0, print).steps_together_timer is not None


def test_timer_idles_the_drained_gpu_before_each_measurement(monkeypatch):
    """--idle-ms: the queue is drained, then the GPU left idle, before the measurement starts; 0 skips both."""
    events = []
    monkeypatch.setattr(measure.torch.cuda, "synchronize", lambda: events.append("sync"))
    monkeypatch.setattr(measure.time, "sleep", lambda seconds: events.append(("sleep", seconds)))
    timer = measure.Timer(warmup_ms=1, rep_ms=1, idle_ms=250)
    timer._do_bench = lambda fn, **kwargs: events.append("measure") or 1.5
    assert timer(lambda: None) == 1.5
    assert events == ["sync", ("sleep", 0.25), "measure"]
    assert "idle 250 ms" in timer.describe()
    events.clear()
    timer.idle_ms = 0
    timer(lambda: None)
    assert events == ["measure"]


def test_features_call_ours_with_each_feature(stand_in_ours):
    suites.RUNNERS["features"](_cpu_bench(), _tiny_plan())
    options = [opts for _, opts in stand_in_ours]
    assert any(opts.get("window_size") == (8, 0) and opts.get("causal") for opts in options)
    assert any(opts == {"causal": True} for opts in options)  # the full causal baseline
    assert any(opts.get("dropout_p") == 0.1 for opts in options)
    assert any(opts.get("deterministic") is True for opts in options)
    varlen = [opts for name, opts in stand_in_ours if name == "varlen"]
    lengths = mixed_lengths(4, 64, 4, 28, seed=0)
    assert varlen and varlen[0]["cu_seqlens_q"][-1] == 64 and varlen[0]["max_seqlen_q"] == max(lengths)


def test_feature_table_states_ratio_and_target(stand_in_ours):
    suite = suites.RUNNERS["features"](_cpu_bench(), _tiny_plan())
    table = report.suite_table(suite)
    header = table.splitlines()[0]
    assert "ours / best peer" not in header and "ours / sdpa-flash" not in header
    for column in ("case", "setup", "pass", "feature", "baseline", "compared", "result", "target", "meets target"):
        assert f"| {column} |" in header
    assert len({line.count("|") for line in table.splitlines()}) == 1
    assert "µs ·" in table and "FLOP ratio 2.97" in table  # 48 queries, window 8: 1176 / 396 elements
    assert "time causal / window" in table and "TFLOP/s varlen / dense" in table


def _cell(ms, flops=1e9):
    return Cell(OK, tflops_per_s(flops, ms), ms)


def test_comparisons_judge_their_targets():
    assert features.DROPOUT.extra(_cell(1.2), _cell(1.0))["result"] == "+20.0%"
    assert features.DROPOUT.extra(_cell(1.2), _cell(1.0))["meets_target"] == "NO"
    assert features.DROPOUT.extra(_cell(1.1), _cell(1.0))["meets_target"] == "yes"
    window = features.window_comparison(2.29)
    assert window.extra(_cell(1.0), _cell(3.1))["meets_target"] == "yes"
    assert window.extra(_cell(1.0), _cell(2.2))["ratio"] == pytest.approx(2.2)
    varlen = features.VARLEN.extra(_cell(1.0, flops=0.9e9), _cell(1.0))
    assert varlen["ratio"] == pytest.approx(0.9) and varlen["meets_target"] == "NO"
    assert features.DETERMINISTIC.extra(_cell(1.1), _cell(1.0))["meets_target"] == "yes"  # 0.91 >= 0.85
    assert features.OVERHEAD.extra(_cell(1.0), _cell(0.9))["meets_target"] == "NO"
    failed = features.OVERHEAD.extra(Cell(ERROR, note="x"), _cell(1.0))
    assert failed["ratio"] is None and failed["meets_target"] == "—" and failed["target"] == "≥ 1.00"


@pytest.mark.skipif(not hasattr(flash_attn, "flash_attn_varlen_func"),
                    reason="flash_attn_varlen_func does not exist yet")
def test_features_and_padded_series_run_on_the_library():
    """Our real functions (the CPU reference path) take every option the suites pass."""
    bench, plan = _cpu_bench(), _tiny_plan()
    suite = features.run_features(bench, plan)
    for row in suite.rows:
        if row.config["case"].startswith("dropout ("):  # SDPA peers: no CPU kernel with dropout
            continue
        assert all(cell.status == OK for cell in row.cells.values()), (row.config, row.cells)
    q, k, v = (torch.randn(2, 16, 2, 8, dtype=torch.bfloat16) for _ in range(3))
    key_mask = torch.arange(16) < torch.tensor([16, 10]).unsqueeze(1)
    ours = impls.ours_padded(q, k, v, key_mask, 0.0)
    torch.testing.assert_close(ours[key_mask], impls.naive_padded(q, k, v, key_mask, 0.0)[key_mask],
                               atol=2e-2, rtol=2e-2)


def test_naive_decode_matches_sdpa_with_gqa():
    q = torch.randn(2, 1, 8, 16)
    k, v = torch.randn(2, 40, 2, 16), torch.randn(2, 40, 2, 16)
    expected = impls.sdpa_forward(q, impls.repeat_kv(k, 8), impls.repeat_kv(v, 8), causal=False)
    torch.testing.assert_close(impls.naive_decode(q, k, v), expected)


# ---- results: JSON, markdown, plots ----

def _metadata():
    metadata = env.collect_metadata("stand-in timer", ["--quick"])
    metadata["set"] = "test"
    return metadata


def _all_suites():
    bench, plan = _cpu_bench(), _tiny_plan()
    return [runner(bench, plan) for runner in suites.RUNNERS.values()]


def test_results_json_and_markdown(tmp_path):
    all_suites = _all_suites()
    all_suites[0].rows[0].extra["ours_max_abs_diff"] = float("nan")  # JSON has no NaN: written as text
    metadata = _metadata()
    paths = report.write_results(tmp_path / "out", metadata, all_suites)
    assert [p.name for p in paths] == ["results.json", "results.md"]
    data = json.loads(paths[0].read_text())
    for key in ("device", "torch", "cuda", "cudnn", "date", "timer"):
        assert key in data["metadata"]
    assert set(data["suites"]) == {"speed", "speedup", "memory", "decode", "features"}
    assert data["suites"]["features"]["rows"][0]["extra"]["target"] == "≥ 0.95"
    assert data["suites"]["speed"]["rows"][0]["extra"]["ours_max_abs_diff"] == "nan"
    markdown = paths[1].read_text()
    assert markdown.startswith("# flash_attn benchmark")
    assert metadata["device"] in markdown and metadata["date"] in markdown and metadata["torch"] in markdown
    assert "ours / best peer" in markdown and "ours / sdpa-flash" in markdown
    table_lines = [line for line in markdown.splitlines() if line.startswith("|")]
    assert len({line.count("|") for line in table_lines if "---" not in line}) >= 1
    for suite in all_suites:
        widths = {line.count("|") for line in report.suite_table(suite).splitlines()}
        assert len(widths) == 1, suite.name  # every row has as many cells as the header


def test_plots_are_written(tmp_path):
    pytest.importorskip("matplotlib")
    from flash_attn.benchmark import plots

    plt = plots.load_pyplot()
    metadata = _metadata()
    names = []
    for suite in _all_suites():
        names += [p.name for p in plots.write_plots(plt, suite, metadata, tmp_path)]
    assert sorted(names) == ["decode.png", "memory.png", "speed_bf16.png", "speedup.png"]
    for name in names:
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_results_folder_is_named_by_device_and_date():
    assert env.device_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    folder = env.default_results_dir({"device": "NVIDIA H200", "date": "2026-11-22"})
    assert folder == Path("benchmarks/results/nvidia-h200_2026-11-22")


def test_cudnn_version_text(monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: True)
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 91900)
    assert env.cudnn_version() == "9.19.0"
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 8902)
    assert env.cudnn_version() == "8.9.2"


# ---- the command ----

def test_cli_without_gpu_checks_the_cpu_path_and_exits_0():
    environment = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run([sys.executable, "-m", "flash_attn.benchmark", "--suite", "speed", "--no-plots"],
                            cwd=REPO_ROOT, env=environment, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "No GPU found" in result.stdout
    last_lines = result.stdout.strip().splitlines()[-2:]
    assert all(line.startswith("|") and "yes" in line for line in last_lines)


def test_gpu_run_writes_each_suite_and_prints_the_report_last(tmp_path, monkeypatch, capsys):
    """The GPU command's orchestration, with the CPU stand-in bench in place of the CUDA one."""
    from flash_attn.benchmark import cli

    monkeypatch.setattr(cli, "cuda_bench", lambda timer, cap, progress: _cpu_bench(progress=progress))
    monkeypatch.setattr(cli, "warm_up_gpu", lambda: None)
    argv = ["--out", str(tmp_path), "--no-plots"]
    assert cli.gpu_run(cli.parse_args(argv), _tiny_plan(), argv) == 0
    captured = capsys.readouterr()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json", "results.md"]
    assert captured.out == (tmp_path / "results.md").read_text()
    assert "[speed 1/2]" in captured.err and "decode done" in captured.err and "features done" in captured.err
    assert "## Feature costs against their targets" in captured.out
    assert json.loads((tmp_path / "results.json").read_text())["metadata"]["arguments"] == argv


def test_cli_offers_the_features_suite():
    from flash_attn.benchmark import cli

    assert cli.parse_args([]).suite == plan_lib.SUITES and "features" in plan_lib.SUITES
    args = cli.parse_args(["--suite", "features,speedup"])
    assert args.suite == ("features", "speedup")
    assert plan_lib.build_plan(suites=args.suite).suites == ("features", "speedup")


@pytest.mark.parametrize("argv", [["--suite", "bogus"], ["--impls", "ours,nope"], ["--dtypes", "fp8"]])
def test_cli_rejects_bad_arguments(argv, capsys):
    assert main(argv) == 2
    assert "error" in capsys.readouterr().err
