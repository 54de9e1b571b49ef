"""The suites: training speed, speed-up over naive attention, memory, and decode.

Each returns a Suite of rows; each row holds one Cell per implementation. Every measurement runs
through measure.guarded, so a failing or out-of-memory implementation fills its cell and the run
goes on. Inputs are fresh torch.randn tensors (never zeros: zeros hide wrong indexing and can run
faster than real data).
"""

import functools
import time

import torch

from . import impls as impl_lib
from .cells import ERROR, OK, OOM, SKIPPED, Cell, Row, Suite, compute_ratios, format_value, short_text
from .measure import guarded, release_memory
from .plan import DTYPES
from .shapes import (
    PASSES,
    AttnShape,
    attention_flops,
    format_seqlen,
    gb_per_s,
    kv_cache_bytes,
    materialized_peak_bytes,
    tflops_per_s,
    training_shape,
)

GIB = 2**30
MIB = 2**20
SDPA_PEERS = ("flash", "cudnn", "efficient", "math")


def _inputs(shape, dtype, device, requires_grad=True):
    """q, k, v (batch, seqlen, nheads, headdim) and dout, drawn from randn."""
    def draw(seqlen, nheads, grad):
        return torch.randn(shape.batch, seqlen, nheads, shape.headdim, dtype=dtype, device=device,
                           requires_grad=grad)

    q = draw(shape.seqlen_q, shape.nheads, requires_grad)
    k = draw(shape.seqlen_k, shape.nheads_k, requires_grad)
    v = draw(shape.seqlen_k, shape.nheads_k, requires_grad)
    dout = draw(shape.seqlen_q, shape.nheads, False)
    return q, k, v, dout


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


def _cells_where_they_fit(bench, impls, shape, dtype, measure):
    """One cell per implementation: guarded measure(impl), or OOM where a materializing one would not
    fit (no cost cap: these suites exist to show naive attention where it runs)."""
    cells = {}
    for impl in impls:
        verdict = _materialized_verdict(bench, impl, shape, dtype, float("inf"))
        cells[impl.name] = verdict or guarded(functools.partial(measure, impl))
    return cells


def _timed_cell(bench, fn, flops):
    """A TFLOP/s cell from the median time of fn."""
    ms = bench.timer(fn)
    return Cell(OK, tflops_per_s(flops, ms), ms)


def _backward_cell(bench, forward, inputs, dout, flops, kept):
    """Forward once, then time torch.autograd.grad over that graph (retain_graph, as it is replayed).
    The detached output goes to kept['out'] for the correctness check; the graph dies on return."""
    out = forward()
    kept["out"] = out.detach()
    return _timed_cell(bench, lambda: torch.autograd.grad(out, inputs, dout, retain_graph=True), flops)


def _time_training(bench, impl, q, k, v, dout, causal, shape):
    """Cells for each pass (TFLOP/s) and the forward output (or None). The backward goes first so its
    retained graph is gone before the other passes allocate theirs."""
    inputs = (q, k, v)

    def forward():
        return impl.forward(q, k, v, causal)

    kept = {}
    flops = {name: attention_flops(shape, causal, name) for name in PASSES}
    cells = {"bwd": guarded(lambda: _backward_cell(bench, forward, inputs, dout, flops["bwd"], kept))}
    cells["fwd"] = guarded(lambda: _timed_cell(bench, forward, flops["fwd"]))
    cells["fwd+bwd"] = guarded(
        lambda: _timed_cell(bench, lambda: torch.autograd.grad(forward(), inputs, dout), flops["fwd+bwd"])
    )
    return cells, kept.get("out")


def _output_difference(outputs, columns):
    """max |ours - peer| over the forward output, against the first peer (in column order) that ran:
    a kernel that returns wrong numbers must not pass as a fast one."""
    reference = next((name for name in columns if name != "ours" and name in outputs), None)
    if "ours" not in outputs or reference is None:
        return {}
    diff = (outputs["ours"].float() - outputs[reference].float()).abs().max().item()
    return {"ours_max_abs_diff": diff, "diff_reference": impl_lib.label(reference)}


def _speed_rows(bench, impls, cfg, shape, cap_bytes):
    dtype = DTYPES[cfg.dtype]
    q, k, v, dout = _inputs(shape, dtype, bench.device)
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


def _noise(first, second, description):
    """The first configuration timed twice: per implementation (and pass) both times in ms, and the
    largest spread in percent of the smaller. A difference between peers below it is noise."""
    times, spreads = {}, []
    for row_a, row_b in zip(first, second, strict=True):
        for name, cell_a in row_a.cells.items():
            cell_b = row_b.cells.get(name)
            if not (cell_a.ok and cell_b is not None and cell_b.ok and cell_a.ms and cell_b.ms):
                continue
            key = f"{name} {row_a.config.get('pass', '')}".strip()
            times[key] = [cell_a.ms, cell_b.ms]
            spreads.append(abs(cell_a.ms - cell_b.ms) / min(cell_a.ms, cell_b.ms) * 100)
    return {"config": description, "times_ms": times, "max_spread_pct": max(spreads) if spreads else None}


def _compact(cell, digits):
    if cell.ok:
        return format_value(cell.value, digits)
    return {OOM: "OOM", SKIPPED: "skip", ERROR: "err"}.get(cell.status, cell.status)


def _summary(suite, rows):
    """One progress line's numbers: each implementation's cells, one per row, joined by '/'."""
    parts = []
    for name in suite.columns:
        values = "/".join(_compact(row.cells[name], 0 if suite.digits <= 1 else suite.digits) for row in rows)
        parts.append(f"{impl_lib.label(name)} {values}")
    return " · ".join(parts)


def _run_configs(bench, suite, configs, run_one, describe, repeat_first=True):
    """Run each configuration; time the first twice (noise estimate, the second is kept); report one
    progress line per configuration; finish with the ratios."""
    for index, cfg in enumerate(configs):
        start = time.perf_counter()
        rows = run_one(cfg)
        if index == 0 and repeat_first:
            again = run_one(cfg)
            suite.noise = _noise(rows, again, describe(cfg))
            rows = again
        suite.rows.extend(rows)
        release_memory()
        bench.progress(f"[{suite.name} {index + 1}/{len(configs)}] {describe(cfg)}: {suite.metric} "
                       f"{_summary(suite, rows)} ({time.perf_counter() - start:.1f} s)")
    compute_ratios(suite)
    return suite


def run_speed(bench, plan):
    """TFLOP/s of forward, backward and forward+backward on the training shapes (hidden 2048,
    batch = 16k / seqlen), ours against every SDPA backend, naive attention and optional FlexAttention."""
    impls = [impl_lib.training_impl(name) for name in plan.impls]
    suite = Suite(
        "speed", "Training attention speed (TFLOP/s, higher is better)", "TFLOP/s", True,
        columns=list(plan.impls), ours=["ours"],
        config_keys=["dtype", "headdim", "causal", "seqlen", "batch", "nheads", "pass"],
        extra_columns=[("ours_max_abs_diff", "max abs diff, ours vs first peer", 4)],
    )
    suite.notes.append(f"Passes: fwd, bwd (autograd.grad over a retained graph), fwd+bwd; passes are counted as "
                       f"2.5 and 3.5 forwards; causal FLOPs are halved. Shapes: nheads = {plan.hidden} / headdim, "
                       f"batch = {plan.tokens} / seqlen. Max abs diff: ours' forward output against the first peer "
                       f"that ran, in column order (a wrong kernel must not pass as a fast one).")

    def run_one(cfg):
        shape = training_shape(cfg.seqlen, cfg.headdim, plan.hidden, plan.tokens)
        return _speed_rows(bench, impls, cfg, shape, plan.materialized_cap_bytes)

    def describe(cfg):
        shape = training_shape(cfg.seqlen, cfg.headdim, plan.hidden, plan.tokens)
        return f"{cfg.dtype} {'causal' if cfg.causal else 'non-causal'} {shape.describe()} (fwd/bwd/fwd+bwd)"

    return _run_configs(bench, suite, plan.speed, run_one, describe)


def _fwd_bwd_ms_cell(bench, impl, q, k, v, dout, causal):
    """A cell whose value is the median forward+backward time in ms."""
    def step():
        return torch.autograd.grad(impl.forward(q, k, v, causal), (q, k, v), dout)

    with impl.context():
        ms = bench.timer(step)
    return Cell(OK, ms, ms)


def _baseline_over(cells, name, baseline="naive"):
    """baseline's value over name's (naive's time or memory over ours: the speed-up or reduction), or None."""
    if name not in cells or baseline not in cells or not (cells[name].ok and cells[baseline].ok):
        return None
    return cells[baseline].value / cells[name].value


def run_speedup(bench, plan):
    """Forward+backward time of naive attention, SDPA-flash and ours, and the speed-up over naive,
    at the shape of the FlashAttention paper's speed-up figure (batch 8, 12 heads, headdim 64)."""
    names = [name for name in ("naive", "flash", "ours") if name in plan.impls]
    impls = [impl_lib.training_impl(name) for name in names]
    batch, nheads, headdim = plan.speedup_shape
    dtype = DTYPES[plan.speedup_dtype]
    suite = Suite(
        "speedup", "Forward+backward time (ms, lower is better) and speed-up over naive attention", "ms", False,
        columns=names, ours=["ours"], config_keys=["causal", "seqlen", "batch", "nheads", "headdim"], digits=2,
        extra_columns=[("speedup_ours", "ours speed-up vs naive", 2),
                       ("speedup_flash", "sdpa-flash speed-up vs naive", 2)],
    )
    suite.notes.append(f"{plan.speedup_dtype}, no dropout, no padding mask (those columns come with those features).")

    def run_one(cfg):
        causal, seqlen = cfg
        shape = AttnShape(batch, seqlen, seqlen, nheads, nheads, headdim)
        q, k, v, dout = _inputs(shape, dtype, bench.device)
        cells = _cells_where_they_fit(bench, impls, shape, dtype,
                                      lambda impl: _fwd_bwd_ms_cell(bench, impl, q, k, v, dout, causal))
        extra = {"speedup_ours": _baseline_over(cells, "ours"), "speedup_flash": _baseline_over(cells, "flash")}
        return [Row({"causal": causal, "seqlen": seqlen, "batch": batch, "nheads": nheads, "headdim": headdim},
                    cells, extra)]

    configs = [(causal, seqlen) for causal in (False, True) for seqlen in plan.speedup_seqlens]
    return _run_configs(bench, suite, configs, run_one,
                        lambda cfg: f"{'causal' if cfg[0] else 'non-causal'} s={format_seqlen(cfg[1])}")


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
        q, k, v, dout = _inputs(shape, dtype, bench.device)
        cells = _cells_where_they_fit(bench, impls, shape, dtype,
                                      lambda impl: _memory_cell(bench, impl, q, k, v, dout, True))
        return [Row({"seqlen": seqlen, "batch": batch, "nheads": nheads, "headdim": headdim, "causal": True},
                    cells, {"reduction_vs_naive": _baseline_over(cells, "ours")})]

    return _run_configs(bench, suite, plan.memory_seqlens, run_one, lambda s: f"s={format_seqlen(s)}",
                        repeat_first=False)


def _bandwidth_cell(bench, fn, nbytes):
    """A GB/s cell (bytes of K and V over the median time)."""
    ms = bench.timer(fn)
    return Cell(OK, gb_per_s(nbytes, ms), ms)


def _sdpa_decode_cell(bench, name, q, k, v, nbytes):
    """An SDPA backend on the GQA decode: with enable_gqa=True, else on K and V repeated to the query
    heads beforehand (the GB/s still count the cache's own bytes, the problem's)."""
    with impl_lib.training_impl(name).context():
        cell = guarded(lambda: _bandwidth_cell(bench, lambda: impl_lib.sdpa_decode_gqa(q, k, v), nbytes))
        if cell.status != ERROR:
            return cell
        gqa_error = cell.note
        nheads = q.shape[2]

        def repeated():
            k_rep, v_rep = impl_lib.repeat_kv(k, nheads), impl_lib.repeat_kv(v, nheads)
            return _bandwidth_cell(bench, lambda: impl_lib.sdpa_decode_repeated(q, k_rep, v_rep), nbytes)

        cell = guarded(repeated)
    if cell.ok:
        cell.note = f"K/V repeated to {nheads} heads (enable_gqa=True failed: {short_text(gqa_error, 120)})"
    else:
        cell.note = f"{cell.note}; with enable_gqa=True: {gqa_error}"
    return cell


DECODE_FUNCTIONS = {"ours-kvcache": impl_lib.ours_kvcache_decode, "ours": impl_lib.ours_decode,
                    "naive": impl_lib.naive_decode}


def _decode_cell(bench, name, q, k, v, nbytes):
    if name in SDPA_PEERS:
        return _sdpa_decode_cell(bench, name, q, k, v, nbytes)
    fn = DECODE_FUNCTIONS[name]
    return guarded(lambda: _bandwidth_cell(bench, lambda: fn(q, k, v), nbytes))


def run_decode(bench, plan):
    """One query token against a KV cache (GQA 32/8 heads, headdim 128): µs and GB/s of K+V read.
    Ours is flash_attn_with_kvcache when this version has it; flash_attn_func runs too."""
    ours = []
    if "ours" in plan.impls:
        ours = (["ours-kvcache"] if impl_lib.kvcache_function() else []) + ["ours"]
    peers = [name for name in (*SDPA_PEERS, "naive") if name in plan.impls]
    nheads, nheads_k, headdim = plan.decode_heads
    dtype = DTYPES[plan.decode_dtype]
    suite = Suite(
        "decode", "Decode, one query token (µs · GB/s of K+V read, higher GB/s is better)", "GB/s", True,
        columns=ours + peers, ours=ours, config_keys=["batch", "context", "nheads", "nheads_k", "headdim"],
        digits=0, show_us=True,
    )
    if impl_lib.kvcache_function() is None:
        suite.notes.append("flash_attn.flash_attn_with_kvcache does not exist in this version: this suite measures "
                           "the peers; `ours` is flash_attn_func on the one-token query (the prefill kernel).")

    def run_one(cfg):
        batch, context = cfg
        shape = AttnShape(batch, 1, context, nheads, nheads_k, headdim)
        q, k, v, _ = _inputs(shape, dtype, bench.device, requires_grad=False)
        nbytes = kv_cache_bytes(batch, context, nheads_k, headdim, q.element_size())
        cells = {name: _decode_cell(bench, name, q, k, v, nbytes) for name in suite.columns}
        return [Row({"batch": batch, "context": context, "nheads": nheads, "nheads_k": nheads_k,
                     "headdim": headdim}, cells)]

    with torch.no_grad():
        return _run_configs(bench, suite, plan.decode, run_one,
                            lambda cfg: f"b={cfg[0]} ctx={format_seqlen(cfg[1])}")


RUNNERS = {"speed": run_speed, "speedup": run_speedup, "memory": run_memory, "decode": run_decode}
