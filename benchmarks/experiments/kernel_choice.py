"""Two or more kernel choices compared in one process: an environment variable the launchers read
per call (FLASH_ATTN_SM90_FWD, FLASH_ATTN_SM90_BWD) is switched between rounds, so every choice
sees the same GPU and host. bf16.

--measure time: GPU time, do_bench median (L2 flushed per run), at the speed suite's shapes
  (hidden 2048: heads = 2048 / headdim; batch x seqlen = 16k tokens); one row per case and round.
--measure host: the host's enqueue time per call, CALLS calls queued behind a long
  torch.cuda._sleep (the GPU is busy, so only the host is timed), ROUNDS rounds; min and median
  per case. The warp-specialized kernels encode their TMA tensor maps on the host for every call:
  this is where that cost shows.

    python benchmarks/experiments/kernel_choice.py --env FLASH_ATTN_SM90_BWD --values cpasync,ws \
        --pass bwd --cases 64:512:causal,128:2048 [--measure time|host] [--rounds 2]

Cases are headdim:seqlen[:causal]. --options adds keyword arguments to every call, e.g.
"dropout_p=0.1", "softcap=30", "alibi=1" (ALiBi slopes 2^-(8 (h + 1) / heads), fp32).
A value "sdpa-cudnn" times SDPA's cuDNN backend on the same shapes instead of ours (a peer
column for head dims the speed suite does not take, 32 and 96; no --options).
"""

import argparse
import os
import statistics
import time

import torch
from triton.testing import do_bench

from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention

from flash_attn import flash_attn_func

PEER = "sdpa-cudnn"
CALLS = 50
SLEEP_CYCLES = 200_000_000  # ~100 ms at H100 clocks: longer than queueing CALLS calls


def parse_options(text, heads):
    """--options "name=value,..." as flash_attn_func keyword arguments."""
    options = {}
    for item in filter(None, text.split(",")):
        name, value = item.split("=")
        if name == "alibi":
            exponents = torch.arange(1, heads + 1, device="cuda", dtype=torch.float32) * (8.0 / heads)
            options["alibi_slopes"] = torch.pow(2.0, -exponents)
        else:
            options[name] = float(value)
    return options


def make_call(headdim, seqlen, causal, which, options_text=""):
    """A function that returns the call to measure, made anew for each choice: the backward's
    forward runs with the same choice, outside the measurement."""
    heads, batch = 2048 // headdim, max(1, 16384 // seqlen)
    q, k, v = (torch.randn(batch, seqlen, heads, headdim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    dout = torch.randn_like(q)
    options = parse_options(options_text, heads)

    def make(impl):
        if impl == PEER:
            return make_peer_call(q, k, v, dout, causal, which)
        if which == "fwd":
            return lambda: flash_attn_func(q, k, v, causal=causal, **options)
        out = flash_attn_func(q, k, v, causal=causal, **options)
        return lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    return make


def make_peer_call(q, k, v, dout, causal, which):
    """SDPA's cuDNN backend on copies of q, k, v, dout in its (batch, heads, seqlen, headdim) layout."""
    qt, kt, vt = (x.detach().transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v))
    doutt = dout.transpose(1, 2).contiguous()

    def forward():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
    if which == "fwd":
        return forward
    out = forward()
    return lambda: torch.autograd.grad(out, (qt, kt, vt), doutt, retain_graph=True)


def gpu_us(call):
    call()
    return do_bench(call, warmup=25, rep=100, return_mode="median") * 1e3


def host_us(call):
    call()
    torch.cuda.synchronize()
    torch.cuda._sleep(SLEEP_CYCLES)
    start = time.perf_counter()
    for _ in range(CALLS):
        call()
    elapsed = (time.perf_counter() - start) / CALLS * 1e6
    torch.cuda.synchronize()
    return elapsed


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--env", required=True)
    parser.add_argument("--values", required=True)
    parser.add_argument("--pass", dest="which", default="fwd", choices=["fwd", "bwd"])
    parser.add_argument("--cases", required=True)
    parser.add_argument("--measure", default="time", choices=["time", "host"])
    parser.add_argument("--rounds", type=int, default=None, help="default: 2 for time, 7 for host")
    parser.add_argument("--options", default="", help='keyword arguments of every call: "dropout_p=0.1,softcap=30"')
    parser.add_argument("--label", default="", help="a name printed with the header (the ab stage's before / after)")
    args = parser.parse_args()
    values = args.values.split(",")
    if PEER in values and args.options:
        parser.error(f"--options apply to ours only, not to {PEER}")
    rounds = args.rounds or (2 if args.measure == "time" else 7)
    measure = gpu_us if args.measure == "time" else host_us
    print(f"{args.label} {torch.cuda.get_device_name()}: {args.which} {args.measure} µs, {args.env} in {values}"
          f"{', options ' + args.options if args.options else ''}")
    header = "| case | round | " if args.measure == "time" else "| case | "
    cell = "" if args.measure == "time" else " min / median"
    print(header + " | ".join(v + cell for v in values) + " |")
    print("|---|" + ("---|" if args.measure == "time" else "") + "---|" * len(values))
    for case in args.cases.split(","):
        parts = case.split(":")
        headdim, seqlen, causal = int(parts[0]), int(parts[1]), len(parts) > 2 and parts[2] == "causal"
        name = f"hd {headdim} s {seqlen}{' causal' if causal else ''}"
        make = make_call(headdim, seqlen, causal, args.which, args.options)
        samples = {v: [] for v in values}
        for round_index in range(rounds):
            for value in values:
                if value != PEER:
                    os.environ[args.env] = value
                samples[value].append(measure(make(value)))
            if args.measure == "time":
                print(f"| {name} | {round_index} | " + " | ".join(f"{samples[v][-1]:.1f}" for v in values) + " |",
                      flush=True)
        if args.measure == "host":
            print(f"| {name} | " + " | ".join(f"{min(t):.1f} / {statistics.median(t):.1f}" for t in samples.values())
                  + " |", flush=True)


if __name__ == "__main__":
    main()
