"""csrc/flash/fast_divmod.h, the tile walk's division by launch-time divisors, checked on the host: its
own code compiled with g++ (tests/host/fast_divmod_test.cpp) against / and %."""

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_fast_divmod_matches_integer_division(tmp_path):
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("g++ not found: FastDivmod is checked by a host C++ test")
    binary = tmp_path / "fast_divmod_test"
    subprocess.run([compiler, "-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror", "-I", os.path.join(ROOT, "csrc"),
                    os.path.join(ROOT, "tests", "host", "fast_divmod_test.cpp"), "-o", str(binary)], check=True)
    result = subprocess.run([str(binary)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert " 0 wrong" in result.stdout, result.stdout
