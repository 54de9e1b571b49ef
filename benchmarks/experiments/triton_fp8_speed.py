"""Issue #9's fp8 target, measured: the Triton backend's fp8 e4m3 forward against its bf16 forward
(target: >= 1.3x at head dim 128, seqlen >= 4k), over a handful of forward tiles in one process.
16 heads of head dim 128 (--headdim another), 16k tokens, seqlen 4k / 8k / 16k, non-causal and
causal; do_bench median, L2 flushed per run; TFLOP/s of the forward (the fp8 time includes the copy
of V into the keys-contiguous layout and the descale stack that every fp8 call makes).

    FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE python benchmarks/experiments/triton_fp8_speed.py

Each candidate tile "BLOCK_M,BLOCK_N,num_warps,num_stages" runs through the forward's experiment
variables (flash_attn/triton/tuning.py), a suffix "@N" sets the block source as in
triton_tile_sweep.py (fp8: "@0" pointers, "@2" host-made descriptors of q, k, out and V's
keys-contiguous copy), "default" is the host's fixed tile and "autotune" sets
FLASH_ATTENTION_TRITON_AMD_AUTOTUNE=TRUE. The first table lists every run: TFLOP/s, fp8 over the
default bf16 tile and over the fastest bf16 candidate of that shape, and for fp8 the largest
difference from the default bf16 forward of the same (dequantized) inputs, which stays near 1e-2
(P rounded to e4m3) for a correct tile; a tile that does not compile shows "failed" and its error.
The second ranks the fp8 candidates that ran everywhere by their smallest ratio over the shapes, the
number the target constrains. About 2-3 minutes on an H100, mostly compiling. Options narrow the
sweep (--fp8-tiles, --bf16-tiles, --seqlens).
"""

import argparse
import os

import torch
import triton
from triton.testing import do_bench

from flash_attn import flash_attn_func
from flash_attn.triton import tuning
from triton_tile_sweep import environment, tiles

HEADS, TOKENS = 16, 16384
FP8 = torch.float8_e4m3fn
DEVICE = "cuda"
DEFAULT, AUTOTUNE = "default", "autotune"
# Around attention.FP8_FORWARD_TILE (128 x 128, 8 warps, 3 stages): a narrower key block, deeper
# pipelines, one warpgroup, and the 16-bit default tile (64 x 64, 4 warps) the fp8 forward had before.
FP8_CANDIDATES = (DEFAULT, "128,128,8,4", "128,64,8,3", "128,64,8,4", "128,64,4,3", "64,64,4,3", AUTOTUNE)
# The bf16 forward's default (64 x 64, 4 warps, 3 stages) and Hopper tiles of the kind Triton's
# attention tutorial tunes over (a bf16 128 x 128 tile fits 2 stages of K / V, not 3), so that the
# ratio is also read against a faster bf16 forward than the default.
BF16_CANDIDATES = (DEFAULT, "128,64,4,3", "128,64,8,3", "128,128,8,2", AUTOTUNE)


def tflops(seqlen, batch, causal, ms, headdim):
    flops = 4 * batch * seqlen * seqlen * HEADS * headdim / (2 if causal else 1)
    return flops / ms / 1e9


def forward_tile(variable, candidate):
    """The environment of one candidate: autotuning, or its tile in `variable` (none for the default)
    with triton_tile_sweep.tiles' "@N" suffix for the block source."""
    if candidate == AUTOTUNE:
        return environment({variable: None, tuning.DESCRIPTORS_VARIABLE: None, tuning.AUTOTUNE_VARIABLE: "TRUE"})
    return tiles("fp8" if variable == tuning.FP8_FORWARD_TILE_VARIABLE else "fwd", candidate)


def inputs(seqlen, headdim):
    """bf16 q, k, v; their e4m3 quantization with unit descales; the bf16 values of the e4m3 ones."""
    batch = TOKENS // seqlen
    q, k, v = (torch.randn(batch, seqlen, HEADS, headdim, device=DEVICE, dtype=torch.bfloat16) for _ in range(3))
    fp8 = tuple(t.to(FP8) for t in (q, k, v))
    return (q, k, v), fp8, tuple(t.to(torch.bfloat16) for t in fp8)


def time_ms(call, rep):
    return do_bench(call, warmup=25, rep=rep, return_mode="median")


def run_candidate(variable, candidate, call, seqlen, batch, causal, rep, headdim):
    """TFLOP/s of call under one candidate's environment and its output, or (None, the error) when the
    tile does not compile (a 16-bit 128 x 128 tile in 3 stages can exceed the shared memory)."""
    with forward_tile(variable, candidate):
        try:
            ms = time_ms(call, rep)
            return tflops(seqlen, batch, causal, ms, headdim), call()
        except Exception as error:  # reported in the table; the sweep goes on
            return None, f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"


def measure_shape(seqlen, causal, fp8_candidates, bf16_candidates, rep, headdim):
    """{(dtype, candidate): (TFLOP/s or None, max abs diff (fp8) or the error or None)} of one shape."""
    bf16_inputs, fp8_inputs, dequantized = inputs(seqlen, headdim)
    batch = TOKENS // seqlen
    ones = torch.ones(batch, HEADS, device=DEVICE, dtype=torch.float32)
    reference = flash_attn_func(*dequantized, causal=causal)
    results = {}
    for candidate in bf16_candidates:
        value, out = run_candidate(tuning.FORWARD_TILE_VARIABLE, candidate,
                                   lambda: flash_attn_func(*bf16_inputs, causal=causal), seqlen, batch, causal, rep,
                                   headdim)
        results["bf16", candidate] = (value, out if value is None else None)
    for candidate in fp8_candidates:
        call = lambda: flash_attn_func(*fp8_inputs, causal=causal, q_descale=ones, k_descale=ones,  # noqa: E731
                                       v_descale=ones)
        value, out = run_candidate(tuning.FP8_FORWARD_TILE_VARIABLE, candidate, call, seqlen, batch, causal, rep,
                                   headdim)
        diff = out if value is None else (out.float() - reference.float()).abs().max().item()
        results["fp8", candidate] = (value, diff)
    return results


def best_bf16(results):
    return max(value for (dtype, _), (value, _) in results.items() if dtype == "bf16" and value is not None)


def print_runs(all_results):
    print("| dtype | tile | seqlen | causal | TFLOP/s | / bf16 default | / best bf16 | max abs diff |")
    print("|---|---|---|---|---|---|---|---|")
    for (seqlen, causal), results in all_results.items():
        bf16_default, bf16_best = results["bf16", DEFAULT][0], best_bf16(results)
        for (dtype, candidate), (value, note) in results.items():
            if value is None:
                print(f"| {dtype} | {candidate} | {seqlen} | {causal} | failed | | | {note} |")
                continue
            ratios = f"{value / bf16_default:.2f} | {value / bf16_best:.2f}"
            note_text = "" if note is None else f"{note:.2e}"
            print(f"| {dtype} | {candidate} | {seqlen} | {causal} | {value:.1f} | {ratios} | {note_text} |")


def print_ranking(all_results, fp8_candidates):
    """fp8 candidates by their smallest ratio over the shapes (against the default and the best bf16)."""
    rows = []
    for candidate in fp8_candidates:
        values = [(results["fp8", candidate][0], results) for results in all_results.values()]
        if any(value is None for value, _ in values):
            continue
        rows.append((min(value / results["bf16", DEFAULT][0] for value, results in values),
                     min(value / best_bf16(results) for value, results in values), candidate))
    print("\n| fp8 tile | min fp8 / bf16 default | min fp8 / best bf16 |")
    print("|---|---|---|")
    for to_default, to_best, candidate in sorted(rows, reverse=True):
        print(f"| {candidate} | {to_default:.2f} | {to_best:.2f} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fp8-tiles", nargs="+", default=FP8_CANDIDATES)
    parser.add_argument("--bf16-tiles", nargs="+", default=BF16_CANDIDATES)
    parser.add_argument("--seqlens", nargs="+", type=int, default=(4096, 8192, 16384))
    parser.add_argument("--rep", type=int, default=100, help="do_bench's rep (ms)")
    parser.add_argument("--headdim", type=int, default=128, help="the issue's target is at 128")
    args = parser.parse_args()
    assert os.environ.get("FLASH_ATTENTION_TRITON_AMD_ENABLE", "").upper() == "TRUE", "run with the Triton switch on"
    print(f"{torch.cuda.get_device_name()}, triton {triton.__version__}, torch {torch.__version__}; hd {args.headdim}, "
          f"{HEADS} heads, {TOKENS} tokens, forward TFLOP/s; default: the host's tiles and block sources", flush=True)
    all_results = {}
    for seqlen in args.seqlens:
        for causal in (False, True):
            all_results[seqlen, causal] = measure_shape(seqlen, causal, args.fp8_tiles, args.bf16_tiles, args.rep,
                                                        args.headdim)
            print(f"measured seqlen {seqlen} causal {causal}", flush=True)
    print_runs(all_results)
    print_ranking(all_results, args.fp8_tiles)


if __name__ == "__main__":
    main()
