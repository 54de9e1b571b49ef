"""Tiles of the Triton backend's kernels at one head dim (issue #9): the bf16 forward, the fp8 (e4m3)
forward and the bf16 backward (its dK / dV and dQ tiles as a pair), each candidate run through the
experiment variables of flash_attn/triton/tuning.py ("BLOCK_M,BLOCK_N,num_warps,num_stages";
a fifth integer is Triton's maxnreg; "default" is the host's fixed tile; a suffix "@N" sets the
forward's block source and ":MiB" its schedule groups, tiles() says how), in one process; --kinds
narrows the sweep to some of the three. 16 heads, 16k tokens (batch = 16384 / seqlen),
non-causal and causal; do_bench median, L2 flushed per run; TFLOP/s (4 * batch * seqlen^2 * heads *
hd, halved when causal, times 2.5 for the backward). Each candidate's output (or gradients) is
compared with the default tile's: a correct tile differs by rounding only.

    FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE python benchmarks/experiments/triton_tile_sweep.py --headdim 256

do_bench includes host time where the GPU waits on the host: at hd 128 1k causal two identical settings
read 261 and 330 TFLOP/s in one sweep (NOTES.md v46). For short cells compare candidates by kernel
time instead: triton_kernel_time.py --candidates takes the same notation.

Prints a markdown table of every run and, per kernel kind, the candidate whose smallest ratio to the
default over the shapes is largest, as lines "BEST <kind> <tile>" for a calling script.
"""

import argparse
import contextlib
import os

import torch
import triton
from triton.testing import do_bench

from flash_attn import flash_attn_func
from flash_attn.triton import tuning

HEADS, TOKENS = 16, 16384
FP8 = torch.float8_e4m3fn
DEFAULT = "default"
KINDS = {  # kind: the experiment variables its candidate sets (a backward candidate names two tiles)
    "fwd": (tuning.FORWARD_TILE_VARIABLE,),
    "fp8": (tuning.FP8_FORWARD_TILE_VARIABLE,),
    "bwd": (tuning.DKDV_TILE_VARIABLE, tuning.DQ_TILE_VARIABLE),
}


@contextlib.contextmanager
def environment(values):
    """os.environ with `values` ({name: text, or None to unset}) for the block, restored after it."""
    saved = {name: os.environ.pop(name, None) for name in values}
    os.environ.update({name: text for name, text in values.items() if text is not None})
    try:
        yield
    finally:
        for name, value in saved.items():
            os.environ.pop(name, None)
            if value is not None:
                os.environ[name] = value


def tiles(kind, candidate):
    """The environment of one candidate: its tile(s) in the kind's variables, or none for the default;
    a suffix "@0" / "@1" / "@2" sets the forward's block source (tuning.DESCRIPTORS_VARIABLE: pointers,
    K / V descriptors made in the kernel, Q / K / V / Out descriptors made by the host), none leaves
    the host's choice; a suffix ":MiB" (after any "@") sets the forward schedule's group size
    (tuning.SCHEDULE_GROUP_VARIABLE, ":0" groups of one pair), none leaves the host's; no autotuning
    either way."""
    candidate, _, group = candidate.partition(":")
    candidate, _, descriptors = candidate.partition("@")
    chosen = dict(zip(KINDS[kind], candidate.split("/"))) if candidate != DEFAULT else {}
    chosen[tuning.DESCRIPTORS_VARIABLE] = descriptors or None
    chosen[tuning.SCHEDULE_GROUP_VARIABLE] = group or None
    return environment({name: chosen.get(name) for name in KINDS[kind] + (
        tuning.AUTOTUNE_VARIABLE, tuning.DESCRIPTORS_VARIABLE, tuning.SCHEDULE_GROUP_VARIABLE)})


def calls(headdim, seqlen, causal):
    """{kind: a call returning the tensors to compare}, and the work of one forward in FLOP."""
    batch = TOKENS // seqlen
    q, k, v, dout = (torch.randn(batch, seqlen, HEADS, headdim, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    q8, k8, v8 = (t.to(FP8) for t in (q, k, v))
    ones = torch.ones(batch, HEADS, device="cuda", dtype=torch.float32)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = flash_attn_func(*leaves, causal=causal)

    def backward():
        return torch.autograd.grad(out, leaves, dout, retain_graph=True)

    return {
        "fwd": lambda: (flash_attn_func(q, k, v, causal=causal),),
        "fp8": lambda: (flash_attn_func(q8, k8, v8, causal=causal, q_descale=ones, k_descale=ones, v_descale=ones),),
        "bwd": backward,
    }, 4 * batch * seqlen * seqlen * HEADS * headdim / (2 if causal else 1)


def run(kind, candidate, call, flop, reference, rep):
    """(TFLOP/s, max abs difference from the reference (0 without one), the call's tensors), or
    (None, the error, None) when the tile does not compile."""
    with tiles(kind, candidate):
        try:
            result = call()
            ms = do_bench(call, warmup=25, rep=rep, return_mode="median")
        except Exception as error:  # reported in the table; the sweep goes on
            return None, f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}", None
    diff = 0.0 if reference is None else max((a.float() - b.float()).abs().max().item()
                                             for a, b in zip(result, reference))
    return flop * (2.5 if kind == "bwd" else 1) / ms / 1e9, diff, result


def sweep_kind(kind, candidates, call, flop, shape, rep):
    """One kind's candidates on one shape, the default first (its output is the reference): prints a
    row each, returns {candidate: TFLOP/s over the default's (0 where it failed)}."""
    ratios, default_value, reference = {}, None, None
    for candidate in (DEFAULT,) + tuple(c for c in candidates if c != DEFAULT):
        value, note, result = run(kind, candidate, call, flop, reference, rep)
        if candidate == DEFAULT:
            default_value, reference = value, result
        if value is None:
            print(f"| {kind} | {candidate} | {shape} | failed | | {note} |", flush=True)
            ratios[candidate] = 0.0
            continue
        ratios[candidate] = value / default_value if default_value else float("nan")
        print(f"| {kind} | {candidate} | {shape} | {value:.1f} | {ratios[candidate]:.2f} | {note:.2e} |", flush=True)
    return ratios


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--headdim", type=int, default=256)
    parser.add_argument("--seqlens", nargs="+", type=int, default=(4096,))
    parser.add_argument("--fwd", nargs="+", default=(DEFAULT,))
    parser.add_argument("--fp8", nargs="+", default=(DEFAULT,))
    parser.add_argument("--bwd", nargs="+", default=(DEFAULT,), help="DKDV/DQ tile pairs")
    parser.add_argument("--rep", type=int, default=100, help="do_bench's rep (ms)")
    parser.add_argument("--kinds", nargs="+", default=tuple(KINDS), choices=tuple(KINDS), help="kinds swept")
    args = parser.parse_args()
    assert os.environ.get("FLASH_ATTENTION_TRITON_AMD_ENABLE", "").upper() == "TRUE", "run with the Triton switch on"
    print(f"{torch.cuda.get_device_name()}, triton {triton.__version__}, torch {torch.__version__}; hd {args.headdim}, "
          f"{HEADS} heads, {TOKENS} tokens, TFLOP/s", flush=True)
    print("| kind | tile | seqlen | causal | TFLOP/s | / default | max abs diff from default |")
    print("|---|---|---|---|---|---|---|")
    ratios = {}  # (kind, candidate): [ratio to the default per shape]
    for seqlen in args.seqlens:
        for causal in (False, True):
            shape_calls, flop = calls(args.headdim, seqlen, causal)
            chosen = {"fwd": args.fwd, "fp8": args.fp8, "bwd": args.bwd}
            for kind, candidates in ((kind, chosen[kind]) for kind in args.kinds):
                shape_ratios = sweep_kind(kind, candidates, shape_calls[kind], flop, f"{seqlen} | {causal}", args.rep)
                for candidate, ratio in shape_ratios.items():
                    ratios.setdefault((kind, candidate), []).append(ratio)
    for kind in KINDS:
        ranked = sorted(((min(r), c) for (k, c), r in ratios.items() if k == kind), reverse=True)
        if ranked:
            print(f"BEST {kind} {ranked[0][1]} (smallest ratio to the default {ranked[0][0]:.2f})")


if __name__ == "__main__":
    main()
