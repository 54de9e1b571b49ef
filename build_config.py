"""What setup.py builds: the GPU extension flash_attn._C for CUDA (nvcc) or ROCm (hipcc), or none.

Kept out of setup.py so that tests can import it without running setup().

Build variables (all optional):
  BUILD_TARGET            auto (default), cuda or rocm. auto builds for the GPU platform of the
                          installed torch (ROCm when torch.version.hip is set, CUDA when
                          torch.version.cuda is) and installs pure Python when it has none; an
                          explicit cuda or rocm that cannot be built here is an error
  FLASH_ATTN_CUDA_ARCHS   compute capabilities, default "80;90" (sm80 code also serves sm86/sm89;
                          90 is built as sm_90a, which adds the Hopper wgmma backward; the newest
                          also ships as PTX for later GPUs)
  PYTORCH_ROCM_ARCH       AMD GPU targets of the ROCm build, default "gfx90a;gfx942" (MI200, MI300)
  FLASH_ATTN_DTYPES       "fp16;bf16" (default) or one of them
  FLASH_ATTN_HDIMS        compiled head dims, default "32;64;96;128;192;256"; other head dims run
                          on the next larger compiled one
  FLASH_ATTN_SKIP_CUDA_BUILD=1   pure-Python install (CPU path only), whatever BUILD_TARGET says
  FLASH_ATTN_LINEINFO=1   line tables in device code (-lineinfo; -gline-tables-only on ROCm), for
                          compute-sanitizer and profilers
  FLASH_ATTN_PTXAS_VERBOSE=1     print registers, spills and shared memory per kernel (on ROCm:
                          -Rpass-analysis=kernel-resource-usage)
  FLASH_ATTN_DISABLE_{DROPOUT,SOFTCAP,ALIBI,LOCAL,VARLEN}=1   compile a feature out (trimmed dev
                          builds; calls that need it raise, and its tests skip naming the flag)
  MAX_JOBS                parallel compile jobs (ninja)
A dev build such as FLASH_ATTN_HDIMS=128 FLASH_ATTN_DTYPES=bf16 FLASH_ATTN_CUDA_ARCHS=90 compiles 2
kernels instead of 24.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(ROOT, "csrc"))
import generate_instantiations  # noqa: E402

BUILD_TARGETS = ("auto", "cuda", "rocm")
SKIP_VARIABLE = "FLASH_ATTN_SKIP_CUDA_BUILD"
ALL_CUDA_ARCHS = ("80", "86", "89", "90")
DEFAULT_ROCM_ARCHS = "gfx90a;gfx942"  # MI200 (CDNA2) and MI300 (CDNA3)
FEATURE_FLAGS = ("DROPOUT", "SOFTCAP", "ALIBI", "LOCAL", "VARLEN")
# Kernel sources compiled once whatever the dtype / head dim selection.
SHARED_KERNEL_SOURCES = ("csrc/flash/dropout_mask.cu", "csrc/flash/fp8_v_layout.cu")
# The torch-facing C++: the ops' CUDA implementations (training, kvcache) and the CUDA autograd of
# flash_attn::fwd.
TORCH_SOURCES = ("csrc/torch/ops.cpp", "csrc/torch/ops_kvcache.cpp", "csrc/torch/ops_fp8.cpp", "csrc/torch/autograd.cpp")
_ARCH_SUFFIX = {"90": "a"}  # arch-specific features (wgmma) need sm_90a
# A gfx target, optionally with target features: gfx90a, gfx942:sramecc+:xnack-
_ROCM_ARCH_PATTERN = re.compile(r"gfx[0-9a-z]+(:[a-z]+[+-])*")
# (compiler, variables naming its toolkit, default toolkit) as torch's extension builder looks for them.
COMPILER_SEARCHES = (("nvcc", ("CUDA_HOME", "CUDA_PATH"), "/usr/local/cuda"),
                     ("hipcc", ("ROCM_PATH", "ROCM_HOME"), "/opt/rocm"))

# pip captures a build's output and shows it only with -v or when the build fails, so the skip
# warning also goes to the terminal that pip runs in, where there is one (not in CI or docker build).
TERMINAL = "/dev/tty"

_BUILD_REQUIREMENTS_FIX = ("install torch and the build requirements into this environment, then build against them:\n"
                           "    pip install torch ninja setuptools wheel\n"
                           "    pip install --no-build-isolation -e .\n"
                           "(without --no-build-isolation pip builds in a fresh environment that has no torch)")
_GPU_TORCH_FIX = ("install a CUDA or ROCm build of torch (pytorch.org's install selector gives the command), "
                  "then pip install --no-build-isolation -e .")
_NVCC_FIX = "install the CUDA toolkit that matches torch's CUDA and put nvcc on PATH or set CUDA_HOME"
_HIPCC_FIX = "install the ROCm that matches torch's and set ROCM_PATH (or put hipcc on PATH)"


class BuildTargetError(RuntimeError):
    """BUILD_TARGET named a platform that cannot be built on this machine."""


@dataclass(frozen=True)
class TorchBuild:
    """What the installed torch was built for, and the toolkits its extension builder found."""

    version: str
    cuda: str | None
    hip: str | None
    cuda_home: str | None
    rocm_home: str | None


@dataclass(frozen=True)
class BuildProblem:
    """Why flash_attn._C cannot be built, and what the user can do about it."""

    reason: str
    fix: str


def _env(name, default=""):
    return os.environ.get(name, default).strip()


def requested_target():
    target = _env("BUILD_TARGET", "auto").lower() or "auto"
    if target not in BUILD_TARGETS:
        raise ValueError(f"BUILD_TARGET={target!r}: choose one of {', '.join(BUILD_TARGETS)}")
    return target


def probe_torch():
    """The installed torch as a TorchBuild, or None when it cannot be imported."""
    try:
        import torch
        from torch.utils import cpp_extension
    except ImportError:
        return None
    return TorchBuild(version=torch.__version__, cuda=torch.version.cuda, hip=getattr(torch.version, "hip", None),
                      cuda_home=cpp_extension.CUDA_HOME, rocm_home=cpp_extension.ROCM_HOME)


def choose_target(requested, torch_build):
    """(target, problem): the platform to build for ("cuda", "rocm" or None) and a BuildProblem when it
    cannot be built (None when it can)."""
    if torch_build is None:
        return None, BuildProblem("torch is not installed in the build environment", _BUILD_REQUIREMENTS_FIX)
    target = requested if requested != "auto" else _platform_of(torch_build)
    if target is None:
        return None, BuildProblem(f"torch {torch_build.version} is a CPU-only build (neither CUDA nor ROCm)",
                                  _GPU_TORCH_FIX)
    return target, _cuda_problem(torch_build) if target == "cuda" else _rocm_problem(torch_build)


def _platform_of(torch_build):
    # hip first, as torch's extension builder decides: a torch reporting both builds a HIP extension.
    if torch_build.hip:
        return "rocm"
    return "cuda" if torch_build.cuda else None


def _cuda_problem(torch_build):
    if torch_build.cuda is None:
        return BuildProblem(f"torch {torch_build.version} has no CUDA", _GPU_TORCH_FIX)
    if torch_build.cuda_home is None:
        return BuildProblem(f"no CUDA toolkit (nvcc) found for torch's CUDA {torch_build.cuda}", _NVCC_FIX)
    return None


def _rocm_problem(torch_build):
    if torch_build.hip is None:
        return BuildProblem(f"torch {torch_build.version} has no ROCm", _GPU_TORCH_FIX)
    if torch_build.rocm_home is None:
        return BuildProblem(f"no ROCm toolkit (hipcc) found for torch's ROCm {torch_build.hip}", _HIPCC_FIX)
    return None


def gpu_compilers_found():
    """Paths of nvcc and hipcc on this machine, looked for without torch (which may be missing or CPU-only):
    on PATH, under CUDA_HOME / CUDA_PATH / ROCM_PATH / ROCM_HOME, or at the default install places."""
    found = []
    for compiler, home_variables, default_home in COMPILER_SEARCHES:
        homes = [_env(name) for name in home_variables if _env(name)] + [default_home]
        candidates = [shutil.which(compiler)] + [os.path.join(home, "bin", compiler) for home in homes]
        found += [path for path in candidates if path and os.path.isfile(path)][:1]
    return found


def skip_warning(problem, compilers):
    """The multi-line warning for a machine with a GPU compiler that still gets no GPU extension."""
    rule = "=" * 100
    fix = problem.fix.replace("\n", "\n          ")
    return "\n".join([
        rule,
        "flash_attn WARNING: the GPU extension flash_attn._C is NOT being built; this is a pure-Python install",
        f"  found:  {', '.join(compilers)}",
        f"  why:    {problem.reason}",
        "  effect: GPU tensors raise 'flash_attn._C could not be imported'; CPU tensors use the slow reference path",
        f"  fix:    {fix}",
        f"  BUILD_TARGET=cuda or rocm makes this an error; {SKIP_VARIABLE}=1 makes a pure-Python install deliberate",
        rule,
    ])


def extension_setup_kwargs(root=None):
    """setup() arguments for the GPU extension; {} for a pure-Python install. root: the source tree
    (ROOT, looked up at call time so that tests can point the generated sources elsewhere)."""
    root = root or ROOT
    if _env(SKIP_VARIABLE) == "1":
        print(f"flash_attn: building without the GPU extension ({SKIP_VARIABLE}=1); CPU tensors use the reference path")
        return {}
    requested = requested_target()
    target, problem = choose_target(requested, probe_torch())
    if problem is not None:
        return _skip(requested, problem)
    from torch.utils.cpp_extension import BuildExtension

    return {"ext_modules": [gpu_extension(target, root)], "cmdclass": {"build_ext": BuildExtension}}


def _skip(requested, problem):
    if requested != "auto":
        raise BuildTargetError(f"BUILD_TARGET={requested}, but flash_attn._C cannot be built: {problem.reason}.\n"
                               f"Fix: {problem.fix}\n"
                               f"({SKIP_VARIABLE}=1 installs pure Python instead.)")
    compilers = gpu_compilers_found()
    if compilers:
        warning = skip_warning(problem, compilers)
        print(warning, file=sys.stderr)
        tell_terminal(warning)
    else:
        print(f"flash_attn: building without the GPU extension ({problem.reason}); CPU tensors use the reference path")
    return {}


def tell_terminal(text):
    """Writes text to the controlling terminal (TERMINAL) unless stderr already is it; True if it did.
    Under pip, stderr is a pipe that pip shows only with -v: the terminal is where a user sees it."""
    try:
        if sys.stderr.isatty():
            return False
        with open(TERMINAL, "w", encoding="utf-8") as terminal:
            terminal.write(text + "\n")
    except (OSError, ValueError):  # no controlling terminal (CI, docker build), or stderr closed
        return False
    return True


def gpu_extension(target, root):
    # On a ROCm torch the same CUDAExtension hipifies the sources and compiles them with hipcc.
    from torch.utils.cpp_extension import CUDAExtension

    return CUDAExtension(**extension_kwargs(target, root))


def extension_kwargs(target, root):
    """CUDAExtension's arguments for target ("cuda" or "rocm"); writes the instantiation sources."""
    defines = feature_defines()
    device_flags = cuda_device_flags(defines) if target == "cuda" else rocm_device_flags(defines)
    return {
        "name": "flash_attn._C",
        "sources": _sources(root, target),
        "include_dirs": [os.path.join(root, "csrc")],
        "extra_compile_args": {"cxx": ["-O3", *defines], "nvcc": device_flags},
    }


def _sources(root, target):
    dtypes = generate_instantiations.parse_selection(_env("FLASH_ATTN_DTYPES"), generate_instantiations.ALL_DTYPES,
                                                     "FLASH_ATTN_DTYPES")
    hdims = generate_instantiations.parse_selection(_env("FLASH_ATTN_HDIMS"), generate_instantiations.ALL_HEADDIMS,
                                                    "FLASH_ATTN_HDIMS", int)
    kernel_sources = generate_instantiations.generate(os.path.join(root, "csrc", "instantiations"), dtypes, hdims,
                                                      target, fp8=target == "cuda" and "90" in cuda_archs())
    return [os.path.relpath(p, root) for p in kernel_sources] + list(SHARED_KERNEL_SOURCES) + list(TORCH_SOURCES)


def feature_defines():
    return [f"-DFLASH_ATTN_DISABLE_{name}" for name in FEATURE_FLAGS if _env(f"FLASH_ATTN_DISABLE_{name}") == "1"]


def _debug_flags(lineinfo_flag, verbose_flag):
    """The compiler's spellings of FLASH_ATTN_LINEINFO=1 and FLASH_ATTN_PTXAS_VERBOSE=1."""
    flags = []
    if _env("FLASH_ATTN_LINEINFO") == "1":
        flags.append(lineinfo_flag)
    if _env("FLASH_ATTN_PTXAS_VERBOSE") == "1":
        flags.append(verbose_flag)
    return flags


def cuda_device_flags(defines):
    return ["-O3", "--expt-relaxed-constexpr", *gencode_flags(), *defines, *_debug_flags("-lineinfo", "-Xptxas=-v")]


def cuda_archs():
    return generate_instantiations.parse_selection(_env("FLASH_ATTN_CUDA_ARCHS", "80;90"), ALL_CUDA_ARCHS,
                                                   "FLASH_ATTN_CUDA_ARCHS")


def gencode_flags():
    archs = cuda_archs()
    # sm_90 code is built as sm_90a, the Hopper-only target that has wgmma (the sm90 backward);
    # the PTX kept for newer GPUs is plain compute_XX, so there those kernels are the sm80 ones.
    flags = [f"-gencode=arch=compute_{arch}{_ARCH_SUFFIX.get(arch, '')},code=sm_{arch}{_ARCH_SUFFIX.get(arch, '')}"
             for arch in archs]
    flags.append(f"-gencode=arch=compute_{archs[-1]},code=compute_{archs[-1]}")  # PTX for newer GPUs
    return flags


def rocm_device_flags(defines):
    # No --expt-relaxed-constexpr: clang (hipcc) already lets device code call constexpr functions
    # and rejects nvcc's flag. Giving --offload-arch ourselves stops torch from choosing the targets
    # (from PYTORCH_ROCM_ARCH, else the GPUs visible at build time: none in a container build).
    return ["-O3", *[f"--offload-arch={arch}" for arch in rocm_archs()], *defines,
            *_debug_flags("-gline-tables-only", "-Rpass-analysis=kernel-resource-usage")]


def rocm_archs():
    """PYTORCH_ROCM_ARCH as a list; ';' or spaces separate targets, as in torch's own builds."""
    archs = _env("PYTORCH_ROCM_ARCH").replace(",", ";").replace(" ", ";").split(";")
    archs = [arch for arch in archs if arch] or DEFAULT_ROCM_ARCHS.split(";")
    unknown = [arch for arch in archs if not _ROCM_ARCH_PATTERN.fullmatch(arch)]
    if unknown:
        raise ValueError(f"PYTORCH_ROCM_ARCH: {unknown} are not AMD GPU targets such as gfx90a or gfx942")
    return archs
