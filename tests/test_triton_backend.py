"""The portable Triton backend (flash_attn/triton, issue #9): forward and backward against the
reference with the tolerance rule, on the GPU where there is one and otherwise under Triton's
interpreter (TRITON_INTERPRET=1, set by conftest.py on machines without CUDA; CI installs a
Triton whose interpreter runs with its numpy).

fp32 inputs are checked against an fp64 reference: the rule's bound is then the fp32 reference's
own error (times the factor), which the backend's fp32 products ("ieee" dots, no TF32) and fp32
softmax can meet. bf16 runs on the GPU only: Triton's interpreter (3.6 and 3.9) reads bf16
tensors wrongly (errors of 1e9 on a 40 x 64 product), whatever the kernel.
"""

import itertools

import pytest
import torch

triton = pytest.importorskip("triton", reason="triton is not installed")
import triton.language as tl  # noqa: E402 - after the skip above

import flash_attn
from flash_attn import dropout as dropout_lib
from flash_attn.reference import attention_ref
from feature_checks import make_cu_seqlens
from helpers import Results, assert_matches_reference

triton_backend = pytest.importorskip("flash_attn.triton", reason="triton is not installed")
from flash_attn.triton import attention as triton_attention, poison, tuning  # noqa: E402 - after the skip above
from flash_attn.triton import direct_launch, kernels  # noqa: E402 - after the skip above
from flash_attn.triton.kernels import (_full_key_blocks, _full_query_blocks, _key_range, _query_range,  # noqa: E402
                                      _visible)
from triton_checks import assert_descriptors_match_pointers, recorded_descriptors  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE == "cuda" else [])
DTYPE_IDS = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


@pytest.fixture(autouse=True)
def _poisoned_outputs():
    """Every test here runs with the backend's outputs poisoned (flash_attn/triton/poison.py): an
    element its kernels leave unwritten is NaN and fails the comparison."""
    previous = poison.set_poison_outputs(True)
    triton_attention.clear_plans()  # tests here replace deciding functions
    yield
    poison.set_poison_outputs(previous)


def test_poisoned_outputs_start_as_nan():
    assert poison.unwritten((3, 5), dtype=torch.float16, device=DEVICE).isnan().all()
    poison.set_poison_outputs(False)
    assert poison.unwritten((3, 5), dtype=torch.float16, device=DEVICE).shape == (3, 5)


def _switch_on(monkeypatch):
    """FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE, and Triton's interpreter where there is no GPU."""
    if DEVICE == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("FLASH_ATTENTION_TRITON_AMD_ENABLE", "TRUE")


def _count_calls(monkeypatch, module, name):
    """A list that grows by one at each call of module.name (which still runs)."""
    calls, real = [], getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **kw: calls.append(1) or real(*a, **kw))
    return calls


def _compute_dtype(dtype):
    return torch.float64 if dtype == torch.float32 else torch.float32


def _slopes(alibi, batch, nheads):
    if not alibi:
        return None
    return (torch.rand(batch, nheads, device=DEVICE) * 0.5 + 0.05).float()


def _window(causal, window_size):
    left, right = window_size
    return (left, 0) if causal else (left, right)


# (batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, causal, window_size, softcap, alibi)
DENSE_CASES = [
    (2, 70, 75, 4, 2, 32, True, (-1, -1), 0.0, False),
    (1, 33, 129, 2, 1, 64, False, (-1, -1), 0.0, False),
    (2, 100, 60, 2, 2, 40, True, (-1, -1), 0.0, False),
    (1, 90, 90, 4, 4, 64, False, (20, 10), 0.0, False),
    (1, 80, 96, 2, 1, 32, True, (30, -1), 8.0, True),
    (2, 65, 65, 2, 2, 96, False, (-1, -1), 5.0, False),
    # key lengths that fill every key block: the kernels compile no masked walk (non-causal) or the
    # left window's only (kernels.attention_forward_kernel, CLIP_LEFT / CLIP_RIGHT)
    (1, 64, 128, 2, 2, 64, False, (-1, -1), 0.0, False),
    (1, 80, 256, 4, 1, 64, False, (50, -1), 0.0, False),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: DTYPE_IDS[d])
@pytest.mark.parametrize("batch,seqlen_q,seqlen_k,nheads,nheads_k,headdim,causal,window_size,softcap,alibi",
                         DENSE_CASES)
def test_triton_dense(dtype, batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, causal, window_size, softcap,
                      alibi):
    new = lambda s, h: torch.randn(batch, s, h, headdim, dtype=dtype, device=DEVICE)  # noqa: E731
    q, k, v, dout = new(seqlen_q, nheads), new(seqlen_k, nheads_k), new(seqlen_k, nheads_k), new(seqlen_q, nheads)
    slopes = _slopes(alibi, batch, nheads)
    scale = headdim ** -0.5
    options = dict(window=_window(causal, window_size), softcap=softcap, alibi_slopes=slopes)
    out, lse = triton_backend.forward(q, k, v, scale, **options)
    assert out.dtype == dtype and lse.shape == (batch, nheads, seqlen_q) and lse.dtype == torch.float32
    grads = triton_backend.backward(dout, q, k, v, out, lse, scale, **options)
    assert all(g.shape == t.shape and g.dtype == dtype for g, t in zip(grads, (q, k, v)))
    assert_matches_reference(Results(out, lse, *grads), q, k, v, dout, causal, scale, _compute_dtype(dtype),
                             window_size=window_size, softcap=softcap, alibi_slopes=slopes)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: DTYPE_IDS[d])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_triton_varlen(dtype, causal):
    """Packed sequences of very different lengths, 0 and 1 among them, GQA; each sequence against the
    reference run on it alone, and rows of no sequence left at zero."""
    lengths_q = [0, 1, 37, 130, 5, 64]
    lengths_k = lengths_q if causal else [3, 1, 50, 100, 0, 64]
    nheads, nheads_k, headdim = 4, 2, 64
    total_q, total_k = sum(lengths_q) + 3, sum(lengths_k)  # 3 trailing rows outside every sequence
    new = lambda s, h: torch.randn(s, h, headdim, dtype=dtype, device=DEVICE)  # noqa: E731
    q, k, v, dout = new(total_q, nheads), new(total_k, nheads_k), new(total_k, nheads_k), new(total_q, nheads)
    cu_q, cu_k = make_cu_seqlens(lengths_q, DEVICE), make_cu_seqlens(lengths_k, DEVICE)
    scale = headdim ** -0.5
    options = dict(window=(-1, 0) if causal else (-1, -1), cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                   max_seqlen_q=max(lengths_q), max_seqlen_k=max(lengths_k))
    out, lse = triton_backend.forward(q, k, v, scale, **options)
    assert lse.shape == (nheads, total_q)
    dq, dk, dv = triton_backend.backward(dout, q, k, v, out, lse, scale, **options)
    bq, bk = cu_q.tolist(), cu_k.tolist()
    for b in range(len(lengths_q)):
        if lengths_q[b] == 0:
            continue
        rq, rk = slice(bq[b], bq[b + 1]), slice(bk[b], bk[b + 1])
        one = lambda t, rows: t[rows].unsqueeze(0)  # noqa: E731
        ours = Results(one(out, rq), lse[:, rq].unsqueeze(0), one(dq, rq), one(dk, rk), one(dv, rk))
        assert_matches_reference(ours, one(q, rq), one(k, rk), one(v, rk), one(dout, rq), causal, scale,
                                 _compute_dtype(dtype))
    tail = slice(bq[-1], total_q)
    assert not out[tail].any() and not dq[tail].any() and torch.isinf(lse[:, tail]).all()


@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
def test_schedule_groups_change_only_the_order(monkeypatch, varlen):
    """The forward's schedule (attention.pairs_per_group, kernels._scheduled_query_block) orders the
    programs, nothing else: groups of 4 of 6 (head, batch) pairs (the last group short) and a group
    larger than all pairs give out and lse bit-equal to pair by pair, under a causal mask, whose
    query blocks walk different key counts; every (query block, head, batch) runs once, since
    unwritten rows would keep the poison. Query blocks of 16 rows, so that each pair has several."""
    monkeypatch.setenv(tuning.FORWARD_TILE_VARIABLE, "16,16,4,3")
    batch, nheads, headdim = 3, 2, 32
    lengths = [50, 17, 33]
    if varlen:
        cu = make_cu_seqlens(lengths, DEVICE)
        q, k, v = (torch.randn(sum(lengths), nheads, headdim, device=DEVICE) for _ in range(3))
        options = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max(lengths), max_seqlen_k=max(lengths))
    else:
        q, k, v = (torch.randn(batch, 50, nheads, headdim, device=DEVICE) for _ in range(3))
        options = {}
    results = []
    for pairs in (1, 4, 64):
        triton_attention.clear_plans()
        monkeypatch.setattr(triton_attention, "pairs_per_group", lambda *_, pairs=pairs: pairs)
        results.append(triton_backend.forward(q, k, v, headdim ** -0.5, window=(-1, 0), **options))
    (out, lse), others = results[0], results[1:]
    assert torch.isfinite(out).all() and not torch.isnan(lse).any()
    for out_grouped, lse_grouped in others:
        assert torch.equal(out, out_grouped) and torch.equal(lse, lse_grouped)


def test_schedule_group_variable_keys_the_plan(monkeypatch):
    """tuning.SCHEDULE_GROUP_VARIABLE is part of a cached plan's key: the same shapes plan again under
    a new value (here 1 MiB, 81 pairs a group: the 1D grouped grid instead of the 3D one), and the
    output stays bit-equal, the schedule being an order only."""
    monkeypatch.setenv(tuning.FORWARD_TILE_VARIABLE, "16,16,4,3")
    q, k, v = (torch.randn(2, 50, 3, 32, device=DEVICE) for _ in range(3))
    triton_attention.clear_plans()
    outputs, groups = [], []
    for setting in ("0", "1"):
        monkeypatch.setenv(tuning.SCHEDULE_GROUP_VARIABLE, setting)
        outputs.append(triton_backend.forward(q, k, v, 32 ** -0.5, window=(-1, 0)))
        groups.append(sorted(plan.pairs_per_group for plan in triton_attention._forward_plans.plans.values()))
    assert groups == [[1], [1, 81]]  # 1 MiB / (2 x 50 x 32 x 4 B): one group of the 6 pairs there are
    assert all(torch.equal(a, b) for a, b in zip(*outputs))


def test_schedule_group_sizes(monkeypatch):
    """pairs_per_group: groups whose K and V fit in SCHEDULE_GROUP_BYTES for 16-bit inputs on NVIDIA
    GPUs at the measured head dims (128); one pair a group elsewhere, and on other devices; the
    experiment variable's size for every call where it is set, a clear error where it is no number."""
    def problem(seqlen_k, headdim, dtype=torch.bfloat16):
        q = torch.empty(1, 8, 2, headdim, dtype=dtype)
        k = torch.empty(1, seqlen_k, 2, headdim, dtype=dtype)
        return triton_attention._Problem(q, k, None, None, None, None, (-1, 0), 0.0, None, 0.0)

    cpu = torch.device("cpu")
    assert triton_attention.pairs_per_group(problem(1024, 128), cpu) == 1
    monkeypatch.setattr(triton_attention, "_nvidia_16bit", lambda dtype, device: dtype != torch.float32)
    assert triton_attention.pairs_per_group(problem(1024, 128), cpu) == 32  # 16 MB / 512 KB
    assert triton_attention.pairs_per_group(problem(4096, 128, torch.float16), cpu) == 8
    assert triton_attention.pairs_per_group(problem(1 << 20, 128), cpu) == 1
    assert triton_attention.pairs_per_group(problem(1024, 64), cpu) == 1
    assert triton_attention.pairs_per_group(problem(1024, 128, torch.float32), cpu) == 1
    monkeypatch.setenv(tuning.SCHEDULE_GROUP_VARIABLE, "4")  # the experiment override: any head dim and dtype
    assert triton_attention.pairs_per_group(problem(1024, 64), cpu) == 16  # 4 MB / 256 KB
    assert triton_attention.pairs_per_group(problem(1024, 128, torch.float32), cpu) == 4
    monkeypatch.setenv(tuning.SCHEDULE_GROUP_VARIABLE, "0")
    assert triton_attention.pairs_per_group(problem(1024, 128), cpu) == 1
    monkeypatch.setenv(tuning.SCHEDULE_GROUP_VARIABLE, "4.5")
    with pytest.raises(ValueError, match=tuning.SCHEDULE_GROUP_VARIABLE):
        triton_attention.pairs_per_group(problem(1024, 128), cpu)


def test_triton_rejects_other_dtypes():
    q = torch.randn(1, 8, 1, 32, device=DEVICE)
    with pytest.raises(TypeError, match="q must be float32, float16 or bfloat16"):
        triton_backend.forward(q.double(), q, q, 0.1)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: DTYPE_IDS[d])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_triton_dropout(dtype, causal):
    """Dropout 0.17 with a given (seed, offset): forward and backward against the reference with the
    mask of flash_attn/dropout.py (the CUDA kernels' definition), GQA, lengths not multiples of 16."""
    batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, dropout_p = 2, 45, 77, 4, 2, 32, 0.17
    seed, offset = 123456789012, 40
    new = lambda s, h: torch.randn(batch, s, h, headdim, dtype=dtype, device=DEVICE)  # noqa: E731
    q, k, v, dout = new(seqlen_q, nheads), new(seqlen_k, nheads_k), new(seqlen_k, nheads_k), new(seqlen_q, nheads)
    rng_state = torch.tensor([seed, offset], dtype=torch.int64, device=DEVICE)
    scale = headdim ** -0.5
    options = dict(window=(-1, 0) if causal else (-1, -1), dropout_p=dropout_p, rng_state=rng_state)
    out, lse = triton_backend.forward(q, k, v, scale, **options)
    grads = triton_backend.backward(dout, q, k, v, out, lse, scale, **options)
    keep = dropout_lib.keep_mask(seed, offset, batch, nheads, seqlen_q, seqlen_k, dropout_p).to(DEVICE)
    assert_matches_reference(Results(out, lse, *grads), q, k, v, dout, causal, scale, _compute_dtype(dtype),
                             dropout_p=dropout_p, dropout_mask=keep)


# (seqlen_q, seqlen_k, causal, window_size, softcap, alibi, dropout_p) whose query blocks of 16 walk
# masked key blocks before, whole blocks between and masked blocks after (kernels._full_key_blocks),
# and whose key blocks of 32 walk masked, whole and masked query blocks (kernels._full_query_blocks);
# the last three with key lengths of whole blocks (the masked walks compiled only for a window side)
SMALL_TILE_CASES = {
    "window_both_sides": (100, 160, False, (60, 30), 0.0, False, 0.0),
    "causal_more_keys": (70, 150, True, (-1, -1), 0.0, False, 0.0),
    "causal_more_queries": (150, 70, True, (-1, -1), 0.0, False, 0.0),
    "window_softcap_alibi": (90, 90, False, (40, 25), 6.0, True, 0.0),
    "causal_dropout": (64, 96, True, (-1, -1), 0.0, False, 0.2),
    "whole_blocks_only": (90, 128, False, (-1, -1), 0.0, False, 0.0),
    "left_window_whole_blocks": (100, 128, False, (30, -1), 0.0, True, 0.0),
    "causal_whole_blocks": (128, 128, True, (-1, -1), 4.0, False, 0.0),
}


@pytest.mark.parametrize("name", SMALL_TILE_CASES)
def test_walks_of_small_tiles(monkeypatch, name):
    """Forward (16 x 16 tiles) and backward (dK / dV: 16 queries x 32 keys, dQ: 32 x 16) through the
    tile variables of tuning.py: many whole blocks between masked ones, in fp32 against the fp64
    reference."""
    seqlen_q, seqlen_k, causal, window_size, softcap, alibi, dropout_p = SMALL_TILE_CASES[name]
    monkeypatch.setenv(tuning.FORWARD_TILE_VARIABLE, "16,16,4,3")
    monkeypatch.setenv(tuning.DKDV_TILE_VARIABLE, "16,32,4,3")
    monkeypatch.setenv(tuning.DQ_TILE_VARIABLE, "32,16,4,3")
    batch, nheads, nheads_k, headdim, seed, offset = 1, 2, 1, 32, 987654321, 3
    new = lambda s, h: torch.randn(batch, s, h, headdim, device=DEVICE)  # noqa: E731
    q, k, v, dout = new(seqlen_q, nheads), new(seqlen_k, nheads_k), new(seqlen_k, nheads_k), new(seqlen_q, nheads)
    slopes = _slopes(alibi, batch, nheads)
    rng_state = torch.tensor([seed, offset], dtype=torch.int64, device=DEVICE)
    options = dict(window=_window(causal, window_size), softcap=softcap, alibi_slopes=slopes, dropout_p=dropout_p,
                   rng_state=rng_state)
    out, lse = triton_backend.forward(q, k, v, headdim ** -0.5, **options)
    grads = triton_backend.backward(dout, q, k, v, out, lse, headdim ** -0.5, **options)
    mods = dict(window_size=window_size, softcap=softcap, alibi_slopes=slopes)
    if dropout_p > 0:
        keep = dropout_lib.keep_mask(seed, offset, batch, nheads, seqlen_q, seqlen_k, dropout_p).to(DEVICE)
        mods.update(dropout_p=dropout_p, dropout_mask=keep)
    assert_matches_reference(Results(out, lse, *grads), q, k, v, dout, causal, headdim ** -0.5, torch.float64,
                             **mods)


DESCRIPTOR_CASES = {  # (seqlen_q, seqlen_k, nheads, nheads_k, headdim, causal, window_size, softcap, alibi, dropout_p)
    "causal_gqa_padded_head": (70, 93, 4, 2, 40, True, (-1, -1), 0.0, False, 0.0),
    "window_softcap_alibi_mqa": (33, 200, 2, 1, 128, False, (20, 5), 5.0, True, 0.0),
    "dropout": (64, 80, 2, 2, 64, False, (-1, -1), 0.0, False, 0.17),
    "causal_gqa_whole_head": (70, 93, 4, 2, 32, True, (-1, -1), 0.0, False, 0.0),
    "blocks_whole": (64, 128, 2, 2, 64, False, (-1, -1), 0.0, False, 0.0),
}
POINTERS, DEVICE_KV, HOST = (kernels.POINTER_BLOCKS.value, kernels.DEVICE_KV_DESCRIPTORS.value,
                             kernels.HOST_DESCRIPTORS.value)


@pytest.mark.parametrize("name", DESCRIPTOR_CASES)
def test_descriptors_match_the_pointer_loads(monkeypatch, name):
    """The forward's blocks through tensor descriptors (tuning.DESCRIPTORS_VARIABLE): K / V through
    descriptors made on the device, and Q / K / V / Out through descriptors made by the host, give
    the same output and lse as the pointer loads, bit for bit (the copies' zero rows past the
    sequence and zero columns past the head dim stand in for the masked loads; the store stops at
    the sequence's end), and each call took the path asked for (host-made ones only where the head
    dim fills its block: else device-made)."""
    case = DESCRIPTOR_CASES[name]
    seqlen_q, seqlen_k, nheads, nheads_k, headdim, causal, window_size, softcap, alibi, dropout_p = case
    batch, dtype = 2, torch.float16
    new = lambda s, h: torch.randn(batch, s, h, headdim, device=DEVICE, dtype=dtype)  # noqa: E731
    q, k, v = new(seqlen_q, nheads), new(seqlen_k, nheads_k), new(seqlen_k, nheads_k)
    options = dict(window=_window(causal, window_size), softcap=softcap, alibi_slopes=_slopes(alibi, batch, nheads),
                   dropout_p=dropout_p, rng_state=torch.tensor([1234, 5], dtype=torch.int64, device=DEVICE))
    host = HOST if headdim in (16, 32, 64, 128, 256) else DEVICE_KV
    assert_descriptors_match_pointers(monkeypatch, q, k, v, headdim ** -0.5, [DEVICE_KV, host], **options)


def test_host_descriptors_of_packed_and_strided_tensors(monkeypatch):
    """Host-made descriptors over q / k / v sliced from a packed qkv (rows 3 * heads * headdim apart)
    and over a batch-strided k: the same results as the pointer loads. Heads not side by side in a
    row (a transposed layout) take device-made descriptors instead."""
    batch, seqlen, nheads, headdim, dtype = 2, 96, 2, 64, torch.float16
    qkv = torch.randn(batch, seqlen, 3, nheads, headdim, device=DEVICE, dtype=dtype)
    q, k, v = qkv.unbind(2)
    assert_descriptors_match_pointers(monkeypatch, q, k, v, 0.125, [HOST], asked=("2",), window=(-1, 0))
    wide = torch.randn(batch, seqlen + 16, nheads, headdim, device=DEVICE, dtype=dtype)
    assert_descriptors_match_pointers(monkeypatch, q, wide[:, 8:8 + seqlen], v, 0.125, [HOST], asked=("2",))
    k_heads_apart = torch.randn(batch, nheads, seqlen, headdim, device=DEVICE, dtype=dtype).transpose(1, 2)
    assert_descriptors_match_pointers(monkeypatch, q, k_heads_apart, v, 0.125, [DEVICE_KV], asked=("2",))


def test_host_descriptors_without_keys(monkeypatch):
    """No keys (seqlen_k 0): host-made descriptors cannot describe an empty k, so the call takes
    device-made ones and returns out 0 and lse +inf, as the pointer loads do."""
    q = torch.randn(2, 16, 2, 64, device=DEVICE, dtype=torch.float16)
    k = torch.randn(2, 0, 2, 64, device=DEVICE, dtype=torch.float16)
    assert_descriptors_match_pointers(monkeypatch, q, k, k, 0.125, [DEVICE_KV], asked=("2",))
    out, lse = triton_backend.forward(q, k, k, 0.125)
    assert torch.equal(out, torch.zeros_like(out)) and torch.isinf(lse).all()


def test_kv_descriptors_need_addressable_tensors(monkeypatch):
    """K or V that TMA cannot address (a row stride that is no multiple of 16 bytes here) take the
    pointer loads, whichever descriptors are asked for, and the call still runs."""
    q = torch.randn(1, 16, 1, 24, device=DEVICE, dtype=torch.float16)
    kv = torch.randn(1, 40, 2, 25, device=DEVICE, dtype=torch.float16)[..., :24]  # rows 50 bytes apart
    k, v = kv.unbind(2)
    k, v = k.unsqueeze(2), v.unsqueeze(2)
    assert not triton_attention._tma_addressable(k)
    assert_descriptors_match_pointers(monkeypatch, q, k, v, 24 ** -0.5, [POINTERS, POINTERS], asked=("1", "2"))


def test_kv_descriptors_in_varlen_calls(monkeypatch):
    """Packed sequences through the device-made descriptors: each sequence's descriptor starts at its
    own first key (lengths 0 and 1 among them, GQA), and out and lse equal the pointer loads' bit
    for bit, rows of no sequence included. Host-made ones are not for varlen calls (a block would
    run into the next sequence's rows): asked for, the call takes device-made ones."""
    lengths_q, lengths_k = [0, 1, 37, 130, 5], [3, 1, 50, 100, 0]
    nheads, nheads_k, headdim, dtype = 4, 2, 64, torch.bfloat16
    new = lambda s, h: torch.randn(s, h, headdim, dtype=dtype, device=DEVICE)  # noqa: E731
    q, k, v = new(sum(lengths_q) + 3, nheads), new(sum(lengths_k), nheads_k), new(sum(lengths_k), nheads_k)
    options = dict(window=(-1, 0), cu_seqlens_q=make_cu_seqlens(lengths_q, DEVICE),
                   cu_seqlens_k=make_cu_seqlens(lengths_k, DEVICE), max_seqlen_q=130, max_seqlen_k=100)
    assert_descriptors_match_pointers(monkeypatch, q, k, v, headdim ** -0.5, [DEVICE_KV, DEVICE_KV], **options)


def test_descriptors_variable_is_checked(monkeypatch):
    """A value of the descriptors variable other than 0 / 1 / 2 raises, naming the variable."""
    monkeypatch.setenv(tuning.DESCRIPTORS_VARIABLE, "host")
    q = torch.randn(1, 16, 1, 64, device=DEVICE, dtype=torch.float16)
    with pytest.raises(ValueError, match=tuning.DESCRIPTORS_VARIABLE):
        triton_backend.forward(q, q, q, 0.125)


@pytest.mark.skipif(DEVICE != "cuda" or torch.version.hip is not None or torch.cuda.get_device_capability()[0] < 9,
                    reason="the descriptor defaults are for NVIDIA GPUs with TMA")
def test_descriptors_by_default(monkeypatch):
    """Without the variable, the host's tables (_nvidia_16bit_descriptors) choose by head dim, window
    and key length."""
    monkeypatch.delenv(tuning.DESCRIPTORS_VARIABLE, raising=False)
    chosen = recorded_descriptors(monkeypatch)
    cases = ((128, False), (128, True), (64, True), (256, False))
    for headdim, causal in cases:
        q, k, v = (torch.randn(1, 128, 2, headdim, device=DEVICE, dtype=torch.bfloat16) for _ in range(3))
        triton_backend.forward(q, k, v, headdim ** -0.5, window=(-1, 0) if causal else (-1, -1))
    assert chosen == [triton_attention._nvidia_16bit_descriptors(headdim, causal, 128)[0]
                      for headdim, causal in cases]


def test_descriptor_table_by_key_length():
    """NVIDIA_16BIT_HOST_DESCRIPTOR_KEYS' key ranges include both ends; outside them, and where a call
    cannot take host-made descriptors, NVIDIA_16BIT_DESCRIPTORS' source holds."""
    table = triton_attention._nvidia_16bit_descriptors
    for (block_d, right_window), (first, last) in triton_attention.NVIDIA_16BIT_HOST_DESCRIPTOR_KEYS.items():
        other = triton_attention.NVIDIA_16BIT_DESCRIPTORS[(block_d, right_window)]
        assert table(block_d, right_window, first) == (HOST, other)
        if first > 0:
            assert table(block_d, right_window, first - 1) == (other, other)
        if last is not None:
            assert table(block_d, right_window, last) == (HOST, other)
            assert table(block_d, right_window, last + 1) == (other, other)
    assert table(64, False, 4096) == (POINTERS, POINTERS)
    assert table(32, True, 2048) == (HOST, POINTERS)  # padded to 64


def test_offsets_past_int32_are_refused():
    """The Triton kernels index with 32-bit offsets: a tensor whose farthest element lies 2^31 or more
    elements from its start is refused with an error naming it (meta tensors: no memory behind them),
    one just below passes; in flash_attn_with_kvcache the split-KV buffer is checked before the append
    writes the cache (the append kernel cannot launch on meta tensors, so the error proves the order),
    and so is each KV cache page, while the cache as a whole may pass 2^31 elements."""
    from flash_attn.triton import attention, kvcache

    limit = attention.OFFSET_LIMIT
    below = torch.empty_strided((2, 3, 4, 64), (limit - 1 - 2 * 256 - 3 * 64 - 63, 256, 64, 1), device="meta",
                                dtype=torch.float16)
    attention.check_tensors(q=below)
    far = torch.empty_strided((2, 3, 4, 64), (limit, 256, 64, 1), device="meta", dtype=torch.float16)
    with pytest.raises(ValueError, match=r"Triton backend: v spans \d+ elements.*32-bit offsets"):
        attention.check_tensors(q=below, v=far)
    q = torch.empty(1, 8192, 32, 128, device="meta", dtype=torch.float16)  # 128 splits x 2^25 elements
    cache = torch.empty(1, 8192, 32, 128, device="meta", dtype=torch.float16)
    new = torch.empty(1, 16, 32, 128, device="meta", dtype=torch.float16)
    seqlens = torch.zeros(1, device="meta", dtype=torch.int32)
    with pytest.raises(ValueError, match="split-KV partial outputs"):
        kvcache.forward_kvcache(q, cache, cache, new, new, None, None, seqlens, None, None, None, 0.1, (-1, -1), 0.0,
                                False, None, 128)
    # A KV cache may pass 2^31 elements (pages are addressed in int64), one page may not (rows in int32).
    q = torch.empty(1, 1, 8, 128, device="meta", dtype=torch.float16)
    new = torch.empty(1, 1, 8, 128, device="meta", dtype=torch.float16)
    one_huge_page = torch.empty(1, limit // 1024 + 1, 8, 128, device="meta", dtype=torch.float16)
    with pytest.raises(ValueError, match="a k_cache page"):
        kvcache.forward_kvcache(q, one_huge_page, one_huge_page, new, new, None, None, seqlens, None, None, None, 0.1,
                                (-1, -1), 0.0, False, None, 1)
    attention.check_tensors(k_cache=torch.empty(limit // 2**18 + 1, 256, 8, 128, device="meta"), wide=("k_cache",))


def test_grid_dims_past_cuda_limits_are_refused():
    """The kernels' grids put heads on grid y and sequences on z, which CUDA caps at 65535: a dense
    batch, a varlen sequence count or a head count past it is refused with an error naming it before
    any kernel runs (meta tensors: nothing could run), in flash_attn_with_kvcache before the append
    writes the cache; 65535 passes the check. A requested num_splits shrinks to fit batch x splits
    in grid z."""
    from flash_attn.triton import attention, kvcache

    cap = attention.MAX_GRID_YZ

    def meta(*shape):
        return torch.empty(*shape, device="meta", dtype=torch.float16)

    with pytest.raises(ValueError, match=f"batch must be at most {cap}"):
        triton_backend.forward(meta(cap + 1, 2, 1, 16), meta(cap + 1, 2, 1, 16), meta(cap + 1, 2, 1, 16), 0.25)
    with pytest.raises(ValueError, match=f"nheads must be at most {cap}"):
        triton_backend.forward(meta(1, 2, cap + 1, 16), meta(1, 2, 1, 16), meta(1, 2, 1, 16), 0.25)
    cu = torch.zeros(cap + 2, device="meta", dtype=torch.int32)
    with pytest.raises(ValueError, match=r"number of sequences \(cu_seqlens_q's length - 1\) must be at most"):
        triton_backend.forward(meta(8, 1, 16), meta(8, 1, 16), meta(8, 1, 16), 0.25, cu_seqlens_q=cu,
                               cu_seqlens_k=cu, max_seqlen_q=1, max_seqlen_k=1)
    attention.check_grid_dims(batch=cap, nheads=cap)
    q, cache, seqlens = meta(cap + 1, 1, 1, 16), meta(cap + 1, 8, 1, 16), torch.zeros(cap + 1, dtype=torch.int32)
    with pytest.raises(ValueError, match=f"batch must be at most {cap}"):
        kvcache.forward_kvcache(q, cache, cache, q, q, None, None, seqlens, None, None, None, 0.25, (-1, -1), 0.0,
                                False, None, 1)
    cpu = torch.device("cpu")
    assert kvcache._num_splits(64, 1, 100, 2048, cpu) == cap // 2048 == 31
    assert kvcache._num_splits(64, 1, 100, 2, cpu) == 64


def test_forward_launch_options(monkeypatch):
    """The forward's fixed launch: the portable 64 x 64 / 32 x 32 blocks with Triton's default warps
    and stages for fp32, CPU tensors and (on ROCm) everything 16-bit and fp8; on NVIDIA GPUs 16-bit
    inputs take NVIDIA_16BIT_FORWARD_TILES (by padded head dim and right window; at hd 128 under a
    right window up to SHORT_WALK_KEYS keys the capped short tile, without one on host-made
    descriptors NVIDIA_16BIT_SHORT_HOST_TILE up to as many keys); fp8 up to head
    dim 128 takes FP8_FORWARD_TILE, or under a right window FP8_SHORT_RIGHT_WINDOW_TILE up to
    FP8_SHORT_WALK_KEYS keys and FP8_RIGHT_WINDOW_TILE beyond, and FP8_WIDE_HEAD_TILE above head dim
    128 (not on ROCm); each variable overrides its own."""
    from flash_attn.triton import attention

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert attention._forward_launch(128, torch.float32, cuda) == dict(BLOCK_M=64, BLOCK_N=64)
    assert attention._forward_launch(256, torch.float32, cuda) == dict(BLOCK_M=32, BLOCK_N=32)
    assert attention._forward_launch(128, torch.bfloat16, cpu) == dict(BLOCK_M=64, BLOCK_N=64)
    assert attention._forward_launch(256, torch.bfloat16, cpu) == dict(BLOCK_M=32, BLOCK_N=32)
    nvidia = torch.version.hip is None
    for dtype, block_d, right_window in itertools.product((torch.float16, torch.bfloat16), (32, 64, 128, 256),
                                                          (False, True)):
        tile = attention.NVIDIA_16BIT_FORWARD_TILES[(max(64, block_d), right_window)]
        expected = tile.launch_options() if nvidia else attention._launch_options(None, block_d)
        long = attention.SHORT_WALK_KEYS + 1
        assert attention._forward_launch(block_d, dtype, cuda, right_window, seqlen_k=long) == expected
        short_tile = attention.NVIDIA_16BIT_SHORT_RIGHT_WINDOW_TILE.launch_options()
        short_keys = attention.SHORT_WALK_KEYS
        short = attention._forward_launch(block_d, dtype, cuda, right_window, seqlen_k=short_keys)
        assert short == (short_tile if nvidia and right_window and block_d == 128 else expected)
        host_short = attention._forward_launch(block_d, dtype, cuda, right_window, seqlen_k=short_keys,
                                               host_descriptors=True)
        host_tile = attention.NVIDIA_16BIT_SHORT_HOST_TILE.launch_options()
        assert host_short == (host_tile if nvidia and not right_window and block_d == 128 else short)
        assert attention._forward_launch(block_d, dtype, cuda, right_window, seqlen_k=long,
                                         host_descriptors=True) == expected
    wide_fp8 = attention.FP8_WIDE_HEAD_TILE.launch_options() if nvidia else dict(BLOCK_M=32, BLOCK_N=32)
    for right_window in (False, True):
        assert attention._forward_launch(256, attention.FP8_DTYPE, cuda, right_window, seqlen_k=100) == wide_fp8
    if nvidia:
        assert attention._forward_launch(128, attention.FP8_DTYPE, cuda) == attention.FP8_FORWARD_TILE.launch_options()
        short, long = attention.FP8_SHORT_WALK_KEYS, attention.FP8_SHORT_WALK_KEYS + 1
        assert (attention._forward_launch(128, attention.FP8_DTYPE, cuda, right_window=True, seqlen_k=short)
                == attention.FP8_SHORT_RIGHT_WINDOW_TILE.launch_options())
        assert (attention._forward_launch(128, attention.FP8_DTYPE, cuda, right_window=True, seqlen_k=long)
                == attention.FP8_RIGHT_WINDOW_TILE.launch_options())
        assert (attention._forward_launch(128, attention.FP8_DTYPE, cuda, seqlen_k=long)
                == attention.FP8_FORWARD_TILE.launch_options())
    monkeypatch.setenv(tuning.FP8_FORWARD_TILE_VARIABLE, "128,64,4,2")
    assert attention._forward_launch(64, attention.FP8_DTYPE, cuda) == dict(BLOCK_M=128, BLOCK_N=64, num_warps=4,
                                                                             num_stages=2)
    assert attention._forward_launch(64, torch.float32, cuda) == dict(BLOCK_M=64, BLOCK_N=64)
    monkeypatch.setenv(tuning.FORWARD_TILE_VARIABLE, "32,16,4,3")
    assert attention._forward_launch(64, torch.float16, cpu) == dict(BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=3)


def test_backward_launch_options(monkeypatch):
    """The backward's fixed launches (dK / dV, dQ): the NVIDIA 16-bit tiles of the padded head dim on
    NVIDIA GPUs, the portable blocks elsewhere; DKDV_TILE_VARIABLE / DQ_TILE_VARIABLE override
    each kernel's."""
    from flash_attn.triton import attention

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    portable = (dict(BLOCK_M=64, BLOCK_N=64), dict(BLOCK_M=64, BLOCK_N=64))
    assert attention._backward_launches(128, torch.float32, cuda) == portable
    assert attention._backward_launches(64, torch.float16, cpu) == portable
    assert attention._backward_launches(256, torch.float32, cuda) == (dict(BLOCK_M=32, BLOCK_N=32),) * 2
    assert attention._backward_launches(256, torch.bfloat16, cpu) == (dict(BLOCK_M=32, BLOCK_N=32),) * 2
    if torch.version.hip is None:
        for block_d, tiles in ((32, attention.NVIDIA_16BIT_BACKWARD_TILES[64]),
                               (128, attention.NVIDIA_16BIT_BACKWARD_TILES[128]),
                               (256, attention.NVIDIA_16BIT_BACKWARD_TILES[256])):
            expected = tuple(tile.launch_options() for tile in tiles)
            assert attention._backward_launches(block_d, torch.bfloat16, cuda) == expected
    monkeypatch.setenv(tuning.DQ_TILE_VARIABLE, "32,16,4,2")
    dkdv, dq = attention._backward_launches(64, torch.float16, cpu)
    assert dkdv == portable[0] and dq == dict(BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=2)


def test_forward_plans_are_reused_by_key(monkeypatch):
    """Dense calls of one key (shapes, strides, dtypes, device, k / v alignment, flags, tile variables)
    reuse one _ForwardPlan; another stride, window or variable makes a new one; a cached plan holds
    no tensor; the cache stays within PLAN_CACHE_SIZE; and every call matches the reference."""
    if DEVICE == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    built = _count_calls(monkeypatch, triton_attention, "_ForwardPlan")
    q, k, v = (torch.randn(2, 24, 2, 32, device=DEVICE) for _ in range(3))
    wide_k = torch.randn(2, 24, 4, 32, device=DEVICE)[:, :, ::2]  # k as a strided view: another key

    def check(q, k, v, window):
        out, lse = triton_backend.forward(q, k, v, 0.3, window)
        expected, expected_lse = attention_ref(q, k, v, causal=window == (-1, 0), softmax_scale=0.3,
                                               compute_dtype=torch.float64)
        torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)  # fp32 ("ieee" dots)
        torch.testing.assert_close(lse.double(), expected_lse, atol=1e-5, rtol=1e-5)

    check(q, k, v, (-1, -1))
    check(q, k, v, (-1, -1))
    assert len(built) == 1
    check(torch.randn_like(q), torch.randn_like(k), torch.randn_like(v), (-1, -1))  # new data, same key
    assert len(built) == 1
    check(q, wide_k, v, (-1, -1))
    check(q, k, v, (-1, 0))
    assert len(built) == 3
    monkeypatch.setenv(tuning.FORWARD_TILE_VARIABLE, "32,32,4,2")
    check(q, k, v, (-1, 0))
    assert len(built) == 4
    for plan in triton_attention._forward_plans.plans.values():
        held = list(vars(plan).values()) + [cell.cell_contents for cell in plan.grid.__closure__]
        assert not any(torch.is_tensor(value) for value in held)
    monkeypatch.setattr(triton_attention, "PLAN_CACHE_SIZE", 2)
    check(q[:, :20], k, v, (-1, -1))
    assert len(triton_attention._forward_plans.plans) <= 2


def test_backward_plans_are_reused_by_key(monkeypatch):
    """Dense backward calls of one layout and flags reuse one _BackwardPlan, GQA and a strided dout
    included; each call's gradients match the reference's; a cached plan holds no tensor."""
    if DEVICE == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    built = _count_calls(monkeypatch, triton_attention, "_BackwardPlan")
    q = torch.randn(2, 24, 4, 32, device=DEVICE).requires_grad_()
    k, v = (torch.randn(2, 30, 2, 32, device=DEVICE).requires_grad_() for _ in range(2))

    def check(dout):
        out, lse = triton_backend.forward(q, k, v, 0.3, (-1, 0))
        grads = triton_backend.backward(dout, q, k, v, out, lse, 0.3, (-1, 0))
        expected, _ = attention_ref(q, k, v, causal=True, softmax_scale=0.3, compute_dtype=torch.float64)
        for got, want in zip(grads, torch.autograd.grad(expected, (q, k, v), dout.double())):
            torch.testing.assert_close(got.double(), want.double(), atol=1e-4, rtol=1e-4)  # fp32 ("ieee" dots)

    check(torch.randn(2, 24, 4, 32, device=DEVICE))
    check(torch.randn(2, 24, 4, 32, device=DEVICE))
    assert len(built) == 1
    check(torch.randn(2, 24, 4, 64, device=DEVICE)[..., ::2])  # dout with a strided last dimension
    assert len(built) == 2
    for plan in triton_attention._backward_plans.plans.values():
        held = list(vars(plan).values()) + [cell.cell_contents for grid in (plan.key_grid, plan.query_grid)
                                            for cell in grid.__closure__]
        assert not any(torch.is_tensor(value) for value in held)


def _bound_launches(plans):
    """The direct_launch.BoundLaunch objects of cached plans (forward: one; backward: three)."""
    found = []
    for plan in plans.plans.values():
        for value in vars(plan).values():
            found += [value] if isinstance(value, direct_launch.BoundLaunch) else []
            found += [value["bound"]] if isinstance(value, dict) and "bound" in value else []
    return found


def test_cached_plans_launch_directly_and_stay_correct(monkeypatch):
    """Dense calls after a plan's first launch its kernels directly (direct_launch.BoundLaunch) on a
    GPU, with new data and another softmax_scale; a q of the same key but not 16-byte aligned goes
    through the JIT again; every call's output and gradients match the reference. Under the
    interpreter (no compiled kernel) nothing launches directly."""
    if DEVICE == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    storage = torch.randn(2 * 24 * 2 * 32 + 1, device=DEVICE)
    aligned_q, misaligned_q = storage[:-1].view(2, 24, 2, 32), storage[1:].view(2, 24, 2, 32)

    def check(q, scale):
        q = q.detach().clone() if q.data_ptr() % 16 == 0 else q.detach()
        q.requires_grad_()
        k, v = (torch.randn(2, 30, 2, 32, device=DEVICE).requires_grad_() for _ in range(2))
        dout = torch.randn_like(q)
        out, lse = triton_backend.forward(q, k, v, scale, (-1, 0))
        grads = triton_backend.backward(dout, q, k, v, out, lse, scale, (-1, 0))
        expected, _ = attention_ref(q, k, v, causal=True, softmax_scale=scale, compute_dtype=torch.float64)
        torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)  # fp32 ("ieee" dots)
        for got, want in zip(grads, torch.autograd.grad(expected, (q, k, v), dout.double())):
            torch.testing.assert_close(got.double(), want.double(), atol=1e-4, rtol=1e-4)

    def direct_counts():
        return [bound.direct_launches for plans in (triton_attention._forward_plans, triton_attention._backward_plans)
                for bound in _bound_launches(plans)]

    check(aligned_q, 0.3)
    assert direct_counts() == [0, 0, 0, 0]  # forward; delta, dK / dV, dQ: first calls go through the JIT
    check(torch.randn_like(aligned_q), 0.25)
    once = 1 if DEVICE == "cuda" else 0
    assert direct_counts() == [once] * 4
    check(misaligned_q, 0.3)
    assert misaligned_q.data_ptr() % 16 != 0 and direct_counts()[0] == once  # the forward's q: the JIT again
    for bound in _bound_launches(triton_attention._forward_plans) + _bound_launches(triton_attention._backward_plans):
        assert not any(torch.is_tensor(value) for value in vars(bound).values())


def test_forward_tile_variable_is_checked(monkeypatch):
    monkeypatch.setenv(tuning.FORWARD_TILE_VARIABLE, "128,64,8")
    q = torch.randn(1, 8, 1, 32, device=DEVICE)
    with pytest.raises(ValueError, match="FLASH_ATTENTION_TRITON_FORWARD_TILE must be four or five integers"):
        triton_backend.forward(q, q, q, 0.1)


def test_forward_tile_variable_takes_a_register_cap(monkeypatch):
    """A fifth integer is Triton's maxnreg: the launch options carry it, and the launch runs with it."""
    monkeypatch.setenv(tuning.FORWARD_TILE_VARIABLE, "32,32,4,2,128")
    assert tuning.tile_from_environment(tuning.FORWARD_TILE_VARIABLE, None).launch_options() == dict(
        BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=2, maxnreg=128)
    if DEVICE == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    q, k, v = (torch.randn(1, 40, 2, 32, device=DEVICE) for _ in range(3))
    out, _ = triton_backend.forward(q, k, v, 0.2, (-1, 0))
    expected, _ = attention_ref(q, k, v, causal=True, softmax_scale=0.2, compute_dtype=torch.float64)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)  # fp32 kernel ("ieee" dots)


@triton.jit
def _walk_bounds_kernel(Params, Bounds, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, QUERY_WALK: tl.constexpr):
    """Bounds[case] = (lo, full_lo, full_hi, hi) of Params[case] = (start, seqlen_q, seqlen_k, left,
    right): the key walk of the query block at `start` (forward, dQ), or with QUERY_WALK the query
    walk of the key block there (dK / dV)."""
    params = Params + 5 * tl.program_id(0)
    start, seqlen_q, seqlen_k = tl.load(params), tl.load(params + 1), tl.load(params + 2)
    left, right = tl.load(params + 3), tl.load(params + 4)
    if QUERY_WALK:
        lo, hi = _query_range(start, BLOCK_N, seqlen_q, seqlen_k, left, right, BLOCK_M)
        full_lo, full_hi = _full_query_blocks(start, lo, hi, seqlen_q, seqlen_k, left, right, BLOCK_M, BLOCK_N)
    else:
        lo, hi = _key_range(start, BLOCK_M, seqlen_q, seqlen_k, left, right, BLOCK_N)
        full_lo, full_hi = _full_key_blocks(start, lo, hi, seqlen_q, seqlen_k, left, right, BLOCK_M, BLOCK_N)
    bounds = Bounds + 4 * tl.program_id(0)
    tl.store(bounds, lo)
    tl.store(bounds + 1, full_lo)
    tl.store(bounds + 2, full_hi)
    tl.store(bounds + 3, hi)


def _visible_keys(m0, block_m, seqlen_q, seqlen_k, left, right):
    """Bool (rows, seqlen_k): which keys the queries [m0, m0 + block_m) of the sequence see."""
    rows = torch.arange(m0, min(m0 + block_m, seqlen_q))[:, None]
    cols = torch.arange(seqlen_k)[None, :]
    diagonal = rows + seqlen_k - seqlen_q
    visible = cols >= 0
    if right >= 0:
        visible = visible & (cols <= diagonal + right)
    if left >= 0:
        visible = visible & (cols >= diagonal - left)
    return visible


def _random_walk_cases(block_m, block_n, blocks_of):
    """300 random (block start, seqlen_q, seqlen_k, left, right): windows or -1, every third key
    length rounded up to a whole number of key blocks; the start a multiple of the block of
    `blocks_of` ("queries": block_m, "keys": block_n) inside its sequence."""
    generator = torch.Generator().manual_seed(block_m * 1000 + block_n + (blocks_of == "keys"))
    cases = []
    for index in range(300):
        seqlen_q, seqlen_k = (int(n) for n in torch.randint(1, 200, (2,), generator=generator))
        if index % 3 == 0:
            seqlen_k = triton.cdiv(seqlen_k, block_n) * block_n
        left, right = (int(w) if w < 120 else -1 for w in torch.randint(0, 160, (2,), generator=generator))
        length, block = (seqlen_q, block_m) if blocks_of == "queries" else (seqlen_k, block_n)
        start = int(torch.randint(0, triton.cdiv(length, block), (1,), generator=generator)) * block
        cases.append((start, seqlen_q, seqlen_k, left, right))
    return cases


@pytest.mark.parametrize("block_m,block_n", [(16, 16), (32, 16), (16, 64)])
def test_full_key_blocks_are_seen_whole(block_m, block_n):
    """For random lengths and windows: the walk [lo, hi) holds every visible key, and the blocks of
    [full_lo, full_hi) (lo <= full_lo <= full_hi, within the walk's blocks) are visible to every query.
    Without a left window there is no masked walk before the whole blocks, and without a right window
    and with whole key blocks none after them (the kernels compile those walks only then)."""
    cases = _random_walk_cases(block_m, block_n, "queries")
    bounds = torch.empty(len(cases), 4, dtype=torch.int32, device=DEVICE)
    _walk_bounds_kernel[(len(cases),)](torch.tensor(cases, dtype=torch.int32, device=DEVICE), bounds,
                                       BLOCK_M=block_m, BLOCK_N=block_n, QUERY_WALK=False)
    for (m0, seqlen_q, seqlen_k, left, right), (lo, full_lo, full_hi, hi) in zip(cases, bounds.tolist()):
        visible = _visible_keys(m0, block_m, seqlen_q, seqlen_k, left, right)
        end = lo + triton.cdiv(max(hi - lo, 0), block_n) * block_n
        assert lo % block_n == 0 and full_lo % block_n == 0 and full_hi % block_n == 0
        assert lo <= full_lo <= full_hi <= end
        assert not visible[:, :lo].any() and not visible[:, max(hi, 0):].any()
        assert full_lo == full_hi or (full_hi <= seqlen_k and visible[:, full_lo:full_hi].all())
        assert left >= 0 or full_lo == lo
        assert right >= 0 or seqlen_k % block_n != 0 or full_hi == end


@pytest.mark.parametrize("block_m,block_n", [(16, 16), (16, 32), (64, 16)])
def test_full_query_blocks_see_the_key_block(block_m, block_n):
    """The dK / dV walk of a key block [n0, n0 + block_n): [lo, hi) holds every query that sees one of
    its keys, and every query (before seqlen_q) of the blocks [full_lo, full_hi) sees all of them,
    the block lying inside the keys. Without a right window and with whole key blocks there is no
    masked walk before the whole blocks, and without a left window none after them."""
    cases = _random_walk_cases(block_m, block_n, "keys")
    bounds = torch.empty(len(cases), 4, dtype=torch.int32, device=DEVICE)
    _walk_bounds_kernel[(len(cases),)](torch.tensor(cases, dtype=torch.int32, device=DEVICE), bounds,
                                       BLOCK_M=block_m, BLOCK_N=block_n, QUERY_WALK=True)
    for (n0, seqlen_q, seqlen_k, left, right), (lo, full_lo, full_hi, hi) in zip(cases, bounds.tolist()):
        visible = _visible_keys(0, seqlen_q, seqlen_q, seqlen_k, left, right)[:, n0:n0 + block_n]
        end = lo + triton.cdiv(max(hi - lo, 0), block_m) * block_m
        assert lo % block_m == 0 and full_lo % block_m == 0 and full_hi % block_m == 0
        assert lo <= full_lo <= full_hi <= end
        assert not visible[:lo].any() and not visible[max(hi, 0):].any()
        assert full_lo == full_hi or (n0 + block_n <= seqlen_k and visible[full_lo:full_hi].all())
        assert right >= 0 or seqlen_k % block_n != 0 or full_lo == lo
        assert left >= 0 or full_hi == end


@triton.jit
def _visible_kernel(Params, Visible, ROWS: tl.constexpr, COLS: tl.constexpr, LEFT_BOUNDED: tl.constexpr,
                    BOUNDS_BY_KEY: tl.constexpr):
    """Visible[case] = kernels._visible over queries [0, ROWS) x keys [0, COLS) for Params[case] =
    (seqlen_q, seqlen_k, left, right), as int8."""
    params = Params + 4 * tl.program_id(0)
    seqlen_q, seqlen_k, left, right = tl.load(params), tl.load(params + 1), tl.load(params + 2), tl.load(params + 3)
    i, j = tl.arange(0, ROWS)[:, None], tl.arange(0, COLS)[None, :]
    visible = _visible(i, j, seqlen_q, seqlen_k, left, right, LEFT_BOUNDED, BOUNDS_BY_KEY)
    tl.store(Visible + tl.program_id(0) * ROWS * COLS + i * COLS + j, visible.to(tl.int8))


@pytest.mark.parametrize("bounds_by_key", [False, True], ids=["by_query", "by_key"])
@pytest.mark.parametrize("left_bounded", [False, True], ids=["no_left_compare", "left_compare"])
def test_visible_is_the_window_rule(bounds_by_key, left_bounded):
    """kernels._visible for random lengths and windows (or -1), keys past seqlen_k included, against
    the rule written out: key j exists (j < seqlen_k) and lies in query i's bottom-right aligned
    window. Rows past seqlen_q are left out (the kernels do not mask them). Without the left compare
    the cases have no left window, as the kernels' CLIP_LEFT guarantees."""
    generator = torch.Generator().manual_seed(2 * bounds_by_key + left_bounded)
    rows = cols = 128
    cases = []
    for _ in range(200):
        seqlen_q, seqlen_k = (int(n) for n in torch.randint(1, 110, (2,), generator=generator))
        left, right = (int(w) if w < 90 else -1 for w in torch.randint(0, 120, (2,), generator=generator))
        cases.append((seqlen_q, seqlen_k, left if left_bounded else -1, right))
    visible = torch.empty(len(cases), rows, cols, dtype=torch.int8, device=DEVICE)
    _visible_kernel[(len(cases),)](torch.tensor(cases, dtype=torch.int32, device=DEVICE), visible, ROWS=rows,
                                   COLS=cols, LEFT_BOUNDED=left_bounded, BOUNDS_BY_KEY=bounds_by_key)
    for case, (seqlen_q, seqlen_k, left, right) in enumerate(cases):
        expected = torch.zeros(seqlen_q, cols, dtype=torch.bool)
        expected[:, :seqlen_k] = _visible_keys(0, seqlen_q, seqlen_q, seqlen_k, left, right)
        assert torch.equal(visible[case, :seqlen_q].bool().cpu(), expected), (seqlen_q, seqlen_k, left, right)


def test_triton_varlen_metadata_out_of_range():
    """cu_seqlens past the tensors' rows and decreasing: the kernels clamp every entry into [0, total]
    (as the CUDA kernels do) and stay inside the tensors. Sequence 1, [12, 1000), becomes rows
    [12, 40), the later ones empty; sequences 0 and 1 are then exact."""
    nheads, headdim, total = 2, 32, 40
    q, k, v, dout = (torch.randn(total, nheads, headdim, device=DEVICE) for _ in range(4))
    cu = torch.tensor([0, 12, 1000, 2000, -7], dtype=torch.int32, device=DEVICE)
    options = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=64, max_seqlen_k=64)
    out, lse = triton_backend.forward(q, k, v, headdim ** -0.5, **options)
    dq, dk, dv = triton_backend.backward(dout, q, k, v, out, lse, headdim ** -0.5, **options)
    for rows in (slice(0, 12), slice(12, 40)):
        one = lambda t: t[rows].unsqueeze(0)  # noqa: E731
        ours = Results(one(out), lse[:, rows].unsqueeze(0), one(dq), one(dk), one(dv))
        assert_matches_reference(ours, one(q), one(k), one(v), one(dout), False, headdim ** -0.5, torch.float64)


@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
def test_triton_backward_of_packed_views(varlen):
    """q, k, v slices of one packed tensor (rows 3 x nheads x headdim apart): dQ, dK, dV are tensors of
    their own, so each kernel must write with its output's strides, not its input's (the GPU suite's
    qkvpacked tests found dQ written with q's row stride, past the end of dQ)."""
    rows, nheads, headdim = 45, 2, 32
    shape = (rows, 3, nheads, headdim) if varlen else (1, rows, 3, nheads, headdim)
    qkv = torch.randn(shape, dtype=torch.float32, device=DEVICE)
    q, k, v = qkv.unbind(-3)
    dout = torch.randn(q.shape, dtype=torch.float32, device=DEVICE)
    cu = torch.tensor([0, 17, rows], dtype=torch.int32, device=DEVICE)
    options = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=28, max_seqlen_k=28) if varlen else {}
    scale = headdim ** -0.5
    out, lse = triton_backend.forward(q, k, v, scale, **options)
    grads = triton_backend.backward(dout, q, k, v, out, lse, scale, **options)
    pieces = [slice(0, 17), slice(17, rows)] if varlen else [slice(None)]
    for piece in pieces:
        one = (lambda t: t[piece].unsqueeze(0)) if varlen else (lambda t: t)  # noqa: E731
        lse_rows = lse[:, piece].unsqueeze(0) if varlen else lse
        assert_matches_reference(Results(one(out), lse_rows, *(one(g) for g in grads)), one(q), one(k), one(v),
                                 one(dout), False, scale, torch.float64)


def _public_call(function, q, k, v, dout, **kwargs):
    """function(q, k, v, return_attn_probs=True, **kwargs)'s forward (out, lse) and backward (dq, dk,
    dv) as a Results; function may be compiled."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out, lse, _ = function(*leaves, return_attn_probs=True, **kwargs)
    return Results(out, lse, *torch.autograd.grad(out, leaves, dout))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: DTYPE_IDS[d])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_switch_sends_the_public_functions_to_triton(monkeypatch, dtype, compiled):
    """FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE: flash_attn_func runs flash_attn::triton_fwd / bwd (the
    backend's forward is counted), also under torch.compile(fullgraph=True), with the public
    function's semantics (causal, GQA, a head dim the public functions pad)."""
    _switch_on(monkeypatch)
    calls = _count_calls(monkeypatch, triton_backend.attention, "forward")
    q, k, v, dout = (torch.randn(2, 50, h, 36, dtype=dtype, device=DEVICE) for h in (4, 2, 2, 4))
    function = flash_attn.flash_attn_func
    if compiled:
        function = torch.compile(function, fullgraph=True, backend="aot_eager")
    ours = _public_call(function, q, k, v, dout, causal=True)
    assert calls
    assert_matches_reference(ours, q, k, v, dout, True, None, _compute_dtype(dtype))


def test_float32_cpu_tensors_run_the_cpu_path():
    """Without the switch, float32 CPU tensors no longer raise: the CPU path computes them (against
    an fp64 reference)."""
    q, k, v, dout = (torch.randn(1, 20, 2, 16) for _ in range(4))
    ours = _public_call(flash_attn.flash_attn_func, q, k, v, dout)
    assert ours.out.dtype == torch.float32
    assert_matches_reference(ours, q, k, v, dout, False, None, torch.float64)


def test_switch_with_dropout_returns_the_mask_it_used(monkeypatch):
    """Through the public function with the switch: dropout_p and return_attn_probs give S_dmask whose
    sign pattern (FlashAttention 2's encoding) is the mask of the rng_state the Triton forward drew,
    and the output matches the reference under that mask."""
    _switch_on(monkeypatch)
    from feature_checks import keep_mask_from_probs
    q, k, v = (torch.randn(1, 40, 2, 32, device=DEVICE) for _ in range(3))
    out, lse, s_dmask = flash_attn.flash_attn_func(q, k, v, dropout_p=0.25, return_attn_probs=True)
    keep = keep_mask_from_probs(s_dmask, 40, 40)
    assert 0.6 < keep.float().mean().item() < 0.9
    dout = torch.randn_like(q)
    assert_matches_reference(Results(out, lse, None, None, None), q, k, v, dout, False, None, torch.float64,
                             dropout_p=0.25, dropout_mask=keep)


@pytest.mark.parametrize("batch,heads,seqlen_q,seqlen_k", [(2, 3, 45, 77), (1, 2, 130, 1), (1, 1, 0, 5)])
def test_keep_mask_kernel_draws_the_definition(batch, heads, seqlen_q, seqlen_k):
    """flash_attn/triton/dropout_mask.py, the CUDA kernel of flash_attn::dropout_keep_mask where the
    extension is not built (the S_dmask of return_attn_probs above): the mask of flash_attn/dropout.py,
    with a seed and an offset that use both 32-bit words."""
    from flash_attn.triton import dropout_mask
    seed, offset = (1 << 40) + 12345, (1 << 33) + 77
    rng_state = torch.tensor([seed, offset], dtype=torch.int64, device=DEVICE)
    keep = dropout_mask.keep_mask(rng_state, batch, heads, seqlen_q, seqlen_k, 0.3)
    expected = dropout_lib.keep_mask(seed, offset, batch, heads, seqlen_q, seqlen_k, 0.3)
    assert keep.dtype == torch.bool and keep.device.type == DEVICE
    assert torch.equal(keep.cpu(), expected)


# flash_attn_with_kvcache through the switch: the Triton append and split-KV kernels
# (flash_attn/triton/kvcache.py) against reference_kvcache with kvcache_checks.check_kvcache (the cache
# after the append compared exactly, out and lse by the tolerance rule). Small caches: the
# interpreter runs every program in Python.
KVCACHE_CASES = {
    "decode": dict(),
    "no_new_tokens": dict(seqlen_new=0),
    "append_rotary_interleaved": dict(seqlen_q=3, seqlen_new=3, rotary_dim=16, causal=True),
    "rotary_halves_noncausal": dict(seqlen_q=2, seqlen_new=1, rotary_dim=32, rotary_interleaved=False),
    "paged": dict(page_size=16, seqlen_new=2, seqlen_q=2, causal=True, rotary_dim=16, leftpad=True),
    "batch_idx_window": dict(batch_idx=True, seqlen_q=4, seqlen_new=4, window_size=(20, 0)),
    "softcap_alibi_mqa": dict(softcap=10.0, alibi=True, nheads=4, nheads_k=1, seqlen_q=2, seqlen_new=2,
                              causal=True),
    "full_cache_headdim_40": dict(full_cache=True, seqlen_new=3, seqlen_q=3, causal=True, headdim=40),
}


@pytest.mark.parametrize("num_splits", [1, 3, 0])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: DTYPE_IDS[d])
@pytest.mark.parametrize("name", KVCACHE_CASES)
def test_triton_kvcache(monkeypatch, name, dtype, num_splits):
    from kvcache_checks import KvCase, check_kvcache

    _switch_on(monkeypatch)
    calls = _count_calls(monkeypatch, triton_backend.kvcache, "forward_kvcache")
    case = KvCase(**{"batch": 2, "nheads": 4, "nheads_k": 2, "headdim": 32, "capacity": 100, "dtype": dtype,
                     "num_splits": num_splits, **KVCACHE_CASES[name]})
    check_kvcache(case, DEVICE)
    assert calls


@pytest.mark.parametrize("name", ["paged", "batch_idx_window", "append_rotary_interleaved"])
def test_triton_kvcache_wide_cache_addressing(monkeypatch, name):
    """The kvcache kernels' WIDE_CACHE addressing (page or batch entry in int64, row in int32), which
    only caches of 2^31 elements or more take, on small caches (the size test forced): the same
    appends and outputs as reference_kvcache, so the interpreter covers that path in CI."""
    from kvcache_checks import KvCase, check_kvcache

    _switch_on(monkeypatch)
    monkeypatch.setattr(triton_backend.kvcache, "within_offset_limit", lambda t: False)
    case = KvCase(**{"batch": 2, "nheads": 4, "nheads_k": 2, "headdim": 32, "capacity": 100, "dtype": torch.float16,
                     "num_splits": 3, **KVCACHE_CASES[name]})
    check_kvcache(case, DEVICE)


def test_triton_kvcache_combine(monkeypatch):
    """The split-KV combine kernel against its formula in fp64: parts weighted by exp(lse_s - lse), a
    part with lse +inf (no visible key) weighing 0, a row with no key in any part giving out 0 and lse
    +inf; out in the requested dtype; one part is only cast."""
    if DEVICE == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    from flash_attn.triton import kvcache

    splits, batch, seqlen_q, heads, headdim = 5, 2, 3, 4, 40
    parts = torch.randn(splits, batch, seqlen_q, heads, headdim, device=DEVICE)
    lse_parts = torch.randn(splits, batch, heads, seqlen_q, device=DEVICE) * 4
    lse_parts[1, 0] = float("inf")  # a split with no key for batch entry 0
    lse_parts[:, 1, 2, 1] = float("inf")  # batch 1, head 2, row 1: no key anywhere
    out, lse = kvcache._combine(parts, lse_parts, torch.float16)
    finite = torch.where(torch.isposinf(lse_parts), float("-inf"), lse_parts).double()
    expected_lse = torch.logsumexp(finite, 0)
    weights = torch.nan_to_num(torch.exp(finite - expected_lse), nan=0.0)
    expected = (weights.transpose(-1, -2).unsqueeze(-1) * parts.double()).sum(0)
    assert out.dtype == torch.float16 and lse.dtype == torch.float32
    torch.testing.assert_close(out.double(), expected, atol=2e-3, rtol=2e-3)  # fp16 output rounding
    assert torch.isposinf(lse[1, 2, 1]) and (out[1, 1, 2] == 0).all()
    torch.testing.assert_close(lse.double(), torch.where(torch.isneginf(expected_lse), float("inf"), expected_lse),
                               atol=1e-5, rtol=1e-5)
    one_out, one_lse = kvcache._combine(parts[:1], lse_parts[:1], torch.float16)
    assert torch.equal(one_out, parts[0].half()) and torch.equal(one_lse, lse_parts[0])


def test_triton_kvcache_metadata_out_of_range(monkeypatch):
    """cache_seqlens past the capacity and negative, block_table entries past the pool and negative,
    leftpad past the end: clamped as reference_kvcache clamps them (the cache after the append and
    the outputs agree with it), nothing written outside the cache."""
    from kvcache_checks import KvCase, make_inputs, run_ours
    from flash_attn import reference_kvcache as rk
    from flash_attn.reference import normalize_window

    _switch_on(monkeypatch)
    case = KvCase(batch=3, nheads=2, nheads_k=1, headdim=16, capacity=64, page_size=16, seqlen_q=2, seqlen_new=2,
                  leftpad=True, dtype=torch.float32, num_splits=2)
    x = make_inputs(case)
    x.cache_seqlens = torch.tensor([1000, -5, 63], dtype=torch.int32)
    x.cache_leftpad = torch.tensor([7, 3, 500], dtype=torch.int32)
    x.block_table[0, 1], x.block_table[1, 0] = 10_000, -3
    ours = x.to(DEVICE)
    out, lse = run_ours(case, ours)
    ref = x.to("cpu")
    window = normalize_window(case.window_size, case.causal, 64)
    ref_out, ref_lse = rk.forward_kvcache(ref.q, ref.k_cache, ref.v_cache, ref.k, ref.v, None, None, ref.cache_seqlens,
                                          None, ref.cache_leftpad, ref.block_table, 16 ** -0.5, window, 0.0, True,
                                          None)
    assert torch.equal(ours.k_cache.cpu(), ref.k_cache) and torch.equal(ours.v_cache.cpu(), ref.v_cache)
    torch.testing.assert_close(out.cpu(), ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.cpu(), ref_lse, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(DEVICE != "cuda", reason="needs ~9 GB of GPU memory: a KV cache past 2^31 elements")
def test_triton_kvcache_past_int32_offsets(monkeypatch):
    """A paged KV cache whose last pages lie more than 2^31 elements from its start (2 x 4.3 GB in
    fp16): the append writes and the attention reads those pages (a cache this size takes the kernels'
    WIDE_CACHE addressing, pages in int64), matching reference_kvcache on a copy of just those pages."""
    from flash_attn import reference_kvcache as rk

    page_size, heads_k, headdim = 256, 8, 128
    pages = triton_backend.attention.OFFSET_LIMIT // (page_size * heads_k * headdim) + 2
    if torch.cuda.mem_get_info()[0] < 2.2 * pages * page_size * heads_k * headdim * 2:
        pytest.skip("not enough free GPU memory for two caches past 2^31 elements")
    _switch_on(monkeypatch)
    generator = torch.Generator(device="cuda").manual_seed(0)
    k_cache, v_cache = (torch.empty(pages, page_size, heads_k, headdim, device="cuda", dtype=torch.float16)
                        for _ in range(2))
    last = [pages - 2, pages - 1]  # the last page starts past 2^31 elements
    for cache in (k_cache, v_cache):
        cache[last] = torch.randn(2, page_size, heads_k, headdim, device="cuda", generator=generator).half()
    q, k, v = (torch.randn(1, 3, heads_k, headdim, device="cuda", generator=generator).half() for _ in range(3))
    cache_seqlens = torch.tensor([300], device="cuda", dtype=torch.int32)  # appends at rows 44-46 of page 1
    small_k, small_v = k_cache[last].cpu(), v_cache[last].cpu()
    out, lse, *_ = flash_attn.flash_attn_with_kvcache(
        q, k_cache, v_cache, k=k, v=v, cache_seqlens=cache_seqlens, causal=True, num_splits=1,
        block_table=torch.tensor([last], device="cuda", dtype=torch.int32), return_softmax_lse=True)
    ref_out, ref_lse = rk.forward_kvcache(q.cpu(), small_k, small_v, k.cpu(), v.cpu(), None, None,
                                          cache_seqlens.cpu(), None, None, torch.tensor([[0, 1]], dtype=torch.int32),
                                          headdim ** -0.5, (-1, 0), 0.0, True, None)
    assert torch.equal(k_cache[last].cpu(), small_k) and torch.equal(v_cache[last].cpu(), small_v)
    torch.testing.assert_close(out.cpu(), ref_out, atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(lse.cpu(), ref_lse, atol=1e-3, rtol=1e-3)


def test_triton_paged_varlen(monkeypatch):
    """flash_attn_varlen_func with block_table through the switch: the paged prefill runs the Triton
    kvcache kernels (counted), against attention_ref per sequence (kvcache_checks.check_paged_varlen)."""
    from kvcache_checks import check_paged_varlen

    _switch_on(monkeypatch)
    calls = _count_calls(monkeypatch, triton_backend.kvcache, "forward_kvcache")
    check_paged_varlen(DEVICE, [5, 1, 20], [30, 1, 20], 16, causal=True, nheads=4, nheads_k=2, headdim=32,
                       dtype=torch.float16)
    assert calls
