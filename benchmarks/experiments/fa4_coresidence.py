"""Does FlashAttention 4 in the same process slow our kernels? Session 34's speed suites with an fa4
column read ours 5-15% slower in a third of the cells than the same suite without it, on the same
machine, while cuDNN's numbers did not move. This times ours on a few of those cells (do_bench, L2
flushed, median ms, three repeats each) in four states of one process, with the SM clock read after
each timing:

  alone          FA4 not imported
  imported       flash_attn.cute imported (the CuTe DSL, tvm-ffi, quack loaded), no FA4 kernel run
  fa4 ran        FA4's forward and backward run once per cell (its kernels compiled and loaded)
  after fa4      each cell's FA4 timing immediately before ours, as in the suite with --impls ours,cudnn,fa4
                 (where ours timed right after the previous configuration's FA4)

    PYTHONPATH=$(benchmarks/experiments/fa4_peer.sh unpack /tmp/fa4) python benchmarks/experiments/fa4_coresidence.py

(from the repository's root: unpack puts this tree first, as a script run from a folder without
flash_attn would otherwise find FA4's namespace folder of that name before the installed package.)
"""

import statistics

import torch
import triton

from flash_attn import flash_attn_func
from flash_attn.benchmark import impls
from flash_attn.benchmark.shapes import training_shape

# (head dim, seqlen, causal, pass): cells that moved in the suites, and one that did not (hd 64 16k)
CELLS = ((128, 8192, True, "bwd"), (128, 16384, True, "bwd"), (128, 4096, True, "fwd"), (64, 8192, True, "bwd"),
         (64, 2048, False, "fwd"), (64, 16384, False, "bwd"))
REPEATS = 3


def sm_clock_mhz():
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        return pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)
    except Exception:  # noqa: BLE001 - the clock is a side reading only
        return -1


def make_call(forward, cell, tensors):
    """The timed callable of one pass: the forward, or autograd.grad over a retained graph."""
    headdim, seqlen, causal, pass_ = cell
    q, k, v, grad = tensors
    if pass_ == "fwd":
        return lambda: forward(q, k, v, causal)
    out = forward(q, k, v, causal)
    return lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)


def cell_tensors(cell):
    headdim, seqlen, _, _ = cell
    shape = training_shape(seqlen, headdim)
    q, k, v = (torch.randn(shape.batch, seqlen, shape.nheads, headdim, device="cuda", dtype=torch.bfloat16,
                           requires_grad=True) for _ in range(3))
    grad = torch.randn_like(q)
    return q, k, v, grad


def ours(q, k, v, causal):
    return flash_attn_func(q, k, v, causal=causal)


def time_ms(call):
    times = [triton.testing.do_bench(call, warmup=25, rep=100) for _ in range(REPEATS)]
    return statistics.median(times), sm_clock_mhz()


def main():
    tensors = {cell: cell_tensors(cell) for cell in CELLS}
    states = {}
    states["alone"] = {cell: time_ms(make_call(ours, cell, tensors[cell])) for cell in CELLS}
    impls._fa4_interface()
    states["imported"] = {cell: time_ms(make_call(ours, cell, tensors[cell])) for cell in CELLS}
    for cell in CELLS:
        make_call(impls.fa4_forward, cell, tensors[cell])()
    torch.cuda.synchronize()
    states["fa4 ran"] = {cell: time_ms(make_call(ours, cell, tensors[cell])) for cell in CELLS}
    after, fa4 = {}, {}
    for cell in CELLS:
        fa4[cell] = time_ms(make_call(impls.fa4_forward, cell, tensors[cell]))
        after[cell] = time_ms(make_call(ours, cell, tensors[cell]))
    states["after fa4"] = after
    states["fa4 itself"] = fa4
    print("ours, median ms (SM MHz after), per state; last column FA4's own time")
    print("| cell | " + " | ".join(states) + " |")
    print("|---|" + "---|" * len(states))
    for cell in CELLS:
        headdim, seqlen, causal, pass_ = cell
        name = f"hd{headdim} {seqlen} {'causal' if causal else 'non-causal'} {pass_}"
        print(f"| {name} | " + " | ".join(f"{states[s][cell][0]:.3f} ({states[s][cell][1]})" for s in states) + " |")


if __name__ == "__main__":
    main()
