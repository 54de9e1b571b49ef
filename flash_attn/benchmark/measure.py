"""Timing and memory measurement on the GPU, and the guard that turns a failure into a cell.

The method is BENCHMARKS.md's (team design notes): median of many timed runs after a warm-up, with the L2 cache
flushed before each run (triton.testing.do_bench does both; the CUDA-event fallback copies it).

Calls that spend more time queueing on the host than running on the GPU (a forward+backward at a few
hundred tokens) are timed back to back instead (Timer.back_to_back), as FlashAttention's own benchmark
(torch.utils.benchmark's timeit) times the speed-up figure: with a flush before each run, the flush
runs while the host queues the call, so the median measures the host time minus the flush and jumps
between two modes from run to run (benchmarks/NOTES.md v11).

Implementations compared at such a configuration are timed together (Timer.back_to_back_together),
block by block in turn: each timed alone in its own window, their ratio moved by up to 2x between runs
on a noisy host (NOTES.md v15), as the host's state drifted between the windows; alternating blocks
exposes every implementation to the same drift.
"""

import functools
import gc
import statistics
import time
import warnings
from dataclasses import dataclass
from typing import Callable

import torch

from .cells import ERROR, OOM, Cell

L2_FLUSH_BYTES = 256 * 2**20  # larger than any L2 of the GPUs we run on (H100 50 MB, H200 60 MB)
FREE_MEMORY_MARGIN = 0.9  # the allocator's fragmentation and the library workspaces need some room
WARNINGS_KEPT = 3  # SDPA says why a backend refused in warnings, one per failed check
ERROR_CHARS = 500  # of an error message kept in the JSON


class Timer:
    """Median time of a callable in milliseconds: triton.testing.do_bench when triton is importable
    (the tool the published numbers used), else CUDA events with the same warm-up, repeat count and
    L2 flush. warmup_ms and rep_ms are the time spent warming up and timing, as in do_bench.

    idle_ms: the GPU is left idle this long before each measurement. At the power cap (700 W on the
    H100 / H200) a kernel that draws more leaves the clock lowered for whatever runs next: timed one
    after the other, an implementation read 5-15% slower in the cells where it ran right after
    FlashAttention 4's, and FA4's as much where it ran right after ours (benchmarks/NOTES.md v40);
    the gap gives every measurement the same starting state: with 250 ms the two orders' cells agreed
    within 0-4% (one 7%; bf16 hd 128), and ours' fp16 hd 128 16k forward+backward cell, which read 0.93 of cuDNN after its
    own forward and backward passes, read 1.03 (H200, NOTES.md v40 item 5)."""

    def __init__(self, warmup_ms=25, rep_ms=100, idle_ms=0):
        self.warmup_ms = warmup_ms
        self.rep_ms = rep_ms
        self.idle_ms = idle_ms
        try:
            from triton.testing import do_bench
        except ImportError:
            self._do_bench = None
        else:
            self._do_bench = do_bench

    def describe(self):
        method = "triton.testing.do_bench" if self._do_bench else "CUDA events"
        return (f"{method}, median, warm-up {self.warmup_ms} ms, rep {self.rep_ms} ms, L2 flushed per run, "
                f"the GPU idle {self.idle_ms} ms before each measurement; "
                f"the speedup suite and the host-overhead rows: {BACK_TO_BACK_DESCRIPTION}")

    def _idle(self):
        """Drain the queue, then leave the GPU idle for idle_ms."""
        if self.idle_ms > 0:
            torch.cuda.synchronize()
            time.sleep(self.idle_ms / 1000)

    def back_to_back(self, fn):
        """Median over BACK_TO_BACK_BLOCKS blocks of the mean time per call of fn called back to back
        (ms): the rate at which a loop of such calls runs, host time included where it exceeds the GPU's."""
        return _back_to_back_ms(fn, self.warmup_ms, self.rep_ms)

    def back_to_back_together(self, entries):
        """back_to_back of each (context_factory, fn) of entries, the implementations alternating block
        by block (_interleaved_back_to_back_ms): ms per call, in entry order."""
        return _interleaved_back_to_back_ms(entries, self.warmup_ms, self.rep_ms)

    def __call__(self, fn):
        self._idle()
        if self._do_bench is not None:
            return float(self._do_bench(fn, warmup=self.warmup_ms, rep=self.rep_ms, return_mode="median"))
        return _events_median_ms(fn, self.warmup_ms, self.rep_ms)


def _warmed_up_estimate_ms(fn, warmup_ms, before_each=lambda: None):
    """One call, a 5-run estimate of fn's time (before_each() ahead of each run), then warm-up runs
    for warmup_ms: do_bench's start. Returns the estimate in ms."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        before_each()
        fn()
    end.record()
    torch.cuda.synchronize()
    estimate_ms = max(start.elapsed_time(end) / 5, 1e-3)
    for _ in range(max(1, int(warmup_ms / estimate_ms))):
        fn()
    return estimate_ms


def _events_median_ms(fn, warmup_ms, rep_ms):
    """do_bench's procedure with CUDA events: a warmed-up estimate, then timed runs each after an L2
    flush (so inputs that fit in L2 are not timed from the cache)."""
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")
    estimate_ms = _warmed_up_estimate_ms(fn, warmup_ms, flush.zero_)
    count = max(1, int(rep_ms / estimate_ms))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(count)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(count)]
    for begin, finish in zip(starts, ends, strict=True):
        flush.zero_()
        begin.record()
        fn()
        finish.record()
    torch.cuda.synchronize()
    return statistics.median(begin.elapsed_time(finish) for begin, finish in zip(starts, ends, strict=True))


BACK_TO_BACK_BLOCKS = 7  # an odd count, so the median is one block's time
BACK_TO_BACK_DESCRIPTION = (f"calls back to back, no flush between them (as torch.utils.benchmark times "
                            f"FlashAttention's speed-up figure), median of {BACK_TO_BACK_BLOCKS} blocks' mean per "
                            f"call; the implementations compared in a row alternate block by block "
                            f"({BACK_TO_BACK_BLOCKS} rounds of one block each, the order rotating from round to "
                            f"round, one untimed call before each block), so a drift of the host's state hits "
                            f"them alike")


def _calls_per_block(estimate_ms, rep_ms):
    """Calls per block: rep_ms shared among the blocks, at least one call."""
    return max(1, int(rep_ms / BACK_TO_BACK_BLOCKS / estimate_ms))


def _block_mean_ms(fn, calls, start, end):
    """Mean ms per call of `calls` calls of fn queued back to back between the events start and end;
    the queue is drained before start, so no earlier work is timed."""
    torch.cuda.synchronize()
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / calls


def _back_to_back_ms(fn, warmup_ms, rep_ms):
    """Events around blocks of calls queued one after another: a host-bound call is timed at its host
    rate, a GPU-bound one at its GPU time, as in a training loop. rep_ms is shared among the blocks."""
    calls = _calls_per_block(_warmed_up_estimate_ms(fn, warmup_ms), rep_ms)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    return statistics.median(_block_mean_ms(fn, calls, start, end) for _ in range(BACK_TO_BACK_BLOCKS))


def _rotated_rounds(blocks, rounds):
    """Run each of blocks (callables returning one block's mean ms) once per round, the order rotated
    by one from round to round, so that none always runs first or always follows the same other one.
    Returns each block's means, in block order."""
    means = [[] for _ in blocks]
    for round_index in range(rounds):
        for offset in range(len(blocks)):
            index = (round_index + offset) % len(blocks)
            means[index].append(blocks[index]())
    return means


def _entry_block(context_factory, fn, calls, start, end):
    """One block of fn inside its context (entered once per block, so its cost stays out), after one
    untimed call: the switch from the previous implementation (its context, the caches it left) is
    not timed."""
    with context_factory():
        fn()
        return _block_mean_ms(fn, calls, start, end)


def _warmed_up_calls(context_factory, fn, warmup_ms, rep_ms):
    with context_factory():
        return _calls_per_block(_warmed_up_estimate_ms(fn, warmup_ms), rep_ms)


def _interleaved_back_to_back_ms(entries, warmup_ms, rep_ms):
    """_back_to_back_ms of each (context_factory, fn) of entries, their blocks alternating: every entry
    is warmed up in its context and gets its own call count, then BACK_TO_BACK_BLOCKS rounds run one
    block of each (_rotated_rounds). Timed one after the other, the ratio of two host-bound calls
    moved by up to 2x between runs (NOTES.md v15); alternating, a drift of the host's state between
    blocks reaches every entry. Returns each entry's median block mean (ms), in entry order."""
    calls = [_warmed_up_calls(context_factory, fn, warmup_ms, rep_ms) for context_factory, fn in entries]
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    blocks = [functools.partial(_entry_block, context_factory, fn, count, start, end)
              for (context_factory, fn), count in zip(entries, calls, strict=True)]
    return [statistics.median(means) for means in _rotated_rounds(blocks, BACK_TO_BACK_BLOCKS)]


def cuda_peak_bytes(step):
    """Peak bytes allocated by `step()` above what was allocated right before it (its inputs are
    already allocated then). step runs once unmeasured first, so one-time allocations that outlive it
    (cuBLAS and cuDNN workspaces) count as already allocated, not as its peak."""
    step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def cuda_free_bytes():
    """Bytes a new allocation can get: the device's free memory after the allocator's cache is
    returned, times a margin for fragmentation."""
    release_memory()
    free, _total = torch.cuda.mem_get_info()
    return int(free * FREE_MEMORY_MARGIN)


def release_memory(collect_garbage=False):
    """Return the allocator's cached blocks to the device, so the next estimate sees them as free.
    collect_garbage also frees tensors held in reference cycles (after an OOM, where every byte
    counts; elsewhere it is skipped: one collection costs ~0.1 s with torch loaded)."""
    if collect_garbage:
        gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def warm_up_gpu(seconds=1.0):
    """Run bf16 matmuls for `seconds` so the clocks are up before the first measurement."""
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        for _ in range(20):
            a @ a
        torch.cuda.synchronize()


def _error_text(exc, caught):
    """'Type: message (warning; warning)': SDPA says in warnings why a backend refused."""
    message = f"{type(exc).__name__}: {exc}".strip()
    reasons = list(dict.fromkeys(str(w.message).strip() for w in caught if str(w.message).strip()))
    if reasons:
        message = f"{message} ({'; '.join(reasons[:WARNINGS_KEPT])})"
    return message[:ERROR_CHARS]


def guarded(measure):
    """Run `measure()` (which returns a Cell); an out-of-memory error becomes an OOM cell and any other
    exception an error cell carrying its message, so one failing implementation never stops the run."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            return measure()
        except torch.OutOfMemoryError:
            failure = Cell(OOM, note="out of memory")
        except Exception as exc:  # noqa: BLE001 - a peer may fail in any way; the run goes on
            failure = Cell(ERROR, note=_error_text(exc, caught))
    release_memory(collect_garbage=failure.status == OOM)
    return failure


def failure_of(action):
    """None when action() runs, else the OOM or error cell guarded() makes of its exception: a probe
    that sets a failing implementation aside before a measurement that times several together."""
    def run():
        action()

    return guarded(run)


@dataclass
class Bench:
    """What the suites measure with. The GPU run uses cuda_bench(); tests put in a CPU device and
    stand-in timer and memory functions, so the suites' logic runs in CI.

    timer(fn) -> median ms; peak_bytes(step) -> bytes above the inputs; free_bytes() -> bytes a new
    allocation can get; materialized_cap_bytes: naive and SDPA MATH configurations estimated above this
    are skipped (the quick set keeps them where cheap); progress(line) reports one configuration;
    step_timer(fn) -> ms per call of fn back to back (Timer.back_to_back), for host-bound calls;
    timer where not given; steps_together_timer(entries) -> the same for each (context_factory, fn)
    of entries, timed together (Timer.back_to_back_together); each entry alone where not given."""

    device: torch.device
    timer: Callable
    peak_bytes: Callable
    free_bytes: Callable
    materialized_cap_bytes: float
    progress: Callable
    step_timer: Callable = None
    steps_together_timer: Callable = None

    def time_steps(self, fn):
        return (self.step_timer or self.timer)(fn)

    def time_steps_together(self, entries):
        """ms per call of each entry's fn, in entry order, the entries (context_factory, fn) compared
        in one measurement where steps_together_timer is set, else each timed alone in its context."""
        if self.steps_together_timer is not None:
            return self.steps_together_timer(entries)
        return [self._time_steps_in(context_factory, fn) for context_factory, fn in entries]

    def _time_steps_in(self, context_factory, fn):
        with context_factory():
            return self.time_steps(fn)


def cuda_bench(timer, materialized_cap_bytes, progress):
    return Bench(torch.device("cuda"), timer, cuda_peak_bytes, cuda_free_bytes, materialized_cap_bytes, progress,
                 timer.back_to_back, timer.back_to_back_together)
