"""Turns csrc/flash into ROCm sources in a build tree, with PyTorch's bundled hipify.

    python -m hip.hipify_sources --out build/hip      (from the repository root)
    python hip/hipify_sources.py --out DIR

writes DIR/flash/..., the same files under the same names as csrc/flash (a `.cu` becomes `.hip`),
so `-I DIR` replaces `-I csrc` in a ROCm build. csrc/ itself is never modified: the copy is
hipified in a staging folder next to DIR/flash.

What hipify (`torch.utils.hipify.hipify_python.hipify`, the code torch's CUDAExtension runs on a
ROCm build, is_pytorch_extension=True) translates:
  * CUDA runtime includes and calls: `cuda_runtime.h` -> `hip/hip_runtime.h`, cudaError_t,
    cudaStream_t, cudaGetLastError, cudaFuncSetAttribute, cudaDeviceGetAttribute, cudaMemsetAsync...
  * `cuda_fp16.h` -> `hip/hip_fp16.h`, `cuda_bf16.h` -> `hip/hip_bf16.h` (absent in ROCm 5.2, whose
    header is `hip/hip_bfloat16.h`), `__nv_bfloat16` -> `__hip_bfloat16`
  * kernel launches `k<<<grid, block, smem, stream>>>(args)` -> `hipLaunchKernelGGL(k, ...)`
  * curand -> hiprand, ATen CUDA headers -> ATen HIP ones
and renames every file whose text changed (`x.cuh` -> `x_hip.cuh`, `x.cu` -> `x.hip`), rewriting the
includes to match; this script writes them back under their original names.

What it does not translate, and the arch layer (csrc/flash/arch/cdna*.cuh, selected by arch.cuh under
`__HIP_PLATFORM_AMD__`) supplies instead:
  * inline PTX (mma.sync, ldmatrix, cp.async, ex2/lg2/rcp.approx, ld.acquire / st.release):
    MFMA builtins, 8-byte LDS operand reads, global -> register -> LDS copies, amdgcn math builtins,
    __hip_atomic_load / store
  * `__shfl_xor_sync` and the other `*_sync` intrinsics with `0xffffffff` masks, `__syncwarp`:
    `__shfl_xor` with width 64 (ROCm >= 6.2 wants 64-bit masks equal to the active lanes), a wave
    barrier with fences
  * warp size 32 and `warpSize` (not constexpr in ROCm 7): kWarpSize = 64
  * `__CUDA_ARCH__` checks (undefined in AMD device code: `#if __CUDA_ARCH__ >= 800` silently drops
    code) and `__cvta_generic_to_shared`; `CUDA_VERSION` becomes TORCH_HIP_VERSION (other numbering)
  * shared-memory limits: 64 KiB of LDS per workgroup (checked_lds_bytes)
`untranslated()` lists those spellings in a hipified tree; outside csrc/flash/arch/sm80* and sm90*
(which the HIP build does not include) there must be none but KNOWN_LEFTOVERS.
"""

import argparse
import os
import re
import shutil
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE_DIR = os.path.join(ROOT, "csrc", "flash")
SOURCE_EXTENSIONS = (".cu", ".cuh", ".h")

# CUDA-only spellings that are wrong on AMD when left in a hipified file (name: pattern).
CUDA_ONLY_SPELLINGS = {
    "inline asm (PTX)": r"\basm\s*(volatile\s*)?\(",
    "*_sync intrinsic": r"\b__\w+_sync\s*\(",
    "__syncwarp": r"\b__syncwarp\b",
    "__CUDA_ARCH__": r"\b__CUDA_ARCH__\b",
    "__cvta_generic_to_shared": r"\b__cvta_generic_to_shared\b",
    "32-bit full lane mask": r"\b0xffffffffu?\b",
    "warpSize": r"\bwarpSize\b",
    "CUDA_VERSION": r"\bCUDA_VERSION\b",
    "<<<...>>> launch": r"<<<",
    "CUDA header": r"#\s*include\s*[<\"](cuda_\w+\.h|cuda\.h|cuda/\S+)[>\"]",
    "CUDA runtime API": r"\bcuda[A-Z]\w*",
    "__nv_ type": r"\b__nv_\w+",
}

# Spellings left outside the arch layer today, each with why it is wrong on AMD and the fix; the
# tests require the leftovers to be exactly these, so a new one fails and a fixed one must go.
KNOWN_LEFTOVERS = {}


def _source_files(source_dir):
    """Paths relative to source_dir of every file hipify should see."""
    paths = []
    for folder, _, names in os.walk(source_dir):
        paths.extend(os.path.relpath(os.path.join(folder, name), source_dir) for name in names
                     if name.endswith(SOURCE_EXTENSIONS))
    return sorted(paths)


def _run_torch_hipify(stage_root, files):
    """hipify as CUDAExtension runs it, on the staged copy; returns {original abs path: hipified abs path}."""
    from torch.utils.hipify import hipify_python

    # hipify keeps its results in a module-level dict that include rewriting consults: start empty so a
    # second run in one process (tests) does not reuse a first run's paths.
    hipify_python.HIPIFY_FINAL_RESULT.clear()
    result = hipify_python.hipify(project_directory=stage_root, output_directory=stage_root,
                                  header_include_dirs=[stage_root], includes=[os.path.join(stage_root, "*")],
                                  extra_files=files, show_detailed=False, is_pytorch_extension=True,
                                  hipify_extra_files_only=True, show_progress=False)
    return {source: (outcome.hipified_path or source) for source, outcome in result.items()}


def _restore_include_names(text, renamed):
    """Include spellings that hipify pointed at its renamed copies (`x_hip.cuh`) back to `x.cuh`."""
    for original, hipified in renamed.items():
        text = re.sub(r'(#\s*include\s*")((?:[^"]*/)?)' + re.escape(hipified) + '"',
                      lambda m, name=original: m.group(1) + m.group(2) + name + '"', text)
    return text


def _output_name(relative_path):
    root, ext = os.path.splitext(relative_path)
    return root + ".hip" if ext == ".cu" else relative_path


def _renamed_basenames(stage, relative, hipified):
    """{original basename: hipify's name} for the files hipify wrote under another name."""
    renamed = {}
    for path in relative:
        source = os.path.join(stage, path)
        target = hipified.get(source, source)
        if os.path.basename(target) != os.path.basename(source):
            renamed[os.path.basename(source)] = os.path.basename(target)
    return renamed


def _write_tree(final, stage, relative, hipified):
    """Each staged file's hipified text, includes restored, at its original name under final."""
    renamed = _renamed_basenames(stage, relative, hipified)
    shutil.rmtree(final, ignore_errors=True)
    written = []
    for path in relative:
        source = os.path.join(stage, path)
        with open(hipified.get(source, source), encoding="utf-8") as f:
            text = _restore_include_names(f.read(), renamed)
        target = os.path.join(final, _output_name(path))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "w", encoding="utf-8") as f:
            f.write(text)
        written.append(target)
    return written


def hipify_tree(out_dir, source_dir=SOURCE_DIR):
    """Writes the hipified copy of source_dir to out_dir/flash; returns the written paths (relative to out_dir)."""
    out_dir = os.path.abspath(out_dir)
    if os.path.commonpath([out_dir, os.path.abspath(source_dir)]) == os.path.abspath(source_dir):
        raise ValueError(f"{out_dir} lies inside {source_dir}: the sources are never hipified in place")
    stage_root = os.path.join(out_dir, ".hipify-stage")
    shutil.rmtree(stage_root, ignore_errors=True)
    stage = os.path.join(stage_root, "flash")
    shutil.copytree(source_dir, stage)
    relative = _source_files(stage)
    hipified = _run_torch_hipify(stage_root, [os.path.join(stage, path) for path in relative])
    written = _write_tree(os.path.join(out_dir, "flash"), stage, relative, hipified)
    shutil.rmtree(stage_root)
    return [os.path.relpath(path, out_dir) for path in written]


def untranslated(tree_dir):
    """{path relative to tree_dir: [(line number, spelling name, line)]} of CUDA-only spellings left."""
    found = {}
    compiled = {name: re.compile(pattern) for name, pattern in CUDA_ONLY_SPELLINGS.items()}
    for folder, _, names in os.walk(tree_dir):
        for name in sorted(names):
            path = os.path.join(folder, name)
            with open(path, encoding="utf-8") as f:
                for number, line in enumerate(f, 1):
                    code = line.split("//", 1)[0]  # comments may name CUDA spellings
                    for spelling, pattern in compiled.items():
                        if pattern.search(code):
                            found.setdefault(os.path.relpath(path, tree_dir), []).append(
                                (number, spelling, line.strip()))
    return found


def is_nvidia_arch_file(relative_path):
    """True for the arch files the HIP build never includes (arch.cuh selects cdna* under HIP)."""
    name = os.path.basename(relative_path)
    return os.path.dirname(relative_path).endswith(os.path.join("flash", "arch")) and name.startswith(("sm80", "sm90"))


def unexpected_leftovers(leftovers):
    """The entries of untranslated(tree/flash) that are neither NVIDIA arch files nor KNOWN_LEFTOVERS."""
    unexpected = {}
    for path, hits in leftovers.items():
        if is_nvidia_arch_file(os.path.join("flash", path)):
            continue
        extra = [hit for hit in hits if hit[1] not in KNOWN_LEFTOVERS.get(path, set())]
        if extra:
            unexpected[path] = extra
    return unexpected


def _describe(path):
    if is_nvidia_arch_file(os.path.join("flash", path)):
        return "NVIDIA arch file, not built for ROCm"
    return "known, see KNOWN_LEFTOVERS" if path in KNOWN_LEFTOVERS else "UNEXPECTED"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="build folder; the sources land in OUT/flash")
    args = parser.parse_args(argv)
    written = hipify_tree(args.out)
    leftovers = untranslated(os.path.join(args.out, "flash"))
    print(f"hipified {len(written)} files into {os.path.join(args.out, 'flash')}")
    for path, hits in sorted(leftovers.items()):
        kinds = sorted({spelling for _, spelling, _ in hits})
        print(f"  untranslated in flash/{path} ({_describe(path)}): {', '.join(kinds)}")
    unexpected = unexpected_leftovers(leftovers)
    for path, hits in sorted(unexpected.items()):
        for number, spelling, line in hits:
            print(f"flash/{path}:{number}: {spelling} left after hipify: {line}", file=sys.stderr)
    return 1 if unexpected else 0


if __name__ == "__main__":
    sys.exit(main())
