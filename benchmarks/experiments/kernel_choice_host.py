"""Host time of one call under two kernel choices, in one process: an environment variable the
launchers read per call (FLASH_ATTN_SM90_BWD, FLASH_ATTN_SM90_FWD) is switched between rounds, so
both choices see the same host. Each measurement queues CALLS calls behind a long torch.cuda._sleep
(the GPU is busy, so only the host's enqueue time is timed); ROUNDS rounds alternate the choices;
the minimum and the median per call are printed. bf16, batch 8, 12 heads, hd 64 unless given.

    python benchmarks/experiments/kernel_choice_host.py --env FLASH_ATTN_SM90_BWD --values cpasync,ws \
        [--pass bwd|fwd] [--seqlens 128,512] [--headdim 64]

The warp-specialized kernels encode their TMA tensor maps on the host for every call; this is
where that cost shows.
"""

import argparse
import os
import statistics
import time

import torch

import flash_attn

CALLS = 50
ROUNDS = 7
SLEEP_CYCLES = 200_000_000  # ~100 ms at H100 clocks: longer than queueing CALLS calls


def host_us_per_call(call):
    call()
    torch.cuda.synchronize()
    torch.cuda._sleep(SLEEP_CYCLES)
    start = time.perf_counter()
    for _ in range(CALLS):
        call()
    host = (time.perf_counter() - start) / CALLS * 1e6
    torch.cuda.synchronize()
    return host


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--env", required=True)
    parser.add_argument("--values", required=True)
    parser.add_argument("--pass", dest="which", default="bwd", choices=["fwd", "bwd"])
    parser.add_argument("--seqlens", default="128,512")
    parser.add_argument("--headdim", type=int, default=64)
    args = parser.parse_args()
    values = args.values.split(",")
    print(f"{torch.cuda.get_device_name()}: host µs per {args.which} call, {args.env} in {values}")
    print("| seqlen | " + " | ".join(f"{v} min / median" for v in values) + " |")
    print("|---|" + "---|" * len(values))
    for seqlen in (int(s) for s in args.seqlens.split(",")):
        q, k, v = (torch.randn(8, seqlen, 12, args.headdim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        dout = torch.randn_like(q)
        out = flash_attn.flash_attn_func(q, k, v)
        if args.which == "bwd":
            call = lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)  # noqa: E731
        else:
            call = lambda: flash_attn.flash_attn_func(q, k, v)  # noqa: E731
        times = {v: [] for v in values}
        for _ in range(ROUNDS):
            for value in values:
                os.environ[args.env] = value
                times[value].append(host_us_per_call(call))
        print(f"| {seqlen} | " + " | ".join(f"{min(t):.1f} / {statistics.median(t):.1f}" for t in times.values()) + " |")


if __name__ == "__main__":
    main()
