"""The training API's options on the CUDA kernels: window, softcap, ALiBi, dropout, deterministic
backward and varlen, alone and combined, forward and backward, against the fp32 reference with the
tolerance rule (outputs poisoned with NaN before every kernel). Head dims 64 and 128 run the Hopper
kernels on an H100/H200 (each pair of Hopper kernels forced with FLASH_ATTN_SM90_FWD and
FLASH_ATTN_SM90_BWD =ws or cpasync, and the default's choice) and the sm80 ones with
FLASH_ATTN_DISABLE_SM90=1; 96 runs the sm80 kernels everywhere; 192 and 256 the Hopper forward
and the head-split Hopper backward.

The `sanitizer` tests are the ones scripts/gpu_check.sh also runs under compute-sanitizer memcheck:
varlen batches whose cu_seqlens hold offsets past the tensors or out of order.
"""

import pytest
import torch

import flash_attn
from feature_checks import Mods, check_dense, check_varlen, dropped_fraction, keep_mask_from_probs, make_cu_seqlens
from flash_attn import dropout as dropout_lib
from flash_attn.reference import window_keep_mask
from helpers import CUDA_KERNELS_ONLY, GPU_TEST_MARKS, TEST_BACKEND, make_qkv, require_kernel

pytestmark = GPU_TEST_MARKS

OPTIONS = {
    "window": Mods(window_size=(100, 30)),
    "window_left": Mods(window_size=(64, -1)),
    "window_right": Mods(window_size=(-1, 17)),
    "causal_window": Mods(causal=True, window_size=(129, -1)),
    "softcap": Mods(softcap=5.0),
    "causal_softcap": Mods(causal=True, softcap=30.0),
    "alibi_head": Mods(alibi="head"),
    "alibi_batch_causal": Mods(alibi="batch", causal=True),
    "dropout": Mods(dropout_p=0.17),
    "causal_dropout": Mods(causal=True, dropout_p=0.1),
    "deterministic": Mods(deterministic=True),
    "deterministic_causal_window": Mods(deterministic=True, causal=True, window_size=(200, -1)),
    "everything": Mods(causal=True, window_size=(150, -1), softcap=20.0, alibi="batch", dropout_p=0.1,
                       deterministic=True),
}
SEQLENS = [(113, 203), (203, 113), (256, 256), (1, 300), (1000, 1000)]


def _kernels(monkeypatch, kernel):
    if kernel == "sm80":
        monkeypatch.setenv("FLASH_ATTN_DISABLE_SM90", "1")
    if kernel in ("ws", "cpasync"):  # the warp-specialized (TMA) Hopper forward and backward, or the cp.async ones
        monkeypatch.setenv("FLASH_ATTN_SM90_FWD", kernel)
        monkeypatch.setenv("FLASH_ATTN_SM90_BWD", kernel)


def _sanitizer_forward(monkeypatch, forward):
    """The sanitizer walks' Hopper forward, "ws" or "cpasync"; the other backend runs once (as "ws")."""
    if TEST_BACKEND != "cuda":
        if forward != "ws":
            pytest.skip("a CUDA kernel variant: the other backend runs the walk once")
        return
    _kernels(monkeypatch, forward)


@pytest.mark.parametrize("seqlen_q,seqlen_k", SEQLENS)
@pytest.mark.parametrize("headdim,kernel", [(64, "default"), (64, "ws"), (128, "default"), (96, "default"),
                                            (32, "default"), (128, "sm80"), (128, "cpasync"), (192, "default"),
                                            (256, "default")])
@pytest.mark.parametrize("name", OPTIONS)
def test_option_dense(monkeypatch, name, headdim, kernel, seqlen_q, seqlen_k):
    require_kernel(torch.bfloat16, headdim)
    _kernels(monkeypatch, kernel)
    check_dense(OPTIONS[name], 2, seqlen_q, seqlen_k, 4, 2, headdim, torch.bfloat16, "cuda")


@pytest.mark.parametrize("kernel", ["ws", "cpasync", "sm80"])
@pytest.mark.parametrize("dropout_p", [0.001, 0.999])
def test_dropout_threshold_edges(monkeypatch, dropout_p, kernel):
    """keep_threshold 255 (p < 1/512: only byte 255 dropped) and 0 (every entry dropped) at the edges
    of the kernels' four-byte drop test (dropout.cuh), forward and backward, against the reference
    with the mask S_dmask reports (test_dropout_mask_cuda_equals_cpu_definition ties that to the
    definition)."""
    require_kernel(torch.bfloat16, 128)
    _kernels(monkeypatch, kernel)
    check_dense(Mods(dropout_p=dropout_p), 2, 203, 600, 4, 2, 128, torch.bfloat16, "cuda")


@pytest.mark.parametrize("headdim", [64, 128, 256])
@pytest.mark.parametrize("name", ["window", "softcap", "alibi_batch_causal", "dropout", "everything"])
def test_option_fp16(name, headdim):
    require_kernel(torch.float16, headdim)
    check_dense(OPTIONS[name], 1, 239, 300, 4, 1, headdim, torch.float16, "cuda")


VARLEN_LENGTHS = {  # name: (lengths_q, lengths_k)
    "mixed": ([300, 0, 1, 17, 1000, 128], [310, 5, 1, 0, 1000, 129]),
    "equal": ([256, 256, 256], [256, 256, 256]),
    "long_short": ([2048, 1, 3], [1, 2048, 64]),
}


@pytest.mark.parametrize("lengths", VARLEN_LENGTHS)
@pytest.mark.parametrize("headdim,kernel", [(64, "default"), (64, "ws"), (128, "default"), (96, "default"),
                                            (32, "default"), (64, "sm80"), (128, "cpasync"), (192, "default"),
                                            (256, "default")])
@pytest.mark.parametrize("name", ["plain", "causal", *OPTIONS])
def test_option_varlen(monkeypatch, name, headdim, kernel, lengths):
    require_kernel(torch.bfloat16, headdim)
    _kernels(monkeypatch, kernel)
    mods = {"plain": Mods(), "causal": Mods(causal=True)}.get(name) or OPTIONS[name]
    lengths_q, lengths_k = VARLEN_LENGTHS[lengths]
    check_varlen(mods, lengths_q, lengths_k, 4, 2, headdim, torch.bfloat16, "cuda")


@pytest.mark.parametrize("packing", ["qkv", "kv"])
def test_varlen_packed(packing):
    require_kernel(torch.bfloat16, 128)
    lengths = [77, 1, 0, 513]
    check_varlen(Mods(causal=True, dropout_p=0.1), lengths, lengths if packing == "qkv" else [80, 3, 9, 500], 4,
                 4 if packing == "qkv" else 2, 128, torch.bfloat16, "cuda", packing=packing)


@CUDA_KERNELS_ONLY
@pytest.mark.parametrize("p", [0.1, 0.3, 0.001, 0.999])
def test_dropout_mask_cuda_equals_cpu_definition(p):
    """The CUDA Philox mask is bit for bit flash_attn.dropout.keep_mask (the documented definition)."""
    rng_state = torch.tensor([0x1234_5678_9ABC_DEF, 4 * 977], dtype=torch.int64, device="cuda")
    cuda_mask = torch.ops.flash_attn.dropout_keep_mask(rng_state, 2, 3, 70, 131, p)
    cpu_mask = dropout_lib.keep_mask(0x1234_5678_9ABC_DEF, 4 * 977, 2, 3, 70, 131, p)
    assert torch.equal(cuda_mask.cpu(), cpu_mask)


@pytest.mark.parametrize("window_size,causal", [((-1, -1), False), ((-1, -1), True), ((100, 50), False)])
@pytest.mark.parametrize("p", [0.1, 0.3])
def test_dropout_keep_fraction(p, window_size, causal):
    """Of the visible entries, 1 - p are kept, within 0.01 (2 x 4 x 512 x 512 entries)."""
    require_kernel(torch.bfloat16, 64)
    q, k, v, _ = make_qkv(2, 512, 512, 4, 4, 64, torch.bfloat16, "cuda")
    _, _, s_dmask = flash_attn.flash_attn_func(q, k, v, dropout_p=p, causal=causal, window_size=window_size,
                                               return_attn_probs=True)
    keep = keep_mask_from_probs(s_dmask, 512, 512)
    visible = window_keep_mask(512, 512, (window_size[0], 0 if causal else window_size[1]), "cuda")
    assert abs(dropped_fraction(keep, visible) - p) <= 0.01


def test_dropout_follows_manual_seed():
    require_kernel(torch.bfloat16, 128)
    q, k, v, _ = make_qkv(2, 300, 300, 4, 4, 128, torch.bfloat16, "cuda")
    torch.manual_seed(5)
    first = flash_attn.flash_attn_func(q, k, v, dropout_p=0.2)
    torch.manual_seed(5)
    second = flash_attn.flash_attn_func(q, k, v, dropout_p=0.2)
    third = flash_attn.flash_attn_func(q, k, v, dropout_p=0.2)
    assert torch.equal(first, second) and not torch.equal(second, third)


DETERMINISTIC_CASES = {  # name: (headdim, kernel, mods, varlen, (seqlen_q, seqlen_k)); dq_order.cuh's walks:
    "hd128_causal_gqa": (128, "default", Mods(causal=True), False, (1500, 1500)),  # descending
    "hd64_window_dropout": (64, "default", Mods(window_size=(300, 100), dropout_p=0.1), False, (1500, 1500)),
    "hd64_window_left": (64, "default", Mods(window_size=(300, -1)), False, (1500, 1500)),  # ascending
    "hd64_varlen_causal": (64, "default", Mods(causal=True), True, (1500, 1500)),
    "hd96_ws": (96, "default", Mods(causal=True, alibi="head"), False, (1500, 1500)),  # on the hd 128 kernel
    "hd96_sm80": (96, "sm80", Mods(causal=True, alibi="head"), False, (1500, 1500)),  # 128-column dq_accum rows
    "hd32_window_varlen": (32, "default", Mods(window_size=(300, 100)), True, (1500, 1500)),  # on the hd 64 kernel
    "hd128_sm80_forced": (128, "sm80", Mods(softcap=10.0), True, (1500, 1500)),  # staggered from here on
    "hd64_full": (64, "default", Mods(), False, (1500, 1500)),
    "hd64_full_varlen_alibi": (64, "default", Mods(alibi="head"), True, (1500, 1500)),
    "hd128_full_more_keys": (128, "default", Mods(), False, (300, 1500)),  # 4 laps per query block
    "hd64_full_laps_share_slices": (64, "default", Mods(), False, (100, 1500)),  # 12 laps, 4 slices
    # the cp.async Hopper backward (the default runs the warp-specialized one for these)
    "hd64_full_cpasync": (64, "cpasync", Mods(), False, (1500, 1500)),
    "hd128_causal_cpasync": (128, "cpasync", Mods(causal=True), True, (1500, 1500)),
    "hd64_short_causal_ws": (64, "ws", Mods(causal=True), False, (700, 700)),
    # hd 256: the head-split Hopper backward, whose dQ writer adds from the query stages
    "hd256_causal_varlen_dropout": (256, "default", Mods(causal=True, dropout_p=0.1), True, (1500, 1500)),
    "hd256_full_more_keys": (256, "default", Mods(), False, (300, 1500)),
    "hd192_window_left_varlen": (192, "default", Mods(window_size=(300, -1)), True, (1500, 1500)),
}


@pytest.mark.parametrize("case", DETERMINISTIC_CASES)
def test_deterministic_backward_is_bitwise_reproducible(monkeypatch, case):
    """deterministic=True: dq, dk, dv bitwise equal over 50 runs (many query blocks per key block,
    so the default backward's dQ atomics would reorder)."""
    headdim, kernel, mods, varlen, (seqlen_q, seqlen_k) = DETERMINISTIC_CASES[case]
    require_kernel(torch.bfloat16, headdim)
    _kernels(monkeypatch, kernel)
    slopes = mods.slopes(2, 8, "cuda")
    kwargs = dict(causal=mods.causal, window_size=mods.window_size, softcap=mods.softcap, alibi_slopes=slopes,
                  dropout_p=mods.dropout_p, deterministic=True)
    q, k, v, dout = make_qkv(2, seqlen_q, seqlen_k, 8, 2, headdim, torch.bfloat16, "cuda")
    if varlen:  # (the varlen cases are 1500 x 1500: sequences of 1000 and 2000)
        q, k, v, dout = (t.reshape(-1, *t.shape[2:]) for t in (q, k, v, dout))
        cu = make_cu_seqlens([1000, 2000], "cuda")
    leaves = [t.requires_grad_() for t in (q, k, v)]
    rng = torch.cuda.get_rng_state()
    first = None
    for _ in range(50):
        torch.cuda.set_rng_state(rng)  # the same dropout mask each run
        out = (flash_attn.flash_attn_varlen_func(*leaves, cu, cu, 2000, 2000, **kwargs) if varlen
               else flash_attn.flash_attn_func(*leaves, **kwargs))
        grads = torch.autograd.grad(out, leaves, dout)
        if first is None:
            first = grads
        for name, g, g0 in zip(("dq", "dk", "dv"), grads, first):
            assert torch.equal(g, g0), f"{name} differs between runs"


@pytest.mark.parametrize("forward", ["ws", "cpasync"])
def test_sanitizer_varlen_offsets_past_the_tensors(monkeypatch, forward):
    """cu_seqlens pointing past total_q / total_k and out of order: the kernels clamp every
    sequence to the tensors' rows, so nothing outside q, k, v, out, lse is read or written (memcheck
    in gpu_check.sh) and the result is finite where a sequence lies inside the tensors. Both Hopper
    forwards: the TMA one's boxes stop at the tensors' extent, its epilogue at the sequence's."""
    require_kernel(torch.bfloat16, 64)
    _sanitizer_forward(monkeypatch, forward)
    total_q, total_k = 200, 150
    q = torch.randn(total_q, 4, 64, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    k, v = (torch.randn(total_k, 2, 64, dtype=torch.bfloat16, device="cuda", requires_grad=True) for _ in range(2))
    cu_q = torch.tensor([0, 100, 90, 5000, 200], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 150, 9000, 20, -7], dtype=torch.int32, device="cuda")
    out = flash_attn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 5000, 9000, dropout_p=0.1, causal=True)
    out.backward(torch.randn_like(out))
    torch.cuda.synchronize()
    assert torch.isfinite(out[:100]).all()
    assert torch.isfinite(q.grad[:100]).all() and torch.isfinite(k.grad).all() and torch.isfinite(v.grad).all()


@pytest.mark.parametrize("forward", ["ws", "cpasync"])
@pytest.mark.parametrize("deterministic", [False, True])
def test_sanitizer_varlen_lengths_zero_and_one(monkeypatch, deterministic, forward):
    require_kernel(torch.bfloat16, 64)
    _sanitizer_forward(monkeypatch, forward)
    check_varlen(Mods(causal=True, window_size=(7, 3), softcap=5.0, alibi="batch", dropout_p=0.1,
                      deterministic=deterministic), [0, 1, 33, 0, 70], [1, 0, 40, 5, 65], 4, 2, 64,
                 torch.bfloat16, "cuda")


@pytest.mark.parametrize("seqlen_q", [1100, 100, 1])
@pytest.mark.parametrize("causal", [False, True])
def test_sanitizer_deterministic_dq_slices(causal, seqlen_q):
    """deterministic=True over 1100 keys: several dQ partial sums (dq_order.cuh), the first add of each
    writing its tile and the convert pass reading only the written ones; with 100 queries the
    staggered walk (not causal) has more laps than slices, which then share them; with 1 query the
    128-query block's second counter lies past the last query (it once fell into the next head's
    counters, and past the buffer for the last head). Against the reference, and under memcheck in
    gpu_check.sh."""
    require_kernel(torch.bfloat16, 64)
    check_dense(Mods(causal=causal, deterministic=True), 1, seqlen_q, 1100, 2, 1, 64, torch.bfloat16, "cuda")
