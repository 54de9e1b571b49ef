"""Where the time of a short forward+backward goes: host (enqueue) against GPU (kernels), ours and
SDPA-flash, at the features suite's host-overhead shapes (batch 8, 12 heads, hd 64, bf16).

Per implementation and sequence length:
  gpu_us   kernels only: the iterations are queued behind a long torch.cuda._sleep, so the GPU runs
           them back to back and the events time the kernels without host gaps (L2 warm);
  host_us  the wall time of queueing one iteration while the GPU is still busy with that sleep;
  fwd_host_us / bwd_host_us  the same, for the forward alone and for autograd.grad alone;
  bench_us the features suite's measurement (do_bench median, L2 flushed per run), three rounds
           alternating the implementations.
Then the profiler's host-side op table of ours, to say which step of the call costs what.
SDPA's backend selection is entered once around its measurements, as the benchmark suites do: the
context manager costs ~29 µs per entry on the CPU machine, which the first runs of this script
(NOTES.md v11) counted into every SDPA forward.

    python benchmarks/experiments/host_overhead.py [--seqlens 128,256,512,1024] [--profile]
"""

import argparse
import contextlib
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flash_attn

BATCH, HEADS, HEADDIM = 8, 12, 64
QUEUED = 20  # iterations per sleep-backed measurement
SLEEP_CYCLES = 60_000_000  # ~30 ms at H100 clocks: longer than queueing QUEUED iterations


def ours(q, k, v):
    return flash_attn.flash_attn_func(q, k, v)


def sdpa(q, k, v):
    """SDPA on (batch, seqlen, heads, headdim) views; the caller selects the flash backend."""
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)


IMPLS = (("ours", ours, contextlib.nullcontext), ("sdpa-flash", sdpa, lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION)))


def inputs(seqlen):
    q, k, v = (torch.randn(BATCH, seqlen, HEADS, HEADDIM, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    return q, k, v, torch.randn_like(q)


def queued(step):
    """(host µs per step, GPU µs per step) with the steps queued behind a sleep."""
    step()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(SLEEP_CYCLES)
    start.record()
    t0 = time.perf_counter()
    for _ in range(QUEUED):
        step()
    host = (time.perf_counter() - t0) / QUEUED * 1e6
    end.record()
    torch.cuda.synchronize()
    return host, start.elapsed_time(end) / QUEUED * 1e3


def measure(fn, seqlen):
    q, k, v, dout = inputs(seqlen)
    full = lambda: torch.autograd.grad(fn(q, k, v), (q, k, v), dout)  # noqa: E731
    host, gpu = queued(full)
    fwd_host, _ = queued(lambda: fn(q, k, v))
    out = fn(q, k, v)
    bwd_host, _ = queued(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
    return {"host_us": host, "gpu_us": gpu, "fwd_host_us": fwd_host, "bwd_host_us": bwd_host}, full


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seqlens", default="128,256,512,1024")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    from triton.testing import do_bench

    print(f"{args.label} {torch.cuda.get_device_name()} batch {BATCH} heads {HEADS} hd {HEADDIM} bf16, µs")
    print("| seqlen | impl | host | fwd host | bwd host | gpu | bench (3 rounds) |")
    print("|---|---|---|---|---|---|---|")
    for seqlen in (int(s) for s in args.seqlens.split(",")):
        rows, steps = {}, {}
        for name, fn, context in IMPLS:
            with context():
                rows[name], steps[name] = measure(fn, seqlen)
            rows[name]["bench"] = []
        for _ in range(3):
            for name, _, context in IMPLS:
                with context():
                    rows[name]["bench"].append(do_bench(steps[name], warmup=25, rep=100, return_mode="median") * 1e3)
        for name, r in rows.items():
            print(f"| {seqlen} | {name} | {r['host_us']:.1f} | {r['fwd_host_us']:.1f} | {r['bwd_host_us']:.1f} | "
                  f"{r['gpu_us']:.1f} | {' / '.join(f'{b:.1f}' for b in r['bench'])} |")
        print(f"| {seqlen} | ratio sdpa/ours | | | | | {statistics.median(rows['sdpa-flash']['bench']) / statistics.median(rows['ours']['bench']):.2f} |")
    if args.profile:
        q, k, v, dout = inputs(128)
        step = lambda: torch.autograd.grad(ours(q, k, v), (q, k, v), dout)  # noqa: E731
        for _ in range(20):
            step()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(50):
                step()
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


if __name__ == "__main__":
    main()
