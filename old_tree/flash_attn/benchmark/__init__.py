"""Benchmarks of flash_attn against its peers: `python -m flash_attn.benchmark`.

Modules, one concern each: shapes (shapes, FLOP and byte counts, memory estimates), plan (the quick
and full sets), impls (ours and the peers), measure (timing, peak memory, the failure guard), runner
(inputs, timed cells, the loop over configurations), suites (speed, speedup, memory, decode), features
(each feature against its baseline and target), cells (results and ratios), report (markdown, JSON),
plots (PNG), env (device and versions), cpu_check (the no-GPU path), cli (the command line).
"""

from .cli import main

__all__ = ["main"]
