"""Issue #9's tutorial comparison: our Triton backend against Triton's fused-attention tutorial
(triton-lang/triton, python/tutorials/06-fused-attention.py) on the same GPU, in one process, on
the same inputs. The tutorial is third-party code and not part of the triton wheel: it is read from
peers/triton_fused_attention_tutorial.py (ignored by git, never committed); without that file this
script says so and exits 0.

    FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE python benchmarks/experiments/triton_tutorial_peer.py

Measured with triton.testing.do_bench (median, L2 flushed per run), 16 heads, 16k tokens (batch =
16384 / seqlen), head dim 64 and 128, seqlen 1k..16k, non-causal and causal:
- forward: ours in bf16 and fp16, the tutorial in fp16 (its kernels cast P and the output to fp16,
  so bf16 inputs are tried once and the error reported);
- backward alone (torch.autograd.grad of a retained forward graph), the same way for both;
  the tutorial's backward walks the causal triangle only, so it is timed for causal shapes only;
- fp8 forward: ours in e4m3 with unit descales (bf16 out), the tutorial's fp8 in e5m2 (the only
  fp8 its code takes; on Hopper it runs its non-TMA kernel, which under a causal mask still walks
  every key block, masked ones included), at head dim 128 and seqlen >= 4k by default.
TFLOP/s count 4 * batch * seqlen^2 * heads * hd (halved when causal), times 2.5 for the backward.

Equal work: the outputs of ours and the tutorial's in fp16 are compared (max abs diff), and the
causal gradients too. The tutorial gets its (batch, heads, seqlen, hd) layout as (1, batch * heads,
seqlen, hd): the same independent problems, and its TMA forward computes the row offset of a batch
entry as off_z + off_h * N_CTX, which is right only for a batch of one.

--tutorial-configs hopper (the default) keeps the tutorial's autotune lists to its BLOCK_M = 128
configs with BLOCK_N >= 64 and at most 4 stages (the Hopper winners), so that compiling the lists
does not take most of the run; --tutorial-configs full keeps its lists as written. Our side runs as
the environment says (FLASH_ATTENTION_TRITON_AMD_AUTOTUNE, FLASH_ATTENTION_TRITON_FORWARD_TILE, ...).
--no-fp8 leaves out the fp8 columns (ours and the tutorial's), --headdims 256 runs head dim 256.
"""

import argparse
import importlib.util
import inspect
import os
import sys
import types

import torch
import triton
from triton.testing import do_bench

from flash_attn import flash_attn_func

HEADS, TOKENS = 16, 16384
DEVICE = "cuda"
TUTORIAL_PATH = os.path.join(os.path.dirname(__file__), "..", "..", "peers", "triton_fused_attention_tutorial.py")
NOT_RUN = "-"


def load_tutorial(path):
    """(module, None) of the tutorial file, or (None, why it could not be imported). A missing pytest
    (the tutorial imports it for its own test) is stood in for by a module whose marks do nothing."""
    if "pytest" not in sys.modules and importlib.util.find_spec("pytest") is None:
        stand_in = types.ModuleType("pytest")
        stand_in.mark = types.SimpleNamespace(parametrize=lambda *a, **k: (lambda f: f))
        sys.modules["pytest"] = stand_in
    try:
        spec = importlib.util.spec_from_file_location("triton_fused_attention_tutorial", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except Exception as error:  # the tutorial may use APIs this triton lacks
        return None, f"{type(error).__name__}: {error}"
    return module, None


def keep_hopper_configs(module):
    """Restrict the tutorial's autotuners to BLOCK_M 128, BLOCK_N >= 64, <= 4 stages (see the docstring)."""
    for name in ("_attn_fwd_tma", "_attn_fwd"):
        tuner = getattr(module, name, None)
        if tuner is None or not hasattr(tuner, "configs"):
            continue
        kept = [c for c in tuner.configs
                if c.kwargs.get("BLOCK_M") == 128 and c.kwargs.get("BLOCK_N", 0) >= 64 and c.num_stages <= 4]
        if kept:
            tuner.configs = kept


class Tutorial:
    """The tutorial's attention on our (batch, seqlen, heads, hd) tensors, remembering the first error."""

    def __init__(self, module):
        self.attention = module.attention
        parameters = inspect.signature(module._attention.forward).parameters
        # newer tutorials take warp_specialize (a Blackwell option); off, as its Hopper runs use it
        self.extra = (False,) if "warp_specialize" in parameters else ()
        self.errors = {}

    @staticmethod
    def layout(t):
        """(batch, seqlen, heads, hd) -> the tutorial's (1, batch * heads, seqlen, hd), contiguous."""
        batch, seqlen, heads, hd = t.shape
        return t.transpose(1, 2).reshape(1, batch * heads, seqlen, hd).contiguous()

    @staticmethod
    def fp8_layout(q, k, v):
        """e5m2 q, k, and v stored transposed, as the tutorial's fp8 benchmark prepares them."""
        q, k, v = (Tutorial.layout(t) for t in (q, k, v))
        v = v.permute(0, 1, 3, 2).contiguous().permute(0, 1, 3, 2)
        return q.to(torch.float8_e5m2), k.to(torch.float8_e5m2), v.to(torch.float8_e5m2)

    def __call__(self, kind, q, k, v, causal, scale):
        """The output, or None after an error (kept in self.errors[kind])."""
        if kind in self.errors:
            return None
        try:
            return self.attention(q, k, v, causal, scale, *self.extra)
        except Exception as error:
            self.errors[kind] = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            return None


def flops(batch, seqlen, hd, causal):
    return 4 * batch * seqlen * seqlen * HEADS * hd / (2 if causal else 1)


def tflops(work, ms):
    return NOT_RUN if ms is None else work / ms / 1e9


def time_ms(call, rep):
    return do_bench(call, warmup=25, rep=rep, return_mode="median")


def max_diff(a, b):
    return NOT_RUN if a is None or b is None else (a.float() - b.float().reshape(a.shape)).abs().max().item()


def from_tutorial_layout(t, batch, heads):
    """The tutorial's (1, batch * heads, seqlen, hd) back to (batch, seqlen, heads, hd)."""
    return t.reshape(batch, heads, *t.shape[2:]).transpose(1, 2)


def ours_backward(q, k, v, causal, dout):
    """(output, backward call, gradients) of our forward on leaves q, k, v."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = flash_attn_func(*leaves, causal=causal)
    call = lambda: torch.autograd.grad(out, leaves, dout, retain_graph=True)  # noqa: E731
    return out, call, call()


def tutorial_backward(tutorial, q, k, v, causal, scale, dout):
    """(output, backward call, gradients in our layout) of the tutorial's forward, or Nones on error."""
    batch, heads = q.shape[0], q.shape[2]
    leaves = [Tutorial.layout(t).requires_grad_() for t in (q, k, v)]
    out = tutorial("fp16 forward+backward", *leaves, causal, scale)
    if out is None:
        return None, None, None
    grad_out = Tutorial.layout(dout)
    call = lambda: torch.autograd.grad(out, leaves, grad_out, retain_graph=True)  # noqa: E731
    try:
        grads = call()
    except Exception as error:
        tutorial.errors["fp16 backward"] = f"{type(error).__name__}: {error}"
        return None, None, None
    return out, call, [from_tutorial_layout(g, batch, heads) for g in grads]


class Shape:
    def __init__(self, hd, seqlen, causal):
        self.hd, self.seqlen, self.causal = hd, seqlen, causal
        self.batch = TOKENS // seqlen
        self.scale = hd ** -0.5

    def randn(self, dtype):
        return torch.randn(self.batch, self.seqlen, HEADS, self.hd, device=DEVICE, dtype=dtype)


def measure_16bit(shape, tutorial, rep, row):
    """Forward and backward of ours (bf16, fp16) and of the tutorial (fp16) into row."""
    fwd_work = flops(shape.batch, shape.seqlen, shape.hd, shape.causal)
    bwd_work = 2.5 * fwd_work
    inputs = {dtype: [shape.randn(dtype) for _ in range(4)] for dtype in (torch.bfloat16, torch.float16)}
    for dtype, name in ((torch.bfloat16, "bf16"), (torch.float16, "fp16")):
        q, k, v, dout = inputs[dtype]
        row[f"fwd ours {name}"] = tflops(fwd_work, time_ms(lambda: flash_attn_func(q, k, v, causal=shape.causal), rep))
        out, call, grads = ours_backward(q, k, v, shape.causal, dout)
        row[f"bwd ours {name}"] = tflops(bwd_work, time_ms(call, rep))
    ours_out, ours_grads = out.detach(), grads  # fp16's, the tutorial's dtype
    if tutorial is None:
        return
    q, k, v, dout = inputs[torch.float16]
    tq, tk, tv = (Tutorial.layout(t) for t in (q, k, v))
    out = tutorial("fp16 forward", tq, tk, tv, shape.causal, shape.scale)
    if out is not None:
        row["fwd tutorial fp16"] = tflops(fwd_work, time_ms(lambda: tutorial("fp16 forward", tq, tk, tv, shape.causal,
                                                                             shape.scale), rep))
        row["out diff fp16"] = max_diff(ours_out, from_tutorial_layout(out, shape.batch, HEADS))
    if shape.causal:
        _, call, grads = tutorial_backward(tutorial, q, k, v, shape.causal, shape.scale, dout)
        if call is not None:
            row["bwd tutorial fp16"] = tflops(bwd_work, time_ms(call, rep))
            row["grad diff fp16"] = max(max_diff(ours, theirs) for ours, theirs in zip(ours_grads, grads))


def measure_fp8(shape, tutorial, rep, row, with_tutorial):
    """Our e4m3 forward and the tutorial's e5m2 one, each against our bf16 forward of the unquantized
    inputs (so the differences include each format's rounding of the inputs: a sanity bound, near
    1e-2, not an accuracy figure)."""
    work = flops(shape.batch, shape.seqlen, shape.hd, shape.causal)
    q, k, v = (shape.randn(torch.bfloat16) for _ in range(3))
    reference = flash_attn_func(q, k, v, causal=shape.causal)
    q8, k8, v8 = (t.to(torch.float8_e4m3fn) for t in (q, k, v))
    ones = torch.ones(shape.batch, HEADS, device=DEVICE, dtype=torch.float32)
    call = lambda: flash_attn_func(q8, k8, v8, causal=shape.causal, q_descale=ones, k_descale=ones,  # noqa: E731
                                   v_descale=ones)
    row["fp8 ours"] = tflops(work, time_ms(call, rep))
    row["fp8 diff ours"] = max_diff(call(), reference)
    if tutorial is None or not with_tutorial:
        return
    tq, tk, tv = Tutorial.fp8_layout(q, k, v)
    out = tutorial("fp8 forward", tq, tk, tv, shape.causal, shape.scale)
    if out is not None:
        row["fp8 tutorial"] = tflops(work, time_ms(lambda: tutorial("fp8 forward", tq, tk, tv, shape.causal,
                                                                    shape.scale), rep))
        row["fp8 diff tutorial"] = max_diff(from_tutorial_layout(out, shape.batch, HEADS), reference)


def ratio(row, ours, theirs):
    if row.get(ours, NOT_RUN) == NOT_RUN or row.get(theirs, NOT_RUN) == NOT_RUN:
        return NOT_RUN
    return row[ours] / row[theirs]


COLUMNS = (("fwd ours bf16", "{:.0f}"), ("fwd ours fp16", "{:.0f}"), ("fwd tutorial fp16", "{:.0f}"),
           ("fwd bf16 / tut", "{:.2f}"), ("bwd ours bf16", "{:.0f}"), ("bwd ours fp16", "{:.0f}"),
           ("bwd tutorial fp16", "{:.0f}"), ("bwd bf16 / tut", "{:.2f}"), ("fp8 ours", "{:.0f}"),
           ("fp8 tutorial", "{:.0f}"), ("fp8 ours / tut", "{:.2f}"), ("fp8 / bf16 ours", "{:.2f}"),
           ("out diff fp16", "{:.1e}"), ("grad diff fp16", "{:.1e}"), ("fp8 diff ours", "{:.1e}"),
           ("fp8 diff tutorial", "{:.1e}"))


def print_row(shape, row):
    row["fwd bf16 / tut"] = ratio(row, "fwd ours bf16", "fwd tutorial fp16")
    row["bwd bf16 / tut"] = ratio(row, "bwd ours bf16", "bwd tutorial fp16")
    row["fp8 ours / tut"] = ratio(row, "fp8 ours", "fp8 tutorial")
    row["fp8 / bf16 ours"] = ratio(row, "fp8 ours", "fwd ours bf16")
    cells = [row.get(name, NOT_RUN) for name, _ in COLUMNS]
    text = [NOT_RUN if cell == NOT_RUN else fmt.format(cell) for cell, (_, fmt) in zip(cells, COLUMNS)]
    print(f"| {shape.hd} | {shape.seqlen} | {shape.causal} | " + " | ".join(text) + " |", flush=True)


def try_bf16(tutorial):
    """Whether the tutorial takes bf16 inputs (one small causal call); the error goes to tutorial.errors."""
    q = torch.randn(1, 2, 1024, 64, device=DEVICE, dtype=torch.bfloat16)
    return tutorial("bf16 forward (tried once)", q, q, q, True, 0.125) is not None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--headdims", nargs="+", type=int, default=(64, 128))
    parser.add_argument("--seqlens", nargs="+", type=int, default=(1024, 2048, 4096, 8192, 16384))
    parser.add_argument("--tutorial-configs", choices=("hopper", "full"), default="hopper")
    parser.add_argument("--tutorial-fp8-min-seqlen", type=int, default=4096)
    parser.add_argument("--tutorial-fp8-headdims", nargs="+", type=int, default=(128,))
    parser.add_argument("--no-fp8", action="store_true", help="leave out the fp8 columns (ours and the tutorial's)")
    parser.add_argument("--rep", type=int, default=100, help="do_bench's rep (ms)")
    parser.add_argument("--tutorial", default=os.path.normpath(TUTORIAL_PATH))
    args = parser.parse_args()
    assert os.environ.get("FLASH_ATTENTION_TRITON_AMD_ENABLE", "").upper() == "TRUE", "run with the Triton switch on"
    if not os.path.exists(args.tutorial):
        print(f"No tutorial at {args.tutorial}: save triton-lang/triton's python/tutorials/06-fused-attention.py "
              f"there (unmodified; peers/ is ignored by git) to compare. Nothing measured.")
        return
    module, import_error = load_tutorial(args.tutorial)
    if module is not None and args.tutorial_configs == "hopper":
        keep_hopper_configs(module)
    tutorial = None if module is None else Tutorial(module)
    print(f"{torch.cuda.get_device_name()}, triton {triton.__version__}, torch {torch.__version__}; {HEADS} heads, "
          f"{TOKENS} tokens; TFLOP/s; tutorial {args.tutorial} "
          f"({'not imported: ' + import_error if module is None else args.tutorial_configs + ' autotune configs'})")
    if tutorial is not None:
        print(f"tutorial takes bf16: {try_bf16(tutorial)}")
    print("| hd | seqlen | causal | " + " | ".join(name for name, _ in COLUMNS) + " |")
    print("|" + "---|" * (3 + len(COLUMNS)))
    for hd in args.headdims:
        for seqlen in args.seqlens:
            for causal in (False, True):
                shape, row = Shape(hd, seqlen, causal), {}
                measure_16bit(shape, tutorial, args.rep, row)
                if not args.no_fp8:
                    with_tutorial_fp8 = seqlen >= args.tutorial_fp8_min_seqlen and hd in args.tutorial_fp8_headdims
                    measure_fp8(shape, tutorial, args.rep, row, with_tutorial_fp8)
                print_row(shape, row)
    for kind, error in (tutorial.errors.items() if tutorial is not None else ()):
        print(f"tutorial {kind}: {error}")


if __name__ == "__main__":
    main()
