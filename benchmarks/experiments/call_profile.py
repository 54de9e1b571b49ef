"""Where the time of one attention call goes, ours against SDPA cuDNN's: torch.profiler's CUDA kernel
table of 10 backward calls (torch.autograd.grad of one forward, graph retained), with --pass fwd 10
forward calls, with --pass step 10 training steps (forward and its backward, the speed suite's fwd+bwd
cell), each table under the time of one call back to back (Timer.back_to_back), so that a gap the
kernels do not fill shows; bf16, hidden 2048, batch x seqlen = 16k tokens (the speed suite's shapes),
hd 128 by default: the main kernel and what else each call launches (in our backward the preprocess,
which also clears dq_accum, and the dQ convert pass).

    python benchmarks/experiments/call_profile.py [--pass bwd|fwd|step] [--headdim 128]
        [--seqlens 512 1024 4096] [--causal both|no|yes] [--only ours]
"""

import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

from flash_attn import flash_attn_func
from flash_attn.benchmark.measure import Timer

HIDDEN, TOKENS, CALLS = 2048, 16384, 10


def cudnn(q, k, v, causal):
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                              is_causal=causal).transpose(1, 2)


def profile_calls(attention, pass_, seqlen, headdim, causal):
    heads, batch = HIDDEN // headdim, TOKENS // seqlen
    q, k, v = (torch.randn(batch, seqlen, heads, headdim, device="cuda", dtype=torch.bfloat16,
                           requires_grad=pass_ != "fwd") for _ in range(3))
    if pass_ == "fwd":
        call = lambda: attention(q, k, v, causal)  # noqa: E731
    else:
        out = attention(q, k, v, causal)
        dout = torch.randn_like(out)
        if pass_ == "bwd":
            call = lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)  # noqa: E731
        else:
            call = lambda: torch.autograd.grad(attention(q, k, v, causal), (q, k, v), dout)  # noqa: E731
    return f"time of one call, back to back: {Timer().back_to_back(call):.3f} ms\n" + kernel_table(call)


def profiled(call, calls=CALLS, warmups=3):
    """torch.profiler (CUDA activity) over `calls` calls of call(), after `warmups` untimed ones."""
    for _ in range(warmups):
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    return prof


def kernel_table(call, calls=CALLS, row_limit=8):
    """torch.profiler's CUDA table (by total time) of `calls` calls of call(), after three warm-up calls."""
    return profiled(call, calls).key_averages().table(sort_by="cuda_time_total", row_limit=row_limit,
                                                      max_name_column_width=70)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--headdim", type=int, default=128)
    parser.add_argument("--seqlens", nargs="+", type=int, default=(512, 1024, 4096))
    parser.add_argument("--pass", dest="pass_", choices=("fwd", "bwd", "step"), default="bwd")
    parser.add_argument("--causal", choices=("both", "no", "yes"), default="both")
    parser.add_argument("--only", choices=("ours", "cudnn"), help="profile one of the two")
    args = parser.parse_args()
    attentions = {"ours": lambda q, k, v, causal: flash_attn_func(q, k, v, causal=causal), "cudnn": cudnn}
    if args.only:
        attentions = {args.only: attentions[args.only]}
    for seqlen in args.seqlens:
        for causal in {"both": (False, True), "no": (False,), "yes": (True,)}[args.causal]:
            for name, attention in attentions.items():
                print(f"=== {name}: hd {args.headdim} seqlen {seqlen} causal {causal}, {CALLS} {args.pass_} calls")
                print(profile_calls(attention, args.pass_, seqlen, args.headdim, causal))


if __name__ == "__main__":
    main()
