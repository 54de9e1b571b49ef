"""Where the Triton forward's host time goes (issue #9), piece by piece: µs per call of back-to-back
calls on a problem small enough that the GPU waits on the host (batch 1, 128 tokens, 16 heads, head
dim 64 and 128, bf16, causal), one process:
- flash_attn_func through the Triton backend, without gradients, and attention.forward;
- the forward kernel's launch by Triton's JIT (kernel[grid](*args, **options), the arguments
  attention.forward passes, captured from its first call);
- the parts of that launch: the binder (argument specialization, Triton's generated code), the
  compiled kernel's launcher alone (CompiledKernel.run: no binder, no cache lookup), and torch's
  allocations of out / lse / the rng state;
then cProfile of attention.forward at hd 64 (the functions with the most own time). The launch's
parts are timed through Triton 3.6's internals (JITFunction.device_caches' binder, CompiledKernel.run
and its argument order), which other Triton versions may not have.

    python benchmarks/experiments/triton_launch_cost.py
"""

import contextvars
import cProfile
import io
import os
import pstats

import torch
import triton
from triton.runtime import driver

import flash_attn
from flash_attn.triton import attention, tuning
from padded_step_profile import wall_us

SWITCH = "FLASH_ATTENTION_TRITON_AMD_ENABLE"


def per_call_us(call):
    return wall_us(call, steps=500, warmup=20)


def captured_launch(q, k, v):
    """The forward Launcher call of attention.forward: (launcher, grid, args, keyword arguments)."""
    seen = []
    original = tuning.Launcher.__call__

    def record(self, grid, *args, fixed_blocks, **meta):
        seen.append((self, grid, args, {**fixed_blocks, **meta}))
        return original(self, grid, *args, fixed_blocks=fixed_blocks, **meta)

    tuning.Launcher.__call__ = record
    try:
        attention.forward(q, k, v, q.shape[-1] ** -0.5, (-1, 0))
    finally:
        tuning.Launcher.__call__ = original
    return seen[0]


def launch_parts(q, k, v):
    """Rows (name, µs) for the forward launch's parts, with a scratch allocator set as attention.forward
    sets one where its kernel makes tensor descriptors (hd 128: flash_attn/triton/scratch.py)."""
    return contextvars.copy_context().run(_launch_parts, q, k, v)


def _launch_parts(q, k, v):
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device=q.device))
    launcher, grid, args, options = captured_launch(q, k, v)
    jit = launcher.kernel
    compiled = jit[grid](*args, **options)
    device = driver.active.get_current_device()
    stream = driver.active.get_current_stream(device)
    binder = jit.device_caches[device][4]
    bound, _, _ = binder(*args, **options)
    values = list(bound.values())
    blocks = grid(bound)
    blocks = tuple(blocks) + (1,) * (3 - len(blocks))
    rows = [("kernel[grid](*args, **options): Triton's JIT launch", per_call_us(lambda: jit[grid](*args, **options))),
            ("binder(*args, **options): specialization only", per_call_us(lambda: binder(*args, **options))),
            ("CompiledKernel.run: the launcher alone",
             per_call_us(lambda: compiled.run(*blocks, stream, compiled.function, compiled.packed_metadata, None, None,
                                              None, *values)))]
    shape, lse_shape = q.shape, (q.shape[0], q.shape[2], q.shape[1])
    rows.append(("torch.empty out + lse, torch.zeros rng state (the forward's allocations)",
                 per_call_us(lambda: (torch.empty(shape, dtype=q.dtype, device=q.device),
                                      torch.empty(lse_shape, dtype=torch.float32, device=q.device),
                                      torch.zeros(2, dtype=torch.int64, device=q.device)))))
    print(f"hd {q.shape[-1]}: the forward kernel takes {len(args)} positional arguments, {len(values)} bound "
          "with its constexprs")
    return rows


def main():
    print(f"{torch.cuda.get_device_name()}: µs per call, batch 1, 128 tokens, 16 heads, causal, bf16")
    print("| hd | what | µs per call |\n|---|---|---|")
    for hd in (64, 128):
        q, k, v = (torch.randn(1, 128, 16, hd, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        os.environ[SWITCH] = "TRUE"
        with torch.no_grad():
            rows = [("flash_attn_func (Triton backend), no grad",
                     per_call_us(lambda: flash_attn.flash_attn_func(q, k, v, causal=True))),
                    ("attention.forward", per_call_us(lambda: attention.forward(q, k, v, hd ** -0.5, (-1, 0))))]
            rows += launch_parts(q, k, v)
        os.environ.pop(SWITCH, None)
        for name, us in rows:
            print(f"| {hd} | {name} | {us:.1f} |", flush=True)
    q, k, v = (torch.randn(1, 128, 16, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(300):
        attention.forward(q, k, v, 0.125, (-1, 0))
    profiler.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
    print("\n### cProfile, attention.forward, hd 64, 300 calls (tottime: own time)\n")
    print("\n".join(line for line in text.getvalue().splitlines() if line.strip()))


if __name__ == "__main__":
    main()
