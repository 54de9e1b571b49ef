"""Header code of the kernels checked on the host: each tests/host/*_test.cpp includes one header
of csrc/flash with its CUDA qualifiers defined away, is compiled here with g++ and checks the
header's own code against a plain-C++ statement of what it must compute, printing "N wrong".
- fast_divmod_test.cpp: FastDivmod (the tile walk's division by launch-time divisors) against / and %.
- mask_test.cpp: AttentionMask's row-range and block queries (which key blocks the forward's step
  walk leaves unmasked) against the per-row ranges and block_fully_visible.
- env_switch_test.cpp: the kernel switches' reading of their environment variable (env_switch.h)."""

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("source", ["fast_divmod_test.cpp", "mask_test.cpp", "env_switch_test.cpp"])
def test_header_code_on_the_host(tmp_path, source):
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("g++ not found: this header code is checked by a host C++ test")
    binary = tmp_path / source.replace(".cpp", "")
    subprocess.run([compiler, "-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror", "-I", os.path.join(ROOT, "csrc"),
                    os.path.join(ROOT, "tests", "host", source), "-o", str(binary)], check=True)
    result = subprocess.run([str(binary)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert " 0 wrong" in result.stdout, result.stdout
