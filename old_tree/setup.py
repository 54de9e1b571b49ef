"""Builds flash_attn and, where torch has CUDA (or ROCm) and nvcc (or hipcc) is present, its GPU
extension flash_attn._C. The build variables (BUILD_TARGET, FLASH_ATTN_CUDA_ARCHS, PYTORCH_ROCM_ARCH,
...) and the choice of what to build are in build_config.py, which tests import without running
setup().
"""

import os
import sys

from setuptools import find_packages, setup

# setuptools runs this file with its own directory as the working directory but not always on sys.path.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import build_config  # noqa: E402

setup(
    name="flash_attn",
    version="0.1.0",
    description="Fast, memory-efficient, exact attention with hand-written CUDA kernels (FlashAttention 2 API)",
    packages=find_packages(include=["flash_attn", "flash_attn.*"]),
    python_requires=">=3.9",
    install_requires=["torch"],
    **build_config.extension_setup_kwargs(),
)
