"""Host side of the portable Triton backend (issue #9): launches flash_attn/triton/kernels.py on
dense (batch, seqlen, heads, headdim) or varlen (total, heads, headdim) tensors, with the
semantics of flash_attn/reference.py: lse (batch, heads, seqlen_q) dense or (heads, total_q)
varlen, +inf (and output 0) for a query that sees no key.

What it covers: forward and backward, fp32 / fp16 / bf16, causal and local windows, softcap, ALiBi,
dropout (the masks of csrc/flash/dropout.cuh, from an rng_state (seed, offset) int64 tensor), GQA /
MQA, varlen; the fp8 e4m3 forward with descales (flash_attn/triton/fp8.py checks its arguments);
tiles fixed or autotuned (tuning.py). flash_attn/triton/ops.py puts it behind the public functions,
and flash_attn/triton/kvcache.py runs flash_attn_with_kvcache. Without a GPU it runs under
Triton's interpreter (TRITON_INTERPRET=1, set before triton is imported). Tested there (fp32
against fp64, fp16, fp8) and on an H100 (tests/test_triton_*.py; README says which cases ran where).
"""

import os

import torch
import triton

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # a Triton without host-made descriptors keeps the other block sources
    TensorDescriptor = None

from .. import dropout as dropout_lib
from ..ops import FP8_OUT_DTYPE
from ..validation import cuda_capability, nvidia_gpu
from . import fp8_kernels, kernels, poison, shared_memory_fit, tuning
from .direct_launch import BoundLaunch, launch_kernel
from .scratch import launch_with_scratch

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
FP8_DTYPE = torch.float8_e4m3fn

# The autotuner's cache key (tuning.py): lengths, heads, head dim and flags, not the batch.
TUNING_KEY = ("seqlen_q", "seqlen_k", "heads", "group", "headdim", "left", "right", "VARLEN", "HAS_SOFTCAP",
              "HAS_ALIBI", "HAS_DROPOUT")
_forward_kernel = tuning.Launcher(kernels.attention_forward_kernel, tuning.FORWARD_TILES, TUNING_KEY,
                                  tuning.INTERPRETER_TILES["attention"])
_dkdv_kernel = tuning.Launcher(kernels.attention_backward_dkdv_kernel, tuning.DKDV_TILES, TUNING_KEY,
                               tuning.INTERPRETER_TILES["attention"])
_dq_kernel = tuning.Launcher(kernels.attention_backward_dq_kernel, tuning.DQ_TILES, TUNING_KEY,
                             tuning.INTERPRETER_TILES["attention"])

# The portable fixed tiles: 64 x 64 up to head dim 128, 32 x 32 above it so that the fp32
# accumulators of a 256-wide head stay small, with Triton's default warps and stages. They serve
# fp32 inputs, ROCm (no AMD GPU has run them; left as they were) and CPU tensors under the
# interpreter; on NVIDIA GPUs 16-bit and fp8 inputs take the tiles below at every head dim.
def _blocks(headdim_padded):
    return (64, 64) if headdim_padded <= 128 else (32, 32)


# The fp8 forward's fixed tiles up to head dim 128 on NVIDIA GPUs (BLOCK_M, BLOCK_N, warps, stages).
# Non-causal: 128 queries x 64 keys, 4 warps, 3 stages; swept on an H100 (triton 3.6, hd 128, 4k-16k
# tokens; benchmarks/NOTES.md v22, triton_fp8_speed.py) and again on an H200 once V's key blocks had
# an alignment the compiler sees (kernels._block_indices; NOTES.md "Triton backend (#9), session 24"):
# the fastest swept at 4k / 8k / 16k (up to the runs' noise). Under a right window (causal), by key length:
# 64 x 64 with 4 warps up to FP8_SHORT_WALK_KEYS keys, 128 x 128 with 8 warps beyond. fp8 / bf16 in
# two H200 sweeps (V copied by torch, then by keys_contiguous_kernel): 4k 1.14 / 1.50 against 1.05 /
# 1.40; 8k 1.31 / 1.38-1.48 against 1.29 / 1.48 (even: the second sweep's two 64 x 64 runs differed
# by 7%); 16k 1.30 / 1.50 against 1.42 / 1.56.
FP8_FORWARD_TILE = tuning.Tile(128, 64, 4, 3)
# Head dims 129-256 (block_d 256), causal or not: 128 x 64 with 8 warps and 3 stages, the fastest of
# four swept against the portable 32 x 32 (H200, triton 3.6, hd 256, 16 heads, 16k tokens, 4k keys;
# benchmarks/experiments/triton_tile_sweep.py, benchmarks/NOTES.md "Triton backend (#9), session 29"):
# 176 -> 822 TFLOP/s non-causal, 172 -> 742 causal (64 x 64 with 4 warps 790 / 740, with 8 warps 425 /
# 412; 128 x 64 in 2 stages 661 / 530).
FP8_WIDE_HEAD_TILE = tuning.Tile(128, 64, 8, 3)
FP8_SHORT_RIGHT_WINDOW_TILE = tuning.Tile(64, 64, 4, 3)
FP8_RIGHT_WINDOW_TILE = tuning.Tile(128, 128, 8, 3)
FP8_SHORT_WALK_KEYS = 8192


# The fp8 forward at hd 128 on NVIDIA GPUs with TMA: q, k, out and V's keys-contiguous copy through
# host-made descriptors (kernels.HOST_DESCRIPTORS) for key lengths in [first, last] (None: unbounded)
# by (padded head dim, right window), as NVIDIA_16BIT_HOST_DESCRIPTOR_KEYS; elsewhere pointers. There
# it takes FP8_HOST_TILE, 64 queries x 128 keys with 4 warps and 3 stages: of ten fp8 settings swept
# (H200, triton 3.6, hd 128, 16 heads x 16k tokens, two rounds; benchmarks/NOTES.md v47) the only one
# at 1.34-1.44x the bf16 forward in every cell from 4k to 16k keys, causal or not. The tiles above on
# pointers read 1.26-1.37x, and 1.26-1.29x causal. Its acc (64 x 128 over 128 threads) takes one
# rescale a score where 128 x 64 takes two. Without the descriptors it was not measured. Below 4k
# keys only 1k was measured, by kernel time (NOTES.md v47 item 3): 220 us against 227 for the old
# pointer tile (128 x 64), but 172 against 166 (+3%) for the old causal one (64 x 64); the call is
# host-bound there.
FP8_HOST_DESCRIPTOR_KEYS = {(128, False): (0, None), (128, True): (0, None)}
FP8_HOST_TILE = tuning.Tile(64, 128, 4, 3)


def _fp8_descriptors(block_d, right_window, seqlen_k):
    """_nvidia_16bit_descriptors' pair for an fp8 forward: (the block source, its fallback: pointers)."""
    return _tabled_descriptors(FP8_HOST_DESCRIPTOR_KEYS, (block_d, right_window), seqlen_k,
                               kernels.POINTER_BLOCKS.value)


def _tabled_descriptors(host_keys, key, seqlen_k, fallback):
    """(block source, fallback) of a forward by a host-descriptor table (NVIDIA_16BIT_HOST_DESCRIPTOR_KEYS,
    FP8_HOST_DESCRIPTOR_KEYS): host-made descriptors where seqlen_k lies in the [first, last] range the
    table holds for `key`, else `fallback` for both."""
    keys = host_keys.get(key)
    if keys is not None and seqlen_k >= keys[0] and (keys[1] is None or seqlen_k <= keys[1]):
        return kernels.HOST_DESCRIPTORS.value, fallback
    return fallback, fallback


def _fp8_tile(right_window, seqlen_k, host_descriptors=False):
    """The fp8 forward's fixed tile up to hd 128: FP8_HOST_TILE on host-made descriptors, else by
    whether a right window bounds the keys, and then by seqlen_k."""
    if host_descriptors:
        return FP8_HOST_TILE
    if not right_window:
        return FP8_FORWARD_TILE
    return FP8_SHORT_RIGHT_WINDOW_TILE if seqlen_k <= FP8_SHORT_WALK_KEYS else FP8_RIGHT_WINDOW_TILE


# The 16-bit tiles on NVIDIA GPUs, up to head dim 128 (BLOCK_M, BLOCK_N, warps, stages), from an H200
# run (triton 3.6, 16 heads, 16k tokens; benchmarks/NOTES.md v25, results/nvidia-h200_2026-11-27_v25/
# triton_speed_ab_first.md). Forward: 128 x 64 with 8 warps (each warpgroup 64 query rows, K and V
# shared): at hd 128 the fastest of v22's H100 sweep and 5% ahead of 64 x 64 with 4 warps at 4k
# causal here, at hd 64 non-causal 14-17% ahead of the old 64 x 64 forward; but at hd 64 with a right
# window (causal) 64 x 64 with 4 warps ran 1.35x the 8-warp tile (4k causal). Backward (dK / dV:
# BLOCK_M queries a step, BLOCK_N keys a program; dQ: BLOCK_M queries a program, BLOCK_N keys a step),
# at 4k causal: hd 64 keeps the portable 64 x 64 tiles with 4 warps (1.13x the 8-warp 64 x 128 / 128 x
# 64 pair first chosen by registers); hd 128 took 128 x 32 with 8 warps for dQ (1.31x the 64 x 64
# 8-warp one) and 32 x 128 with 8 warps for dK / dV (with the 4-warp 64 x 64 for dK / dV as well as
# for dQ the backward ran 1.12x, against 1.28x with that dQ tile alone). Since session 30 hd 128
# takes 64 x 128 for dK / dV with 128 x 64 for dQ (8 warps, 3 stages): against that pair, H200,
# triton_tile_sweep.py, 1k / 4k / 16k keys, 1.06 / 1.13 / 1.09x non-causal, 1.01 / 1.14 / 1.11x
# causal (NOTES.md "Triton backend (#9), session 30"). At hd 64 the same pair ran 0.85x at 4k causal.
# Since session 44 hd 64 takes 32 x 64 with 4 warps and 4 stages for dK / dV: 168 registers causal
# against 64 x 64's 248 (Triton 3.6 for sm_90, offline; no spills with any feature, where 64 x 64
# spilled 40 B under dropout), three CTAs an SM instead of two. Whole-backward kernel time against
# the 64 x 64 pair, H200, 16 heads x 16k tokens, 1k-4k, two rounds in one process: causal -5 to -9%,
# non-causal -10% (NOTES.md v49 item 3). dQ keeps 64 x 64 with 4 warps: of six other dQ tiles only
# 64 x 32 was ahead anywhere (-2% at 1k causal; +7% at 4k non-causal; v49 item 2).
# Since session 24 the hd 128 forward takes 128 x 128 with 8 warps and 3 stages (224 KB of shared memory
# on sm_90, 160 KB on sm_80 / sm_89 per Triton 3.6's offline compile, NOTES.md v50 item 2; an earlier
# note here said 96 / 64 KB): against 128 x 64, alternating in
# one process on an H200, 1.05-1.09x non-causal and 1.01-1.07x causal at 4k / 16k (NOTES.md "Triton
# backend (#9), session 24"); 128 x 128 with 2 stages ran 0.92-0.93x. Only Hopper has run these tiles.
# Head dims 129-256 (block_d 256, session 29, the same sweep as FP8_WIDE_HEAD_TILE's, bf16, 4k keys):
# the forward takes 128 x 64 with 8 warps and 2 stages, 3.2x / 3.1x the portable 32 x 32 non-causal /
# causal (154 -> 492, 150 -> 462 TFLOP/s; 64 x 64 with 4 warps 2.5x / 2.1x); the backward 64 x 64 with
# 8 warps and 2 stages for dK / dV and 128 x 32 with 8 warps and 2 stages for dQ, 1.5x / 1.3x (160 ->
# 242, 153 -> 203; of two other pairs one ran 0.6x, the other 1.1x).
# One or two shapes measured per choice; the tile variables of tuning.py select others.
NVIDIA_16BIT_FORWARD_TILES = {  # (padded head dim, right window): tile
    (64, False): tuning.Tile(128, 64, 8, 3),
    (64, True): tuning.Tile(64, 64, 4, 3),
    (128, False): tuning.Tile(128, 128, 8, 3),
    (128, True): tuning.Tile(128, 128, 8, 3),
    (256, False): tuning.Tile(128, 64, 8, 2),
    (256, True): tuning.Tile(128, 64, 8, 2),
}
NVIDIA_16BIT_BACKWARD_TILES = {  # padded head dim: (dK / dV tile, dQ tile)
    64: (tuning.Tile(32, 64, 4, 4), tuning.Tile(64, 64, 4, 3)),
    128: (tuning.Tile(64, 128, 8, 3), tuning.Tile(128, 64, 8, 3)),
    256: (tuning.Tile(64, 64, 8, 2), tuning.Tile(128, 32, 8, 2)),
}
# Where the 16-bit forward's blocks come from on Hopper and later (kernels.POINTER_BLOCKS,
# DEVICE_KV_DESCRIPTORS, HOST_DESCRIPTORS), by (padded head dim, right window), where
# NVIDIA_16BIT_HOST_DESCRIPTOR_KEYS does not choose host-made ones. At hd 128 the pointer loads'
# address tensors cost 36-44 registers a thread (Triton 3.9 for sm_90: 255 + 8 B of stack -> 213 at
# 128 x 128 causal); there K / V descriptors made in the kernel took 3% / 8% of the kernel time at
# 1k (non-causal / causal) and 10-16% at 4k / 16k (H200, Triton 3.6, benchmarks/NOTES.md v36). At hd
# 64 they cost 4-5% at 1k and gained 0-4% from 4k; at hd 256 -2% to +4%: both keep the pointer loads.
NVIDIA_16BIT_DESCRIPTORS = {
    (64, False): kernels.POINTER_BLOCKS.value,
    (64, True): kernels.POINTER_BLOCKS.value,
    (128, False): kernels.DEVICE_KV_DESCRIPTORS.value,
    (128, True): kernels.DEVICE_KV_DESCRIPTORS.value,
    (256, False): kernels.POINTER_BLOCKS.value,
    (256, True): kernels.POINTER_BLOCKS.value,
}
# Q / K / V / Out through host-made descriptors (kernels.HOST_DESCRIPTORS) for key lengths in
# [first, last] (None: unbounded), by (padded head dim, right window). They save the kernel the
# in-kernel descriptors' setup and Q's pointer tensor, but cost host time (four descriptors made and
# encoded per launch, by us and by Triton's launcher; ~20-40 us a call, read from back-to-back
# timings that swung 150-350 us between rounds, not isolated), so only where the kernel gains more.
# Kernel time on the H200 (triton 3.6, 16 heads x 16k tokens, torch.profiler; NOTES.md v46),
# host-made against the other table's choice: hd 64 causal 1k -9% (but the call is host-bound there:
# back-to-back +22%), 4k -7%, 16k -5%, non-causal 0 to +3%; hd 128 causal 1k -9%, 2k -5%, 4k -2%,
# 16k +3%, non-causal 1k -6% on the 4-warp tile below, 2k +1%, 4k +6%; hd 256 non-causal -4 to -5% at
# 1k-16k, causal 1k -4%, 4k / 16k 0 to +1%.
NVIDIA_16BIT_HOST_DESCRIPTOR_KEYS = {
    (64, True): (1025, None),
    (128, False): (0, 1024),
    (128, True): (0, 2048),
    (256, False): (0, None),
    (256, True): (0, 1024),
}
# hd 128 non-causal walks of up to 1k keys on host-made descriptors: the tutorial's 128 x 64 with 4
# warps, 2 stages. Its whole-block loop fits in 253 registers without spills there (Triton 3.6 for
# sm_90, offline; 88 B of spills with pointer loads, 80 with device-made K / V descriptors) and ran 289
# us of kernel time against the 128 x 128 tile's 307 at 1k (H200, NOTES.md v46; 3 stages and 128 x 64
# with 8 warps capped at 128 registers were compared only by a do_bench sweep, 0.94x / 1.05x against
# this tile's 1.08x, a sweep whose short cells also read host time).
NVIDIA_16BIT_SHORT_HOST_TILE = tuning.Tile(128, 64, 4, 2)
# Short causal walks at hd 128 (a right window, up to SHORT_WALK_KEYS keys): 128 x 64 with 8
# warps, 2 stages and at most 128 registers a thread, so that two CTAs share an SM (96 KB of shared
# memory each; uncapped it takes 159-178 registers (Triton 3.9 for sm_90, offline) and runs alone,
# 0.64-0.76x the default tile on the H200). One
# 8-warp CTA an SM waits at every step's barrier for both warpgroups (NOTES.md v37 item 4); two hide
# each other's waits. H200, triton 3.6, 16 heads x 16k tokens, two rounds in one process (NOTES.md v44
# item 3): 1k causal 301-302 TFLOP/s against the 128 x 128 tile's 280 (+8%; its second round read 217),
# 1k non-causal equal (0.99-1.00), 2k causal 0.96, 4k-16k 0.86-0.94: so only walks up to 1k keys.
# The cap spills 32 B (offline, as above).
NVIDIA_16BIT_SHORT_RIGHT_WINDOW_TILE = tuning.Tile(128, 64, 8, 2, max_registers=128)
SHORT_WALK_KEYS = 1024  # the longest key walk of both short hd 128 tiles (this one and the host tile's)
SIXTEEN_BIT = (torch.float16, torch.bfloat16)


def _nvidia_16bit_tile(block_d, right_window, seqlen_k, host_descriptors=False):
    """The 16-bit forward's fixed tile on NVIDIA GPUs: by padded head dim and whether a right window
    bounds the keys, and at hd 128 by seqlen_k (as _fp8_tile goes by it) and the block source."""
    if block_d == 128 and seqlen_k <= SHORT_WALK_KEYS:
        if right_window:
            return NVIDIA_16BIT_SHORT_RIGHT_WINDOW_TILE
        if host_descriptors:
            return NVIDIA_16BIT_SHORT_HOST_TILE
    return NVIDIA_16BIT_FORWARD_TILES[(max(64, block_d), right_window)]


def _nvidia_16bit_descriptors(block_d, right_window, seqlen_k):
    """The tables' block source of a 16-bit forward on an NVIDIA GPU with TMA, and the source it falls
    back to where host-made descriptors cannot carry the call (_host_describable)."""
    key = (max(64, block_d), right_window)
    return _tabled_descriptors(NVIDIA_16BIT_HOST_DESCRIPTOR_KEYS, key, seqlen_k,
                               NVIDIA_16BIT_DESCRIPTORS.get(key, kernels.POINTER_BLOCKS.value))


def _nvidia_16bit(dtype, device):
    """Whether the NVIDIA 16-bit tiles apply: fp16 / bf16 tensors on an NVIDIA GPU."""
    return nvidia_gpu(device) and dtype in SIXTEEN_BIT


def _launch_options(tile, block_d):
    """A Tile's launch options, or the portable blocks (no warps / stages named) for None."""
    if tile is None:
        block_m, block_n = _blocks(block_d)
        return dict(BLOCK_M=block_m, BLOCK_N=block_n)
    return tile.launch_options()


def _forward_launch(block_d, dtype, device, right_window=False, seqlen_k=0, host_descriptors=False):
    """The forward's fixed launch options: the tile of tuning.py's experiment variable where set, else
    for fp8 (not on ROCm, whose fp8 keeps the portable tile) _fp8_tile's up to head dim 128 and
    FP8_WIDE_HEAD_TILE above it, NVIDIA_16BIT_FORWARD_TILES for 16-bit inputs on NVIDIA GPUs (by
    head dim and whether a right window, causal included, bounds the keys; at hd 128 up to
    SHORT_WALK_KEYS keys NVIDIA_16BIT_SHORT_RIGHT_WINDOW_TILE under a right window and
    NVIDIA_16BIT_SHORT_HOST_TILE without one on host-made descriptors), else the portable blocks."""
    fp8 = dtype == FP8_DTYPE
    tile = tuning.tile_from_environment(tuning.FP8_FORWARD_TILE_VARIABLE if fp8 else tuning.FORWARD_TILE_VARIABLE,
                                        None)
    if tile is None and fp8 and torch.version.hip is None:
        tile = _fp8_tile(right_window, seqlen_k, host_descriptors) if block_d <= 128 else FP8_WIDE_HEAD_TILE
    if tile is None and _nvidia_16bit(dtype, device):
        tile = _nvidia_16bit_tile(block_d, right_window, seqlen_k, host_descriptors)
    return _launch_options(tile, block_d)


def _backward_launches(block_d, dtype, device):
    """(dK / dV, dQ) fixed launch options: each kernel's tile variable where set, else the NVIDIA
    16-bit tiles of the head dim, else the portable blocks."""
    nvidia = NVIDIA_16BIT_BACKWARD_TILES.get(max(64, block_d)) if _nvidia_16bit(dtype, device) else None
    return tuple(_launch_options(tuning.tile_from_environment(variable, None if nvidia is None else nvidia[i]),
                                 block_d)
                 for i, variable in enumerate((tuning.DKDV_TILE_VARIABLE, tuning.DQ_TILE_VARIABLE)))


def _forward_descriptors(q, k, v, pr, right_window):
    """Where the forward's blocks come from (kernels.POINTER_BLOCKS, DEVICE_KV_DESCRIPTORS,
    HOST_DESCRIPTORS) of a 16-bit or fp8 call (fp32 calls take pointers): as
    tuning.DESCRIPTORS_VARIABLE says, else on NVIDIA GPUs with TMA as the tables
    (_nvidia_16bit_descriptors, _fp8_descriptors) do. Where _host_describable fails (varlen calls among
    them), host-made descriptors fall back to the tables' other source (device-made ones when the
    variable asked; pointers for fp8, whose V the kernel reads from a keys-contiguous copy it makes no
    descriptor of), and device-made ones to pointers where TMA cannot address k and v from every
    head's and sequence's first row."""
    pointers, device_kv, host = (kernels.POINTER_BLOCKS.value, kernels.DEVICE_KV_DESCRIPTORS.value,
                                 kernels.HOST_DESCRIPTORS.value)
    fp8 = pr.dtype == FP8_DTYPE
    if pr.dtype not in SIXTEEN_BIT and not fp8:
        return pointers
    setting = os.environ.get(tuning.DESCRIPTORS_VARIABLE)
    if setting is not None:  # forced only where TMA exists (or in the interpreter, for the tests)
        wanted = (pointers, device_kv, host)[tuning.descriptors_setting(setting)]
        if fp8 and wanted == device_kv:  # the kernel makes no descriptor of V's keys-contiguous copy
            wanted = pointers
        fallback = wanted
        if wanted == host:
            fallback = pointers if fp8 else device_kv
        if not (tuning.interpreting() or _has_tma(q.device)):
            wanted = fallback = pointers
    elif _has_tma(q.device):
        wanted, fallback = (_fp8_descriptors(pr.block_d, right_window, pr.seqlen_k) if fp8
                            else _nvidia_16bit_descriptors(pr.block_d, right_window, pr.seqlen_k))
    else:
        wanted = fallback = pointers
    # the strides are checked last: most calls are decided without them (a few us of host time)
    if wanted == host and not _host_describable(q, k, v, pr):
        wanted = fallback
    if wanted == device_kv and not all(_tma_addressable(t) for t in (k, v)):
        wanted = pointers
    return wanted


def _host_describable(q, k, v, pr):
    """Whether host-made descriptors (_host_descriptor) can carry q, k, v and out: a dense call (a
    varlen sequence's block would run into the next sequence's rows) of whole head dims (no padded
    columns: the view's next columns are the next head's), with fixed tiles (the descriptors' block
    shapes are the tile's; autotuning chooses the tile later), each tensor's heads side by side in a
    row (the (batch, seqlen, heads * headdim) view) and addressable by TMA (out is new and dense), and
    no tensor empty (a descriptor's dimensions are positive; an empty q skips the launch, keys do not).
    An fp8 v is not read there but through its keys-contiguous copy, which keys_contiguous makes
    addressable (_keys_contiguous_descriptor)."""
    return (TensorDescriptor is not None and not pr.varlen and not pr.pad_d and not tuning.enabled()
            and all(t.numel() > 0 and t.stride(2) == pr.headdim and _tma_addressable(t)
                    for t in ((q, k) if pr.dtype == FP8_DTYPE else (q, k, v))))


def _host_descriptor(t, rows, block_d):
    """A TMA descriptor over the (batch, seqlen, heads * headdim) view of the dense q / k / v-like t
    (_host_describable), in blocks of `rows` rows of one head (kernels._row_block_view)."""
    batch, seqlen, heads, headdim = t.shape
    return TensorDescriptor(t, [batch, seqlen, heads * headdim], [t.stride(0), t.stride(1), 1], [1, rows, block_d])


def _keys_contiguous_descriptor(v_copy, keys, block_d):
    """A TMA descriptor over the (batch, heads * headdim, seqlen) view of keys_contiguous's dense copy of
    an fp8 v (a view (batch, seqlen, heads, headdim) with the keys' stride 1), in blocks of one head's
    dims by `keys` keys (kernels._attend: V_KEYS_CONTIGUOUS)."""
    batch, seqlen, heads, headdim = v_copy.shape
    return TensorDescriptor(v_copy, [batch, heads * headdim, seqlen], [v_copy.stride(0), v_copy.stride(3), 1],
                            [1, block_d, keys])


def _has_tma(device):
    """Whether the device is an NVIDIA GPU that copies with TMA (compute capability 9.0 and later; not
    ROCm, whose MI300 also reports a major version of 9)."""
    return nvidia_gpu(device) and cuda_capability(device)[0] >= 9


def _tma_addressable(t):
    """Whether a TMA descriptor can address t from the first row of any head and sequence: a
    16-byte aligned base, the head dim contiguous, every other stride a positive multiple of 16
    bytes (a device-made descriptor is not checked, so a call that fails this takes the pointers)."""
    row_bytes = [stride * t.element_size() for stride in t.stride()[:-1]]
    return (t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and all(b > 0 and b % 16 == 0 for b in row_bytes))


def _rng_state_arg(rng_state, dropout, unread):
    """The kernels' Rng: the call's [seed, offset]; zeros for a dropout call without one; else the
    tensor `unread` (the kernels read Rng only with dropout), so that a call allocates nothing for it."""
    if rng_state is not None:
        return rng_state
    return torch.zeros(2, dtype=torch.int64, device=unread.device) if dropout else unread


# tl.dot's input_precision in every kernel (their DOT_PRECISION): fp32 inputs multiply in full fp32,
# not TF32, as the fp32 path is for accuracy. 16-bit and fp8 operands ignore it on NVIDIA GPUs (Triton
# 3.6 for sm_90, offline: the same SASS with "tf32" for nine forward / dK dV / dQ kernels of bf16, fp16
# and fp8 and three split-KV ones; NOTES.md v50 item 3), but Triton's MI200 (gfx90a) backend refuses
# "tf32" outright, which had kept every kernel from compiling there until session 45.
DOT_PRECISION = "ieee"


class _Problem:
    """Strides, lengths and flags shared by the three kernels of one call."""

    def __init__(self, q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, window, softcap,
                 alibi_slopes, dropout_p):
        self.varlen = cu_seqlens_q is not None
        if self.varlen:
            self.batch = cu_seqlens_q.numel() - 1
            self.seqlen_q, self.seqlen_k = int(max_seqlen_q), int(max_seqlen_k)
            self.heads, self.headdim = q.shape[1], q.shape[2]
            self.heads_k = k.shape[1]
        else:
            self.batch, self.seqlen_q, self.heads, self.headdim = q.shape
            self.seqlen_k, self.heads_k = k.shape[1], k.shape[2]
        self.total_q, self.total_k = q.shape[0], k.shape[0]  # varlen: the packed rows, the clamp bound
        sequences = "the number of sequences (cu_seqlens_q's length - 1)" if self.varlen else "batch"
        check_grid_dims(**{sequences: self.batch, "nheads": self.heads})
        self.group = self.heads // self.heads_k
        self.left, self.right = window
        self.softcap = float(softcap)
        self.has_alibi = alibi_slopes is not None
        # tl.dot's smallest reduction: 16, and 32 for 8-bit operands on NVIDIA GPUs
        self.block_d = max(32 if q.dtype == FP8_DTYPE else 16, triton.next_power_of_2(self.headdim))
        self.pad_d = self.headdim != self.block_d  # the kernels' PAD_D: head-dim masks only then
        self.dtype = q.dtype
        self.dropout_p = float(dropout_p)

    def strides(self, t):
        """(batch, row, head) strides of a q/k/v-like tensor; batch 0 for varlen."""
        return _row_strides(t, self.varlen)

    def vector_strides(self, lse):
        """(batch, head) strides of lse-like vectors: dense (b, h, s), varlen (h, total)."""
        return (0, lse.stride(0)) if self.varlen else (lse.stride(0), lse.stride(1))

    def query_grid(self):
        """The grid over query blocks, heads and batch of the dQ kernel and of the forward's groups of
        one pair (scheduled_query_grid), a function of the launch's meta-parameters (the tile may be
        tuned); it closes over numbers, not over the problem and its tensors (a cached plan keeps it)."""
        seqlen_q, heads, batch = self.seqlen_q, self.heads, self.batch
        return lambda meta: (triton.cdiv(seqlen_q, meta["BLOCK_M"]), heads, batch)

    def scheduled_query_grid(self, grouped):
        """The forward's grid (kernels._scheduled_query_block): for groups of more than one (head,
        batch) pair (grouped, the kernel's GROUPED) a 1D grid over query blocks x heads x batch (a
        function of the launch's meta-parameters, as query_grid); else query_grid's."""
        if not grouped:
            return self.query_grid()
        seqlen_q, pairs = self.seqlen_q, self.heads * self.batch
        return lambda meta: (triton.cdiv(seqlen_q, meta["BLOCK_M"]) * pairs,)

    def key_grid(self):
        seqlen_k, heads, batch = self.seqlen_k, self.heads, self.batch
        return lambda meta: (triton.cdiv(seqlen_k, meta["BLOCK_N"]), heads, batch)

    def tail_before_scale(self):
        """The kernels' arguments after the strides and before the softmax scale."""
        return self.seqlen_q, self.seqlen_k, self.total_q, self.total_k, self.group, self.headdim

    def tail_after_scale(self):
        """The kernels' arguments after the softmax scale."""
        keep_scale = 1.0 / (1.0 - self.dropout_p)
        return (self.softcap, self.left, self.right, self.heads, dropout_lib.keep_threshold(self.dropout_p),
                keep_scale)

    def meta(self, *fixed_launches):
        """The constexpr flags of the kernels, given the fixed launch options of the kernels that run
        (their tiles when untuned): PAD_D, the head dim narrower than its block; CLIP_LEFT, a left
        window, whose masked key walk (queries' first keys; the dK / dV kernel's last query
        blocks) the kernels then compile; CLIP_RIGHT, a causal / right window, varlen or seqlen_k
        not a multiple of every BLOCK_N that may run (a fixed one or any listed one), whose masked
        key walk (the diagonal or the keys' end) they compile. Plain non-causal calls of
        block-multiple lengths compile neither (kernels.attention_forward_kernel says why)."""
        block_n_bound = max([tuning.MAX_LISTED_BLOCK_N] + [fixed["BLOCK_N"] for fixed in fixed_launches])
        clip_right = self.right >= 0 or self.varlen or self.seqlen_k % block_n_bound != 0
        return dict(BLOCK_D=self.block_d, VARLEN=self.varlen, HAS_SOFTCAP=self.softcap > 0,
                    HAS_ALIBI=self.has_alibi, HAS_DROPOUT=self.dropout_p > 0,
                    DOT_PRECISION=DOT_PRECISION, PAD_D=self.pad_d,
                    CLIP_LEFT=self.left >= 0, CLIP_RIGHT=clip_right)


def check_tensors(dtypes=DTYPES, wide=(), **tensors):
    """Each given tensor (None: absent) is of one of `dtypes` with a contiguous last dimension, and
    within check_offsets' bound unless its name is in `wide` (a kernel indexes it in int64); errors
    name the argument."""
    for name, t in tensors.items():
        if t is None:
            continue
        if t.dtype not in dtypes:
            names = [str(d).removeprefix("torch.") for d in dtypes]
            allowed = " or ".join(filter(None, (", ".join(names[:-1]), names[-1])))
            raise TypeError(f"flash_attn Triton backend: {name} must be {allowed}, got {t.dtype}")
        if t.stride(-1) != 1:
            raise ValueError(f"flash_attn Triton backend: {name} must have a contiguous last dimension")
    check_offsets(**{name: t for name, t in tensors.items() if name not in wide})


# The kernels' grids put the heads on grid dimension y and the batch entries (sequences) on z (the
# decode kernel: batch entries x splits), which CUDA caps at 65535; a larger launch fails. Such calls
# are refused before any kernel runs, as the CUDA kernels refuse them (csrc/torch/op_common.h).
MAX_GRID_YZ = 65535


def check_grid_dims(**counts):
    """Each count (name: number) fits grid dimension y / z (MAX_GRID_YZ); errors name it."""
    for name, count in counts.items():
        if count > MAX_GRID_YZ:
            raise ValueError(f"flash_attn Triton backend: {name} must be at most {MAX_GRID_YZ} (a grid "
                             f"dimension of the kernels), got {count}")


# The Triton kernels form element offsets as program ids and indices times strides in 32-bit integers
# (kernels.py, kvcache_kernels.py): an element 2^31 or more elements past a tensor's start would wrap
# to another address. Such calls are refused; the CUDA kernels take 64-bit strides (params.h).
OFFSET_LIMIT = 2**31


def _span(t):
    """Elements from t's first to its farthest element, inclusive (t not empty)."""
    return 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))


def within_offset_limit(t):
    """Whether t's farthest element lies less than OFFSET_LIMIT elements from its start."""
    if t.numel() == 0:
        return True
    if t.device.type != "meta" and t.untyped_storage().nbytes() < OFFSET_LIMIT * t.element_size():
        return True  # the whole storage is within reach, and so every element (a per-call Python shortcut)
    return _span(t) <= OFFSET_LIMIT


def check_offsets(**tensors):
    """Each given tensor's farthest element lies less than OFFSET_LIMIT elements from its start, else a
    ValueError naming it (a keyword may name a buffer the backend allocates, in words)."""
    for name, t in tensors.items():
        if t is not None and not within_offset_limit(t):
            raise ValueError(f"flash_attn Triton backend: {name} spans {_span(t)} elements from its start; its "
                             f"kernels index with 32-bit offsets (at most {OFFSET_LIMIT}): split the call, or use "
                             "the CUDA backend")


# Keys per program of the V transpose: 64 x hd 128 bytes of fp8, the size of one forward key block.
KEYS_CONTIGUOUS_BLOCK_K = 64
KEYS_ROW_ALIGNMENT = 16  # elements of e4m3: the 16 bytes TMA wants between rows


def keys_contiguous(v, bound=None):
    """v with the same shape and values, stored so that each (head, dim) column of keys is contiguous
    (the key dim's stride 1): the B operand of P.V in the layout Hopper's fp8 MMA reads (it takes
    8-bit operands K-major only, and P.V reduces over the keys), as Triton's fp8 attention tutorial
    prepares V. One copy of V per call, by fp8_kernels.keys_contiguous_kernel: torch's copy of the
    permuted bytes took ~185 us at 16k tokens x 16 heads x hd 128 on an H200, a fifth of the 4k-key
    forward (benchmarks/NOTES.md v29). Measured without the transpose (H100, hd 128, 16k tokens): the
    fp8 forward at 0.41-0.62x of the bf16 one (benchmarks/experiments/triton_fp8_speed.py). bound: the
    calling plan's direct_launch.BoundLaunch of the copy (one plan, one shape of v), or None."""
    dense = v.dim() == 4  # dense (batch, seqlen, heads, headdim), else varlen (total, heads, headdim)
    v4 = v if dense else v.unsqueeze(0)
    batch, seqlen, heads, headdim = v4.shape
    # rows of keys padded to 16 bytes, so that a TMA descriptor can address the copy
    # (_keys_contiguous_descriptor); the padding is never written nor read
    padded = -(-seqlen // KEYS_ROW_ALIGNMENT) * KEYS_ROW_ALIGNMENT
    out = torch.empty((batch, heads, headdim, padded), dtype=v.dtype, device=v.device)[..., :seqlen]
    if out.numel():
        grid = (triton.cdiv(seqlen, KEYS_CONTIGUOUS_BLOCK_K), heads, batch)
        launch_kernel(fp8_kernels.keys_contiguous_kernel, grid,
                      (v4, out, seqlen, v4.stride(0), v4.stride(1), v4.stride(2), *out.stride()[:3]),
                      dict(HEADDIM=headdim, BLOCK_D=triton.next_power_of_2(headdim), BLOCK_K=KEYS_CONTIGUOUS_BLOCK_K),
                      bound)
    out = out.permute(0, 3, 1, 2)
    return out if dense else out[0]


def _row_strides(t, varlen):
    """(batch, row, head) strides of a q/k/v-like tensor, as _Problem.strides gives them."""
    return (0, t.stride(0), t.stride(1)) if varlen else (t.stride(0), t.stride(1), t.stride(2))


def _new_row_strides(shape, varlen):
    """_row_strides of a new (contiguous) q/k/v-like tensor of `shape`."""
    return _row_strides(torch.empty(shape, device="meta"), varlen)


def _bound_launch(varlen):
    """A direct_launch.BoundLaunch for a kernel of a dense plan, which later calls reuse (cached), else
    None: a varlen plan is made for one call and launches through Triton's JIT."""
    return None if varlen else BoundLaunch()


class _ForwardPlan:
    """What a forward launch depends on apart from its tensors' data and softmax_scale, decided from
    shapes, strides, dtypes, flags and the tile variables (check_tensors, _Problem, the tile tables,
    _forward_descriptors): numbers only, so that a cached plan holds no tensor. run() allocates the outputs
    and launches."""

    def __init__(self, q, k, v, window, softcap, alibi_slopes, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                 max_seqlen_k, dropout_p, fp8):
        check_tensors((FP8_DTYPE,) if fp8 else DTYPES, q=q, k=k, v=v)
        pr = _Problem(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, window, softcap, alibi_slopes,
                      dropout_p)
        self.fp8, self.varlen = fp8, pr.varlen
        self.out_dtype = FP8_OUT_DTYPE if fp8 else q.dtype
        self.lse_shape = (pr.heads, q.shape[0]) if pr.varlen else (pr.batch, pr.heads, pr.seqlen_q)
        self.empty = q.numel() == 0 or pr.batch == 0 or pr.seqlen_q == 0
        self.pairs_per_group = pairs_per_group(pr, q.device)
        grouped = self.pairs_per_group > 1
        self.grid = pr.scheduled_query_grid(grouped)
        self.qk_strides = (*pr.strides(q), *pr.strides(k))
        self.v_strides = None if fp8 else (*pr.strides(v), v.stride(-1))  # fp8: of V's keys-contiguous copy
        self.out_strides = _new_row_strides(q.shape, pr.varlen)  # out: a new tensor of q's shape
        self.lse_strides = pr.vector_strides(torch.empty(self.lse_shape, device="meta"))  # lse: a new tensor
        self.tail_before_scale, self.tail_after_scale = pr.tail_before_scale(), pr.tail_after_scale()
        right_window = pr.right >= 0  # a causal or right window bounds the keys: the tile tables' second key
        descriptors = _forward_descriptors(q, k, v, pr, right_window=right_window)
        self.host_described = descriptors == kernels.HOST_DESCRIPTORS.value
        self.device_described = descriptors == kernels.DEVICE_KV_DESCRIPTORS.value  # the launch needs scratch
        fixed = _forward_launch(pr.block_d, q.dtype, q.device, right_window=right_window, seqlen_k=pr.seqlen_k,
                                host_descriptors=self.host_described)
        # rows of the host-made descriptors' blocks of q, k, v and out; their columns
        self.descriptor_rows = (fixed["BLOCK_M"], fixed["BLOCK_N"], fixed["BLOCK_N"], fixed["BLOCK_M"])
        self.block_d = pr.block_d
        self.options = dict(IS_FP8=fp8, INTERPRETER_ROUNDING=fp8 and tuning.interpreting(),
                            DESCRIPTORS=descriptors, GROUPED=grouped, **pr.meta(fixed), fixed_blocks=fixed,
                            bound=_bound_launch(pr.varlen),
                            shrinkable=_forward_shrinkable(fp8, self.host_described))
        self.copy_launch = _bound_launch(pr.varlen) if fp8 else None  # of V's keys-contiguous copy

    def run(self, q, k, v, softmax_scale, alibi_slopes, cu_seqlens_q, cu_seqlens_k, rng_state, descales):
        out = poison.unwritten(q.shape, dtype=self.out_dtype, device=q.device)
        if self.varlen:  # rows outside every sequence keep out 0 and lse +inf; dense rows are all written
            out.zero_()
            lse = torch.full(self.lse_shape, float("inf"), device=q.device, dtype=torch.float32)
        else:
            lse = poison.unwritten(self.lse_shape, device=q.device, dtype=torch.float32)
        if self.empty:
            return out.zero_(), lse.fill_(float("inf"))
        slopes, slope_stride = _slope_args(alibi_slopes, lse)
        cu_q, cu_k = (cu_seqlens_q, cu_seqlens_k) if self.varlen else (q, q)  # unread when dense; any pointer
        rng_state = _rng_state_arg(rng_state, self.options["HAS_DROPOUT"], lse)
        if self.fp8:
            v = keys_contiguous(v, self.copy_launch)
            v_strides, descale_strides = (*_row_strides(v, self.varlen), v.stride(-1)), descales.stride()[:2]
        else:
            v_strides, descales, descale_strides = self.v_strides, slopes, (0, 0)  # descales: any pointer
        blocks = (q, k, v, out)
        if self.host_described:
            describe = [_host_descriptor] * 4
            if self.fp8:
                describe[2] = _keys_contiguous_descriptor
            blocks = tuple(made(t, rows, self.block_d) for made, t, rows in zip(describe, blocks, self.descriptor_rows))
        launch_with_scratch(
            self.device_described, _forward_kernel, q.device, self.grid, *blocks,
            lse, cu_q, cu_k, slopes, rng_state, descales, *self.qk_strides, *v_strides, *self.out_strides,
            *self.lse_strides, slope_stride, *descale_strides, *self.tail_before_scale, float(softmax_scale),
            *self.tail_after_scale, self.pairs_per_group, **self.options)
        return out, lse


# An fp8 forward's key block halves no further than this where the GPU's shared memory refuses its
# tile (shared_memory_fit): P.V reduces over BLOCK_N keys in 8-bit operands, 32 at least on NVIDIA GPUs.
FP8_SMALLEST_KEY_BLOCK = 32


def _forward_shrinkable(fp8, host_described):
    """The forward's blocks that may halve where the GPU refuses its tile, by smallest size: none on
    host-made descriptors (their block shapes are the tile's), else both (the grid follows them)."""
    if host_described:
        return {}
    if fp8:
        return {**shared_memory_fit.ATTENTION_BLOCKS, "BLOCK_N": FP8_SMALLEST_KEY_BLOCK}
    return shared_memory_fit.ATTENTION_BLOCKS


# The forward's schedule (kernels._scheduled_query_block): (head, batch) pairs run in groups whose K and
# V, 2 * seqlen_k * headdim elements a pair, fit in SCHEDULE_GROUP_BYTES, a third of Hopper's 50 MB L2,
# meant to keep a group's K and V resident while its blocks run (L2 hits were not measured). Within a
# group the longest causal walks start first, the last group's too, which leaves the launch a tail of
# short walks. Kernel time against pairs one by one (H200, Triton 3.6, bf16, 16 heads x 16k tokens, one
# round; benchmarks/NOTES.md v48): hd 128 1k -3.1% / causal -5.8%, 4k -0.9% / causal -3.9%; hd 64 4k
# causal -5.3% but 1k +2.1% / causal +5.7% and 4k +1.7%. Again at hd 128 against the commit before the
# schedule, two rounds (NOTES.md v49 item 6): -1 to -8% at 1k / 4k. So only where it was measured to
# gain: 16-bit inputs on NVIDIA GPUs at the padded head dims of SCHEDULE_GROUP_HEADDIMS (fp8 and fp32
# were not measured); elsewhere pairs run one by one.
SCHEDULE_GROUP_BYTES = 16 << 20
SCHEDULE_GROUP_HEADDIMS = (128,)


def pairs_per_group(pr, device):
    """The forward's (head, batch) pairs per schedule group of the problem pr: groups of
    SCHEDULE_GROUP_BYTES where the table applies, of tuning.SCHEDULE_GROUP_VARIABLE's size wherever it
    is set."""
    group_bytes = tuning.schedule_group_bytes_from_environment()
    if group_bytes is None:
        if not _nvidia_16bit(pr.dtype, device) or pr.block_d not in SCHEDULE_GROUP_HEADDIMS:
            return 1
        group_bytes = SCHEDULE_GROUP_BYTES
    return max(1, group_bytes // (2 * max(pr.seqlen_k, 1) * pr.headdim * pr.dtype.itemsize))


def _slope_args(alibi_slopes, unread):
    """(ALiBi slopes as the kernels read them, their batch stride); without ALiBi the float32 tensor
    `unread` stands in (the kernels do not read it), so that no tensor is allocated for it."""
    if alibi_slopes is None:
        return unread, 0
    slopes = alibi_slopes.float().contiguous()
    return slopes, (slopes.stride(0) if slopes.dim() == 2 else 0)


class _PlanCache:
    """Launch plans of dense calls by key: a short call's host time is mostly Python that decides the
    same launches every time (NOTES.md v44 item 4). Cleared when it holds PLAN_CACHE_SIZE plans."""

    def __init__(self):
        self.plans = {}

    def get(self, key, build):
        """The plan of `key` (None: not cacheable), built by build() where there is none."""
        plan = self.plans.get(key) if key is not None else None
        if plan is None:
            plan = build()
            if key is not None:
                if len(self.plans) >= PLAN_CACHE_SIZE:
                    self.plans.clear()
                self.plans[key] = plan
        return plan


PLAN_CACHE_SIZE = 256
_PLAN_VARIABLES = (tuning.FORWARD_TILE_VARIABLE, tuning.FP8_FORWARD_TILE_VARIABLE, tuning.DESCRIPTORS_VARIABLE,
                   tuning.AUTOTUNE_VARIABLE, tuning.DKDV_TILE_VARIABLE, tuning.DQ_TILE_VARIABLE,
                   tuning.SCHEDULE_GROUP_VARIABLE, "TRITON_INTERPRET", "TRITON_DEBUG")
_forward_plans, _backward_plans = _PlanCache(), _PlanCache()


def clear_plans():
    """Forgets every cached plan (tests that replace this module's deciding functions call it)."""
    _forward_plans.plans.clear()
    _backward_plans.plans.clear()


def _layout_key(*tensors):
    """The shapes, strides and dtypes of `tensors` and the first one's device, the variables the tile
    tables and _forward_descriptors read: what every plan depends on besides its call's flags."""
    return (tuple((t.shape, t.stride(), t.dtype) for t in tensors), tensors[0].device,
            tuple(os.environ.get(name) for name in _PLAN_VARIABLES))


def _plan_key(q, k, v, window, softcap, alibi_slopes, dropout_p, fp8):
    """Everything a dense call's _ForwardPlan depends on: q / k / v's layouts (check_tensors' verdicts
    and every stride), their 16-byte alignment (_tma_addressable), the flags and the variables."""
    return (_layout_key(q, k, v), q.data_ptr() % 16, k.data_ptr() % 16, v.data_ptr() % 16, tuple(window),
            float(softcap), alibi_slopes is None, float(dropout_p), fp8)


def forward(q, k, v, softmax_scale, window=(-1, -1), softcap=0.0, alibi_slopes=None, cu_seqlens_q=None,
            cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, dropout_p=0.0, rng_state=None, descales=None):
    """(out, lse). window: (left, right) normalized as reference.normalize_window does; rng_state: the
    (2,) int64 [seed, offset] of the dropout masks (read only with dropout_p > 0). descales: for
    float8_e4m3fn q, k, v, their (3, batch, heads_k) float32 descales stacked (fp8.py checks and
    stacks them); out is then bfloat16. Dense calls reuse the plan of an earlier call of the same
    key (_plan_key); varlen calls plan each time."""
    fp8 = descales is not None
    key = None if cu_seqlens_q is not None else _plan_key(q, k, v, window, softcap, alibi_slopes, dropout_p, fp8)
    plan = _forward_plans.get(key, lambda: _ForwardPlan(q, k, v, window, softcap, alibi_slopes, cu_seqlens_q,
                                                        cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, fp8))
    return plan.run(q, k, v, softmax_scale, alibi_slopes, cu_seqlens_q, cu_seqlens_k, rng_state, descales)


def _given_or_contiguous(t, row_major):
    """t where its last dimension is contiguous (row_major), else its contiguous copy."""
    return t if row_major else t.contiguous()


class _BackwardPlan:
    """The backward's launches apart from its tensors' data and softmax_scale (as _ForwardPlan is the
    forward's): numbers only. run() makes dout / out / lse readable, allocates, launches the D, dK /
    dV and dQ kernels and sums the dK / dV slices of each KV head."""

    def __init__(self, dout, q, k, v, out, lse, window, softcap, alibi_slopes, cu_seqlens_q, cu_seqlens_k,
                 max_seqlen_q, max_seqlen_k, dropout_p):
        check_tensors(q=q, k=k, v=v)
        pr = _Problem(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, window, softcap, alibi_slopes,
                      dropout_p)
        self.dout_row_major, self.out_row_major = dout.stride(-1) == 1, out.stride(-1) == 1
        dout = _given_or_contiguous(dout, self.dout_row_major)
        out = _given_or_contiguous(out, self.out_row_major)
        lse = lse.contiguous()  # D below is laid out like it
        self.varlen, self.group = pr.varlen, pr.group
        self.runs = q.numel() > 0 and k.numel() > 0 and pr.batch > 0
        # one dK / dV slice per query head, summed over the query heads of each KV head in run()
        self.slice_shape = (*k.shape[:-2], pr.heads, pr.headdim)
        self.grouped_shape = (*k.shape[:-2], pr.heads_k, pr.group, pr.headdim)
        slices = torch.empty(self.slice_shape, device="meta")
        check_offsets(dout=dout, out=out, **{"the per-query-head dK / dV buffer (k's tokens x nheads x headdim)":
                                             slices})
        delta_rows = max(16, min(128, 8192 // pr.block_d))
        self.delta_grid = (triton.cdiv(pr.seqlen_q, delta_rows), pr.heads, pr.batch)
        self.delta_args = (*pr.strides(out), *pr.strides(dout), *pr.vector_strides(lse), pr.seqlen_q, pr.total_q,
                           pr.headdim)
        self.delta_options = dict(BLOCK_M=delta_rows, BLOCK_D=pr.block_d, VARLEN=pr.varlen, PAD_D=pr.pad_d)
        self.common = (*pr.strides(q), *pr.strides(k), *pr.strides(v), *pr.strides(dout), *pr.vector_strides(lse))
        self.dq_strides = _new_row_strides(q.shape, pr.varlen)
        self.slice_strides = _new_row_strides(self.slice_shape, pr.varlen)
        self.tail_before_scale, self.tail_after_scale = pr.tail_before_scale(), pr.tail_after_scale()
        dkdv_launch, dq_launch = _backward_launches(pr.block_d, q.dtype, q.device)
        meta = pr.meta(dkdv_launch, dq_launch)
        self.key_grid, self.query_grid = pr.key_grid(), pr.query_grid()
        shrinkable = shared_memory_fit.ATTENTION_BLOCKS  # the grids follow both blocks
        self.dkdv_options = dict(**meta, fixed_blocks=dkdv_launch, bound=_bound_launch(pr.varlen),
                                 shrinkable=shrinkable)
        self.dq_options = dict(**meta, fixed_blocks=dq_launch, bound=_bound_launch(pr.varlen), shrinkable=shrinkable)
        self.delta_launch = _bound_launch(pr.varlen)

    def run(self, dout, q, k, v, out, lse, softmax_scale, alibi_slopes, cu_seqlens_q, cu_seqlens_k, rng_state):
        dout = _given_or_contiguous(dout, self.dout_row_major)
        out = _given_or_contiguous(out, self.out_row_major)
        lse = lse.contiguous()
        # dense: the kernels write every element; varlen: rows outside every sequence stay 0
        new = poison.unwritten if self.runs and not self.varlen else torch.zeros
        dq = new(q.shape, device=q.device, dtype=q.dtype)
        dk_slices = new(self.slice_shape, device=k.device, dtype=k.dtype)
        dv_slices = new(self.slice_shape, device=k.device, dtype=k.dtype)
        if self.runs:
            cu_q, cu_k = (cu_seqlens_q, cu_seqlens_k) if self.varlen else (q, q)  # unread when dense
            rng_state = _rng_state_arg(rng_state, self.dkdv_options["HAS_DROPOUT"], lse)
            delta = torch.empty_like(lse)  # D = rowsum(dO * O), laid out like lse
            launch_kernel(kernels.attention_backward_delta_kernel, self.delta_grid,
                          (out, dout, delta, cu_q, *self.delta_args), self.delta_options, self.delta_launch)
            slopes, slope_stride = _slope_args(alibi_slopes, lse)
            tail = (*self.tail_before_scale, float(softmax_scale), *self.tail_after_scale)
            _dkdv_kernel(self.key_grid, q, k, v, dout, lse, delta, dk_slices, dv_slices, cu_q, cu_k, slopes,
                         rng_state, *self.common, slope_stride, *self.slice_strides, *tail, **self.dkdv_options)
            _dq_kernel(self.query_grid, q, k, v, dout, lse, delta, dq, cu_q, cu_k, slopes, rng_state, *self.common,
                       slope_stride, *self.dq_strides, *tail, **self.dq_options)
        if self.group == 1:
            return dq, dk_slices, dv_slices
        return dq, dk_slices.view(self.grouped_shape).sum(-2), dv_slices.view(self.grouped_shape).sum(-2)


def backward(dout, q, k, v, out, lse, softmax_scale, window=(-1, -1), softcap=0.0, alibi_slopes=None,
             cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, dropout_p=0.0,
             rng_state=None):
    """(dq, dk, dv) for the forward's (out, lse), with its dropout_p and rng_state. Dense calls reuse the
    plan of an earlier call of the same layouts and flags; varlen calls plan each time."""
    key = None
    if cu_seqlens_q is None:
        key = (_layout_key(q, k, v, dout, out, lse), tuple(window), float(softcap), alibi_slopes is None,
               float(dropout_p))
    plan = _backward_plans.get(key, lambda: _BackwardPlan(dout, q, k, v, out, lse, window, softcap, alibi_slopes,
                                                          cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                                          dropout_p))
    return plan.run(dout, q, k, v, out, lse, softmax_scale, alibi_slopes, cu_seqlens_q, cu_seqlens_k, rng_state)
