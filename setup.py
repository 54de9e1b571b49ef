"""Builds flash_attn and, where torch has CUDA and nvcc is present, its CUDA extension flash_attn._C.

Build variables (all optional):
  FLASH_ATTN_CUDA_ARCHS   compute capabilities, default "80;90" (sm80 code also serves sm86/sm89;
                          90 is built as sm_90a, which adds the Hopper wgmma backward; the newest
                          also ships as PTX for later GPUs)
  FLASH_ATTN_DTYPES       "fp16;bf16" (default) or one of them
  FLASH_ATTN_HDIMS        compiled head dims, default "32;64;96;128;192;256"; other head dims run
                          on the next larger compiled one
  FLASH_ATTN_SKIP_CUDA_BUILD=1   pure-Python install (CPU path only)
  FLASH_ATTN_LINEINFO=1   add -lineinfo (for compute-sanitizer and profilers)
  FLASH_ATTN_PTXAS_VERBOSE=1     print registers, spills and shared memory per kernel
  FLASH_ATTN_DISABLE_{DROPOUT,SOFTCAP,ALIBI,LOCAL,VARLEN}=1   compile a feature out (trimmed dev
                          builds; calls that need it raise, and its tests skip naming the flag)
  MAX_JOBS                parallel compile jobs (ninja)
A dev build such as FLASH_ATTN_HDIMS=128 FLASH_ATTN_DTYPES=bf16 FLASH_ATTN_CUDA_ARCHS=90 compiles 2
kernels instead of 24.
"""

import os
import sys

from setuptools import find_packages, setup

ROOT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(ROOT, "csrc"))
import generate_instantiations  # noqa: E402

ALL_CUDA_ARCHS = ("80", "86", "89", "90")
FEATURE_FLAGS = ("DROPOUT", "SOFTCAP", "ALIBI", "LOCAL", "VARLEN")
# Kernel sources compiled once whatever the dtype / head dim selection.
SHARED_KERNEL_SOURCES = ("csrc/flash/dropout_mask.cu",)
# The torch-facing C++: the ops' CUDA implementations (training, kvcache) and the CUDA autograd of
# flash_attn::fwd.
TORCH_SOURCES = ("csrc/torch/ops.cpp", "csrc/torch/ops_kvcache.cpp", "csrc/torch/autograd.cpp")
_ARCH_SUFFIX = {"90": "a"}  # arch-specific features (wgmma) need sm_90a


def _env(name, default=""):
    return os.environ.get(name, default).strip()


def _cuda_build_reason_to_skip():
    """None when the CUDA extension can be built here, else why not."""
    if _env("FLASH_ATTN_SKIP_CUDA_BUILD") == "1":
        return "FLASH_ATTN_SKIP_CUDA_BUILD=1"
    try:
        import torch
        from torch.utils.cpp_extension import CUDA_HOME
    except ImportError:
        return "torch is not installed in the build environment (use pip install --no-build-isolation)"
    if torch.version.cuda is None:
        return f"torch {torch.__version__} has no CUDA"
    if CUDA_HOME is None:
        return "no CUDA toolkit (nvcc) found"
    return None


def _gencode_flags():
    archs = generate_instantiations.parse_selection(_env("FLASH_ATTN_CUDA_ARCHS", "80;90"), ALL_CUDA_ARCHS,
                                                    "FLASH_ATTN_CUDA_ARCHS")
    # sm_90 code is built as sm_90a, the Hopper-only target that has wgmma (the sm90 backward);
    # the PTX kept for newer GPUs is plain compute_XX, so there those kernels are the sm80 ones.
    flags = [f"-gencode=arch=compute_{arch}{_ARCH_SUFFIX.get(arch, '')},code=sm_{arch}{_ARCH_SUFFIX.get(arch, '')}"
             for arch in archs]
    flags.append(f"-gencode=arch=compute_{archs[-1]},code=compute_{archs[-1]}")  # PTX for newer GPUs
    return flags


def _cuda_extension():
    from torch.utils.cpp_extension import CUDAExtension

    dtypes = generate_instantiations.parse_selection(_env("FLASH_ATTN_DTYPES"), generate_instantiations.ALL_DTYPES,
                                                     "FLASH_ATTN_DTYPES")
    hdims = generate_instantiations.parse_selection(_env("FLASH_ATTN_HDIMS"), generate_instantiations.ALL_HEADDIMS,
                                                    "FLASH_ATTN_HDIMS", int)
    kernel_sources = generate_instantiations.generate(os.path.join(ROOT, "csrc", "instantiations"), dtypes, hdims)
    defines = [f"-DFLASH_ATTN_DISABLE_{name}" for name in FEATURE_FLAGS if _env(f"FLASH_ATTN_DISABLE_{name}") == "1"]
    nvcc_flags = ["-O3", "--expt-relaxed-constexpr", *_gencode_flags(), *defines]
    if _env("FLASH_ATTN_LINEINFO") == "1":
        nvcc_flags.append("-lineinfo")
    if _env("FLASH_ATTN_PTXAS_VERBOSE") == "1":
        nvcc_flags.append("-Xptxas=-v")
    sources = [os.path.relpath(p, ROOT) for p in kernel_sources] + list(SHARED_KERNEL_SOURCES) + list(TORCH_SOURCES)
    return CUDAExtension(
        name="flash_attn._C",
        sources=sources,
        include_dirs=[os.path.join(ROOT, "csrc")],
        extra_compile_args={"cxx": ["-O3", *defines], "nvcc": nvcc_flags},
    )


def _build_config():
    reason = _cuda_build_reason_to_skip()
    if reason is not None:
        print(f"flash_attn: building without the CUDA extension ({reason}); CPU tensors use the reference path")
        return {}
    from torch.utils.cpp_extension import BuildExtension

    return {"ext_modules": [_cuda_extension()], "cmdclass": {"build_ext": BuildExtension}}


setup(
    name="flash_attn",
    version="0.1.0",
    description="Fast, memory-efficient, exact attention with hand-written CUDA kernels (FlashAttention 2 API)",
    packages=find_packages(include=["flash_attn", "flash_attn.*"]),
    python_requires=">=3.9",
    install_requires=["torch"],
    **_build_config(),
)
