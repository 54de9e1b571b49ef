"""examples/llama_block: its three attentions compute the same model, and the CPU smoke run measures
all three and writes every output (CPU, seconds; the GPU run is the benchmark itself)."""

import json
import pathlib
import sys

import pytest
import torch

from helpers import OUT_FACTOR, assert_fa_close

pytest.importorskip("matplotlib", reason="the example's report needs matplotlib")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "examples" / "llama_block"))
import bench  # noqa: E402
import llama_model  # noqa: E402
import llama_report  # noqa: E402

TINY = llama_model.LlamaConfig(vocab_size=64, n_layer=2, n_embd=64, n_head=4, n_kv_head=2, intermediate_size=96)


@pytest.mark.parametrize("kind", ["ours", "sdpa"])
def test_attentions_agree(kind):
    """Same weights: flash_attn's MHA and SDPA give the plain attention's logits (GQA, rotary, causal;
    tolerance rule: ref the plain model in fp64, pt in fp32)."""
    state = llama_model.initial_state(TINY, seed=0, device="cpu")
    tokens = torch.randint(0, TINY.vocab_size, (2, 40))
    with torch.no_grad():
        out = llama_model.build(kind, TINY, "cpu", state)(tokens)
        pt = llama_model.build("plain", TINY, "cpu", state)(tokens)
        ref = llama_model.build("plain", TINY, "cpu", state).double()(tokens)
    assert_fa_close("logits", out, ref, pt, OUT_FACTOR)


def test_smoke_run_writes_outputs(tmp_path):
    results = bench.main(["--smoke", "--out", str(tmp_path)])
    for name in ("throughput_memory.png", "results.md", "results.json"):
        assert (tmp_path / name).stat().st_size > 0, name
    written = json.loads((tmp_path / "results.json").read_text())
    assert written["preset"] == "smoke" and written["device"] == "CPU"
    contexts = bench.PRESETS["smoke"].contexts
    assert [(run["context"], run["attention"]) for run in results["runs"]] == [
        (context, kind) for context in contexts for kind in llama_model.ATTENTIONS]
    for run in results["runs"]:
        assert not run["oom"] and run["timed_steps"] == bench.PRESETS["smoke"].timed_steps, run
        assert run["tokens_per_s"] > 0 and torch.isfinite(torch.tensor(run["last_loss"])), run
    assert all(check["agree"] for check in results["checks"]), results["checks"]
    assert all(check["sdpa_backend"] for check in results["checks"]), results["checks"]
    markdown = (tmp_path / "results.md").read_text()
    assert "flash_attn MHA" in markdown and "PyTorch SDPA" in markdown


def test_oom_is_reported_as_a_row(monkeypatch):
    """A run out of GPU memory becomes an OOM row instead of ending the benchmark."""
    def out_of_memory(*args):
        raise torch.OutOfMemoryError("test")

    monkeypatch.setattr(bench, "run_steps", out_of_memory)
    row = bench.measure("plain", 64, bench.PRESETS["smoke"], state=None, device=torch.device("cpu"), seed=0)
    assert row["oom"] and row["tokens_per_s"] is None and row["batch"] == 2


def _gpu_like_run(attention, tokens_per_s, peak_mib):
    oom = tokens_per_s is None
    return dict(context=4096, batch=2, attention=attention, oom=oom, timed_steps=0 if oom else 10,
                ms_per_step=None if oom else 8192e3 / tokens_per_s, tokens_per_s=tokens_per_s, peak_mib=peak_mib,
                above_resident_mib=None if oom else peak_mib - 18000, first_loss=None if oom else 10.4,
                first_grad_norm=None if oom else 1.5, last_loss=None if oom else 10.3)


def test_report_of_a_gpu_run(tmp_path):
    """The GPU-only parts of the report (peak memory, the 4k comparison with the articles, OOM rows),
    which the CPU smoke run does not reach, on made-up numbers."""
    runs = [_gpu_like_run("ours", 60000.0, 30000.0), _gpu_like_run("plain", 30000.0, 60000.0),
            _gpu_like_run("sdpa", 58000.0, 29000.0), dict(_gpu_like_run("plain", None, None), context=8192, batch=1)]
    checks = [dict(context=4096, first_loss={"ours": 10.4, "plain": 10.4, "sdpa": 10.4}, loss_spread=0.0,
                   grad_norm_spread=0.0, agree=True, sdpa_backend="FLASH_ATTENTION")]
    results = dict(title="t", setup="s", runs=runs, checks=checks, tolerance=bench.TOLERANCES["bf16"])
    llama_report.write_all(results, tmp_path)
    markdown = (tmp_path / "results.md").read_text()
    assert "| 2.00x | -50.0% |" in markdown
    assert "| 8192 | 1 | plain PyTorch attention | OOM |" in markdown
    assert "Here, flash_attn MHA against plain PyTorch attention at 4096: 2.00x the throughput, -50.0%" in markdown
    assert (tmp_path / "throughput_memory.png").stat().st_size > 0
