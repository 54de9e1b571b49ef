"""Issue #13's fp8 target, measured: the CUDA fp8 (e4m3) forward on Hopper against our bf16 forward
(target: >= 1.5x at head dims 128 and 256, seqlen >= 4k), with the Triton backend's fp8 forward and
SDPA cuDNN's bf16 forward as peers, and cuDNN's fp8 forward where the cuDNN frontend imports
(cudnn_fp8_peer.py: its graph API, e4m3 O, per-tensor descales); hidden 2048 (2048 / hd
heads), batch x seqlen = 16k tokens, non-causal and causal; do_bench median, L2 flushed per run,
the GPU idle --idle-ms before each measurement (measure.Timer: a kernel timed right after another
that ran at the power cap starts at a lowered clock, benchmarks/NOTES.md v40); TFLOP/s of the
forward. --fp8-env NAME=A,B times our fp8
forward once per value of the environment variable NAME (a kernel switch read per call), in turn
within each configuration, one column each. Then the error
of each fp8 forward as RMSE against an fp32 attention of the unquantized inputs, next to a plain
fp8 attention in PyTorch (per-(batch, KV head) scaled e4m3 inputs, fp32 math, P rounded to e4m3)
and our bf16 forward.

    python benchmarks/experiments/fp8_speed.py [--label NAME] [--headdims 128,256]
        [--seqlens 4096,8192,16384] [--idle-ms 250] [--fp8-env NAME=A,B]
"""

import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from flash_attn import flash_attn_func
from flash_attn.benchmark.impls import TRITON_SWITCH, environment
from flash_attn.benchmark.measure import Timer

import cudnn_fp8_peer

FP8 = torch.float8_e4m3fn
HIDDEN, TOKENS = 2048, 16384


def quantize(x):
    """(e4m3 x, float32 (batch, heads) descale): one scale per batch entry and head (MHA here)."""
    descale = x.float().abs().amax(dim=(1, 3)).clamp(min=1e-12) / torch.finfo(FP8).max
    return (x.float() / descale[:, None, :, None]).to(FP8), descale


def tflops(batch, seqlen, heads, headdim, causal, ms):
    return 4 * batch * seqlen * seqlen * heads * headdim / (2 if causal else 1) / ms / 1e9


def with_env(pairs, fn):
    """fn called with the environment variables of `pairs` set (then restored)."""
    def call():
        with environment(pairs):
            return fn()
    return call


def calls(batch, seqlen, heads, headdim, causal, fp8_env=None):
    q, k, v = (torch.randn(batch, seqlen, heads, headdim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    (q8, qd), (k8, kd), (v8, vd) = quantize(q), quantize(k), quantize(v)
    scales = dict(q_descale=qd, k_descale=kd, v_descale=vd)
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))

    triton_fp8 = with_env(TRITON_SWITCH, lambda: flash_attn_func(q8, k8, v8, causal=causal, **scales))

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

    def ours_fp8():
        return flash_attn_func(q8, k8, v8, causal=causal, **scales)

    fp8_columns = {"ours fp8": ours_fp8}
    if fp8_env is not None:
        name, values = fp8_env
        fp8_columns = {f"ours fp8 {name}={value}": with_env(((name, value),), ours_fp8) for value in values}
    columns = {"ours bf16": lambda: flash_attn_func(q, k, v, causal=causal), **fp8_columns, "triton fp8": triton_fp8,
               "cudnn bf16": cudnn}
    peer = cudnn_fp8_peer.forward_or_none(q, k, v, causal)
    if peer is not None:
        columns["cudnn fp8"] = peer
    return columns


def speed_table(headdims, seqlens, timer, fp8_env):
    names = list(calls(1, 128, 2, 128, False, fp8_env))
    fp8_names = [name for name in names if name.startswith("ours fp8") or name == "cudnn fp8"]
    ratios = [f"{name} / ours bf16" for name in fp8_names]
    print(f"| hd | seqlen | causal | {' | '.join(names + ratios)} |")
    print("|---|---|---|" + "---|" * (len(names) + len(ratios)))
    for headdim in headdims:
        heads = HIDDEN // headdim
        for seqlen in seqlens:
            for causal in (False, True):
                batch = max(1, TOKENS // seqlen)
                row = {}
                for name, fn in calls(batch, seqlen, heads, headdim, causal, fp8_env).items():
                    row[name] = tflops(batch, seqlen, heads, headdim, causal, timer(fn))
                cells = [f"{value:.1f}" for value in row.values()]
                cells += [f"{row[name] / row['ours bf16']:.2f}" for name in fp8_names]
                print(f"| {headdim} | {seqlen} | {causal} | {' | '.join(cells)} |", flush=True)


def plain_fp8_attention(q8, k8, v8, descales, causal):
    """PyTorch fp32 math on the dequantized e4m3 inputs, P rounded to e4m3 for P.V (row sums before)."""
    (qd, kd, vd) = descales
    q, k, v = (x.float() * d[:, None, :, None] for x, d in zip((q8, k8, v8), (qd, kd, vd)))
    s = torch.einsum("bthd,bshd->bhts", q, k) * q.shape[-1] ** -0.5
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    p = torch.exp(s - s.amax(-1, keepdim=True))
    return torch.einsum("bhts,bshd->bthd", p.to(FP8).float(), v) / p.sum(-1).transpose(1, 2)[..., None]


def error_table(headdims, seqlen=4096, heads=2):
    print(f"\nRMSE against fp32 attention of the unquantized bf16 inputs (batch 1, seqlen {seqlen}, {heads} heads)")
    with_cudnn = cudnn_fp8_peer.available()[0]
    print("| hd | causal | ours bf16 | ours fp8 | triton fp8 | plain fp8 (PyTorch) |"
          + (" cudnn fp8 (per-tensor descales, e4m3 O) |" if with_cudnn else ""))
    print("|---|---|---|---|---|---|" + ("---|" if with_cudnn else ""))
    for headdim in headdims:
        for causal in (False, True):
            q, k, v = (torch.randn(1, seqlen, heads, headdim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            (q8, qd), (k8, kd), (v8, vd) = quantize(q), quantize(k), quantize(v)
            qt, kt, vt = (t.float().transpose(1, 2) for t in (q, k, v))
            ref = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal).transpose(1, 2)
            scales = dict(q_descale=qd, k_descale=kd, v_descale=vd)
            with environment(TRITON_SWITCH):
                triton_out = flash_attn_func(q8, k8, v8, causal=causal, **scales)
            outs = [flash_attn_func(q, k, v, causal=causal), flash_attn_func(q8, k8, v8, causal=causal, **scales),
                    triton_out, plain_fp8_attention(q8, k8, v8, (qd, kd, vd), causal)]
            peer = cudnn_fp8_peer.forward_or_none(q, k, v, causal) if with_cudnn else None
            if with_cudnn:
                outs.append(peer() if peer is not None else torch.full_like(ref, float("nan")))
            errors = [(o.float() - ref).pow(2).mean().sqrt().item() for o in outs]
            print(f"| {headdim} | {causal} | " + " | ".join(f"{e:.3e}" for e in errors) + " |", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default="")
    parser.add_argument("--headdims", default="128,256")
    parser.add_argument("--seqlens", default="4096,8192,16384")
    parser.add_argument("--idle-ms", type=float, default=250.0, help="GPU idle before each measurement (ms)")
    parser.add_argument("--fp8-env", default=None, help="NAME=A,B: our fp8 forward timed once per value of NAME")
    args = parser.parse_args()
    headdims = [int(x) for x in args.headdims.split(",")]
    fp8_env = None
    if args.fp8_env:
        name, values = args.fp8_env.split("=", 1)
        fp8_env = (name, values.split(","))
    timer = Timer(idle_ms=args.idle_ms)
    usable, why = cudnn_fp8_peer.available()
    if not usable:
        print(f"no cudnn fp8 column: {why}")
    print(f"{args.label} {torch.cuda.get_device_name()}, hidden {HIDDEN}, {TOKENS} tokens, forward TFLOP/s; "
          f"{timer.describe()}")
    speed_table(headdims, [int(x) for x in args.seqlens.split(",")], timer, fp8_env)
    error_table(headdims)


if __name__ == "__main__":
    main()
