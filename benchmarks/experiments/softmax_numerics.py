"""The forward's online softmax emulated on the CPU, to see what a change to its numerics does to out
and lse before any GPU time: the walk over 128-key blocks from the last one (as the Hopper forwards
take them), P rounded to the input dtype for P.V, against an fp64 reference and next to the error of
plain PyTorch in the input dtype (pt: the bound the tolerance rule scales by 2). Variants:
  main     row sums of the fp32 P (FADDs), the exact running max
  mma      row sums of the rounded P (the tensor core's sum over a column of ones, NOTES.md v33 item 7)
  mma+lag  the same with lazy rescaling: a row keeps its max until a block passes it by 2^8 (item 8)

    python benchmarks/experiments/softmax_numerics.py [--headdim 64]

Prints per case (dtype, seqlen_q, seqlen_k, causal, peaked scores) the max |lse - ref| and
|out - ref| of pt and of each variant.
"""

import argparse
import math

import torch

BLOCK, LAG_LOG2 = 128, 8.0
CASES = [(1, 2, False, False), (113, 203, True, False), (1024, 1023, False, False), (239, 300, True, True),
         (1, 4097, False, True)]


def online_softmax(s, v, scale, dtype, sums_of_rounded, lag):
    """(out, lse) of scores s (fp64, -inf where masked) and v, walked block by block in fp32."""
    scale_log2 = scale * math.log2(math.e)
    x_all, ninf = s.float(), float("-inf")
    m = torch.full(s.shape[:-1], ninf)
    l = torch.zeros(s.shape[:-1])
    o = torch.zeros(*s.shape[:-1], v.shape[-1])
    for j in reversed(range(0, s.shape[-1], BLOCK)):
        x = x_all[..., j:j + BLOCK]
        new_max = torch.maximum(m, x.max(-1).values)
        if lag:
            new_max = torch.where((m != ninf) & ((new_max - m) * scale_log2 <= LAG_LOG2), m, new_max)
        max_scaled = torch.where(new_max == ninf, torch.zeros_like(new_max), new_max * scale_log2)
        rescale = torch.where(m == ninf, torch.zeros_like(m),
                              torch.where(m == new_max, torch.ones_like(m), torch.exp2(m * scale_log2 - max_scaled)))
        p = torch.exp2(x * scale_log2 - max_scaled[..., None])
        p_rounded = p.to(dtype).float()
        l = l * rescale + (p_rounded if sums_of_rounded else p).sum(-1)
        o = o * rescale[..., None] + p_rounded @ v[..., j:j + BLOCK, :].float()
        m = new_max
    return (o / l[..., None]).to(dtype).double(), (m * scale + torch.log(l)).double()


def case(dtype, seqlen_q, seqlen_k, causal, peaked, headdim):
    q, k, v = (torch.randn(1, 4, n, headdim).to(dtype) for n in (seqlen_q, seqlen_k, seqlen_k))
    if peaked:
        k = (k.float() * 3).to(dtype)
    scale = headdim ** -0.5
    mask = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool).tril(seqlen_k - seqlen_q) if causal else None
    s = q.double() @ k.double().transpose(-1, -2)
    s_pt = (q @ k.transpose(-1, -2)).float()
    if causal:
        s, s_pt = s.masked_fill(~mask, float("-inf")), s_pt.masked_fill(~mask, float("-inf"))
    ref_lse, ref_out = torch.logsumexp(s * scale, -1), torch.softmax(s * scale, -1) @ v.double()
    err = lambda out, lse: ((lse - ref_lse).abs().max().item(), (out - ref_out).abs().max().item())  # noqa: E731
    pt = err((torch.softmax(s_pt * scale, -1).to(dtype) @ v).double(), torch.logsumexp(s_pt * scale, -1).double())
    variants = {name: err(*online_softmax(s, v, scale, dtype, rounded, lag))
                for name, rounded, lag in (("main", False, False), ("mma", True, False), ("mma+lag", True, True))}
    return pt, variants


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--headdim", type=int, default=64)
    args = parser.parse_args()
    torch.manual_seed(0)
    for dtype in (torch.bfloat16, torch.float16):
        for seqlen_q, seqlen_k, causal, peaked in CASES:
            (pt_lse, pt_out), variants = case(dtype, seqlen_q, seqlen_k, causal, peaked, args.headdim)
            cells = " | ".join(f"{name} lse {a:.2e} out {b:.2e}" for name, (a, b) in variants.items())
            print(f"{str(dtype).removeprefix('torch.')} {seqlen_q}x{seqlen_k} causal={causal} peaked={peaked} | "
                  f"pt lse {pt_lse:.2e} out {pt_out:.2e} | {cells}")


if __name__ == "__main__":
    main()
