"""Issue #9's speed points before / after a change of the Triton backend, with Triton's
fused-attention tutorial as the peer: bf16 forward and backward TFLOP/s of our Triton backend (the
flash_attn package first on PYTHONPATH: this tree, or an exported baseline such as ./old_tree), the
tutorial's fp16 ones (peers/triton_fused_attention_tutorial.py, loaded as triton_tutorial_peer.py
loads it; its backward is causal-only), 16 heads, 16k tokens (batch = 16384 / seqlen), head dim 64
and 128, causal and not. Each build runs in its own process: the "before" run saves its rows
(--save), the "after" run reads them (--before) and prints both with the tutorial's in one table
(columns "base": the --before rows; "tut": the tutorial's, of this run or else of the --before rows).

    cd /tmp && FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE PYTHONPATH=$R/old_tree \\
        python $R/benchmarks/experiments/triton_speed_ab.py --label before --no-tutorial --save /tmp/before.json
    cd /tmp && FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE PYTHONPATH=$R \\
        python $R/benchmarks/experiments/triton_speed_ab.py --label after --before /tmp/before.json

--variants NAME=VAR:VALUE+VAR:VALUE ... then times our kernels again with those environment variables
(tuning.py's tile variables: FLASH_ATTENTION_TRITON_FORWARD_TILE, _DKDV_TILE, _DQ_TILE, read per
call) on --variant-shapes, against the default tiles measured in the same process.

Timing: triton.testing.do_bench, median, L2 flushed per run; the backward alone (torch.autograd.grad
of a retained forward graph). TFLOP/s count 4 * batch * seqlen^2 * heads * hd (halved when causal),
times 2.5 for the backward.
"""

import argparse
import json
import os

import torch

import triton_tutorial_peer as peer
from flash_attn import flash_attn_func

HEADS, TOKENS = peer.HEADS, peer.TOKENS


def measure_ours(hd, seqlen, causal, rep):
    """(forward, backward) TFLOP/s of our bf16 attention on fresh randn inputs."""
    shape = peer.Shape(hd, seqlen, causal)
    q, k, v, dout = (shape.randn(torch.bfloat16) for _ in range(4))
    work = peer.flops(shape.batch, seqlen, hd, causal)
    forward = peer.time_ms(lambda: flash_attn_func(q, k, v, causal=causal), rep)
    _, call, _ = peer.ours_backward(q, k, v, causal, dout)
    backward = peer.time_ms(call, rep)
    return work / forward / 1e9, 2.5 * work / backward / 1e9


def measure_tutorial(tutorial, hd, seqlen, causal, rep):
    """(forward, backward or None) TFLOP/s of the tutorial in fp16 (None where it failed)."""
    shape = peer.Shape(hd, seqlen, causal)
    q, k, v, dout = (shape.randn(torch.float16) for _ in range(4))
    work = peer.flops(shape.batch, seqlen, hd, causal)
    tq, tk, tv = (peer.Tutorial.layout(t) for t in (q, k, v))
    if tutorial("fp16 forward", tq, tk, tv, causal, shape.scale) is None:
        return None, None
    forward = work / peer.time_ms(lambda: tutorial("fp16 forward", tq, tk, tv, causal, shape.scale), rep) / 1e9
    backward = None
    if causal:
        _, call, _ = peer.tutorial_backward(tutorial, q, k, v, causal, shape.scale, dout)
        if call is not None:
            backward = 2.5 * work / peer.time_ms(call, rep) / 1e9
    return forward, backward


def key(hd, seqlen, causal):
    return f"{hd}/{seqlen}/{int(causal)}"


def cell(value, fmt="{:.0f}"):
    return "-" if value is None else fmt.format(value)


def ratio(a, b):
    return None if a is None or b is None else a / b


def parse_variant(text):
    """NAME=VAR:VALUE+VAR:VALUE -> (NAME, {VAR: VALUE}); VAR without the FLASH_ATTENTION_TRITON_ prefix
    gets it (DKDV_TILE:64,64,4,3)."""
    name, _, settings = text.partition("=")
    pairs = (item.split(":", 1) for item in settings.split("+") if item)
    return name, {(var if var.startswith("FLASH_") else "FLASH_ATTENTION_TRITON_" + var): value for var, value in pairs}


def run_variants(variants, shapes, rep, rows):
    print("\n| variant | hd | seqlen | causal | fwd | fwd / default | bwd | bwd / default |")
    print("|---|---|---|---|---|---|---|---|")
    for name, settings in variants:
        for hd, seqlen, causal in shapes:
            saved = {var: os.environ.get(var) for var in settings}
            os.environ.update(settings)
            try:
                forward, backward = measure_ours(hd, seqlen, causal, rep)
            except Exception as error:  # a tile that does not compile: say so, go on
                print(f"| {name} | {hd} | {seqlen} | {causal} | {type(error).__name__}: {str(error)[:80]} |||||")
                continue
            finally:
                for var, value in saved.items():
                    os.environ.pop(var) if value is None else os.environ.__setitem__(var, value)
            default = rows.get(key(hd, seqlen, causal)) or dict(zip(("fwd", "bwd"), measure_ours(hd, seqlen, causal,
                                                                                                   rep)))
            print(f"| {name} | {hd} | {seqlen} | {causal} | {forward:.0f} | "
                  f"{cell(ratio(forward, default['fwd'] or None), '{:.2f}')} | {backward:.0f} | "
                  f"{cell(ratio(backward, default['bwd'] or None), '{:.2f}')} |", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default="after")
    parser.add_argument("--headdims", nargs="+", type=int, default=(64, 128))
    parser.add_argument("--seqlens", nargs="+", type=int, default=(1024, 4096, 16384))
    parser.add_argument("--rep", type=int, default=100, help="do_bench's rep (ms)")
    parser.add_argument("--tutorial", default=os.path.normpath(peer.TUTORIAL_PATH))
    parser.add_argument("--no-tutorial", action="store_true")
    parser.add_argument("--save", help="write this run's rows (JSON) here, after each row")
    parser.add_argument("--before", help="rows (JSON) of a --save run, printed beside this one's")
    parser.add_argument("--variants", nargs="*", default=(), type=parse_variant)
    parser.add_argument("--variant-shapes", nargs="*", default=("64:4096:0", "64:4096:1", "128:4096:1"),
                        help="hd:seqlen:causal")
    args = parser.parse_args()
    assert os.environ.get("FLASH_ATTENTION_TRITON_AMD_ENABLE", "").upper() == "TRUE", "run with the Triton switch on"
    import flash_attn
    tutorial, note = None, "not run (--no-tutorial)"
    if not args.no_tutorial:
        if not os.path.exists(args.tutorial):
            note = f"missing: {args.tutorial}"
        else:
            module, error = peer.load_tutorial(args.tutorial)
            note = f"not imported: {error}" if module is None else args.tutorial
            if module is not None:
                peer.keep_hopper_configs(module)
                tutorial = peer.Tutorial(module)
    before = {}
    if args.before:
        with open(args.before) as f:
            before = json.load(f)
    print(f"{args.label}: {torch.cuda.get_device_name()}, torch {torch.__version__}, triton "
          f"{__import__('triton').__version__}, flash_attn from {os.path.dirname(flash_attn.__file__)}; tutorial "
          f"{note}; {HEADS} heads, {TOKENS} tokens, TFLOP/s (ours bf16, tutorial fp16)", flush=True)
    this = args.label
    print(f"| hd | seqlen | causal | fwd base | fwd {this} | fwd tut | {this} / base | {this} / tut | base / tut "
          f"| bwd base | bwd {this} | bwd tut | {this} / base | {this} / tut | base / tut |")
    print("|" + "---|" * 15)
    rows = {}
    for hd in args.headdims:
        for seqlen in args.seqlens:
            for causal in (False, True):
                fwd, bwd = measure_ours(hd, seqlen, causal, args.rep)
                tut_fwd, tut_bwd = (measure_tutorial(tutorial, hd, seqlen, causal, args.rep) if tutorial
                                    else (None, None))
                rows[key(hd, seqlen, causal)] = dict(fwd=fwd, bwd=bwd, tut_fwd=tut_fwd, tut_bwd=tut_bwd)
                old = before.get(key(hd, seqlen, causal), {})
                tut_fwd = tut_fwd if tut_fwd is not None else old.get("tut_fwd")
                tut_bwd = tut_bwd if tut_bwd is not None else old.get("tut_bwd")
                cells = [old.get("fwd"), fwd, tut_fwd]
                cells = [cell(x) for x in cells] + [cell(ratio(fwd, old.get("fwd")), "{:.2f}"),
                                                    cell(ratio(fwd, tut_fwd), "{:.2f}"),
                                                    cell(ratio(old.get("fwd"), tut_fwd), "{:.2f}")]
                cells += [cell(x) for x in (old.get("bwd"), bwd, tut_bwd)]
                cells += [cell(ratio(bwd, old.get("bwd")), "{:.2f}"), cell(ratio(bwd, tut_bwd), "{:.2f}"),
                          cell(ratio(old.get("bwd"), tut_bwd), "{:.2f}")]
                print(f"| {hd} | {seqlen} | {causal} | " + " | ".join(cells) + " |", flush=True)
                if args.save:  # after every row, so that a run cut short by a time limit leaves its rows
                    with open(args.save, "w") as f:
                        json.dump(rows, f)
    for kind, error in (tutorial.errors.items() if tutorial else ()):
        if not kind.startswith("bf16"):
            print(f"tutorial {kind}: {error}")
    if args.variants:
        shapes = [tuple(int(x) for x in text.split(":")) for text in args.variant_shapes]
        run_variants(args.variants, [(hd, s, bool(c)) for hd, s, c in shapes], args.rep, rows)


if __name__ == "__main__":
    main()
