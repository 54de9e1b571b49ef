"""The Triton backend's attention kernels compile for AMD GPUs (issue #9: a portable backend that
FlashAttention's AMD users reach with FLASH_ATTENTION_TRITON_AMD_ENABLE): no AMD GPU has run them, so
this is the one guard that a kernel change keeps the ROCm build possible. Compiled: the forward, dK /
dV and dQ kernels with the blocks ROCm launches (the portable ones, Triton's default warps and
stages), in bf16 under a causal mask with dropout (the most code), and the split-KV attention kernel
with decode blocks and every flag on (paged, rotary, softcap, ALiBi, ...), for MI300 (gfx942) and
MI200 (gfx90a), by the Triton wheel's own LLVM. The compile runs benchmarks/experiments/
triton_static_regs.py in a process of its own: the interpreter that conftest.py turns on replaces the
kernels this compile needs. Each kernel must fit the 64 KB of LDS a workgroup gets there (Triton
refuses a larger one when it loads it). CPU only."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="triton is not installed")

TOOL = Path(__file__).resolve().parents[1] / "benchmarks" / "experiments" / "triton_static_regs.py"
LDS_BYTES = 64 * 1024  # a workgroup's LDS on CDNA2 / CDNA3
ROW = re.compile(r"^\| (\w+) \| (\w+) \| (\d+) \| ([\w+]+) \| ([^|]+) \| (\w+) \| ([\d-]+) \| ([\d-]+) \|$")


def compiled_rows(arch, headdims):
    environment = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, str(TOOL), "--arch", arch, "--headdims", *map(str, headdims),
                           "--kernels", "forward", "dkdv", "dq", "kvcache", "--dtypes", "bf16",
                           "--features", "dropout"],
                          capture_output=True, text=True, env=environment, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return [ROW.match(line).groups() for line in done.stdout.splitlines() if ROW.match(line)]


@pytest.mark.parametrize("arch,headdims", [("gfx942", (64, 128, 256)), ("gfx90a", (128,))])
def test_attention_kernels_compile_for_amd(arch, headdims):
    rows = compiled_rows(arch, headdims)
    assert len(rows) == 4 * len(headdims)  # kernels x head dims
    for kernel, dtype, headdim, feature, tile, vgprs, scratch, lds in rows:
        assert vgprs.isdigit(), f"{kernel} {dtype} hd {headdim} did not compile for {arch}: {vgprs}"
        assert int(lds) <= LDS_BYTES, f"{kernel} {dtype} hd {headdim} ({tile}) takes {lds} B of LDS on {arch}"
