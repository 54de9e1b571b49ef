"""Registers, spills and shared memory of the Triton backend's attention kernels compiled for a GPU
target without a GPU (triton.compile on an ASTSource, ptxas from the triton wheel, cuobjdump's
resource usage): the fixed tiles the host picks on NVIDIA GPUs (flash_attn/triton/attention.py) or
given ones, per kernel, head dim, dtype and feature flags. A static check, not a timing: spills and
register counts decide occupancy, not speed. Runs on a CPU-only machine (no TRITON_INTERPRET).

    python benchmarks/experiments/triton_static_regs.py [--arch 90 | --arch gfx942] [--headdims 64 128]
        [--dtypes bf16 fp16] [--kernels forward dkdv dq] [--tiles 128,64,8,3 ...] [--features plain causal ...]

Features: plain (non-causal, key length a multiple of 128: one whole-block walk), causal (the masked
diagonal walk too), local (both masked walks), softcap, alibi, dropout, varlen, padded (the head dim
below its block, as hd 96 in a block of 128: the loads' head-dim masks), fp8 (forward only), descriptors
(forward only: causal, with K and V through tensor descriptors made in the kernel, attention._forward_descriptors),
host (forward only: causal, Q / K / V / Out through host-made descriptors; fp8: V's keys-contiguous
copy), host_plain (host, non-causal), grouped (forward only: the 1D grid of schedule groups of more
than one pair, GROUPED; every other feature compiles the grid of groups of one). Features combine with
"+", e.g. host+grouped (later ones override earlier ones' flags). The kvcache kernel (the split-KV
attention kernel, decode blocks) reads "plain" as every flag off and any other feature as every
flag on (kvcache_flags).
Each row: the compiled kernel's registers per thread, stack (spill) bytes, and shared memory. For an
AMD target (--arch gfx942, gfx90a; the wheel's own LLVM, no ROCm needed): VGPRs (the unified count,
AGPRs included), scratch bytes a lane and LDS, the host's tiles being the portable blocks.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from flash_attn.triton import attention, kernels, kvcache, kvcache_kernels, tuning  # noqa: E402

KERNELS = {"forward": kernels.attention_forward_kernel, "dkdv": kernels.attention_backward_dkdv_kernel,
           "dq": kernels.attention_backward_dq_kernel, "kvcache": kvcache_kernels.kvcache_attention_kernel}
POINTERS = {"Lse": "fp32", "Delta": "fp32", "CuQ": "i32", "CuK": "i32", "Slopes": "fp32", "Rng": "i64",
            "Descales": "fp32"}
# The split-KV attention kernel's pointers that are not of the inputs' dtype (its partial outputs are fp32)
KVCACHE_POINTERS = {**POINTERS, "Out": "fp32", "SeqlensK": "i32", "BatchIdx": "i32", "LeftPad": "i32",
                    "BlockTable": "i32"}
KVCACHE_FLAGS = ("PAGED", "HAS_BATCH_IDX", "HAS_LEFTPAD", "HAS_ROTARY", "INTERLEAVED", "ROTARY_PER_TOKEN",
                 "HAS_SOFTCAP", "HAS_ALIBI", "WIDE_CACHE")
FLOATS = ("scale", "softcap", "keep_scale")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp8": attention.FP8_DTYPE}
TRITON_TYPES = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32", "fp8": "fp8e4nv"}


def flags(feature):
    """The constexpr flags of a feature, or of features joined by "+" (see the docstring)."""
    flags = dict(VARLEN=False, HAS_SOFTCAP=False, HAS_ALIBI=False, HAS_DROPOUT=False, PAD_D=False, CLIP_LEFT=False,
                 CLIP_RIGHT=True)
    for part in feature.split("+"):
        flags.update({"plain": dict(CLIP_RIGHT=False), "causal": {}, "local": dict(CLIP_LEFT=True),
                      "descriptors": {}, "softcap": dict(HAS_SOFTCAP=True), "alibi": dict(HAS_ALIBI=True),
                      "dropout": dict(HAS_DROPOUT=True), "varlen": dict(VARLEN=True), "padded": dict(PAD_D=True),
                      "fp8": {}, "host": {}, "host_plain": dict(CLIP_RIGHT=False), "grouped": dict(GROUPED=True)}[part])
    return flags


def kvcache_flags(feature):
    """The split-KV attention kernel's constexpr flags: "plain" every one off, any other feature every
    one on (paged, batch index, left padding, interleaved rotary per token, softcap, ALiBi, 64-bit
    cache addressing: the most code)."""
    return {flag: feature != "plain" for flag in KVCACHE_FLAGS}


def block_source(feature):
    """kernels' DESCRIPTORS value of a feature (the last of its parts that names a block source)."""
    sources = {"descriptors": kernels.DEVICE_KV_DESCRIPTORS.value, "host": kernels.HOST_DESCRIPTORS.value,
               "host_plain": kernels.HOST_DESCRIPTORS.value}
    named = [sources[part] for part in feature.split("+") if part in sources]
    return named[-1] if named else kernels.POINTER_BLOCKS.value


def compile_kernel(name, dtype_name, block_d, tile, feature, target):
    """Triton's CompiledKernel of one kernel for a GPUTarget (no GPU needed); on AMD targets without
    the register cap, which Triton takes on NVIDIA only."""
    fn = KERNELS[name]
    element = TRITON_TYPES[dtype_name]
    constexprs = dict(BLOCK_M=tile["BLOCK_M"], BLOCK_N=tile["BLOCK_N"], BLOCK_D=block_d,
                      DOT_PRECISION=attention.DOT_PRECISION)
    constexprs.update(kvcache_flags(feature) if name == "kvcache" else flags(feature))
    source_of_blocks = block_source(feature)
    grouped = constexprs.pop("GROUPED", False)
    pointers = KVCACHE_POINTERS if name == "kvcache" else POINTERS
    if name == "forward":
        constexprs.update(IS_FP8=dtype_name == "fp8", INTERPRETER_ROUNDING=False, DESCRIPTORS=source_of_blocks,
                          GROUPED=grouped)
    elif grouped:
        raise ValueError(f"the {name} kernel has no grouped schedule")
    signature, attrs = {}, {}
    for index, arg in enumerate(fn.arg_names):
        if arg in constexprs:
            signature[arg] = "constexpr"
        elif arg == "stride_vd" and dtype_name != "fp8":  # 1, which Triton specializes
            signature[arg], constexprs[arg] = "constexpr", 1
        elif source_of_blocks == kernels.HOST_DESCRIPTORS.value and arg in ("Q", "K", "V", "Out"):
            rows = tile["BLOCK_N"] if arg in ("K", "V") else tile["BLOCK_M"]
            block = f"1, {rows}, {block_d}"
            if dtype_name == "fp8" and arg == "V":  # its keys-contiguous copy: the head's dims by keys
                block = f"1, {block_d}, {rows}"
            signature[arg] = f"tensordesc<{'bf16' if arg == 'Out' and dtype_name == 'fp8' else element}[{block}]>"
        elif arg in pointers:
            signature[arg] = "*" + pointers[arg]
            attrs[(index,)] = [["tt.divisibility", 16]]
        elif arg[0].isupper():
            signature[arg] = "*" + ("bf16" if arg == "Out" and dtype_name == "fp8" else element)
            attrs[(index,)] = [["tt.divisibility", 16]]
        elif arg in FLOATS:
            signature[arg] = "fp32"
        else:
            signature[arg] = "i32"
            if arg.startswith("stride_") or arg in ("headdim", "seqlen_q", "seqlen_k"):
                attrs[(index,)] = [["tt.divisibility", 16]]
    source = ASTSource(fn, signature, {(fn.arg_names.index(k),): v for k, v in constexprs.items()}, attrs)
    default_stages = 3 if target.backend == "cuda" else 2  # Triton's defaults: CUDAOptions, HIPOptions
    options = dict(num_warps=tile.get("num_warps", 4), num_stages=tile.get("num_stages", default_stages))
    if tile.get("maxnreg") and target.backend == "cuda":
        options["maxnreg"] = tile["maxnreg"]
    return triton.compile(source, target=target, options=options)


def amd_resources(compiled):
    """(VGPRs, scratch bytes a lane (spills), LDS bytes) of a kernel compiled for an AMD target, from
    its AMDGCN assembly's metadata and Triton's."""
    text = compiled.asm["amdgcn"]
    vgprs = re.search(r"\.vgpr_count:\s+(\d+)", text)
    scratch = re.search(r"\.private_segment_fixed_size:\s+(\d+)", text)
    return int(vgprs[1]), int(scratch[1]), compiled.metadata.shared


def compile_one(name, dtype_name, block_d, tile, feature, arch, cubin_dir=None):
    """(registers, stack bytes, shared bytes) of one kernel compiled for sm_`arch`, or for an AMD
    target where arch names one ("gfx942": VGPRs, scratch bytes, LDS bytes); the cubin is kept in
    cubin_dir where one is given (for cuobjdump -sass and sass_loops.py)."""
    if str(arch).startswith("gfx"):
        return amd_resources(compile_kernel(name, dtype_name, block_d, tile, feature, GPUTarget("hip", arch, 64)))
    compiled = compile_kernel(name, dtype_name, block_d, tile, feature, GPUTarget("cuda", int(arch), 32))
    if cubin_dir is not None:
        tile_name = "_".join(str(tile.get(key, "")) for key in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages",
                                                                 "maxnreg"))
        with open(os.path.join(cubin_dir, f"{name}_{dtype_name}_{block_d}_{feature}_{tile_name}.cubin"), "wb") as f:
            f.write(compiled.asm["cubin"])
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
        usage = subprocess.run([tool, "-res-usage", cubin.name], capture_output=True, text=True).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+)", usage)
    return int(found[1]), int(found[2]), compiled.metadata.shared


def host_tiles(name, dtype, block_d, amd=False):
    """The host's fixed launch options of kernel `name` on an NVIDIA GPU, or on an AMD one (amd: the
    portable blocks, Triton's default warps and stages)."""
    if name == "kvcache":  # a decode call's blocks, on every GPU
        block_m, block_n = kvcache._blocks(1, block_d)
        return dict(BLOCK_M=block_m, BLOCK_N=block_n)
    if amd:
        return attention._launch_options(None, block_d)
    cuda = torch.device("cuda")
    if name == "forward":
        return attention._forward_launch(block_d, dtype, cuda)
    dkdv, dq = attention._backward_launches(block_d, dtype, cuda)
    return dkdv if name == "dkdv" else dq


def parse_tile(text):
    """BLOCK_M,BLOCK_N,warps,stages[,maxnreg] as launch options (tuning.Tile's)."""
    return tuning.Tile(*(int(x) for x in text.split(","))).launch_options()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="90", help="an sm_ number (90), or an AMD target (gfx942)")
    parser.add_argument("--headdims", nargs="+", type=int, default=(64, 128))
    parser.add_argument("--dtypes", nargs="+", choices=sorted(DTYPES), default=("bf16",))
    parser.add_argument("--kernels", nargs="+", choices=sorted(KERNELS), default=("forward", "dkdv", "dq"))
    parser.add_argument("--tiles", nargs="+", type=parse_tile,
                        help="BLOCK_M,BLOCK_N,warps,stages[,maxnreg] (default: the host's)")
    parser.add_argument("--features", nargs="+", default=("plain", "causal"))
    parser.add_argument("--cubins", help="a folder to keep each compiled kernel's cubin in")
    args = parser.parse_args()
    amd = args.arch.startswith("gfx")
    print(f"triton {triton.__version__}, {args.arch if amd else 'sm_' + args.arch}"
          + (" (regs: VGPRs; stack B: scratch a lane; smem B: LDS)" if amd else ""))
    print("| kernel | dtype | hd | feature | tile | regs | stack B | smem B |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.kernels:
        for dtype_name in args.dtypes:
            if dtype_name == "fp8" and name != "forward":
                continue
            for headdim in args.headdims:
                for feature in args.features:
                    block_d = triton.next_power_of_2(headdim)
                    for tile in args.tiles or [host_tiles(name, DTYPES[dtype_name], block_d, amd)]:
                        cap = f" r{tile['maxnreg']}" if tile.get("maxnreg") else ""
                        text = (f"{tile['BLOCK_M']}x{tile['BLOCK_N']} w{tile.get('num_warps', 4)} "
                                f"s{tile.get('num_stages', 2 if amd else 3)}{cap}")
                        try:
                            regs, stack, smem = compile_one(name, dtype_name, block_d, tile, feature, args.arch,
                                                             args.cubins)
                            cells = f"{regs} | {stack} | {smem}"
                        except Exception as error:  # out of shared memory, unsupported shapes
                            cells = f"{type(error).__name__} | - | -"
                        print(f"| {name} | {dtype_name} | {block_d} | {feature} | {text} | {cells} |", flush=True)


if __name__ == "__main__":
    main()
