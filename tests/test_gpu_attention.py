"""Our CUDA kernels against the reference with the tolerance rule: forward out and lse, backward
dq, dk, dv. Outputs are poisoned with NaN before every kernel (fixture cuda_test_setup), so an
element a kernel never writes fails.

Coverage (this module and test_gpu_compile.py together: 28 s on an H100, build excluded):
- every dtype x head dim (compiled ones, and odd ones that are padded or run on the next larger
  kernel) x seqlen pair x causal / not, MHA: batch 2 with 4 heads for head dims 64 and 128, batch 1
  with 3 heads for the others, batch 1 with 2 heads for 4097 x 4097 (the reference materializes
  the scores);
- GQA and MQA over a subset; packed functions; input layouts; rows without keys; tiny and empty
  sequences; bitwise-deterministic forward.
A (dtype, headdim) this build has no kernel for is skipped with a reason naming FLASH_ATTN_HDIMS /
FLASH_ATTN_DTYPES.
"""

import dataclasses

import pytest
import torch

import flash_attn
import flash_attn.ops
from helpers import (CUDA_KERNELS_ONLY, GPU_TEST_MARKS, LAYOUTS, check_flash_attn, check_layouts, check_public, check_rows_without_keys,
                     fwd_op, make_qkv, require_kernel)

pytestmark = GPU_TEST_MARKS

DTYPES = (torch.float16, torch.bfloat16)
SEQLENS = [(1, 1), (1, 239), (113, 203), (128, 217), (239, 1), (1023, 1024), (1024, 1023), (2048, 2048),
           (4097, 4097)]
CORE_HEADDIMS = (64, 128)  # batch 2; the others run with batch 1
HEADDIMS = (8, 20, 32, 40, 59, 64, 80, 96, 111, 128, 160, 192, 224, 256)  # 8, 20: below the hd 32 kernel's width
GQA_SEQLENS = [(1, 239), (113, 203), (239, 1), (1023, 1024), (4097, 4097)]


@dataclasses.dataclass(frozen=True)
class Case:
    dtype: torch.dtype
    headdim: int
    seqlen_q: int
    seqlen_k: int
    causal: bool
    batch: int = 2
    nheads: int = 4
    nheads_k: int = 4

    def __str__(self):
        return (f"{str(self.dtype).removeprefix('torch.')}-hd{self.headdim}-{self.seqlen_q}x{self.seqlen_k}-"
                f"{'causal' if self.causal else 'full'}-b{self.batch}h{self.nheads}k{self.nheads_k}")


def _large_is_small(case):
    """The 4097 x 4097 cases run with batch 1 and 2 heads (the reference materializes the scores)."""
    if case.seqlen_q * case.seqlen_k > 2048 * 2048:
        return dataclasses.replace(case, batch=1, nheads=2, nheads_k=2 if case.nheads_k == case.nheads else 1)
    return case


CASES = list(dict.fromkeys(_large_is_small(case) for case in (
    [Case(dtype, hd, sq, sk, causal, *((2, 4, 4) if hd in CORE_HEADDIMS else (1, 3, 3))) for dtype in DTYPES
     for hd in HEADDIMS for sq, sk in SEQLENS for causal in (False, True)]
    + [Case(dtype, hd, sq, sk, causal, nheads=h, nheads_k=hk) for dtype in DTYPES for h, hk in ((8, 2), (6, 1))
       for hd in (59, 128) for sq, sk in GQA_SEQLENS for causal in (False, True)]
)))  # unique: the large GQA and MQA cases coincide


@pytest.mark.parametrize("case", CASES, ids=str)
def test_attention(case):
    require_kernel(case.dtype, case.headdim)
    check_flash_attn(case.batch, case.seqlen_q, case.seqlen_k, case.nheads, case.nheads_k, case.headdim, case.dtype,
                     case.causal, "cuda")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlen_k", [1, 2, 7, 9])
def test_tiny_seqlen_k(seqlen_k, causal):
    require_kernel(torch.bfloat16, 128)
    check_flash_attn(2, 64, seqlen_k, 4, 2, 128, torch.bfloat16, causal, "cuda")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(0, 16), (16, 0), (300, 0), (0, 0)])
def test_empty_sequences(seqlen_q, seqlen_k, causal):
    """No query: empty out and lse, zero dk, dv. No key: out 0, lse +inf, zero dq."""
    require_kernel(torch.bfloat16, 40)
    check_flash_attn(2, seqlen_q, seqlen_k, 4, 2, 40, torch.bfloat16, causal, "cuda")


@pytest.mark.parametrize("softmax_scale", [0.03, 0.5])
def test_softmax_scale(softmax_scale):
    require_kernel(torch.float16, 64)
    check_flash_attn(2, 113, 203, 4, 4, 64, torch.float16, True, "cuda", softmax_scale)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("headdim", [59, 64])  # 64: the packed slices are read in place; 59: padded copies
@pytest.mark.parametrize("function,seqlen_q,seqlen_k,nheads_k", [("qkvpacked", 239, 239, 4), ("kvpacked", 113, 203, 2),
                                                                 ("kvpacked", 203, 113, 1)])
def test_packed(function, seqlen_q, seqlen_k, nheads_k, headdim, causal, dtype):
    require_kernel(dtype, headdim)
    check_public(function, 2, seqlen_q, seqlen_k, 4, nheads_k, headdim, dtype, causal, "cuda")


@pytest.mark.parametrize("input_layout,dout_layout", [(layout, "contiguous") for layout in LAYOUTS]
                         + [("contiguous", "expanded"), ("heads_major", "heads_major")])
def test_layouts(input_layout, dout_layout):
    """Strided, offset, head-major and broadcast inputs and output gradients (head dim 64, so
    row_stride_plus_8 is q = big[..., :64] with rows of 72), forward and backward."""
    require_kernel(torch.bfloat16, 64)
    check_layouts(input_layout, dout_layout, 2, 113, 203, 4, 64, torch.bfloat16, True, "cuda")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("seqlen_q,seqlen_k,headdim", [(128, 17, 64), (239, 1, 128), (1024, 3, 59)])
def test_rows_without_keys(seqlen_q, seqlen_k, headdim, dtype):
    """Causal, seqlen_q > seqlen_k: rows that see no key give out exactly 0, lse +inf, dq 0."""
    require_kernel(dtype, headdim)
    check_rows_without_keys(seqlen_q, seqlen_k, headdim, dtype, "cuda")


@pytest.mark.parametrize("case", [Case(torch.bfloat16, 128, 1024, 1023, False), Case(torch.bfloat16, 128, 1024, 1023,
                                                                                      True),
                                  Case(torch.float16, 59, 239, 1, False), Case(torch.float16, 64, 4097, 4097, True,
                                                                               batch=1, nheads=2, nheads_k=2)],
                         ids=str)
def test_forward_is_deterministic(case):
    """The forward gives bitwise-equal out and lse on repeated runs."""
    require_kernel(case.dtype, case.headdim)
    q, k, v, _ = make_qkv(case.batch, case.seqlen_q, case.seqlen_k, case.nheads, case.nheads_k, case.headdim,
                          case.dtype, "cuda")
    runs = [flash_attn.flash_attn_func(q, k, v, causal=case.causal, return_attn_probs=True)[:2] for _ in range(3)]
    for out, lse in runs[1:]:
        assert torch.equal(out, runs[0][0]) and torch.equal(lse, runs[0][1])


@CUDA_KERNELS_ONLY
def test_ops_reject_headdim_not_multiple_of_8():
    """The op itself (below the public functions, which pad) names the head dim rule."""
    q = torch.randn(1, 4, 2, 60, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="head dim must be a multiple of 8"):
        fwd_op(q, q, q, 0.125, False)


@CUDA_KERNELS_ONLY
def test_ops_report_mismatched_shapes_with_numbers():
    """Op-level messages carry the sizes (formatted without iostreams, see csrc/torch/ops.cpp)."""
    q = torch.randn(1, 4, 3, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 4, 2, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match=r"k has batch 2 but q has 1"):
        fwd_op(q, k, k, 0.125, False)
    with pytest.raises(RuntimeError, match=r"nheads of q \(3\) must be a multiple of nheads of k and v \(2\)"):
        fwd_op(q, k[:1], k[:1], 0.125, False)


@CUDA_KERNELS_ONLY
@pytest.mark.parametrize("headdim,causal", [(64, False), (128, True), (256, False)])
def test_backward_single_stage(monkeypatch, headdim, causal):
    """The one-stage backward that GPUs with less shared memory than an H100 run (A100: hd >= 128)."""
    require_kernel(torch.bfloat16, headdim)
    monkeypatch.setenv("FLASH_ATTN_BWD_STAGES", "1")
    check_flash_attn(2, 239, 300, 4, 2, headdim, torch.bfloat16, causal, "cuda")
