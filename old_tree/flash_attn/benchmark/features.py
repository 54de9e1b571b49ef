"""The features suite: what each FlashAttention 2 feature costs, measured against the same attention
without it, beside the target the feature was built to. Each row times a feature side and a baseline
side (µs and TFLOP/s of the unmasked FLOPs), forms their ratio and says whether it meets the target:

- varlen: packed sequences of mixed lengths vs an equal-length dense batch of as many sequences and
  tokens;
- window: causal + sliding window vs full causal (how many times less time the window takes);
- dropout: dropout_p vs none (the extra time), ours and, for reference, SDPA's flash (FlashAttention 2)
  and cuDNN backends' own;
- deterministic: deterministic=True vs the default backward;
- host overhead: ours vs SDPA-flash, forward+backward at short sequences, where launch and host time
  weigh most.
"""

import contextlib
import functools
from dataclasses import dataclass
from typing import Callable

import torch

from . import impls as impl_lib
from .cells import Row, Suite
from .measure import guarded
from .plan import DTYPES
from .runner import backward_cell, random_inputs, run_configs, steps_timed_together, tflops_cell, timed_cell
from .shapes import AttnShape, format_seqlen, mixed_lengths, pairs_flops, score_pairs


@dataclass(frozen=True)
class Comparison:
    """How a row's ratio is formed from its feature and baseline cells, and the target it must meet:
    ratio(feature, baseline) >= target when at_least, else <= target. percent shows it as +x.x%."""

    text: str
    ratio: Callable
    target: float
    at_least: bool = True
    percent: bool = False

    def format(self, value):
        return f"{value * 100:+.1f}%" if self.percent else f"{value:.2f}"

    def target_text(self):
        return ("≥ " if self.at_least else "≤ ") + self.format(self.target)

    def extra(self, feature, baseline):
        """The row's derived columns: how the ratio is formed, its value, the target, whether it is met
        ('—' where a side has no value)."""
        extra = {"compared": self.text, "ratio": None, "result": "—", "target": self.target_text(),
                 "meets_target": "—"}
        if feature.ok and baseline.ok:
            value = self.ratio(feature, baseline)
            met = value >= self.target if self.at_least else value <= self.target
            extra.update(ratio=value, result=self.format(value), meets_target="yes" if met else "NO")
        return extra


def speed_ratio(feature, baseline):
    """The feature's TFLOP/s over the baseline's: the share of the baseline's throughput it keeps."""
    return feature.value / baseline.value


def time_saved(feature, baseline):
    """The baseline's time over the feature's: how many times less time the feature takes."""
    return baseline.ms / feature.ms


def extra_time(feature, baseline):
    """The feature's time over the baseline's, minus 1: the time the feature adds."""
    return feature.ms / baseline.ms - 1


VARLEN = Comparison("TFLOP/s varlen / dense", speed_ratio, 0.95)
DROPOUT = Comparison("extra time with dropout", extra_time, 0.15, at_least=False, percent=True)
DETERMINISTIC = Comparison("TFLOP/s deterministic / default", speed_ratio, 0.85)
OVERHEAD = Comparison("speed ours / sdpa-flash", speed_ratio, 1.0)
WINDOW_TARGET = 3.0
# SDPA backends whose own dropout cost is measured beside ours (FlashAttention 2 is sdpa-flash).
DROPOUT_PEERS = (("flash", "sdpa-flash"), ("cudnn", "sdpa-cudnn"))


def window_comparison(flop_ratio):
    """time causal / window; the text carries the ratio of the two masks' FLOPs, the time ratio that a
    window kernel exactly as efficient per FLOP as the causal one would reach."""
    return Comparison(f"time causal / window (FLOP ratio {flop_ratio:.2f})", time_saved, WINDOW_TARGET)


@dataclass(frozen=True)
class Side:
    """One side of a comparison: forward() -> out, the tensors the backward differentiates, dout, the
    unmasked score elements over all sequences (FLOPs are counted from them), and the context the
    timing runs in (an SDPA backend selection, entered around the timing loop, not per call)."""

    forward: Callable
    inputs: tuple
    dout: torch.Tensor
    pairs: int
    nheads: int
    headdim: int
    context: Callable = contextlib.nullcontext


def _pass_cell(bench, side, pass_name, back_to_back=False):
    """A TFLOP/s cell of one pass (fwd, bwd or fwd+bwd) of side.forward; back_to_back times fwd+bwd steps
    back to back (the host-overhead rows)."""
    flops = pairs_flops(side.pairs, side.nheads, side.headdim, pass_name)
    with side.context():
        if pass_name == "fwd":
            return timed_cell(bench, side.forward, flops)
        if pass_name == "bwd":
            return backward_cell(bench, side.forward, side.inputs, side.dout, flops)
        return timed_cell(bench, _fwd_bwd_step(side), flops, back_to_back)


def _fwd_bwd_step(side):
    return lambda: torch.autograd.grad(side.forward(), side.inputs, side.dout)


@dataclass(frozen=True)
class Case:
    """One comparison: its name and setup (shown in the table), how its ratio is judged, and
    rows(bench, case) -> its Rows (one per pass), which allocates its inputs only while it runs."""

    name: str
    setup: str
    comparison: Comparison
    rows: Callable


def _row_of(case, pass_name, cells):
    config = {"case": case.name, "setup": case.setup, "pass": pass_name}
    return Row(config, cells, case.comparison.extra(cells["feature"], cells["baseline"]))


def _row(bench, case, pass_name, feature, baseline):
    cells = {"feature": guarded(lambda: _pass_cell(bench, feature, pass_name)),
             "baseline": guarded(lambda: _pass_cell(bench, baseline, pass_name))}
    return _row_of(case, pass_name, cells)


def _together_row(bench, case, feature, baseline):
    """A fwd+bwd row whose two sides' steps are timed together, alternating block by block
    (runner.steps_timed_together), for host-bound steps: each timed in its own window, their ratio
    moved by up to 2x between runs (benchmarks/NOTES.md v15)."""
    sides = {"feature": feature, "baseline": baseline}
    entries = {name: (side.context, _fwd_bwd_step(side)) for name, side in sides.items()}

    def cell_of(name, ms):
        side = sides[name]
        return tflops_cell(pairs_flops(side.pairs, side.nheads, side.headdim, "fwd+bwd"), ms)

    cells = steps_timed_together(bench, entries, cell_of,
                                 lambda name: functools.partial(_pass_cell, bench, sides[name], "fwd+bwd", True))
    return _row_of(case, "fwd+bwd", cells)


def _dense_side(bench, shape, dtype, window=(-1, -1), **options):
    """Side of flash_attn_func(q, k, v, **options) on fresh dense inputs of `shape`; `window` is the
    mask the options impose (for the FLOP count)."""
    q, k, v, dout = random_inputs(shape, dtype, bench.device)
    pairs = shape.batch * score_pairs(shape.seqlen_q, shape.seqlen_k, window)
    return Side(functools.partial(impl_lib.ours_attention, q, k, v, **options), (q, k, v), dout, pairs,
                shape.nheads, shape.headdim)


def _packed_inputs(tokens, nheads, headdim, dtype, device):
    """q, k, v (tokens, nheads, headdim) requiring grad, and dout: a varlen batch's packed layout."""
    def draw(grad):
        return torch.randn(tokens, nheads, headdim, dtype=dtype, device=device, requires_grad=grad)

    return draw(True), draw(True), draw(True), draw(False)


def _varlen_side(bench, lengths, nheads, headdim, dtype):
    """Side of flash_attn_varlen_func over sequences of `lengths` packed back to back."""
    q, k, v, dout = _packed_inputs(sum(lengths), nheads, headdim, dtype, bench.device)
    offsets = [0]
    for length in lengths:
        offsets.append(offsets[-1] + length)
    cu_seqlens = torch.tensor(offsets, dtype=torch.int32, device=bench.device)
    longest = max(lengths)
    forward = functools.partial(impl_lib.ours_varlen, q, k, v, cu_seqlens, cu_seqlens, longest, longest)
    pairs = sum(score_pairs(length, length) for length in lengths)
    return Side(forward, (q, k, v), dout, pairs, nheads, headdim)


def _varlen_rows(bench, case, dense, lengths, dtype):
    feature = _varlen_side(bench, lengths, dense.nheads, dense.headdim, dtype)
    baseline = _dense_side(bench, dense, dtype)
    return [_row(bench, case, name, feature, baseline) for name in ("fwd", "bwd")]


def _window_rows(bench, case, shape, left, dtype):
    """Both sides share the inputs: the same problem, two masks."""
    causal = _dense_side(bench, shape, dtype, window=(-1, 0), causal=True)
    q, k, v = causal.inputs
    window = Side(functools.partial(impl_lib.ours_attention, q, k, v, causal=True, window_size=(left, 0)),
                  causal.inputs, causal.dout, shape.batch * score_pairs(shape.seqlen_q, shape.seqlen_k, (left, 0)),
                  shape.nheads, shape.headdim)
    return [_row(bench, case, name, window, causal) for name in ("fwd", "bwd")]


def _option_rows(bench, case, shape, dtype, passes, **options):
    """The same dense problem with `options` (the feature) and without (the baseline)."""
    baseline = _dense_side(bench, shape, dtype)
    q, k, v = baseline.inputs
    feature = Side(functools.partial(impl_lib.ours_attention, q, k, v, **options), baseline.inputs, baseline.dout,
                   baseline.pairs, shape.nheads, shape.headdim)
    return [_row(bench, case, name, feature, baseline) for name in passes]


def _peer_dropout_rows(bench, case, shape, dtype, peer, dropout_p):
    """A peer's own cost of dropout: SDPA on the backend `peer` with dropout_p against without, on the
    same inputs as ours (what the dropout target means for FlashAttention 2 itself: sdpa-flash is it)."""
    impl = impl_lib.training_impl(peer)
    q, k, v, dout = random_inputs(shape, dtype, bench.device)
    pairs = shape.batch * score_pairs(shape.seqlen_q, shape.seqlen_k)

    def side(p):
        return Side(functools.partial(impl_lib.sdpa_forward, q, k, v, False, dropout_p=p), (q, k, v), dout, pairs,
                    shape.nheads, shape.headdim, impl.context)

    return [_row(bench, case, name, side(dropout_p), side(0.0)) for name in ("fwd", "bwd")]


def _overhead_rows(bench, case, shape, dtype):
    """Ours against SDPA-flash on the same inputs, forward+backward, non-causal, steps timed back to back
    and together as in the speedup suite (these calls are host-bound)."""
    ours = _dense_side(bench, shape, dtype)
    q, k, v = ours.inputs
    flash = impl_lib.training_impl("flash")
    sdpa = Side(functools.partial(flash.forward, q, k, v, False), ours.inputs, ours.dout, ours.pairs,
                shape.nheads, shape.headdim, flash.context)
    return [_together_row(bench, case, ours, sdpa)]


def _varlen_case(features, dtype):
    dense = features.varlen_dense
    tokens = dense.batch * dense.seqlen_q
    low, high = features.varlen_lengths
    lengths = mixed_lengths(dense.batch, tokens, low, high, features.seed)
    setup = (f"{len(lengths)} seqs of {low}..{high} ({format_seqlen(tokens)} tokens) vs dense {dense.describe()}, "
             f"non-causal")
    return Case("varlen", setup, VARLEN,
                functools.partial(_varlen_rows, dense=dense, lengths=lengths, dtype=dtype)), lengths


def _window_case(features, dtype):
    shape, left = features.window, features.window_left
    flop_ratio = score_pairs(shape.seqlen_q, shape.seqlen_k, (-1, 0)) / score_pairs(
        shape.seqlen_q, shape.seqlen_k, (left, 0))
    return Case("window", f"causal + window ({left}, 0) vs causal, {shape.describe()}", window_comparison(flop_ratio),
                functools.partial(_window_rows, shape=shape, left=left, dtype=dtype))


def _cases(plan):
    """Every comparison of the suite, in table order, and the varlen case's sequence lengths."""
    features = plan.features
    dtype = DTYPES[features.dtype]
    varlen, lengths = _varlen_case(features, dtype)
    drop = features.dropout
    cases = [varlen, _window_case(features, dtype),
             Case("dropout", f"dropout_p={features.dropout_p} vs 0, {drop.describe()}, non-causal", DROPOUT,
                  functools.partial(_option_rows, shape=drop, dtype=dtype, passes=("fwd", "bwd"),
                                    dropout_p=features.dropout_p))]
    cases += [Case(f"dropout ({peer_name})", f"the peer's own: dropout_p={features.dropout_p} vs 0, {drop.describe()}, "
                   f"non-causal", DROPOUT, functools.partial(_peer_dropout_rows, shape=drop, dtype=dtype, peer=peer,
                                                             dropout_p=features.dropout_p))
              for peer, peer_name in DROPOUT_PEERS]
    cases += [Case("deterministic", f"deterministic=True vs default, {shape.describe()}, non-causal", DETERMINISTIC,
                   functools.partial(_option_rows, shape=shape, dtype=dtype, passes=("bwd",), deterministic=True))
              for shape in features.deterministic]
    batch, nheads, headdim = plan.speedup_shape
    for seqlen in features.overhead_seqlens:
        shape = AttnShape(batch, seqlen, seqlen, nheads, nheads, headdim)
        cases.append(Case("host overhead", f"ours vs sdpa-flash, {shape.describe()}, non-causal", OVERHEAD,
                          functools.partial(_overhead_rows, shape=shape, dtype=DTYPES[plan.speedup_dtype])))
    return cases, lengths


def _notes(features, lengths):
    return [
        "feature and baseline cells: µs · TFLOP/s of the unmasked FLOPs (4·headdim per score element and head "
        "forward, ×2.5 backward, ×3.5 forward+backward), the score elements counted exactly: per query row under "
        "the causal and window masks (causal is s(s+1)/2, not the speed suite's s²/2) and per sequence for "
        "varlen. bwd is autograd.grad over a retained graph, as in the speed suite.",
        "Ratios: TFLOP/s feature / baseline, except the window's (time causal / window: how many times less time "
        "the window takes; its FLOP ratio is the time ratio of a window kernel exactly as efficient per FLOP as "
        "the causal one) and dropout's (the extra time). The host-overhead rows are the speedup suite's plain "
        "series at its short sequences, with their target, timed like it: steps back to back, no L2 flush between "
        "them, ours and sdpa-flash alternating block by block (the calls are host-bound; measure.py says why; a "
        "cell noted 'timed alone' was timed in its own window, the together measurement having failed).",
        f"varlen sequence lengths (seed {features.seed}): {', '.join(str(n) for n in lengths)}.",
    ]


def run_features(bench, plan):
    """Each feature against the same attention without it, with its ratio and target (module docstring)."""
    cases, lengths = _cases(plan)
    suite = Suite(
        "features", "Feature costs against their targets (µs · TFLOP/s, higher TFLOP/s is better)", "TFLOP/s", True,
        columns=["feature", "baseline"], ours=["feature"], config_keys=["case", "setup", "pass"],
        extra_columns=[("compared", "compared", 0), ("result", "result", 2), ("target", "target", 0),
                       ("meets_target", "meets target", 0)],
        show_us=True, peer_ratios=False,
    )
    suite.notes.extend(_notes(plan.features, lengths))
    return run_configs(bench, suite, cases, lambda case: case.rows(bench, case),
                       lambda case: f"{case.name}, {case.setup}")
