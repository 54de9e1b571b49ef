"""The suites: training speed, speed-up over naive attention and memory (the decode suite is in
decode.py, the features suite in features.py).

Each returns a Suite of rows; each row holds one Cell per implementation. Every measurement runs
through measure.guarded, so a failing or out-of-memory implementation fills its cell and the run
goes on. Inputs are fresh torch.randn tensors (runner.random_inputs).
"""

import functools

import torch

from . import impls as impl_lib
from .cells import OK, OOM, SKIPPED, Cell, Row, Suite
from .decode import run_decode
from .features import run_features
from .measure import guarded
from .plan import DTYPES
from .runner import backward_cell, random_inputs, run_configs, steps_timed_together, timed_cell
from .shapes import (
    PASSES,
    AttnShape,
    attention_flops,
    format_seqlen,
    materialized_peak_bytes,
    padding_lengths,
    training_shape,
)

GIB = 2**30
MIB = 2**20


def _materialized_verdict(bench, impl, shape, dtype, cap_bytes):
    """An OOM or skipped cell for an implementation that materializes the scores and would not fit in
    free memory (OOM) or is over the cost cap (skipped); None when it should run."""
    if not impl.materializes:
        return None
    need = materialized_peak_bytes(shape, impl.score_element_bytes(dtype))
    free = bench.free_bytes()
    if need > free:
        return Cell(OOM, note=f"estimated peak {need / GIB:.1f} GiB > {free / GIB:.1f} GiB free")
    if need > cap_bytes:
        return Cell(SKIPPED,
                    note=f"estimated peak {need / GIB:.1f} GiB > the quick set's {cap_bytes / GIB:.0f} GiB cap")
    return None


def _verdicts_where_they_fit(bench, impls, shape, dtype):
    """name -> an OOM cell for each materializing implementation that would not fit in free memory, else
    None (no cost cap: these suites exist to show naive attention where it runs)."""
    return {impl.name: _materialized_verdict(bench, impl, shape, dtype, float("inf")) for impl in impls}


def _cells_where_they_fit(bench, impls, shape, dtype, measure):
    """One cell per implementation: guarded measure(impl), or OOM where a materializing one would not fit."""
    verdicts = _verdicts_where_they_fit(bench, impls, shape, dtype)
    return {impl.name: verdicts[impl.name] or guarded(functools.partial(measure, impl)) for impl in impls}


def _time_training(bench, impl, q, k, v, dout, causal, shape):
    """Cells for each pass (TFLOP/s) and the forward output (or None). The backward goes first so its
    retained graph is gone before the other passes allocate theirs."""
    inputs = (q, k, v)

    def forward():
        return impl.forward(q, k, v, causal)

    kept = {}
    flops = {name: attention_flops(shape, causal, name) for name in PASSES}
    cells = {"bwd": guarded(lambda: backward_cell(bench, forward, inputs, dout, flops["bwd"], kept))}
    cells["fwd"] = guarded(lambda: timed_cell(bench, forward, flops["fwd"]))
    cells["fwd+bwd"] = guarded(
        lambda: timed_cell(bench, lambda: torch.autograd.grad(forward(), inputs, dout), flops["fwd+bwd"])
    )
    return cells, kept.get("out")


def _diff_key(name):
    """The Row.extra key of an implementation's output difference: ours_max_abs_diff, ours_triton_max_abs_diff."""
    return name.replace("-", "_") + "_max_abs_diff"


def _output_difference(outputs, columns):
    """max |ours - peer| over the forward output of each of our implementations (ours, ours-triton),
    against the first peer (in column order) that ran: a kernel that returns wrong numbers must not
    pass as a fast one."""
    reference = next((name for name in columns if not name.startswith("ours") and name in outputs), None)
    ours = [name for name in columns if name.startswith("ours") and name in outputs]
    if not ours or reference is None:
        return {}
    diffs = {_diff_key(name): (outputs[name].float() - outputs[reference].float()).abs().max().item()
             for name in ours}
    return {**diffs, "diff_reference": impl_lib.label(reference)}


def _speed_rows(bench, impls, cfg, shape, cap_bytes):
    dtype = DTYPES[cfg.dtype]
    q, k, v, dout = random_inputs(shape, dtype, bench.device)
    by_pass = {name: {} for name in PASSES}
    outputs = {}
    for impl in impls:
        verdict = _materialized_verdict(bench, impl, shape, dtype, cap_bytes)
        if verdict is not None:
            cells, out = {name: verdict for name in PASSES}, None
        else:
            with impl.context():
                cells, out = _time_training(bench, impl, q, k, v, dout, cfg.causal, shape)
        for name in PASSES:
            by_pass[name][impl.name] = cells[name]
        if out is not None:
            outputs[impl.name] = out
    check = _output_difference(outputs, [impl.name for impl in impls])
    config = {"dtype": cfg.dtype, "headdim": cfg.headdim, "causal": cfg.causal, "seqlen": cfg.seqlen,
              "batch": shape.batch, "nheads": shape.nheads}
    return [Row({**config, "pass": name}, by_pass[name], dict(check) if name == "fwd" else {}) for name in PASSES]


def run_speed(bench, plan):
    """TFLOP/s of forward, backward and forward+backward on the training shapes (hidden 2048,
    batch = 16k / seqlen), ours against every SDPA backend, naive attention and optional FlexAttention."""
    impls = [impl_lib.training_impl(name) for name in plan.impls]
    ours = [name for name in plan.impls if name.startswith("ours")]
    suite = Suite(
        "speed", "Training attention speed (TFLOP/s, higher is better)", "TFLOP/s", True,
        columns=list(plan.impls), ours=["ours"],
        config_keys=["dtype", "headdim", "causal", "seqlen", "batch", "nheads", "pass"],
        extra_columns=[(_diff_key(name), f"max abs diff, {impl_lib.label(name)} vs first peer", 4) for name in ours],
    )
    suite.notes.append(f"Passes: fwd, bwd (autograd.grad over a retained graph), fwd+bwd; passes are counted as "
                       f"2.5 and 3.5 forwards; causal FLOPs are halved. Shapes: nheads = {plan.hidden} / headdim, "
                       f"batch = {plan.tokens} / seqlen. Max abs diff: ours' forward output against the first peer "
                       f"that ran, in column order (a wrong kernel must not pass as a fast one).")
    if "ours-triton" in plan.impls:
        suite.notes.append("ours (triton): the same public functions with FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE "
                           "(flash_attn/triton), fixed tiles unless FLASH_ATTENTION_TRITON_AMD_AUTOTUNE=TRUE was set "
                           "for the run; its first call per (head dim, mask) compiles inside the warm-up. It is "
                           "not a peer: ours / best peer compares the CUDA kernels with the others.")

    def run_one(cfg):
        shape = training_shape(cfg.seqlen, cfg.headdim, plan.hidden, plan.tokens)
        return _speed_rows(bench, impls, cfg, shape, plan.materialized_cap_bytes)

    def describe(cfg):
        shape = training_shape(cfg.seqlen, cfg.headdim, plan.hidden, plan.tokens)
        return f"{cfg.dtype} {'causal' if cfg.causal else 'non-causal'} {shape.describe()} (fwd/bwd/fwd+bwd)"

    return run_configs(bench, suite, plan.speed, run_one, describe)


def _fwd_bwd_step(impl, qkv, dout, options):
    """impl.forward(*qkv, *options) and its backward: one training step's attention."""
    def step():
        return torch.autograd.grad(impl.forward(*qkv, *options), qkv, dout)

    return step


def _ms_cell(impl, qkv, options, ms):
    """A cell whose value is ms; the SDPA peer of the dropout+mask series notes which backend SDPA picked."""
    note = f"SDPA picked {impl_lib.sdpa_padded_backend(*qkv, *options)}" if impl.name == "sdpa" else ""
    return Cell(OK, ms, ms, note)


def _fwd_bwd_ms_cell(bench, impl, qkv, dout, *options):
    """A cell whose value is the time in ms of a forward+backward step, timed alone, back to back
    (bench.time_steps: the short sequences are host-bound, measure.py says why)."""
    with impl.context():
        ms = bench.time_steps(_fwd_bwd_step(impl, qkv, dout, options))
    return _ms_cell(impl, qkv, options, ms)


def _fwd_bwd_ms_cells(bench, impls, qkv, dout, options):
    """_fwd_bwd_ms_cell's cells of impls, their steps timed together, alternating block by block
    (runner.steps_timed_together): timed one after the other, the ratios of these host-bound steps
    moved by up to 2x between runs (benchmarks/NOTES.md v15)."""
    by_name = {impl.name: impl for impl in impls}
    entries = {impl.name: (impl.context, _fwd_bwd_step(impl, qkv, dout, options)) for impl in impls}
    return steps_timed_together(
        bench, entries, lambda name, ms: _ms_cell(by_name[name], qkv, options, ms),
        lambda name: functools.partial(_fwd_bwd_ms_cell, bench, by_name[name], qkv, dout, *options))


def _baseline_over(cells, name, baseline="naive"):
    """baseline's value over name's (naive's time or memory over ours: the speed-up or reduction), or None."""
    if name not in cells or baseline not in cells or not (cells[name].ok and cells[baseline].ok):
        return None
    return cells[baseline].value / cells[name].value


SPEEDUP_SERIES = ("plain", "causal", "dropout+mask")  # the FlashAttention paper's speed-up figure's series
MASKED_SERIES = "dropout+mask"


def _speedup_columns(plan):
    """naive, sdpa-flash, sdpa (auto backend) and ours, those the plan asks for. The dropout+mask
    series' SDPA peer runs where sdpa-flash is asked for: it stands in for it, as sdpa-flash takes no mask."""
    needs = {"naive": "naive", "flash": "flash", "sdpa": "flash", "ours": "ours"}
    return [name for name, needed in needs.items() if needed in plan.impls]


def _key_padding_mask(batch, seqlen, seed, device):
    """(batch, seqlen) bool, True for the first length tokens of each sequence (shapes.padding_lengths)."""
    lengths = torch.tensor(padding_lengths(batch, seqlen, seed), device=device)
    return torch.arange(seqlen, device=device) < lengths[:, None]


def _speedup_cells(bench, plan, columns, series, shape, dtype):
    """The cells of one speedup row: plain or causal attention of naive, sdpa-flash and ours, or for
    the dropout+mask series the padded forwards of naive, sdpa (auto backend) and ours."""
    q, k, v, dout = random_inputs(shape, dtype, bench.device)
    if series == MASKED_SERIES:
        impls = [impl_lib.padded_impl(name) for name in impl_lib.PADDED_IMPLS if name in columns]
        options = (_key_padding_mask(shape.batch, shape.seqlen_q, plan.padding_seed, bench.device),
                   plan.speedup_dropout_p)
    else:
        impls = [impl_lib.training_impl(name) for name in ("naive", "flash", "ours") if name in columns]
        options = (series == "causal",)
    verdicts = _verdicts_where_they_fit(bench, impls, shape, dtype)
    timed = _fwd_bwd_ms_cells(bench, [impl for impl in impls if verdicts[impl.name] is None], (q, k, v), dout,
                              options)
    return {impl.name: verdicts[impl.name] or timed[impl.name] for impl in impls}


def _speedup_notes(plan):
    return [
        f"{plan.speedup_dtype}. Series: plain and causal attention without dropout or mask; {MASKED_SERIES}: "
        f"dropout p={plan.speedup_dropout_p} and a key padding mask, each sequence keeping a random length in "
        f"[seqlen/2, seqlen] (seed {plan.padding_seed}), as the FlashAttention paper's figure.",
        f"{MASKED_SERIES} implementations: naive = scores, padded keys masked_fill -inf, softmax, torch dropout, "
        f"matmul (padded queries computed too); ours = unpad_input -> flash_attn_varlen_func(dropout_p) -> "
        f"pad_input, the unpadding timed with it (what a model with a padding mask does); sdpa (auto backend) = "
        f"SDPA with attn_mask and dropout_p on whichever backend SDPA picks (named in the cell notes), since "
        f"sdpa-flash takes no mask. The sdpa speed-up column is sdpa-flash's in the plain and causal series and "
        f"sdpa (auto backend)'s in {MASKED_SERIES}.",
        "Timing: forward+backward steps back to back, no L2 flush between them (measure.BACK_TO_BACK_DESCRIPTION), "
        "the method of FlashAttention's own benchmark for this figure: at short sequences a step is host-bound "
        "and this is the rate a training loop gets; a flush before each step would overlap the host's queueing "
        "and make the median jump between two modes (benchmarks/NOTES.md v11). The implementations of a row "
        "are timed together, alternating block by block, so that a drift of the host's state reaches them all "
        "(timed one after the other, their ratios moved by up to 2x between runs: NOTES.md v15); a cell noted "
        "'timed alone' was timed in its own window, the together measurement having failed.",
    ]


def run_speedup(bench, plan):
    """Forward+backward time of naive attention, SDPA and ours, and the speed-up over naive, at the
    shape of the FlashAttention paper's speed-up figure (batch 8, 12 heads, headdim 64), in its three
    series: plain, causal, and with dropout and a padding mask."""
    columns = _speedup_columns(plan)
    batch, nheads, headdim = plan.speedup_shape
    dtype = DTYPES[plan.speedup_dtype]
    suite = Suite(
        "speedup", "Forward+backward time (ms, lower is better) and speed-up over naive attention", "ms", False,
        columns=columns, ours=["ours"], config_keys=["series", "seqlen", "batch", "nheads", "headdim"], digits=2,
        extra_columns=[("speedup_ours", "ours speed-up vs naive", 2),
                       ("speedup_sdpa", "sdpa speed-up vs naive", 2)],
    )
    suite.notes.extend(_speedup_notes(plan))

    def run_one(cfg):
        series, seqlen = cfg
        shape = AttnShape(batch, seqlen, seqlen, nheads, nheads, headdim)
        cells = _speedup_cells(bench, plan, columns, series, shape, dtype)
        masked = series == MASKED_SERIES
        extra = {"speedup_ours": _baseline_over(cells, "ours"),
                 "speedup_sdpa": _baseline_over(cells, "sdpa" if masked else "flash")}
        config = {"series": series, "causal": series == "causal", "dropout_p": plan.speedup_dropout_p if masked
                  else 0.0, "padding_mask": masked, "seqlen": seqlen, "batch": batch, "nheads": nheads,
                  "headdim": headdim}
        return [Row(config, cells, extra)]

    configs = [(series, seqlen) for series in SPEEDUP_SERIES for seqlen in plan.speedup_seqlens]
    return run_configs(bench, suite, configs, run_one, lambda cfg: f"{cfg[0]} s={format_seqlen(cfg[1])}")


def _memory_cell(bench, impl, q, k, v, dout, causal):
    """A cell whose value is the forward+backward peak above the inputs, in MiB (one definition for
    every implementation: measure.cuda_peak_bytes around forward + autograd.grad)."""
    with impl.context():
        peak = bench.peak_bytes(lambda: torch.autograd.grad(impl.forward(q, k, v, causal), (q, k, v), dout))
    return Cell(OK, peak / MIB)


def run_memory(bench, plan):
    """Forward+backward peak memory above the inputs vs seqlen (batch 8, 16 heads, headdim 64, causal):
    ours, SDPA-flash and naive (OOM where its estimate does not fit), and naive / ours."""
    names = [name for name in ("ours", "flash", "naive") if name in plan.impls]
    impls = [impl_lib.training_impl(name) for name in names]
    batch, nheads, headdim = plan.memory_shape
    dtype = DTYPES[plan.memory_dtype]
    suite = Suite(
        "memory", "Forward+backward peak memory above the inputs (MiB, lower is better)", "MiB", False,
        columns=names, ours=["ours"], config_keys=["seqlen", "batch", "nheads", "headdim", "causal"],
        extra_columns=[("reduction_vs_naive", "naive / ours", 1)],
    )
    suite.notes.append("Peak = torch.cuda.max_memory_allocated() during forward + autograd.grad, minus the memory "
                       "allocated right before (q, k, v, dout present); it includes the output, dq, dk, dv and "
                       "the saved softmax statistics. Causal, " + plan.memory_dtype + ".")

    def run_one(seqlen):
        shape = AttnShape(batch, seqlen, seqlen, nheads, nheads, headdim)
        q, k, v, dout = random_inputs(shape, dtype, bench.device)
        cells = _cells_where_they_fit(bench, impls, shape, dtype,
                                      lambda impl: _memory_cell(bench, impl, q, k, v, dout, True))
        return [Row({"seqlen": seqlen, "batch": batch, "nheads": nheads, "headdim": headdim, "causal": True},
                    cells, {"reduction_vs_naive": _baseline_over(cells, "ours")})]

    return run_configs(bench, suite, plan.memory_seqlens, run_one, lambda s: f"s={format_seqlen(s)}",
                        repeat_first=False)


RUNNERS = {"speed": run_speed, "speedup": run_speedup, "memory": run_memory, "decode": run_decode,
           "features": run_features}
