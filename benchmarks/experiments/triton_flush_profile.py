"""Why a Triton backward cell reads slower by do_bench than by its kernel time (issue #9): session 40's
triton_kernel_time.py --backward read our hd 64 causal backward at 1k as 386 µs of kernel time and
395 µs a call back to back, but 808 µs by do_bench, whose loop zeroes a 256 MB buffer (an L2 flush)
before each call. Here a loop of do_bench's shape (flush, start event, call, end event; no
synchronization inside) runs under torch.profiler, with and without the flush, and with a
synchronization before each call (the host's time before the first kernel then shows in the
window). Per loop: the median event window and each kernel's mean GPU time per call, so that a
kernel that itself runs slower after the flush is told apart from a GPU waiting on the host.
Ours with the host's tiles and with --tiles (DKDV/DQ pairs as triton_tile_sweep.py takes them), and
the tutorial's backward (causal only), 16 heads, 16k tokens, bf16 (the tutorial fp16).

    FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE python benchmarks/experiments/triton_flush_profile.py
"""

import argparse
import os
import statistics
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(__file__))
from triton_tile_sweep import tiles  # noqa: E402
from triton_tutorial_peer import (HEADS, TOKENS, TUTORIAL_PATH, Tutorial, load_tutorial,  # noqa: E402
                                  ours_backward, tutorial_backward)

FLUSH_BYTES = 256 * 1024 * 1024  # do_bench's buffer (triton.runtime's empty cache for benchmarks)
MODES = ("flush", "no flush", "sync + flush")


def timed_loop(call, mode, steps=40):
    """(median event window in µs, {kernel: mean µs per call}) of `steps` calls in a loop of `mode`."""
    flush = torch.empty(FLUSH_BYTES, dtype=torch.int8, device="cuda")
    starts, ends = ([torch.cuda.Event(enable_timing=True) for _ in range(steps)] for _ in range(2))
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for start, end in zip(starts, ends):
            if mode != "no flush":
                flush.zero_()
            if mode == "sync + flush":
                torch.cuda.synchronize()
            start.record()
            call()
            end.record()
        torch.cuda.synchronize()
    window = statistics.median(s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends))
    shares = {e.key: e.self_device_time_total / steps for e in prof.key_averages()
              if e.self_device_time_total > 0 and "FillFunctor<signed char>" not in e.key}
    return window, shares


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--headdim", type=int, default=64)
    parser.add_argument("--shapes", nargs="+", default=("1024:1", "1024:0", "2048:1"), help="seqlen:causal")
    parser.add_argument("--tiles", nargs="*", default=("32,64,4,3/64,32,4,3",))
    args = parser.parse_args()
    module, error = load_tutorial(os.path.normpath(TUTORIAL_PATH))
    tutorial = Tutorial(module) if module is not None else None
    if module is None:
        print("tutorial not loaded:", error)
    print(f"{torch.cuda.get_device_name()}: backward (autograd.grad), hd {args.headdim}, 16 heads, 16k tokens; "
          "µs per call: event window (median) and the kernels' GPU time (sum, mean per call)")
    print("| seqlen | causal | who | " + " | ".join(f"{m} window | {m} kernels" for m in MODES) + " |")
    print("|---|---|---|" + "---|---|" * len(MODES))
    split = []
    for shape in args.shapes:
        seqlen, causal = (int(x) for x in shape.split(":"))
        batch = TOKENS // seqlen
        q, k, v, dout = (torch.randn(batch, seqlen, HEADS, args.headdim, device="cuda", dtype=torch.bfloat16)
                         for _ in range(4))
        runs = [(f"ours {tile}", tile, ours_backward(q, k, v, bool(causal), dout)[1]) for tile in ("default", *args.tiles)]
        if tutorial is not None and causal:
            halves = [t.half() for t in (q, k, v, dout)]
            call = tutorial_backward(tutorial, *halves[:3], True, args.headdim ** -0.5, halves[3])[1]
            if call is not None:
                runs.append(("tutorial fp16", "default", call))
        for who, tile, call in runs:
            cells = []
            with tiles("bwd", tile):
                for mode in MODES:
                    window, shares = timed_loop(call, mode)
                    cells += [f"{window:.1f}", f"{sum(shares.values()):.1f}"]
                    split.append(f"{seqlen} / causal {bool(causal)} / {who} / {mode}: " + ", ".join(
                        f"{name[:40]} {us:.1f}" for name, us in sorted(shares.items(), key=lambda item: -item[1])))
            print(f"| {seqlen} | {bool(causal)} | {who} | " + " | ".join(cells) + " |", flush=True)
    print("\nkernels by kernel (µs per call):")
    print("\n".join(f"- {line}" for line in split))


if __name__ == "__main__":
    main()
