"""Forward time against the GPU's clocks and power while it runs back to back: ours and SDPA cuDNN
in alternating windows, nvidia-smi sampling every 50 ms. For cells whose time under the speed
suite differs from a single profiled launch (benchmarks/NOTES.md v23: hd 128, 16k non-causal).
bf16, hidden 2048, 16k tokens.

    python benchmarks/experiments/sustained_clocks.py [--headdim 128] [--seqlens 8192,16384]
        [--seconds 3] [--rounds 2]

Prints per window: calls, median and last-quarter ms per call (events around each call, L2
flushed before each as in the speed suite), TFLOP/s, and the mean SM clock (MHz), power (W),
and the throttle reasons nvidia-smi reported in it.
"""

import argparse
import statistics
import subprocess
import tempfile
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from flash_attn import flash_attn_func

TOKENS, HIDDEN = 16384, 2048
QUERY = "timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active"


def implementations(q, k, v):
    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))

    return {"ours": lambda: flash_attn_func(q, k, v), "cudnn": cudnn}


def window(fn, seconds, flush):
    """Calls fn back to back for `seconds`; returns (wall start, wall end, per-call ms)."""
    starts, ends = [], []
    begin = time.time()
    while time.time() - begin < seconds:
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        starts.append(start)
        ends.append(end)
        if len(starts) % 16 == 0:
            torch.cuda.synchronize()  # keeps the host within a few calls of the GPU
    torch.cuda.synchronize()
    return begin, time.time(), [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]


def samples_between(lines, begin, end):
    rows = []
    for line in lines:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4:
            continue
        try:
            stamp = time.mktime(time.strptime(parts[0].split(".")[0], "%Y/%m/%d %H:%M:%S"))
            rows.append((stamp + float("0." + parts[0].split(".")[1]), float(parts[1]), float(parts[2]), parts[3]))
        except (ValueError, IndexError):
            continue
    return [r for r in rows if begin <= r[0] <= end]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--headdim", type=int, default=128)
    parser.add_argument("--seqlens", default="8192,16384")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    with tempfile.NamedTemporaryFile("r", suffix=".csv") as log:
        smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits", "-lms", "50"],
                               stdout=open(log.name, "w"), stderr=subprocess.DEVNULL)
        results = []
        try:
            for seqlen in (int(s) for s in args.seqlens.split(",")):
                shape = (TOKENS // seqlen, seqlen, HIDDEN // args.headdim, args.headdim)
                q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                flop = 4 * shape[0] * seqlen * seqlen * shape[2] * args.headdim
                impls = implementations(q, k, v)
                for fn in impls.values():
                    fn()
                for _ in range(args.rounds):
                    for name, fn in impls.items():
                        begin, end, ms = window(fn, args.seconds, flush)
                        results.append((seqlen, name, begin, end, ms, flop))
        finally:
            time.sleep(0.2)
            smi.terminate()
            smi.wait()
        lines = open(log.name).read().splitlines()
    print(f"{torch.cuda.get_device_name()}, hd {args.headdim}, bf16, hidden {HIDDEN}, {TOKENS} tokens")
    print("| seqlen | impl | calls | median ms | last-quarter ms | TFLOP/s | SM MHz | W | throttle reasons |")
    print("|---|---|---|---|---|---|---|---|---|")
    for seqlen, name, begin, end, ms, flop in results:
        rows = samples_between(lines, begin, end)
        mhz = statistics.mean(r[1] for r in rows) if rows else float("nan")
        watts = statistics.mean(r[2] for r in rows) if rows else float("nan")
        reasons = ",".join(sorted({r[3] for r in rows})) or "-"
        median = statistics.median(ms)
        last = statistics.median(ms[3 * len(ms) // 4:])
        print(f"| {seqlen} | {name} | {len(ms)} | {median:.3f} | {last:.3f} | {flop / median / 1e9:.1f} | "
              f"{mhz:.0f} | {watts:.0f} | {reasons} |")


if __name__ == "__main__":
    main()
