"""Without a GPU: run flash_attn_func's CPU path (the exact fp32 reference) on a small case and check it,
forward and backward, against naive PyTorch attention, by the rule of TESTING.md (team design notes): our error against
the fp32 computation must be within 2x (forward) or 3x (gradients) the error of the same naive math
done in the low precision, plus the fp32 reference's own rounding."""

import torch

import flash_attn

from .impls import naive_forward

FORWARD_FACTOR, GRAD_FACTOR = 2, 3


def _rounding_floor(ref):
    """The reference's own rounding: 2 * max |(ref + 0.3 - 0.3) - ref|."""
    return 2 * ((ref + 0.3 - 0.3) - ref).abs().max().item()


def _run(forward, q, k, v, dout, causal, dtype):
    """Output and (dq, dk, dv) of `forward` on copies of q, k, v converted to dtype."""
    inputs = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    out = forward(*inputs, causal)
    grads = torch.autograd.grad(out, inputs, dout.to(dtype))
    return [out.detach().float()] + [g.float() for g in grads]


def check_case(batch=1, seqlen=128, nheads=2, headdim=64, causal=False, dtype=torch.bfloat16, seed=0):
    """One case. Returns a dict: max error of ours and of naive in `dtype` against naive in fp32, for
    out, dq, dk, dv, and whether ours passes."""
    generator = torch.Generator().manual_seed(seed)
    q, k, v, dout = (torch.randn(batch, seqlen, nheads, headdim, generator=generator).to(dtype) for _ in range(4))
    ours = _run(lambda q_, k_, v_, c: flash_attn.flash_attn_func(q_, k_, v_, causal=c), q, k, v, dout, causal, dtype)
    low = _run(naive_forward, q, k, v, dout, causal, dtype)
    ref = _run(naive_forward, q, k, v, dout, causal, torch.float32)
    result = {"case": f"b={batch} s={seqlen} h={nheads} d={headdim} {'causal' if causal else 'non-causal'} "
                      f"{str(dtype).removeprefix('torch.')}", "passed": True}
    factors = (FORWARD_FACTOR, GRAD_FACTOR, GRAD_FACTOR, GRAD_FACTOR)
    for name, mine, theirs, exact, factor in zip(("out", "dq", "dk", "dv"), ours, low, ref, factors, strict=True):
        error = (mine - exact).abs().max().item()
        allowed = factor * (theirs - exact).abs().max().item() + _rounding_floor(exact)
        result[name] = error
        result[f"{name}_naive_low_precision"] = (theirs - exact).abs().max().item()
        result["passed"] &= error <= allowed
    return result


def run_cpu_check():
    """Non-causal and causal cases. Returns (markdown table, all passed)."""
    results = [check_case(causal=causal) for causal in (False, True)]
    lines = [
        "| case | max abs err out | dq | dk | dv | naive low-precision err out | passed |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(f"| {r['case']} | {r['out']:.2e} | {r['dq']:.2e} | {r['dk']:.2e} | {r['dv']:.2e} | "
                     f"{r['out_naive_low_precision']:.2e} | {'yes' if r['passed'] else 'NO'} |")
    return "\n".join(lines) + "\n", all(r["passed"] for r in results)
