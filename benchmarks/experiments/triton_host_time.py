"""Host time per call of the Triton backend (issue #9), against the Triton tutorial's attention and
our CUDA kernels: wall time of 300 back-to-back calls on a problem small enough that the GPU waits on
the host (batch 1, 128 tokens, 16 heads, head dim 64 / 128, bf16; fp16 for the tutorial), forward
and forward + backward; the hd 64 forward layer by layer (public function, op, backend function,
without gradients); then cProfile of our Triton forward and backward (the functions with the
most own time), to find what the Python side spends. The short cells of the speed comparison
(benchmarks/experiments/triton_tutorial_peer.py) time host gaps where the GPU work per call is
shorter than this.

    python benchmarks/experiments/triton_host_time.py
"""

import cProfile
import io
import os
import pstats

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


def profile(call, title, calls=200):
    call()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        call()
    profiler.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(22)
    print(f"\n### cProfile, {title}, {calls} calls (tottime: own time)\n")
    print("\n".join(line for line in text.getvalue().splitlines() if line.strip())[:6000])


def main():
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
