"""Host time per call of the Triton backend (issue #9), against the Triton tutorial's attention and
our CUDA kernels: wall time of 300 back-to-back calls on a problem small enough that the GPU waits on
the host (batch 1, 128 tokens, 16 heads, head dim 64 / 128, bf16; fp16 for the tutorial), forward
and forward + backward; the hd 64 forward layer by layer (public function, op, backend function,
without gradients); then cProfile of our Triton forward and backward (the functions with the
most own time), to find what the Python side spends. The short cells of the speed comparison
(benchmarks/experiments/triton_tutorial_peer.py) time host gaps where the GPU work per call is
shorter than this.

    python benchmarks/experiments/triton_host_time.py [--fp8]

--fp8 times the fp8 forward instead (e4m3, unit descales, hd 128, causal): per call at batch 1 x 128
tokens and at batch 16 x 1k tokens (a cell of the fp8 speed comparison), the bf16 forward beside it,
then cProfile of both fp8 sizes.
"""

import cProfile
import io
import os
import pstats
import sys

import torch

import flash_attn
from padded_step_profile import wall_us
from triton_tutorial_peer import TUTORIAL_PATH, Tutorial, load_tutorial

SWITCH = "FLASH_ATTENTION_TRITON_AMD_ENABLE"


def per_call_us(call):
    return wall_us(call, steps=300, warmup=20)


def ours(q, k, v, backward, triton):
    def call():
        if triton:
            os.environ[SWITCH] = "TRUE"
        try:
            out = flash_attn.flash_attn_func(q, k, v, causal=True)
            if backward:
                torch.autograd.grad(out, (q, k, v), out)
        finally:
            os.environ.pop(SWITCH, None)
    return call


def tutorial_call(tutorial, q, k, v, backward):
    def call():
        out = tutorial("fp16", q, k, v, True, q.shape[-1] ** -0.5)
        if backward:
            torch.autograd.grad(out, (q, k, v), out)
    return call


def profile(call, title, calls=200, sort="tottime"):
    call()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        call()
    profiler.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats(sort).print_stats(22)
    print(f"\n### cProfile, {title}, {calls} calls, by {sort} (tottime: own time)\n")
    print("\n".join(line for line in text.getvalue().splitlines() if line.strip())[:6000])


def fp8_layers(q8, k8, v8):
    """The fp8 forward's host time layer by layer (batch 1 x 128 tokens, causal), with the pieces
    the fp8 call adds: the descale stack and V's keys-contiguous copy."""
    from flash_attn.triton import attention, fp8
    ones = torch.ones(1, 16, device="cuda")
    stacked = fp8.stacked_descales(ones, ones, ones, 1, 16, "cuda")
    scale = 128 ** -0.5
    layers = {
        "flash_attn_func": lambda: flash_attn.flash_attn_func(q8, k8, v8, causal=True, q_descale=ones,
                                                              k_descale=ones, v_descale=ones),
        "triton fp8 op": lambda: torch.ops.flash_attn.triton_fwd_fp8(q8, k8, v8, ones, ones, ones, None, None, 128,
                                                                     128, scale, -1, 0, 0.0, None),
        "fp8.forward_fp8": lambda: fp8.forward_fp8(q8, k8, v8, ones, ones, ones, scale, (-1, 0)),
        "attention.forward (stacked descales)": lambda: attention.forward(q8, k8, v8, scale, (-1, 0),
                                                                          descales=stacked),
        "fp8.stacked_descales alone": lambda: fp8.stacked_descales(ones, ones, ones, 1, 16, "cuda"),
        "attention.keys_contiguous alone": lambda: attention.keys_contiguous(v8),
    }
    print("\n| fp8 forward, layer by layer | µs per call |\n|---|---|")
    with torch.no_grad():
        for name, call in layers.items():
            print(f"| {name} | {per_call_us(call):.1f} |", flush=True)


def fp8_main():
    """--fp8: the fp8 forward's host time (see the docstring)."""
    print(f"{torch.cuda.get_device_name()}: µs per call back to back, hd 128, 16 heads, causal")
    print("| batch x tokens | bf16 | fp8 |\n|---|---|---|")
    os.environ[SWITCH] = "TRUE"
    fp8_calls = {}
    for batch, seqlen in ((1, 128), (16, 1024)):
        q, k, v = (torch.randn(batch, seqlen, 16, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        q8, k8, v8 = (t.to(torch.float8_e4m3fn) for t in (q, k, v))
        ones = torch.ones(batch, 16, device="cuda")
        fp8_calls[batch, seqlen] = lambda q8=q8, k8=k8, v8=v8, ones=ones: flash_attn.flash_attn_func(
            q8, k8, v8, causal=True, q_descale=ones, k_descale=ones, v_descale=ones)
        bf16 = per_call_us(lambda q=q, k=k, v=v: flash_attn.flash_attn_func(q, k, v, causal=True))
        print(f"| {batch} x {seqlen} | {bf16:.1f} | {per_call_us(fp8_calls[batch, seqlen]):.1f} |", flush=True)
    fp8_layers(*(t.to(torch.float8_e4m3fn) for t in torch.randn(3, 1, 128, 16, 128, device="cuda")))
    for (batch, seqlen), call in fp8_calls.items():
        for sort in ("tottime", "cumulative"):
            profile(call, f"ours Triton fp8 forward, hd 128, batch {batch} x {seqlen}", calls=100, sort=sort)


def main():
    if "--fp8" in sys.argv[1:]:
        return fp8_main()
    module, why = load_tutorial(os.path.normpath(TUTORIAL_PATH))
    tutorial = Tutorial(module) if module is not None else None
    print(f"{torch.cuda.get_device_name()}: µs per call, batch 1, 128 tokens, 16 heads, causal")
    print("| hd | pass | ours Triton | ours CUDA | tutorial |")
    print("|---|---|---|---|---|")
    for hd in (64, 128):
        q, k, v = (torch.randn(1, 128, 16, hd, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        tq, tk, tv = (Tutorial.layout(t.detach().half()).requires_grad_() for t in (q, k, v))
        for backward in (False, True):
            cells = [per_call_us(ours(q, k, v, backward, True))]
            cells.append(per_call_us(ours(q, k, v, backward, False)) if flash_attn.ops.has_cuda_kernels() else None)
            cells.append(per_call_us(tutorial_call(tutorial, tq, tk, tv, backward)) if tutorial else None)
            text = " | ".join("-" if c is None else f"{c:.1f}" for c in cells)
            print(f"| {hd} | {'fwd+bwd' if backward else 'fwd'} | {text} |", flush=True)
    if tutorial is None:
        print(f"tutorial: {why}")
    q, k, v = (torch.randn(1, 128, 16, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    from flash_attn.triton import attention
    with torch.no_grad():
        layers = {
            "flash_attn_func, no grad": lambda: flash_attn.flash_attn_func(q, k, v, causal=True),
            "triton op, no grad": lambda: torch.ops.flash_attn.triton_fwd(q, k, v, None, None, 128, 128, 0.0, 0.125,
                                                                          -1, 0, 0.0, None, False),
            "attention.forward (allocations, checks, launch)": lambda: attention.forward(q, k, v, 0.125, (-1, 0)),
        }
        print("\n| hd 64 forward, layer by layer | µs per call |\n|---|---|")
        os.environ[SWITCH] = "TRUE"
        for name, call in layers.items():
            print(f"| {name} | {per_call_us(call):.1f} |")
        os.environ.pop(SWITCH, None)
    print(f"| flash_attn_func, recording gradients | {per_call_us(ours(q, k, v, False, True)):.1f} |")
    profile(ours(q, k, v, False, True), "ours Triton forward, hd 64")
    profile(ours(q, k, v, True, True), "ours Triton forward + backward, hd 64")


if __name__ == "__main__":
    main()
