"""Forward tile scheduling A/B on Hopper (query_tile_scheduler.cuh): the warp-specialized forward
with its default grid (one CTA per SM walking the natural, heaviest-first or packed varlen order)
against one CTA per tile (FLASH_ATTN_SM90_FWD_GRID=tiles, read per call) and SDPA's cuDNN backend,
in one process; bf16, hidden 2048, batch x seqlen = 16k, plus the features suite's varlen batch
and its equal-length baseline and its window case.

    python benchmarks/experiments/scheduler_ab.py [--label NAME] [--only-default] [--quick]

--only-default times only the default grid, for comparing two builds run one after the other in
the same call (each its own process). Prints markdown rows: forward µs and TFLOP/s of the
unmasked FLOPs.
"""

import argparse
import itertools
import os

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

import flash_attn
from flash_attn import flash_attn_func, flash_attn_varlen_func

HIDDEN, TOKENS = 2048, 16384
MIXED = (3586, 1705, 3232, 3774, 1850, 293, 1188, 756)  # the features suite's varlen lengths (seed 0)


def timed_us(fn, variant):
    """variant: "default", "tiles" (one CTA per tile) or "ws" (the warp-specialized kernel forced,
    default grid: hd64 runs the cp.async kernel on short walks by default)."""
    os.environ["FLASH_ATTN_SM90_FWD_GRID"] = "tiles" if variant == "tiles" else "default"
    os.environ["FLASH_ATTN_SM90_FWD"] = "ws" if variant == "ws" else "default"
    fn()
    return do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3


def cudnn(q, k, v, causal):
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                              is_causal=causal)


def print_row(label, name, flops, grids, fns):
    cells = []
    for grid, fn in zip(grids, fns):
        us = timed_us(fn, grid)
        cells.append(f"{us:.1f} µs · {flops / us / 1e6:.0f}")
    print(f"| {label} | {name} | " + " | ".join(cells) + " |", flush=True)


# --quick: the cells a change of per-tile cost moves most (short walks), and hd64 as a control
QUICK_CELLS = [(128, 512, False), (128, 512, True), (128, 2048, False), (128, 2048, True), (64, 512, False),
               (64, 512, True), (64, 2048, True)]


def dense_rows(label, grids, with_cudnn, quick):
    cells = QUICK_CELLS if quick else itertools.product((64, 128), (512, 2048, 8192), (False, True))
    for headdim, seqlen, causal in cells:
        heads, batch = HIDDEN // headdim, TOKENS // seqlen
        q, k, v = (torch.randn(batch, seqlen, heads, headdim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        pairs = seqlen * (seqlen + 1) // 2 if causal else seqlen * seqlen
        flops = 4 * batch * heads * pairs * headdim
        fns = [lambda: flash_attn_func(q, k, v, causal=causal)] * len(grids)
        if with_cudnn:
            fns.append(lambda: cudnn(q, k, v, causal))
        print_row(label, f"hd{headdim} s={seqlen} causal={int(causal)}", flops,
                  grids + (["default"] if with_cudnn else []), fns)


def varlen_rows(label, grids):
    heads, headdim = 16, 128
    for name, lengths in (("varlen mixed", MIXED), ("varlen 8 x 2048", (2048,) * 8)):
        total = sum(lengths)
        q, k, v = (torch.randn(total, heads, headdim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        cu = torch.tensor([0, *itertools.accumulate(lengths)], device="cuda", dtype=torch.int32)
        flops = 4 * headdim * heads * sum(n * n for n in lengths)
        longest = max(lengths)
        fn = lambda: flash_attn_varlen_func(q, k, v, cu, cu, longest, longest)
        print_row(label, f"{name} hd128 h16", flops, grids, [fn] * len(grids))
    q, k, v = (torch.randn(8, 2048, heads, headdim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    print_row(label, "dense 8 x 2048 hd128 h16", 4 * headdim * heads * 8 * 2048 * 2048, grids,
              [lambda: flash_attn_func(q, k, v)] * len(grids))


def window_rows(label, grids):
    """The features suite's window case: causal with a left window of 4096 at 16k, and plain causal."""
    seqlen, heads, headdim, left = 16384, 16, 128, 4096
    q, k, v = (torch.randn(1, seqlen, heads, headdim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    for name, window in (("causal + window (4096, 0)", (left, 0)), ("causal", (-1, 0))):
        pairs = sum(min(i + 1, left + 1) if window[0] >= 0 else i + 1 for i in range(seqlen))
        fn = lambda: flash_attn_func(q, k, v, causal=True, window_size=window)
        print_row(label, f"{name} 16k hd128 h16", 4 * headdim * heads * pairs, grids, [fn] * len(grids))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--label", default="new")
    parser.add_argument("--only-default", action="store_true")
    parser.add_argument("--quick", action="store_true", help="QUICK_CELLS and the varlen rows only")
    args = parser.parse_args()
    torch.manual_seed(0)
    grids = ["default"] if args.only_default else ["default", "tiles", "ws"]
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "cudnn", torch.backends.cudnn.version(),
          "flash_attn from", os.path.dirname(flash_attn.__file__))
    header = ["build", "shape"] + [f"ours, {g}" for g in grids] + ([] if args.only_default else ["cuDNN"])
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    dense_rows(args.label, grids, with_cudnn=not args.only_default, quick=args.quick)
    varlen_rows(args.label, grids)
    window_rows(args.label, grids)


if __name__ == "__main__":
    main()
