"""What a run measures: the quick and full sets of configurations, and the user's overrides."""

from dataclasses import dataclass, field

import torch

from . import impls as impl_lib
from .shapes import TRAINING_HIDDEN, TRAINING_TOKENS, AttnShape

SUITES = ("speed", "speedup", "memory", "decode", "features")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}

FULL_DTYPES = ("bf16", "fp16")
FULL_HEADDIMS = (64, 128, 256)
FULL_SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
QUICK_DTYPES = ("bf16",)
QUICK_HEADDIMS = (64, 128)
QUICK_SEQLENS = (512, 2048, 8192)
# The quick set adds the longest published point at the head dim most models use: PEERS.md's
# hd128 non-causal 16k is where the peers reach their best numbers.
QUICK_EXTRA_POINT = (128, False, 16384)

SPEEDUP_SEQLENS = {"quick": (128, 256, 512, 1024, 2048, 4096),
                   "full": (128, 256, 512, 1024, 2048, 4096, 8192, 16384)}
MEMORY_SEQLENS = {"quick": (128, 256, 512, 1024, 2048, 4096, 8192),
                  "full": (128, 256, 512, 1024, 2048, 4096, 8192, 16384)}
DECODE_CONFIGS = ((1, 8192), (8, 8192), (32, 4096), (64, 16384), (1, 131072))  # (batch, context)
# The decode suite's copy-bandwidth reference copies at least this much, so it reads from DRAM, not L2.
DECODE_COPY_MIN_BYTES = 256 * 2**20

# The quick set runs naive attention and SDPA MATH only where their estimated peak memory is under
# this: above it they move tens of GB per call and take longer than all the other peers together.
QUICK_MATERIALIZED_CAP_BYTES = 10 * 2**30


@dataclass(frozen=True)
class SpeedConfig:
    dtype: str
    headdim: int
    causal: bool
    seqlen: int


@dataclass
class FeaturePlan:
    """The features suite's problems, at the shapes its targets are stated for (the same in the quick
    and full sets: the suite is cheap). Tests shrink them.

    varlen_dense is the equal-length batch; the varlen side packs as many sequences and tokens, with
    random lengths in varlen_lengths. deterministic lists the shapes of the deterministic backward;
    the host-overhead rows use the plan's speedup_shape at overhead_seqlens."""

    varlen_dense: AttnShape = AttnShape(8, 2048, 2048, 16, 16, 128)
    varlen_lengths: tuple = (128, 4096)
    window: AttnShape = AttnShape(1, 16384, 16384, 16, 16, 128)
    window_left: int = 4096
    dropout: AttnShape = AttnShape(2, 8192, 8192, 16, 16, 128)
    dropout_p: float = 0.1
    deterministic: tuple = (AttnShape(2, 8192, 8192, 16, 16, 128), AttnShape(8, 2048, 2048, 32, 32, 64))
    overhead_seqlens: tuple = (128, 256, 512, 1024)
    dtype: str = "bf16"
    seed: int = 0


@dataclass
class Plan:
    """Everything a run measures. The shapes default to BENCHMARKS.md's (team design notes); tests shrink them.

    speedup_shape and memory_shape are (batch, nheads, headdim); decode_heads is
    (nheads, nheads_k, headdim); decode holds (batch, context) pairs; decode_copy_min_bytes is the
    smallest buffer the decode suite's copy-bandwidth reference copies. The speedup suite's
    dropout+mask series uses speedup_dropout_p and padding lengths drawn with padding_seed."""

    suites: tuple
    impls: tuple
    speed: list
    speedup_seqlens: tuple
    memory_seqlens: tuple
    decode: tuple
    materialized_cap_bytes: float
    quick: bool = True
    hidden: int = TRAINING_HIDDEN
    tokens: int = TRAINING_TOKENS
    speedup_shape: tuple = (8, 12, 64)  # BERT-base, the shape of the FlashAttention paper's speed-up figure
    memory_shape: tuple = (8, 16, 64)
    decode_heads: tuple = (32, 8, 128)
    speedup_dtype: str = "bf16"
    memory_dtype: str = "bf16"
    decode_dtype: str = "bf16"
    decode_copy_min_bytes: int = DECODE_COPY_MIN_BYTES
    speedup_dropout_p: float = 0.1
    padding_seed: int = 0
    features: FeaturePlan = field(default_factory=FeaturePlan)


def speed_configs(quick, dtypes=None, headdims=None, seqlens=None):
    """The speed suite's configurations, causal and non-causal for each (dtype, headdim, seqlen)."""
    dtypes = dtypes or (QUICK_DTYPES if quick else FULL_DTYPES)
    headdims = headdims or (QUICK_HEADDIMS if quick else FULL_HEADDIMS)
    sweep = seqlens or (QUICK_SEQLENS if quick else FULL_SEQLENS)
    points = [(hd, causal, s) for hd in headdims for causal in (False, True) for s in sweep]
    if quick and not seqlens and QUICK_EXTRA_POINT[0] in headdims:
        points.append(QUICK_EXTRA_POINT)
    points.sort()
    return [SpeedConfig(dtype, hd, causal, s) for dtype in dtypes for hd, causal, s in points]


def build_plan(quick=True, suites=None, dtypes=None, headdims=None, seqlens=None, impls=None):
    """The plan for the quick (default) or full set. seqlens, when given, replaces the sweep of the
    speed, speedup and memory suites; dtypes and headdims apply to the speed suite (the other suites
    have the fixed shapes BENCHMARKS.md gives, and the features suite those of its targets)."""
    suites = tuple(suites or SUITES)
    unknown = [name for name in suites if name not in SUITES]
    if unknown:
        raise ValueError(f"unknown suite(s) {', '.join(unknown)}; known: {', '.join(SUITES)}")
    for name in dtypes or ():
        if name not in DTYPES:
            raise ValueError(f"unknown dtype {name!r}; known: {', '.join(DTYPES)}")
    for headdim in headdims or ():
        if headdim <= 0 or TRAINING_HIDDEN % headdim:
            raise ValueError(f"headdim {headdim} does not divide the training shapes' hidden size {TRAINING_HIDDEN}")
    impls = tuple(impls or impl_lib.DEFAULT_TRAINING_IMPLS)
    for name in impls:
        impl_lib.training_impl(name)  # raises on an unknown name before anything runs
    key = "quick" if quick else "full"
    return Plan(
        suites=suites,
        impls=impls,
        speed=speed_configs(quick, dtypes, headdims, seqlens),
        speedup_seqlens=tuple(seqlens or SPEEDUP_SEQLENS[key]),
        memory_seqlens=tuple(seqlens or MEMORY_SEQLENS[key]),
        decode=DECODE_CONFIGS,
        materialized_cap_bytes=QUICK_MATERIALIZED_CAP_BYTES if quick else float("inf"),
        quick=quick,
    )
