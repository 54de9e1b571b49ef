"""Shared test code: the FlashAttention tolerance rule (docs/TESTING.md), the reference results it
judges against, input makers and the build-coverage skip. Device-agnostic: the CPU tests run the
same helpers as the GPU tests, so the test logic itself is exercised in CI.

The rule: for every compared tensor, with
    ref = the same math in fp32 (or fp64) from the same low-precision inputs,
    pt  = the same math done by plain PyTorch in the low precision (the noise users already accept),
    out = ours,
pass iff max|out - ref| <= factor * max|pt - ref| + atol_floor, factor 2 for out and lse, 3 for
dq, dk, dv. NaN never passes. Where the reference is infinite (the lse of a query row that sees no
key is +inf), ours must be the same infinity; the rule is applied to the finite entries.
A broken baseline would make the rule vacuous: test_reference.py checks that pt (forward and
gradients) is accurate to its own dtype.
"""

import dataclasses
import importlib.util
import os
import shutil
import subprocess

import pytest
import torch

import flash_attn
import flash_attn.ops
from flash_attn.reference import attention_ref, default_softmax_scale

FP32_EPS = torch.finfo(torch.float32).eps
OUT_FACTOR = 2  # out and lse
GRAD_FACTOR = 3  # dq, dk, dv


def fp32_rounding_floor(ref):
    """atol_floor for one tensor: one fp32 ulp at the reference's largest magnitude (at least 0.3's),
    i.e. twice the largest fp32 rounding error there. Our kernels accumulate in fp32 and lse is an
    fp32 output, so an fp32 result cannot be closer to the exact one than this; pt - ref can be
    exactly 0 (e.g. out = v when there is one key), and the floor keeps the rule from demanding more
    than fp32 can give. (It was 2 * max|(ref + 0.3 - 0.3) - ref|, which is 0 whenever the few values
    of a small tensor happen to survive that round trip: a decode step's lse of 4 heads.)"""
    r = ref.detach().float()
    r = r[torch.isfinite(r)]
    if r.numel() == 0:
        return 0.0
    top = torch.clamp(r.abs().max(), min=0.3)
    return (torch.nextafter(top, torch.full_like(top, float("inf"))) - top).item()


def grad_floor(q, k, v, dout, softmax_scale):
    """Extra atol_floor for dq, dk, dv: the fp32 accumulation error where the exact gradient cancels
    to 0.

    The backward computes dS = P * (dP - D) with dP = dO . V^T and D = rowsum(dO * O). Where the exact
    dP - D is 0 (one visible key: P = 1 and O = V, e.g. seqlen_k = 1), the reference's softmax backward
    gives exactly 0, and so does the low-precision pt (x - x*1), so max|pt - ref| = 0; but the kernel
    sums the d products of dP and of D in different orders in fp32 and leaves a residue of about
    d * eps_fp32 * max|dO| * max|V| per entry of dS. dq = scale * dS K and dk = scale * dS^T Q carry it
    multiplied by at most max|K| and max|Q| (P sums to 1 over a row; the column sums in dk add
    residues of random sign, far below the d-fold worst case assumed per entry). Hence
        floor_grad = 2 * d * eps_fp32 * max|dO| * max|V| * (max|Q| + max|K|) * softmax_scale,
    a few 1e-4 for randn inputs at d = 128: tiny next to any real bug, and only decisive where the
    gradient is 0."""
    amax = lambda t: t.detach().abs().max().float().item() if t.numel() else 0.0  # noqa: E731
    return 2 * q.shape[-1] * FP32_EPS * amax(dout) * amax(v) * (amax(q) + amax(k)) * softmax_scale


def assert_fa_close(name, out, ref, pt, factor, extra_floor=0.0):
    """The tolerance rule for one tensor (see the module docstring)."""
    assert out.shape == ref.shape == pt.shape, f"{name}: shapes {out.shape}, {ref.shape}, {pt.shape}"
    out, ref, pt = (t.detach().double() for t in (out, ref, pt))
    nan = torch.isnan(out)
    assert not nan.any(), (
        f"{name}: {int(nan.sum())} NaN of {out.numel()} (first at {_index(nan.nonzero()[0])}); "
        "with poisoned outputs this is an element the kernel never wrote"
    )
    finite = torch.isfinite(ref)
    mismatched_inf = ~finite & (out != ref)
    assert not mismatched_inf.any(), (
        f"{name}: reference is {ref[mismatched_inf][0].item()} at {_index(mismatched_inf.nonzero()[0])} "
        f"but ours is {out[mismatched_inf][0].item()} ({int(mismatched_inf.sum())} such entries)"
    )
    if not finite.any():
        return
    err = torch.where(finite, (out - ref).abs(), -1.0)  # -1: excluded (both the same infinity)
    assert torch.isfinite(err).all(), f"{name}: ours is infinite where the reference is finite"
    pt_err = (pt - ref)[finite].abs().max().item()
    floor = fp32_rounding_floor(ref) + extra_floor
    worst = err.argmax()
    max_err = err.flatten()[worst].item()
    tol = factor * pt_err + floor
    assert max_err <= tol, (
        f"{name}: max|out - ref| = {max_err:.4g} > {factor} * max|pt - ref| ({pt_err:.4g}) + floor ({floor:.3g}) "
        f"= {tol:.4g}; worst at {_index(torch.unravel_index(worst, err.shape))}: "
        f"out {out.flatten()[worst].item():.6g}, ref {ref.flatten()[worst].item():.6g}"
    )


def _index(idx):
    return tuple(int(i) for i in idx)


@dataclasses.dataclass
class Results:
    out: torch.Tensor
    lse: torch.Tensor
    dq: torch.Tensor
    dk: torch.Tensor
    dv: torch.Tensor


def reference_results(q, k, v, dout, causal, softmax_scale=None, compute_dtype=torch.float32, **mods):
    """(ref, pt) for inputs q, k, v (low precision) and output gradient dout.

    ref: attention_ref in `compute_dtype` math; gradients by autograd on `compute_dtype` leaf copies
    of the inputs (never rounded back to the low precision). pt: the same computation in the
    inputs' own dtype (upcast=False), gradients by autograd in that dtype. mods: attention_ref's
    window_size, softcap, alibi_slopes, dropout_p, dropout_mask."""
    if softmax_scale is None:
        softmax_scale = default_softmax_scale(q.shape[-1])

    def run(dtype, upcast):
        leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        out, lse = attention_ref(*leaves, causal=causal, softmax_scale=softmax_scale, upcast=upcast,
                                 compute_dtype=compute_dtype, **mods)
        grads = torch.autograd.grad(out, leaves, dout.to(out.dtype))
        return Results(out.detach(), lse.detach(), *grads)

    return run(compute_dtype, True), run(q.dtype, False)


def assert_matches_reference(ours, q, k, v, dout, causal, softmax_scale=None, compute_dtype=torch.float32, **mods):
    """Every field of `ours` (a Results; lse or the gradients may be None to skip them) against the
    reference with the tolerance rule. q, k, v, dout: the low-precision values ours was given;
    mods: see reference_results."""
    if softmax_scale is None:
        softmax_scale = default_softmax_scale(q.shape[-1])
    ref, pt = reference_results(q, k, v, dout, causal, softmax_scale, compute_dtype, **mods)
    floor_grad = grad_floor(q, k, v, dout, softmax_scale)
    floors = {"out": 0.0, "lse": 0.0, "dv": floor_grad}
    if ours.out is not None:
        floors.update(stored_output_floors(ours.out, ref.out, q, k, dout, softmax_scale, floor_grad))
    for field in ("out", "lse", "dq", "dk", "dv"):
        if getattr(ours, field) is None:
            continue
        is_grad = field.startswith("d")
        assert_fa_close(field, getattr(ours, field), getattr(ref, field), getattr(pt, field),
                        GRAD_FACTOR if is_grad else OUT_FACTOR, floors.get(field, floor_grad))


def stored_output_floors(out, ref_out, q, k, dout, softmax_scale, floor_grad):
    """atol_floor of dq and dk for the backward's D = rowsum(dO * O) taken from the stored
    low-precision O (FlashAttention's algorithm): D is off by dD_i = rowsum(dO * (O - O_exact)), which
    moves dS_ij by P_ij * dD_i, so dq by at most scale * max|dD| * max|K| and dk by at most
    scale * max|dD| * max|Q| * seqlen_q * (query heads per KV head) (a column of P sums to at most
    seqlen_q). It decides only where the exact gradient cancels to 0 and pt's is exactly 0: one
    visible key with dropout (O = V / (1 - p), rounded) gives dq = 0 in exact math. Taken from the
    data, so it is as small as ours' forward error."""
    if out.numel() == 0:
        return {}
    delta_error = (dout.double() * (out.detach().double() - ref_out.detach().double())).sum(-1).abs().max().item()
    amax = lambda t: t.detach().abs().max().double().item() if t.numel() else 0.0  # noqa: E731
    group = q.shape[-2] // k.shape[-2]
    return {"dq": floor_grad + 2 * softmax_scale * delta_error * amax(k),
            "dk": floor_grad + 2 * softmax_scale * delta_error * amax(q) * q.shape[1] * group}


def make_qkv(batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, dtype, device):
    """Fresh torch.randn q, k, v and an output gradient dout (the caller's test is seeded)."""
    q = torch.randn(batch, seqlen_q, nheads, headdim, dtype=dtype, device=device)
    k = torch.randn(batch, seqlen_k, nheads_k, headdim, dtype=dtype, device=device)
    v = torch.randn(batch, seqlen_k, nheads_k, headdim, dtype=dtype, device=device)
    dout = torch.randn(batch, seqlen_q, nheads, headdim, dtype=dtype, device=device)
    return q, k, v, dout


def run_flash_attn(q, k, v, dout, causal, softmax_scale=None):
    """flash_attn_func forward (out, lse) and backward (dq, dk, dv) on copies of q, k, v that keep
    their layout (clone preserves dense strides; views are handled by the layout tests)."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out, lse, probs = flash_attn.flash_attn_func(q, k, v, softmax_scale=softmax_scale, causal=causal,
                                                 return_attn_probs=True)
    assert probs is None
    return Results(out, lse, *torch.autograd.grad(out, (q, k, v), dout))


def check_flash_attn(batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, dtype, causal, device,
                     softmax_scale=None, compute_dtype=torch.float32):
    """The standard case: random inputs, ours forward + backward, compared with the rule."""
    q, k, v, dout = make_qkv(batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, dtype, device)
    ours = run_flash_attn(q, k, v, dout, causal, softmax_scale)
    assert ours.out.shape == q.shape and ours.lse.shape == (batch, nheads, seqlen_q)
    assert ours.lse.dtype == torch.float32 and ours.out.dtype == dtype
    assert_matches_reference(ours, q, k, v, dout, causal, softmax_scale, compute_dtype)


# Layouts of q, k, v (and of dout) that users hand us. LAYOUTS[name](new, shape) returns a tensor of
# `shape` viewing memory from new(*storage_shape) (torch.randn with the test's dtype, device and
# requires_grad, so that the view is part of the autograd graph).
def _strided_rows(extra, start=0):
    return lambda new, shape: new(*shape[:-1], shape[-1] + extra)[..., start:start + shape[-1]]


LAYOUTS = {
    "contiguous": lambda new, shape: new(*shape)[...],
    "row_stride_plus_8": _strided_rows(8),  # e.g. d=64 inside rows of 72: 16-byte aligned, read in place
    "row_stride_plus_4": _strided_rows(4),  # rows of d+4 elements: not 16-byte aligned
    "storage_offset_4": _strided_rows(8, start=4),  # aligned strides, misaligned start
    # contiguous, but starting 1 element into its storage: misaligned start
    "contiguous_storage_offset_1": lambda new, shape: new(torch.Size(shape).numel() + 1)[1:].view(shape),
    # (b, h, s, d) storage seen as (b, s, h, d), as from a (b, h, s, d) projection
    "heads_major": lambda new, shape: new(shape[0], shape[2], shape[1], shape[3]).transpose(1, 2),
    # stride 0 on every dim but the last, as the gradient of out.sum() or a broadcast tensor
    "expanded": lambda new, shape: new(1, 1, 1, shape[-1]).expand(shape),
}


def check_layouts(input_layout, dout_layout, batch, seqlen_q, seqlen_k, nheads, headdim, dtype, causal, device):
    """ours on q, k, v built with LAYOUTS[input_layout] and dout with LAYOUTS[dout_layout], gradients
    taken w.r.t. those views, against the reference on the same values."""
    new_leaf = lambda *shape: torch.randn(shape, dtype=dtype, device=device, requires_grad=True)  # noqa: E731
    q, k, v = (LAYOUTS[input_layout](new_leaf, (batch, seqlen, nheads, headdim))
               for seqlen in (seqlen_q, seqlen_k, seqlen_k))
    new = lambda *shape: torch.randn(shape, dtype=dtype, device=device)  # noqa: E731
    dout = LAYOUTS[dout_layout](new, (batch, seqlen_q, nheads, headdim))
    out, lse, _ = flash_attn.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    ours = Results(out, lse, *torch.autograd.grad(out, (q, k, v), dout))
    assert_matches_reference(ours, q.detach(), k.detach(), v.detach(), dout, causal)


def public_call(function, batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, dtype, device):
    """Random leaf inputs for one public function: 'func' (q, k, v), 'qkvpacked' (qkv; needs
    seqlen_q == seqlen_k and nheads == nheads_k) or 'kvpacked' (q, kv). Returns (fn, leaves, unpack),
    unpack mapping the leaves (or their gradients) to (q, k, v) (or (dq, dk, dv))."""
    new = lambda *shape: torch.randn(shape, dtype=dtype, device=device, requires_grad=True)  # noqa: E731
    if function == "qkvpacked":
        assert seqlen_q == seqlen_k and nheads == nheads_k
        return flash_attn.flash_attn_qkvpacked_func, [new(batch, seqlen_q, 3, nheads, headdim)], \
            lambda ts: tuple(ts[0].unbind(2))
    q = new(batch, seqlen_q, nheads, headdim)
    if function == "kvpacked":
        return flash_attn.flash_attn_kvpacked_func, [q, new(batch, seqlen_k, 2, nheads_k, headdim)], \
            lambda ts: (ts[0], *ts[1].unbind(2))
    assert function == "func"
    return flash_attn.flash_attn_func, [q, new(batch, seqlen_k, nheads_k, headdim),
                                        new(batch, seqlen_k, nheads_k, headdim)], tuple


def run_public(fn, leaves, unpack, dout, causal):
    """fn(*leaves) forward (out, lse) and backward (dq, dk, dv, unpacked from the leaves' gradients)."""
    out, lse, probs = fn(*leaves, causal=causal, return_attn_probs=True)
    assert probs is None
    return Results(out, lse, *unpack(torch.autograd.grad(out, leaves, dout)))


def check_public(function, batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, dtype, causal, device,
                 compile_backend=None, compute_dtype=torch.float32):
    """One public function ('func', 'qkvpacked', 'kvpacked'; see public_call) forward and backward
    against the reference. With compile_backend, the function runs under torch.compile(fullgraph=True)
    with that backend, and its forward must also equal eager's bit for bit."""
    fn, leaves, unpack = public_call(function, batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, dtype, device)
    dout = torch.randn(batch, seqlen_q, nheads, headdim, dtype=dtype, device=device)
    if compile_backend is None:
        ours = run_public(fn, leaves, unpack, dout, causal)
    else:
        ours = run_public(torch.compile(fn, fullgraph=True, backend=compile_backend), leaves, unpack, dout, causal)
        eager = run_public(fn, leaves, unpack, dout, causal)
        assert torch.equal(ours.out, eager.out) and torch.equal(ours.lse, eager.lse)
    q, k, v = unpack([t.detach() for t in leaves])
    assert_matches_reference(ours, q, k, v, dout, causal, compute_dtype=compute_dtype)


def check_rows_without_keys(seqlen_q, seqlen_k, headdim, dtype, device):
    """Causal with seqlen_q > seqlen_k: query rows i < seqlen_q - seqlen_k see no key; their output
    is exactly 0, their lse +inf, and their dq exactly 0; the other rows are finite."""
    q, k, v, dout = make_qkv(2, seqlen_q, seqlen_k, 2, 2, headdim, dtype, device)
    ours = run_flash_attn(q, k, v, dout, causal=True)
    empty = seqlen_q - seqlen_k
    assert torch.equal(ours.out[:, :empty], torch.zeros_like(ours.out[:, :empty]))
    assert torch.equal(ours.dq[:, :empty], torch.zeros_like(ours.dq[:, :empty]))
    assert (ours.lse[:, :, :empty] == float("inf")).all()
    assert torch.isfinite(ours.lse[:, :, empty:]).all() and torch.isfinite(ours.out[:, empty:]).all()
    assert_matches_reference(ours, q, k, v, dout, causal=True)


def round_up(x, multiple):
    return -(-x // multiple) * multiple


def require_kernel(dtype, headdim):
    """Skip unless this build has a kernel for (dtype, headdim): the runtime uses the smallest
    compiled head dim >= round_up(headdim, 8) for the dtype. The Triton backend compiles its kernels
    per call, for every head dim."""
    if TEST_BACKEND == "triton":
        return
    compiled = sorted(h for dt, h in flash_attn.ops.compiled_configs() if dt == dtype)
    if not any(h >= round_up(headdim, 8) for h in compiled):
        pytest.skip(
            f"this build has no {dtype} kernel for headdim {headdim} (compiled for {dtype}: {compiled or 'none'}); "
            "rebuild with FLASH_ATTN_HDIMS / FLASH_ATTN_DTYPES covering it"
        )


def assert_rounding_close(name, actual, exact, eps, terms):
    """For comparing two computations of the same math that differ only by rounding (reference vs an
    fp64 naive loop): max|actual - exact| <= terms * eps * (1 + max|exact|), the first-order bound for
    a sum of `terms` rounded terms of magnitude <= 1 + max|exact|. Infinities must match exactly."""
    actual, exact = actual.detach().double(), exact.detach().double()
    assert actual.shape == exact.shape, f"{name}: shapes {tuple(actual.shape)} vs {tuple(exact.shape)}"
    assert not torch.isnan(actual).any(), f"{name}: NaN"
    finite = torch.isfinite(exact)
    assert torch.equal(actual[~finite], exact[~finite]), f"{name}: infinities differ"
    if finite.any():
        err = (actual - exact)[finite].abs().max().item()
        tol = terms * eps * (1 + exact[finite].abs().max().item())
        assert err <= tol, f"{name}: max error {err:.3g} > {tol:.3g} ({terms} terms, eps {eps:.3g})"


OPCHECK_UTILS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def fwd_op(q, k, v, softmax_scale, causal):
    """torch.ops.flash_attn.fwd on dense tensors with no option but causal: (out, lse, rng_state)."""
    return torch.ops.flash_attn.fwd(q, k, v, None, None, q.shape[1], k.shape[1], 0.0, softmax_scale, -1,
                                    0 if causal else -1, 0.0, None, False)


def opcheck_both_ops(device, nheads_k, window, softcap=0.0, alibi=False, varlen=False, dropout_p=0.0,
                     test_utils=OPCHECK_UTILS, dtype=torch.bfloat16, headdim=16, seqlen_q=5, seqlen_k=7):
    """torch.library.opcheck of fwd and bwd (test_schema, test_autograd_registration,
    test_faketensor, test_aot_dispatch_dynamic), with non-contiguous (packed-slice) k and v; varlen
    views the batch of 2 as sequences plus an empty one."""
    q, k, v, dout = make_qkv(2, seqlen_q, seqlen_k, 4, nheads_k, headdim, dtype, device)
    kv = torch.stack((k, v), dim=2)  # k, v below are slices of it: non-contiguous, like kvpacked
    k, v = kv.unbind(2)
    cu = [None, None]
    if varlen:  # the same tensors as 2 sequences of 5 queries / 7 keys, and one empty sequence
        q, k, v, dout = (t.reshape(-1, *t.shape[2:]) for t in (q, k, v, dout))
        cu = [torch.tensor([0, seqlen_q, 2 * seqlen_q, 2 * seqlen_q], dtype=torch.int32, device=device),
              torch.tensor([0, seqlen_k, seqlen_k, 2 * seqlen_k], dtype=torch.int32, device=device)]
    slopes = torch.rand(4, device=device) if alibi else None
    options = [*cu, seqlen_q, seqlen_k, dropout_p, headdim ** -0.5, *window, softcap, slopes]
    args = [t.requires_grad_() for t in (q, k.detach(), v.detach())] + options + [False]
    result = torch.library.opcheck(torch.ops.flash_attn.fwd.default, args, test_utils=test_utils)
    assert set(result.values()) == {"SUCCESS"}, result
    out, lse, rng_state = torch.ops.flash_attn.fwd(*args)
    bwd_args = (dout, q.detach(), k.detach(), v.detach(), out.detach(), lse.detach(), *options, rng_state, True)
    result = torch.library.opcheck(torch.ops.flash_attn.bwd.default, bwd_args, test_utils=test_utils)
    assert set(result.values()) == {"SUCCESS"}, result


# The backend the GPU test modules run against, FLASH_ATTN_TEST_BACKEND: "cuda" (the default) the CUDA
# kernels; "triton" the same tests with FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE set for each
# (conftest.py, cuda_test_setup), so that every public function runs the Triton backend
# (flash_attn/triton, issue #9). Tests of the CUDA kernels or ops themselves (kernel choice, op-level
# messages, the sm90 switches, the CUDA fp8 forward) carry CUDA_KERNELS_ONLY and skip there.
TEST_BACKEND = os.environ.get("FLASH_ATTN_TEST_BACKEND", "cuda")
if TEST_BACKEND not in ("cuda", "triton"):
    raise ValueError(f"FLASH_ATTN_TEST_BACKEND must be 'cuda' or 'triton', got {TEST_BACKEND!r}")


def _gpu_tests_unavailable_reason():
    if not torch.cuda.is_available():
        return "needs a CUDA (or ROCm) GPU"
    if TEST_BACKEND == "triton":
        return None if importlib.util.find_spec("triton") is not None else "FLASH_ATTN_TEST_BACKEND=triton needs triton"
    if not flash_attn.ops.has_cuda_kernels():
        return f"needs the flash_attn._C extension ({flash_attn.ops.cuda_kernels_unavailable_reason()})"
    return None


_GPU_TESTS_UNAVAILABLE = _gpu_tests_unavailable_reason()
# Module marks of the GPU test files: skip cleanly without a GPU or the backend under test (no GPU
# query beyond is_available at import), and poison every output (conftest.cuda_test_setup).
GPU_TEST_MARKS = [
    pytest.mark.skipif(_GPU_TESTS_UNAVAILABLE is not None, reason=str(_GPU_TESTS_UNAVAILABLE)),
    pytest.mark.usefixtures("cuda_test_setup"),
]
CUDA_KERNELS_ONLY = pytest.mark.skipif(TEST_BACKEND != "cuda",
                                       reason="a test of the CUDA kernels or ops themselves (FLASH_ATTN_TEST_BACKEND)")


def run_sm90_layout_check(source, tmp_path):
    """Compiles tests/cuda/<source> for sm_90a with nvcc and asserts that it prints "ALL OK" (the
    stand-alone checks of the Hopper arch layer); skips without nvcc."""
    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    nvcc = os.path.join(cuda_home, "bin", "nvcc")
    nvcc = nvcc if os.path.exists(nvcc) else shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not found")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    binary = tmp_path / os.path.splitext(source)[0]
    subprocess.run([nvcc, "-std=c++17", "-I", os.path.join(root, "csrc"), "-gencode=arch=compute_90a,code=sm_90a",
                    os.path.join(root, "tests", "cuda", source), "-o", str(binary)], check=True)
    result = subprocess.run([str(binary)], capture_output=True, text=True)
    assert result.returncode == 0 and "ALL OK" in result.stdout, result.stdout + result.stderr
