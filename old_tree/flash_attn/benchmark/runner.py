"""What every suite shares: random inputs, timed cells, and the loop over configurations that
estimates the noise, reports one progress line per configuration and computes the ratios."""

import time

import torch

from . import impls as impl_lib
from .cells import ERROR, OK, OOM, SKIPPED, Cell, compute_ratios, format_value
from .measure import failure_of, guarded, release_memory
from .shapes import tflops_per_s


def random_inputs(shape, dtype, device, requires_grad=True):
    """q, k, v (batch, seqlen, nheads, headdim) and dout, drawn from randn (never zeros: zeros hide
    wrong indexing and can run faster than real data)."""
    def draw(seqlen, nheads, grad):
        return torch.randn(shape.batch, seqlen, nheads, shape.headdim, dtype=dtype, device=device,
                           requires_grad=grad)

    q = draw(shape.seqlen_q, shape.nheads, requires_grad)
    k = draw(shape.seqlen_k, shape.nheads_k, requires_grad)
    v = draw(shape.seqlen_k, shape.nheads_k, requires_grad)
    dout = draw(shape.seqlen_q, shape.nheads, False)
    return q, k, v, dout


def tflops_cell(flops, ms):
    return Cell(OK, tflops_per_s(flops, ms), ms)


def timed_cell(bench, fn, flops, back_to_back=False):
    """A TFLOP/s cell from the median time of fn (back_to_back: calls timed back to back, for host-bound
    calls; measure.py says why)."""
    return tflops_cell(flops, bench.time_steps(fn) if back_to_back else bench.timer(fn))


def _run_in(context_factory, step):
    with context_factory():
        step()


def _timed_alone(measure, failure):
    """guarded(measure), a valued cell's note saying that it was timed alone and why: its ratio to the
    others is then the less robust one of separate time windows (measure.py)."""
    cell = guarded(measure)
    if cell.ok:
        cell.note = "; ".join(filter(None, (cell.note, f"timed alone, the together measurement failed: "
                                                       f"{failure.note}")))
    return cell


def steps_timed_together(bench, entries, cell_of, alone):
    """One cell per entry of entries (name -> (context_factory, step)), host-bound steps compared in
    one measurement (bench.time_steps_together: blocks alternating, so a drift of the host's state
    reaches them all; measure.py says why). Each step is first called once, guarded, in its context:
    one that fails keeps its OOM or error cell and the others are timed without it; cell_of(name, ms)
    makes the others' cells. Should the together measurement itself raise, each is measured alone
    instead, guarded(alone(name)), so one failing implementation never stops the row."""
    cells = {name: failure_of(lambda entry=entry: _run_in(*entry)) for name, entry in entries.items()}
    running = [name for name, cell in cells.items() if cell is None]
    if not running:
        return cells
    times = {}
    failed = failure_of(lambda: times.update(zip(running, bench.time_steps_together(
        [entries[name] for name in running]), strict=True)))
    for name in running:
        cells[name] = cell_of(name, times[name]) if failed is None else _timed_alone(alone(name), failed)
    return cells


def backward_cell(bench, forward, inputs, dout, flops, kept=None):
    """Forward once, then time torch.autograd.grad over that graph (retain_graph, as it is replayed).
    The detached output goes to kept['out'] when kept is given (for a correctness check); the graph
    dies on return."""
    out = forward()
    if kept is not None:
        kept["out"] = out.detach()
    return timed_cell(bench, lambda: torch.autograd.grad(out, inputs, dout, retain_graph=True), flops)


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
    if cell is None:
        return "—"
    if cell.ok:
        return format_value(cell.value, digits)
    return {OOM: "OOM", SKIPPED: "skip", ERROR: "err"}.get(cell.status, cell.status)


def _summary(suite, rows):
    """One progress line's numbers: each implementation's cells, one per row, joined by '/'. A column
    that none of the rows has (one series of a suite may use other peers) is left out."""
    parts = []
    digits = 0 if suite.digits <= 1 else suite.digits
    for name in suite.columns:
        if not any(name in row.cells for row in rows):
            continue
        values = "/".join(_compact(row.cells.get(name), digits) for row in rows)
        parts.append(f"{impl_lib.label(name)} {values}")
    return " · ".join(parts)


def run_configs(bench, suite, configs, run_one, describe, repeat_first=True):
    """Run each configuration; time the first twice (noise estimate, the second is kept); report one
    progress line per configuration; finish with the ratios against the peers where the suite has them."""
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
    if suite.peer_ratios:
        compute_ratios(suite)
    return suite
