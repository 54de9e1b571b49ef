"""The package imports, exposes its API, registers its ops and reports its build (CPU, runs in CI;
on the GPU machine the same tests check the built extension); the build's choices (build_config.py:
target, flags, skip warnings and errors) with a mocked torch; the Dockerfiles run README's commands."""

import os
import re
import runpy
import sys
from pathlib import Path

import pytest
import torch

import flash_attn
import flash_attn.ops
from helpers import opcheck_both_ops

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
import build_config  # noqa: E402

PUBLIC_FUNCTIONS = ("flash_attn_func", "flash_attn_kvpacked_func", "flash_attn_qkvpacked_func", "flash_attn_varlen_func",
                    "flash_attn_varlen_kvpacked_func", "flash_attn_varlen_qkvpacked_func", "flash_attn_with_kvcache")


def test_version_and_public_names():
    assert re.fullmatch(r"\d+\.\d+\.\d+([.+-]?\w+)*", flash_attn.__version__)
    assert set(flash_attn.__all__) == set(PUBLIC_FUNCTIONS) | {"__version__"}
    for name in flash_attn.__all__:
        assert getattr(flash_attn, name) is not None
    for name in PUBLIC_FUNCTIONS:
        assert callable(getattr(flash_attn, name)) and getattr(flash_attn, name).__doc__


def test_flash_attn_interface_module_path():
    """FA2's module path: `from flash_attn.flash_attn_interface import ...` finds the same functions."""
    import flash_attn.flash_attn_interface as fai

    for name in PUBLIC_FUNCTIONS:
        assert getattr(fai, name) is getattr(flash_attn, name)


def test_signatures_match_flash_attention_2():
    """Argument names, order and defaults as in FlashAttention 2 (2.6+); after them, keyword-only,
    FlashAttention 3's fp8 descales on flash_attn_func and flash_attn_varlen_func."""
    import inspect

    options = ["dropout_p=0.0", "softmax_scale=None", "causal=False", "window_size=(-1, -1)", "softcap=0.0",
               "alibi_slopes=None", "deterministic=False", "return_attn_probs=False"]
    expected = {
        "flash_attn_func": ["q", "k", "v"] + options,
        "flash_attn_qkvpacked_func": ["qkv"] + options,
        "flash_attn_kvpacked_func": ["q", "kv"] + options,
        "flash_attn_varlen_func": ["q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k"]
        + options + ["block_table=None"],
        "flash_attn_varlen_qkvpacked_func": ["qkv", "cu_seqlens", "max_seqlen"] + options,
        "flash_attn_varlen_kvpacked_func": ["q", "kv", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q",
                                            "max_seqlen_k"] + options,
        "flash_attn_with_kvcache": ["q", "k_cache", "v_cache", "k=None", "v=None", "rotary_cos=None",
                                    "rotary_sin=None", "cache_seqlens=None", "cache_batch_idx=None",
                                    "cache_leftpad=None", "block_table=None", "softmax_scale=None", "causal=False",
                                    "window_size=(-1, -1)", "softcap=0.0", "rotary_interleaved=True",
                                    "alibi_slopes=None", "num_splits=0", "return_softmax_lse=False"],
    }
    fp8_keywords = ["q_descale=None", "k_descale=None", "v_descale=None"]
    for name, parameters in expected.items():
        signature = inspect.signature(getattr(flash_attn, name)).parameters.values()
        assert [str(p) for p in signature if p.kind != p.KEYWORD_ONLY] == parameters
        keywords = fp8_keywords if name in ("flash_attn_func", "flash_attn_varlen_func") else []
        assert [str(p) for p in signature if p.kind == p.KEYWORD_ONLY] == keywords


def test_ops_are_registered():
    for op in (torch.ops.flash_attn.fwd, torch.ops.flash_attn.bwd):
        assert isinstance(op.default, torch._ops.OpOverload)
    assert "softmax_scale" in str(torch.ops.flash_attn.fwd.default._schema)
    assert torch._C._dispatch_has_kernel_for_dispatch_key("flash_attn::fwd", "CPU")
    assert torch._C._dispatch_has_kernel_for_dispatch_key("flash_attn::bwd", "CPU")


OPCHECK_CASES = {  # name: kwargs of opcheck_both_ops
    "plain": dict(nheads_k=4, window=(-1, -1)),
    "causal_gqa": dict(nheads_k=2, window=(-1, 0)),
    "window_softcap_alibi": dict(nheads_k=2, window=(2, 1), softcap=3.0, alibi=True),
    "varlen_causal": dict(nheads_k=2, window=(-1, 0), varlen=True, alibi=True),
    # dropout draws a new mask per call, so only the checks that compare no values across calls
    "dropout": dict(nheads_k=2, window=(-1, 0), dropout_p=0.2, test_utils=("test_schema", "test_faketensor")),
}


@pytest.mark.parametrize("case", OPCHECK_CASES)
def test_opcheck_cpu(case):
    opcheck_both_ops("cpu", **OPCHECK_CASES[case])


def test_build_report():
    """has_cuda_kernels / cuda_kernels_unavailable_reason / compiled_configs tell one consistent story."""
    if flash_attn.ops.has_cuda_kernels():
        assert flash_attn.ops.cuda_kernels_unavailable_reason() is None
        configs = flash_attn.ops.compiled_configs()
        assert configs, "the extension was built with no (dtype, headdim) at all"
        for dtype, headdim in configs:
            assert dtype in (torch.float16, torch.bfloat16) and isinstance(headdim, int)
            assert headdim % 8 == 0 and 8 <= headdim <= 256
        assert torch._C._dispatch_has_kernel_for_dispatch_key("flash_attn::fwd", "CUDA")
        assert torch._C._dispatch_has_kernel_for_dispatch_key("flash_attn::bwd", "CUDA")
    else:
        reason = flash_attn.ops.cuda_kernels_unavailable_reason()
        assert isinstance(reason, str) and "flash_attn._C" in reason
        assert flash_attn.ops.compiled_configs() == set()
        with pytest.raises(RuntimeError, match="flash_attn._C (could not be imported|is not built)"):
            flash_attn.ops.set_poison_outputs(True)


# ---- the build: what setup.py builds, with a mocked torch ----

BUILD_VARIABLES = ("BUILD_TARGET", "PYTORCH_ROCM_ARCH", "CUDA_HOME", "CUDA_PATH", "ROCM_PATH", "ROCM_HOME")


def torch_build(cuda=None, hip=None, cuda_home="/usr/local/cuda", rocm_home="/opt/rocm"):
    return build_config.TorchBuild(version="2.13.0", cuda=cuda, hip=hip, cuda_home=cuda_home, rocm_home=rocm_home)


CUDA_TORCH = torch_build(cuda="13.0")
ROCM_TORCH = torch_build(hip="7.0.1")
CPU_TORCH = torch_build()


@pytest.fixture
def build_env(monkeypatch, tmp_path):
    """No build variable set, and the generated kernel sources written under tmp_path, not the tree."""
    for name in list(os.environ):
        if name.startswith("FLASH_ATTN_") or name in BUILD_VARIABLES:
            monkeypatch.delenv(name)
    monkeypatch.setattr(build_config, "ROOT", str(tmp_path))
    monkeypatch.setattr(build_config, "TERMINAL", str(tmp_path / "terminal"))  # never the real /dev/tty
    return monkeypatch


@pytest.fixture
def extension_calls(build_env):
    """The installed (CPU) torch made to look like a GPU build; CUDAExtension's calls are recorded."""
    from torch.utils import cpp_extension

    calls = []

    def fake_extension(name, sources, **kwargs):
        calls.append({"name": name, "sources": sources, **kwargs})
        return "flash_attn._C extension"

    build_env.setattr(cpp_extension, "CUDAExtension", fake_extension)
    return calls


def make_torch_look_like(monkeypatch, build):
    from torch.utils import cpp_extension

    monkeypatch.setattr(torch.version, "cuda", build.cuda)
    monkeypatch.setattr(torch.version, "hip", build.hip)
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", build.cuda_home)
    monkeypatch.setattr(cpp_extension, "ROCM_HOME", build.rocm_home)


def run_setup_py(monkeypatch):
    """setup.py run as setuptools runs it, with setup() replaced: its keyword arguments."""
    import setuptools

    captured = {}
    monkeypatch.setattr(setuptools, "setup", lambda **kwargs: captured.update(kwargs))
    monkeypatch.setattr(sys, "path", list(sys.path))
    runpy.run_path(str(REPO / "setup.py"), run_name="__main__")
    return captured


# CUDAExtension's arguments as the setup.py before the ROCm target computed them (its _cuda_extension()
# run with a mocked CUDA torch, commit c93103d): the CUDA build must not change. Since then the builds
# that include sm_90a gained the fp8 forward's sources (fwd_fp8_hd128 / 256, ops_fp8.cpp).
_ALL_KERNEL_SOURCES = """
fwd_fp16_hd32 bwd_fp16_hd32 fwd_kvcache_fp16_hd32 fwd_fp16_hd64 bwd_fp16_hd64 fwd_kvcache_fp16_hd64
fwd_fp16_hd96 bwd_fp16_hd96 fwd_kvcache_fp16_hd96 fwd_fp16_hd128 bwd_fp16_hd128 fwd_kvcache_fp16_hd128
fwd_fp16_hd192 bwd_fp16_hd192 fwd_kvcache_fp16_hd192 fwd_fp16_hd256 bwd_fp16_hd256 fwd_kvcache_fp16_hd256
fwd_bf16_hd32 bwd_bf16_hd32 fwd_kvcache_bf16_hd32 fwd_bf16_hd64 bwd_bf16_hd64 fwd_kvcache_bf16_hd64
fwd_bf16_hd96 bwd_bf16_hd96 fwd_kvcache_bf16_hd96 fwd_bf16_hd128 bwd_bf16_hd128 fwd_kvcache_bf16_hd128
fwd_bf16_hd192 bwd_bf16_hd192 fwd_kvcache_bf16_hd192 fwd_bf16_hd256 bwd_bf16_hd256 fwd_kvcache_bf16_hd256
""".split()
_FP8_KERNEL_SOURCES = ["fwd_fp8_hd128", "fwd_fp8_hd256"]
_OTHER_SOURCES = ["csrc/flash/dropout_mask.cu", "csrc/flash/fp8_v_layout.cu", "csrc/torch/ops.cpp",
                  "csrc/torch/ops_kvcache.cpp", "csrc/torch/ops_fp8.cpp", "csrc/torch/autograd.cpp"]
_ALL_DISABLED = ["-DFLASH_ATTN_DISABLE_DROPOUT", "-DFLASH_ATTN_DISABLE_SOFTCAP", "-DFLASH_ATTN_DISABLE_ALIBI",
                 "-DFLASH_ATTN_DISABLE_LOCAL", "-DFLASH_ATTN_DISABLE_VARLEN"]
RECORDED_CUDA_EXTENSIONS = {  # case: (build variables, kernel sources, cxx flags, nvcc flags)
    "default": ({}, _ALL_KERNEL_SOURCES + _FP8_KERNEL_SOURCES, ["-O3"],
                ["-O3", "--expt-relaxed-constexpr", "-gencode=arch=compute_80,code=sm_80",
                 "-gencode=arch=compute_90a,code=sm_90a", "-gencode=arch=compute_90,code=compute_90"]),
    "dev_build": ({"FLASH_ATTN_CUDA_ARCHS": "90", "FLASH_ATTN_HDIMS": "128", "FLASH_ATTN_DTYPES": "bf16"},
                  ["fwd_bf16_hd128", "bwd_bf16_hd128", "fwd_kvcache_bf16_hd128", "fwd_fp8_hd128"], ["-O3"],
                  ["-O3", "--expt-relaxed-constexpr", "-gencode=arch=compute_90a,code=sm_90a",
                   "-gencode=arch=compute_90,code=compute_90"]),
    "everything": ({"FLASH_ATTN_CUDA_ARCHS": "80;86;89;90", "FLASH_ATTN_LINEINFO": "1", "FLASH_ATTN_PTXAS_VERBOSE": "1",
                    **{flag[2:]: "1" for flag in _ALL_DISABLED}},
                   _ALL_KERNEL_SOURCES + _FP8_KERNEL_SOURCES, ["-O3", *_ALL_DISABLED],
                   ["-O3", "--expt-relaxed-constexpr", "-gencode=arch=compute_80,code=sm_80",
                    "-gencode=arch=compute_86,code=sm_86", "-gencode=arch=compute_89,code=sm_89",
                    "-gencode=arch=compute_90a,code=sm_90a", "-gencode=arch=compute_90,code=compute_90", *_ALL_DISABLED,
                    "-lineinfo", "-Xptxas=-v"]),
    "unordered": ({"FLASH_ATTN_CUDA_ARCHS": "86,80", "FLASH_ATTN_DISABLE_SOFTCAP": "1", "FLASH_ATTN_DTYPES": "fp16",
                   "FLASH_ATTN_HDIMS": "256;64"},
                  ["fwd_fp16_hd64", "bwd_fp16_hd64", "fwd_kvcache_fp16_hd64", "fwd_fp16_hd256", "bwd_fp16_hd256",
                   "fwd_kvcache_fp16_hd256"], ["-O3", "-DFLASH_ATTN_DISABLE_SOFTCAP"],
                  ["-O3", "--expt-relaxed-constexpr", "-gencode=arch=compute_80,code=sm_80",
                   "-gencode=arch=compute_86,code=sm_86", "-gencode=arch=compute_86,code=compute_86",
                   "-DFLASH_ATTN_DISABLE_SOFTCAP"]),
}


@pytest.mark.parametrize("case", RECORDED_CUDA_EXTENSIONS)
def test_cuda_extension_unchanged(case, build_env, extension_calls, tmp_path):
    """setup.py on a CUDA torch passes CUDAExtension the same arguments as before the ROCm target."""
    from torch.utils.cpp_extension import BuildExtension

    variables, kernels, cxx_flags, nvcc_flags = RECORDED_CUDA_EXTENSIONS[case]
    for name, value in variables.items():
        build_env.setenv(name, value)
    make_torch_look_like(build_env, CUDA_TORCH)
    setup_kwargs = run_setup_py(build_env)
    assert setup_kwargs["ext_modules"] == ["flash_attn._C extension"]
    assert setup_kwargs["cmdclass"] == {"build_ext": BuildExtension}
    assert extension_calls == [{
        "name": "flash_attn._C",
        "sources": [f"csrc/instantiations/{kernel}.cu" for kernel in kernels] + _OTHER_SOURCES,
        "include_dirs": [str(tmp_path / "csrc")],
        "extra_compile_args": {"cxx": cxx_flags, "nvcc": nvcc_flags},
    }]
    assert all((tmp_path / source).is_file() for source in extension_calls[0]["sources"][:len(kernels)])


def test_rocm_extension(build_env, extension_calls):
    """On a ROCm torch: the CUDA build's sources (less the Hopper-only fp8 forward) and host flags; hipcc gets
    the offload targets, no nvcc flags."""
    build_env.setenv("FLASH_ATTN_DISABLE_ALIBI", "1")
    make_torch_look_like(build_env, CUDA_TORCH)
    build_config.extension_setup_kwargs()
    make_torch_look_like(build_env, ROCM_TORCH)
    build_config.extension_setup_kwargs()
    cuda, rocm = extension_calls
    fp8_sources = [f"csrc/instantiations/{kernel}.cu" for kernel in _FP8_KERNEL_SOURCES]
    assert rocm["sources"] == [source for source in cuda["sources"] if source not in fp8_sources]
    assert rocm["include_dirs"] == cuda["include_dirs"]
    assert rocm["extra_compile_args"] == {
        "cxx": ["-O3", "-DFLASH_ATTN_DISABLE_ALIBI"],
        "nvcc": ["-O3", "--offload-arch=gfx90a", "--offload-arch=gfx942", "-DFLASH_ATTN_DISABLE_ALIBI"],
    }


def test_rocm_debug_flags(build_env):
    build_env.setenv("FLASH_ATTN_LINEINFO", "1")
    build_env.setenv("FLASH_ATTN_PTXAS_VERBOSE", "1")
    assert build_config.rocm_device_flags([])[-2:] == ["-gline-tables-only", "-Rpass-analysis=kernel-resource-usage"]


def test_torch_keeps_our_rocm_targets(build_env):
    """torch adds its own --offload-arch flags (the visible GPUs') only when the nvcc flags have none,
    and renames flags that contain CUDA: ours must pass through as they are."""
    from torch.utils import cpp_extension

    rocm_arch_flags = getattr(cpp_extension, "_get_rocm_arch_flags", None)
    if rocm_arch_flags is None:
        pytest.skip("this torch has no _get_rocm_arch_flags")
    build_env.setenv("FLASH_ATTN_DISABLE_VARLEN", "1")
    flags = build_config.rocm_device_flags(build_config.feature_defines())
    assert rocm_arch_flags(flags) == ["-fno-gpu-rdc"]
    assert not any("CUDA" in flag for flag in flags)


@pytest.mark.parametrize("value, archs", [
    (None, ["gfx90a", "gfx942"]),
    ("", ["gfx90a", "gfx942"]),
    ("gfx942", ["gfx942"]),
    ("gfx90a gfx942;gfx950", ["gfx90a", "gfx942", "gfx950"]),
    ("gfx942:sramecc+:xnack-", ["gfx942:sramecc+:xnack-"]),
])
def test_rocm_archs(value, archs, build_env):
    if value is not None:
        build_env.setenv("PYTORCH_ROCM_ARCH", value)
    assert build_config.rocm_archs() == archs


def test_rocm_archs_rejects_non_targets(build_env):
    build_env.setenv("PYTORCH_ROCM_ARCH", "gfx942;sm_90")
    with pytest.raises(ValueError, match="PYTORCH_ROCM_ARCH.*sm_90"):
        build_config.rocm_archs()


@pytest.mark.parametrize("value, target", [(None, "auto"), ("", "auto"), ("CUDA", "cuda"), (" rocm ", "rocm")])
def test_requested_target(value, target, build_env):
    if value is not None:
        build_env.setenv("BUILD_TARGET", value)
    assert build_config.requested_target() == target


def test_requested_target_rejects_others(build_env):
    build_env.setenv("BUILD_TARGET", "hip")
    with pytest.raises(ValueError, match="BUILD_TARGET='hip'.*auto, cuda, rocm"):
        build_config.requested_target()


@pytest.mark.parametrize("requested, build, target, problem", [
    ("auto", CUDA_TORCH, "cuda", None),
    ("auto", ROCM_TORCH, "rocm", None),
    ("auto", torch_build(cuda="13.0", hip="7.0.1"), "rocm", None),
    ("cuda", CUDA_TORCH, "cuda", None),
    ("rocm", ROCM_TORCH, "rocm", None),
    ("auto", CPU_TORCH, None, "CPU-only build"),
    ("auto", None, None, "torch is not installed in the build environment"),
    ("cuda", None, None, "torch is not installed"),
    ("cuda", ROCM_TORCH, "cuda", "has no CUDA"),
    ("rocm", CUDA_TORCH, "rocm", "has no ROCm"),
    ("auto", torch_build(cuda="13.0", cuda_home=None), "cuda", r"no CUDA toolkit \(nvcc\) found for torch's CUDA 13.0"),
    ("auto", torch_build(hip="7.0.1", rocm_home=None), "rocm", r"no ROCm toolkit \(hipcc\) found"),
])
def test_choose_target(requested, build, target, problem):
    chosen, found_problem = build_config.choose_target(requested, build)
    assert chosen == target
    if problem is None:
        assert found_problem is None
    else:
        assert re.search(problem, found_problem.reason) and found_problem.fix


def test_gpu_compilers_found(build_env, tmp_path):
    nvcc = tmp_path / "cuda" / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.touch()
    build_env.setenv("PATH", str(tmp_path / "empty"))
    build_env.setattr(build_config, "COMPILER_SEARCHES", (("nvcc", ("CUDA_HOME",), str(tmp_path / "none")),
                                                          ("hipcc", ("ROCM_PATH",), str(tmp_path / "none"))))
    assert build_config.gpu_compilers_found() == []
    build_env.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    assert build_config.gpu_compilers_found() == [str(nvcc)]


def pretend(monkeypatch, build, compilers):
    monkeypatch.setattr(build_config, "probe_torch", lambda: build)
    monkeypatch.setattr(build_config, "gpu_compilers_found", lambda: compilers)


@pytest.mark.parametrize("build, reason, fix", [
    (None, "torch is not installed in the build environment", "pip install --no-build-isolation -e ."),
    (CPU_TORCH, "torch 2.13.0 is a CPU-only build", "install a CUDA or ROCm build of torch"),
    (torch_build(cuda="13.0", cuda_home=None), "no CUDA toolkit", "put nvcc on PATH or set CUDA_HOME"),
])
def test_skip_with_a_gpu_compiler_warns(build, reason, fix, build_env, capsys):
    """auto with a GPU compiler on the machine but no GPU extension: a pure-Python install, a loud warning."""
    pretend(build_env, build, ["/usr/local/cuda/bin/nvcc"])
    assert build_config.extension_setup_kwargs() == {}
    out, err = capsys.readouterr()
    assert out == ""
    assert "flash_attn WARNING: the GPU extension flash_attn._C is NOT being built" in err
    assert "found:  /usr/local/cuda/bin/nvcc" in err and reason in err and fix in err
    assert "FLASH_ATTN_SKIP_CUDA_BUILD=1" in err and len(err.splitlines()) >= 8


def test_skip_warning_reaches_the_terminal_under_pip(build_env, tmp_path, capsys):
    """pip shows a successful build's stderr only with -v: the warning also goes to the controlling
    terminal (stderr is not one here, as under pip), and nothing breaks where there is none."""
    pretend(build_env, CPU_TORCH, ["/usr/local/cuda/bin/nvcc"])
    assert build_config.extension_setup_kwargs() == {}
    _, err = capsys.readouterr()
    assert (tmp_path / "terminal").read_text() == err
    build_env.setattr(build_config, "TERMINAL", str(tmp_path / "no-such-folder" / "tty"))
    assert build_config.extension_setup_kwargs() == {}
    assert "NOT being built" in capsys.readouterr().err


def test_skip_warning_is_not_repeated_on_a_terminal_stderr(build_env, tmp_path, monkeypatch):
    """setup.py run directly: stderr is the terminal, so the warning is written once."""
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert build_config.tell_terminal("warning") is False
    assert not (tmp_path / "terminal").exists()


def test_skip_without_gpu_compilers_is_one_line(build_env, capsys):
    pretend(build_env, CPU_TORCH, [])
    assert build_config.extension_setup_kwargs() == {}
    out, err = capsys.readouterr()
    assert err == "" and out.count("\n") == 1 and "CPU-only build" in out


@pytest.mark.parametrize("requested", ["cuda", "rocm"])
@pytest.mark.parametrize("build", [None, CPU_TORCH], ids=["no_torch", "cpu_torch"])
def test_explicit_target_that_cannot_build_is_an_error(requested, build, build_env):
    build_env.setenv("BUILD_TARGET", requested)
    pretend(build_env, build, [])
    with pytest.raises(build_config.BuildTargetError, match=f"BUILD_TARGET={requested}, but flash_attn._C cannot be built"):
        build_config.extension_setup_kwargs()


def test_explicit_target_of_the_other_platform_is_an_error(build_env):
    build_env.setenv("BUILD_TARGET", "rocm")
    pretend(build_env, CUDA_TORCH, [])
    with pytest.raises(build_config.BuildTargetError, match="torch 2.13.0 has no ROCm"):
        build_config.extension_setup_kwargs()


@pytest.mark.parametrize("requested", ["auto", "cuda"])
def test_deliberate_skip_is_quiet(requested, build_env, capsys):
    """FLASH_ATTN_SKIP_CUDA_BUILD=1 installs pure Python with one line, whatever BUILD_TARGET says."""
    build_env.setenv("FLASH_ATTN_SKIP_CUDA_BUILD", "1")
    build_env.setenv("BUILD_TARGET", requested)
    pretend(build_env, CPU_TORCH, ["/usr/local/cuda/bin/nvcc"])
    assert build_config.extension_setup_kwargs() == {}
    out, err = capsys.readouterr()
    assert err == "" and out == ("flash_attn: building without the GPU extension (FLASH_ATTN_SKIP_CUDA_BUILD=1); "
                                 "CPU tensors use the reference path\n")


def test_setup_py_without_gpu_torch_installs_pure_python(build_env):
    """This CPU machine's own case: setup.py runs and asks for no extension."""
    pretend(build_env, CPU_TORCH, [])
    setup_kwargs = run_setup_py(build_env)
    assert "ext_modules" not in setup_kwargs and setup_kwargs["name"] == "flash_attn"


# ---- the Dockerfiles run README's commands ----

MAIN_JOB = "python -m flash_attn.benchmark"  # needs a GPU: the images leave it to `docker run`


def readme_commands():
    """The commands of the code block in README's "Set up and run", without their comments."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Set up and run", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    return [re.sub(r"\s+#.*$", "", line).strip() for line in block.splitlines() if line.strip()]


def dockerfile_lines(name, instruction):
    """The arguments of a Dockerfile's instructions of one kind, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", (REPO / name).read_text())
    return [line[len(instruction) + 1:].strip() for line in text.splitlines() if line.startswith(instruction + " ")]


def test_readme_commands_install_then_test():
    commands = readme_commands()
    assert commands[0].startswith("pip install torch ") and "ninja" in commands[0]
    assert "pip install --no-build-isolation -e ." in commands
    assert MAIN_JOB in commands
    assert commands[-1].endswith("python -m pytest -q tests")


@pytest.mark.parametrize("dockerfile", ["Dockerfile.cuda", "Dockerfile.rocm"])
def test_dockerfile_runs_readme_commands(dockerfile):
    """Each README command but the main job is a RUN line of the Dockerfile, in README's order."""
    expected = [command for command in readme_commands() if command != MAIN_JOB]
    runs = dockerfile_lines(dockerfile, "RUN")
    assert [run for run in runs if run in expected] == expected


@pytest.mark.parametrize("dockerfile, target, archs", [
    ("Dockerfile.cuda", "cuda", 'FLASH_ATTN_CUDA_ARCHS="80;90"'),
    ("Dockerfile.rocm", "rocm", 'PYTORCH_ROCM_ARCH="gfx90a;gfx942"'),
])
def test_dockerfile_build_target(dockerfile, target, archs):
    env = " ".join(dockerfile_lines(dockerfile, "ENV"))
    assert f"BUILD_TARGET={target}" in env.split() and archs in env.split()
    assert dockerfile_lines(dockerfile, "CMD") == ['["python", "-m", "pytest", "-q", "tests"]']
