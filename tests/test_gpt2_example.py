"""examples/gpt2: its two attentions compute the same model, and the CPU smoke run writes every
output (CPU, seconds; the GPU run is the example itself)."""

import json
import pathlib
import sys

import pytest
import torch

from helpers import OUT_FACTOR, assert_fa_close

pytest.importorskip("matplotlib", reason="the example's report needs matplotlib")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "examples" / "gpt2"))
import gpt2_model  # noqa: E402
import train  # noqa: E402


def test_attentions_agree():
    """Same weights, eval mode: flash_attn's MHA and the plain attention give the same logits
    (tolerance rule: ref the plain model in fp64, pt in fp32)."""
    config = gpt2_model.GPTConfig(n_positions=24, n_layer=2, n_head=2, n_embd=32)
    models = gpt2_model.build_pair(config, seed=0, device="cpu")
    tokens = torch.randint(0, config.vocab_size, (2, 24))
    with torch.no_grad():
        ours = models["ours"].eval()(tokens)
        pt = models["plain"].eval()(tokens)
        ref = models["plain"].double()(tokens)
    assert_fa_close("logits", ours, ref, pt, OUT_FACTOR)


def test_smoke_run_writes_outputs(tmp_path):
    results = train.main(["--smoke", "--out", str(tmp_path)])
    for name in ("loss_curves.png", "results.md", "results.json"):
        assert (tmp_path / name).stat().st_size > 0, name
    assert json.loads((tmp_path / "results.json").read_text())["preset"] == "smoke"
    for kind, run in results["runs"].items():
        assert run["steps_done"] == train.PRESETS["smoke"].steps, kind
        assert all(torch.isfinite(torch.tensor(run["val_loss"]))), kind
        assert run["val_loss"][-1] < run["val_loss"][0], kind
    assert "flash_attn MHA" in (tmp_path / "results.md").read_text()
