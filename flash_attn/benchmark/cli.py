"""The command line: `python -m flash_attn.benchmark [--quick | --full] [--suite ...] ...`.

Progress goes to stderr, one line per configuration; the markdown report is printed last on stdout
(the end of the output is what a GPU call shows); JSON, markdown and PNGs go to the results folder
after each suite, so a run cut short keeps what it measured.
"""

import argparse
import sys
import time
import traceback
from pathlib import Path

import torch

from . import impls as impl_lib
from .cpu_check import run_cpu_check
from .env import collect_metadata, default_results_dir, environment_line
from .measure import Timer, cuda_bench, warm_up_gpu
from .plan import SUITES, build_plan
from .plots import load_pyplot, write_plots
from .report import markdown_report, write_results
from .shapes import format_seqlen, parse_seqlen
from .suites import RUNNERS


def name_list(text):
    return tuple(part.strip() for part in text.split(",") if part.strip())


def int_list(text):
    return tuple(int(part) for part in name_list(text))


def seqlen_list(text):
    return tuple(parse_seqlen(part) for part in name_list(text))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m flash_attn.benchmark",
        description="Benchmark flash_attn against SDPA's backends, naive attention and other peers on this "
                    "GPU. Without a GPU, checks the CPU path on a small case and exits.",
    )
    chosen = parser.add_mutually_exclusive_group()
    chosen.add_argument("--quick", dest="full", action="store_false",
                        help="the quick set (default): bf16, headdims 64 and 128, seqlens 512/2k/8k (+16k for hd128 "
                             "non-causal), a memory sweep to 8k, the decode suite, the feature comparisons; about 2 "
                             "minutes on an H100 before --idle-ms (more with it; not yet timed)")
    chosen.add_argument("--full", dest="full", action="store_true",
                        help="the full set: bf16 and fp16, headdims 64/128/256, seqlens 512 to 16k; 10+ minutes")
    parser.add_argument("--suite", type=name_list, default=SUITES, metavar="LIST",
                        help=f"comma-separated suites to run, of {','.join(SUITES)} (default: all)")
    parser.add_argument("--dtypes", type=name_list, metavar="LIST", help="speed suite dtypes, of bf16,fp16")
    parser.add_argument("--headdims", type=int_list, metavar="LIST", help="speed suite head dims, e.g. 64,128,256")
    parser.add_argument("--seqlens", type=seqlen_list, metavar="LIST",
                        help="sequence lengths of the speed, speedup and memory sweeps, e.g. 512,2k,16k (the "
                             "features suite keeps the shapes of its targets)")
    parser.add_argument("--impls", type=name_list, metavar="LIST",
                        help=f"implementations, of {','.join(impl_lib.TRAINING_IMPLS)} "
                             f"(default: {','.join(impl_lib.DEFAULT_TRAINING_IMPLS)}; flex compiles every shape)")
    parser.add_argument("--out", type=Path, metavar="DIR",
                        help="results folder (default: benchmarks/results/<device-slug>_<YYYY-MM-DD>/)")
    parser.add_argument("--no-plots", action="store_true", help="write no PNG files")
    parser.add_argument("--warmup-ms", type=float, default=25.0, help="warm-up time per measurement, ms (default 25)")
    parser.add_argument("--rep-ms", type=float, default=100.0, help="timed time per measurement, ms (default 100)")
    parser.add_argument("--idle-ms", type=float, default=250.0,
                        help="the GPU left idle before each measurement, ms (default 250), so a peer that ran at "
                             "the power cap just before does not lower the next one's clock; 0 as before "
                             "2026-11-28")
    return parser.parse_args(argv)


def progress(line):
    print(line, file=sys.stderr, flush=True)


def describe_plan(plan):
    speed = plan.speed
    return (
        f"{'quick' if plan.quick else 'full'}; suites {', '.join(plan.suites)}; implementations "
        f"{', '.join(impl_lib.label(name) for name in plan.impls)}; speed: {len(speed)} configurations "
        f"(dtypes {', '.join(sorted({c.dtype for c in speed}))}; headdims "
        f"{', '.join(str(h) for h in sorted({c.headdim for c in speed}))}; seqlens "
        f"{', '.join(format_seqlen(s) for s in sorted({c.seqlen for c in speed}))})"
    )


def cpu_fallback():
    """No GPU: say so, check the CPU path on a small case, print the check's table last."""
    print("No GPU found (torch.cuda.is_available() is False): the benchmark needs a CUDA GPU. Checking "
          "flash_attn_func's CPU path (the exact fp32 reference) against naive PyTorch attention on a small "
          "case instead.")
    table, passed = run_cpu_check()
    print(table, end="")
    return 0 if passed else 1


def _run_suite(name, bench, plan):
    """One suite; a bug in it is reported and the other suites still run."""
    try:
        return RUNNERS[name](bench, plan)
    except Exception:  # noqa: BLE001 - each suite's cells are guarded; this catches the suite's own failure
        progress(f"suite {name} failed:\n{traceback.format_exc()}")
        return None


def _write_outputs(out_dir, metadata, suites, suite, plt):
    paths = write_results(out_dir, metadata, suites)
    if plt is not None:
        try:
            paths += write_plots(plt, suite, metadata, out_dir)
        except Exception:  # noqa: BLE001 - a plot must not lose the numbers already written
            progress(f"plots of {suite.name} failed:\n{traceback.format_exc()}")
    return paths


def gpu_run(args, plan, argv):
    timer = Timer(args.warmup_ms, args.rep_ms, args.idle_ms)
    bench = cuda_bench(timer, plan.materialized_cap_bytes, progress)
    metadata = collect_metadata(timer.describe(), argv)
    metadata["set"] = describe_plan(plan)
    out_dir = args.out or default_results_dir(metadata)
    plt = None if args.no_plots else load_pyplot()
    progress(f"flash_attn benchmark on {environment_line(metadata)}; {metadata['set']}; results in {out_dir}")
    if not args.no_plots and plt is None:
        metadata["plots"] = "skipped: matplotlib is not importable"
        progress(f"plots {metadata['plots']}")
    warm_up_gpu()
    suites, written = [], set()
    for name in plan.suites:
        start = time.perf_counter()
        suite = _run_suite(name, bench, plan)
        if suite is None:
            continue
        suites.append(suite)
        written.update(str(path) for path in _write_outputs(out_dir, metadata, suites, suite, plt))
        progress(f"{name} done in {time.perf_counter() - start:.0f} s")
    progress("wrote " + ", ".join(sorted(written)))
    print(markdown_report(metadata, suites), end="")
    return 0


def main(argv=None):
    """Returns the exit status: 0 after a run (cells may hold errors), 1 if the CPU check fails,
    2 for bad arguments."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    try:
        plan = build_plan(not args.full, args.suite, args.dtypes, args.headdims, args.seqlens, args.impls)
    except ValueError as exc:
        print(f"python -m flash_attn.benchmark: error: {exc}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        return cpu_fallback()
    return gpu_run(args, plan, argv)
