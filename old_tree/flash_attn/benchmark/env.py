"""The run's metadata (device, software versions, date) and the results folder named after it."""

import datetime
import platform
import re
import subprocess
from pathlib import Path

import torch

import flash_attn
from flash_attn import ops

RESULTS_ROOT = Path("benchmarks") / "results"  # relative to the working directory: run from the repo root


def cudnn_version():
    """cuDNN's version as text ('9.19.0'), or None. torch reports 91900 for 9.19.0 (cuDNN 9 encodes
    major * 10000 + minor * 100 + patch) and 8902 for 8.9.2 (cuDNN 8: major * 1000 + ...)."""
    version = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    if not version:
        return None
    if version >= 90000:
        return f"{version // 10000}.{version % 10000 // 100}.{version % 100}"
    return f"{version // 1000}.{version % 1000 // 100}.{version % 100}"


def triton_version():
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__


def _git(*args):
    """stdout of `git args` in this package's checkout, or None where git or a checkout is missing."""
    try:
        result = subprocess.run(["git", *args], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def git_commit():
    """The checkout's commit, or None outside a git checkout (the GPU machine may get no .git), with
    " + uncommitted changes" where tracked files differ from it: the GPU machine's copy of the
    working tree can carry an older .git than the code that runs."""
    commit = _git("rev-parse", "--short", "HEAD")
    if not commit:
        return None
    changes = _git("status", "--porcelain", "--untracked-files=no")
    return commit + (" + uncommitted changes" if changes else "")


def device_info():
    """Name, compute capability, SM count and memory (GiB) of the current CUDA device, or the CPU."""
    if not torch.cuda.is_available():
        return {"device": f"CPU ({platform.processor() or platform.machine()})"}
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {
        "device": props.name,
        "capability": f"{props.major}.{props.minor}",
        "sm_count": props.multi_processor_count,
        "memory_gib": round(props.total_memory / 2**30, 1),
    }


def collect_metadata(timer_description=None, arguments=None):
    """Everything a number needs beside it to be read later: device, versions, date, method."""
    now = datetime.datetime.now().astimezone()
    return {
        **device_info(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": cudnn_version(),
        "triton": triton_version(),
        "python": platform.python_version(),
        "flash_attn": flash_attn.__version__,
        "flash_attn_cuda_kernels": ops.has_cuda_kernels(),
        "git_commit": git_commit(),
        "date": now.date().isoformat(),
        "time": now.isoformat(timespec="seconds"),
        "timer": timer_description,
        "arguments": arguments,
    }


def device_slug(name):
    """'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3'."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "device"


def default_results_dir(metadata):
    """benchmarks/results/<device-slug>_<YYYY-MM-DD>/."""
    return RESULTS_ROOT / f"{device_slug(metadata['device'])}_{metadata['date']}"


def environment_line(metadata):
    """One line for titles and headers: device · torch · CUDA · cuDNN · date."""
    return (f"{metadata['device']} · torch {metadata['torch']} · CUDA {metadata['cuda']} · "
            f"cuDNN {metadata['cudnn']} · {metadata['date']}")
