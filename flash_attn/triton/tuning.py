"""Tile choice of the Triton backend's kernels: fixed tiles, or FlashAttention's
FLASH_ATTENTION_TRITON_AMD_AUTOTUNE="TRUE", which autotunes each kernel over a small config list
(block sizes, num_warps, num_stages) and caches the winner per shape key, as FlashAttention's AMD
Triton backend does. The variable is read per call, like FLASH_ATTENTION_TRITON_AMD_ENABLE.

Without it, each kernel launches with the fixed tile its host chooses (attention._forward_launch,
attention._backward_launches, kvcache._blocks): on NVIDIA GPUs, for 16-bit inputs, a tile per
kernel and padded head dim (64, 128, 256) with its warps and stages (attention.py says which and
why); elsewhere (fp32, ROCm) the 64 x 64 / 32 x 32 blocks with Triton's default num_warps /
num_stages; the fp8 forward's own tiles (attention._fp8_tile: FP8_FORWARD_TILE, and under a causal /
right window one of two by the key length; FP8_WIDE_HEAD_TILE above head dim 128). The variables
below (FORWARD_TILE_VARIABLE, FP8_FORWARD_TILE_VARIABLE, DKDV_TILE_VARIABLE, DQ_TILE_VARIABLE)
replace a kernel's fixed tile for experiments.

With it, the first call of a shape key times every config that fits the head dim (triton.autotune,
its cache in memory for the process) and later calls reuse the winner; the key is the kernel's
lengths, heads, head dim and flags (not the batch, so varlen batches of varying total length do not
tune again), plus the tensors' dtypes. The first call of each key is slow (every config compiles
and runs), so warm up before capturing a CUDA graph. Under Triton's interpreter (TRITON_INTERPRET=1)
the configs are timed with the host clock over two tiles, which keeps the machinery (keys, cache,
grids from the chosen tile) tested on machines without a GPU; the GPU lists below are not timed
anywhere yet.
"""

import os
import time
from dataclasses import dataclass
from typing import Optional

import triton
import triton.testing

from .shared_memory_fit import launch_fitted

AUTOTUNE_VARIABLE = "FLASH_ATTENTION_TRITON_AMD_AUTOTUNE"
# Experiment overrides of the forward's fixed tile, of fp32 / 16-bit inputs and of fp8 ones:
# "BLOCK_M,BLOCK_N,num_warps,num_stages", read per call like the other variables, for sweeps such
# as benchmarks/experiments/triton_fp8_speed.py. Unset, the host's tile runs; autotuning ignores them.
FORWARD_TILE_VARIABLE = "FLASH_ATTENTION_TRITON_FORWARD_TILE"
FP8_FORWARD_TILE_VARIABLE = "FLASH_ATTENTION_TRITON_FP8_FORWARD_TILE"
# The same for the backward's two kernels: dK / dV (BLOCK_M queries per step, BLOCK_N keys per
# program) and dQ (BLOCK_M queries per program, BLOCK_N keys per step).
DKDV_TILE_VARIABLE = "FLASH_ATTENTION_TRITON_DKDV_TILE"
DQ_TILE_VARIABLE = "FLASH_ATTENTION_TRITON_DQ_TILE"
# Where the 16-bit and fp8 forwards' blocks come from (kernels.POINTER_BLOCKS, DEVICE_KV_DESCRIPTORS,
# HOST_DESCRIPTORS): "0" pointers, "1" K / V through descriptors made in the kernel (16-bit only; fp8
# takes pointers), "2" Q / K / V / Out through descriptors the host makes, each where the call allows
# it (attention._forward_descriptors falls back from 2 to 1 to 0, fp8 from 2 to 0); unset, the host's
# tables (attention.NVIDIA_16BIT_DESCRIPTORS, FP8_HOST_DESCRIPTOR_KEYS) choose. Read per call, for A/B runs.
DESCRIPTORS_VARIABLE = "FLASH_ATTENTION_TRITON_DESCRIPTORS"
DESCRIPTORS_SETTINGS = ("0", "1", "2")
# The forward schedule's group size in MiB of K and V (attention.pairs_per_group), for every call
# whatever its head dim, dtype and device, "0" for groups of one pair: an experiment override, read per
# call; unset, the host's table (attention.SCHEDULE_GROUP_BYTES at SCHEDULE_GROUP_HEADDIMS) chooses.
SCHEDULE_GROUP_VARIABLE = "FLASH_ATTENTION_TRITON_SCHEDULE_GROUP_MB"

# A tile is tried when each of its row blocks times the padded head dim stays within this many
# elements (128 x 128): larger fp32 accumulators are expected to spill. An unmeasured guess, which
# the NVIDIA fixed tiles at head dims 129-256 exceed (128 x 64 blocks over a 256-wide head ran 3x the
# 32 x 32 ones there, attention.py); a config that does not compile (out of shared memory) is
# skipped by the autotuner itself.
MAX_TILE_ELEMENTS = 128 * 128


def enabled():
    """Whether FLASH_ATTENTION_TRITON_AMD_AUTOTUNE asks for autotuning (read per call)."""
    return os.environ.get(AUTOTUNE_VARIABLE, "").upper() == "TRUE"


def schedule_group_bytes_from_environment():
    """The schedule group size in bytes that SCHEDULE_GROUP_VARIABLE holds (read per call), else None."""
    text = os.environ.get(SCHEDULE_GROUP_VARIABLE, "").strip()
    if not text:
        return None
    if not text.isdigit():
        raise ValueError(f"flash_attn Triton backend: {SCHEDULE_GROUP_VARIABLE} must be a whole number of MiB "
                         f"(0: groups of one pair), got {text!r}")
    return int(text) << 20


def interpreting():
    return os.environ.get("TRITON_INTERPRET") == "1"


@dataclass(frozen=True)
class Tile:
    """One config: block sizes (block_m None where the host fixes BLOCK_M), num_warps, num_stages, and
    max_registers, Triton's maxnreg (NVIDIA only; None: the compiler's choice), which caps the
    registers a thread so that more CTAs fit on an SM."""

    block_m: Optional[int]
    block_n: int
    num_warps: int = 4
    num_stages: int = 3
    max_registers: Optional[int] = None

    def launch_options(self):
        """The keyword arguments of a fixed (untuned) launch."""
        options = dict(BLOCK_M=self.block_m, BLOCK_N=self.block_n, num_warps=self.num_warps,
                       num_stages=self.num_stages)
        if self.max_registers is not None:
            options["maxnreg"] = self.max_registers
        return options

    def config(self):
        blocks = {"BLOCK_N": self.block_n}
        if self.block_m is not None:
            blocks["BLOCK_M"] = self.block_m
        return triton.Config(blocks, num_warps=self.num_warps, num_stages=self.num_stages,
                             maxnreg=self.max_registers)


# The GPU lists start with the old fixed tiles (64 x 64, 32 x 32 above head dim 128, Triton's default
# 4 warps and 3 stages) and hold each kernel's fixed tiles of attention.py (the forward's 128 x 64
# with 8 warps, the fp8 forward's 128 x 64 with 4; the backward's per head dim), plus a few larger
# and pipelined variants in the spirit of FlashAttention's AMD sweep, kept short because every config
# compiles on the first call of each key.
FORWARD_TILES = (Tile(64, 64), Tile(32, 32), Tile(128, 64, 8, 3), Tile(128, 64, 4, 2), Tile(128, 128, 8, 2),
                 Tile(64, 32, 4, 4), Tile(128, 64, 4, 3))
DKDV_TILES = (Tile(64, 64), Tile(32, 32), Tile(64, 128, 8, 3), Tile(32, 128, 8, 3), Tile(32, 64, 4, 3),
              Tile(64, 64, 8, 3))
DQ_TILES = (Tile(64, 64), Tile(32, 32), Tile(128, 64, 8, 3), Tile(64, 64, 8, 3), Tile(128, 32, 8, 3),
            Tile(64, 32, 4, 3))
KVCACHE_TILES = (Tile(None, 64), Tile(None, 32), Tile(None, 128, 4, 3), Tile(None, 128, 8, 2), Tile(None, 64, 8, 3))
# The largest BLOCK_N of the attention lists: a key length that is a multiple of it fills every key
# block of any listed tile (attention.py's CLIP_RIGHT).
MAX_LISTED_BLOCK_N = max(tile.block_n for tiles in (FORWARD_TILES, DKDV_TILES, DQ_TILES) for tile in tiles)
INTERPRETER_TILES = {"attention": (Tile(32, 32), Tile(64, 64)), "kvcache": (Tile(None, 32), Tile(None, 64))}


def tile_from_environment(variable, default):
    """The Tile "BLOCK_M,BLOCK_N,num_warps,num_stages[,maxnreg]" that `variable` holds (read per call),
    else default."""
    text = os.environ.get(variable, "").strip()
    if not text:
        return default
    try:
        parts = [int(part) for part in text.split(",")]
    except ValueError:
        parts = []
    if len(parts) not in (4, 5):
        raise ValueError(f"flash_attn Triton backend: {variable} must be four or five integers "
                         f"'BLOCK_M,BLOCK_N,num_warps,num_stages[,maxnreg]', got {text!r}")
    return Tile(*parts)


def descriptors_setting(text):
    """The index in DESCRIPTORS_SETTINGS of the block source DESCRIPTORS_VARIABLE names (0 pointers, 1
    device-made K / V descriptors, 2 host-made ones; attention._forward_descriptors maps it)."""
    if text.strip() not in DESCRIPTORS_SETTINGS:
        raise ValueError(f"flash_attn Triton backend: {DESCRIPTORS_VARIABLE} must be one of "
                         f"{', '.join(DESCRIPTORS_SETTINGS)}, got {text!r}")
    return DESCRIPTORS_SETTINGS.index(text.strip())


def fits(config, block_d):
    """Whether a config's row blocks times the head dim stay within MAX_TILE_ELEMENTS."""
    rows = max(config.kwargs.get("BLOCK_M", 0), config.kwargs["BLOCK_N"])
    return rows * block_d <= MAX_TILE_ELEMENTS


def _fitting(configs, named_args, **kwargs):
    """triton.autotune's early_config_prune: the configs that fit the call's head dim, at least one
    (the smallest) so that every head dim runs."""
    block_d = kwargs.get("BLOCK_D", named_args.get("BLOCK_D"))
    kept = [config for config in configs if fits(config, block_d)]
    return kept or [min(configs, key=lambda config: config.kwargs["BLOCK_N"])]


def _bench(kernel_call, quantiles):
    """Time of one config: triton.testing.do_bench on a GPU; under the interpreter one call timed
    with the host clock (the interpreter has no device timer)."""
    if interpreting():
        start = time.perf_counter()
        kernel_call()
        return [(time.perf_counter() - start) * 1e3] * len(quantiles)
    return triton.testing.do_bench(kernel_call, quantiles=quantiles)


class Launcher:
    """Launches one kernel with the host's fixed blocks, or autotuned when enabled() is true.

    tiles: the GPU config list; key: the kernel arguments the autotuner's cache is keyed on."""

    def __init__(self, kernel, tiles, key, interpreter_tiles):
        self.kernel = kernel
        tiles = interpreter_tiles if interpreting() else tiles
        self.tuned = triton.autotune(configs=[tile.config() for tile in tiles], key=list(key),
                                     prune_configs_by={"early_config_prune": _fitting}, do_bench=_bench)(kernel)

    def __call__(self, grid, *args, fixed_blocks, bound=None, shrinkable=None, **meta):
        """grid: a function of the launch's meta-parameters (BLOCK_M / BLOCK_N included) wherever a
        block it depends on is shrinkable; fixed_blocks: the blocks of the untuned launch (and where the
        host names them, its num_warps and num_stages), which the autotuner chooses itself, and which
        shrink where the GPU's shared memory refuses them (shared_memory_fit: fewer stages, then the
        shrinkable blocks, {name: smallest size}, halved); bound: the calling plan's
        direct_launch.BoundLaunch of this kernel, if it has one (untuned launches only)."""
        if enabled():
            self.tuned[grid](*args, **meta)
        else:
            launch_fitted(self.kernel, grid, args, {**fixed_blocks, **meta}, bound, shrinkable)
