"""Whether two trees' Triton kernels compile to the same sm_90 PTX, on a machine without a GPU: for a
change meant to leave the generated code alone (a refactor of kernels.py). Each tree's forward,
dK/dV and dQ kernels (bf16, hd 128, one tile each) and the fp8 forward (e4m3 q / k / v, bf16 out,
the fixed fp8 tile: 128 x 64, 4 warps, 3 stages), in the four CLIP_LEFT / CLIP_RIGHT variants, go
through triton.compile for GPUTarget("cuda", 90, 32) with the specializations Triton's JIT gives
a launch (pointers and integer arguments divisible by 16, unit strides as the constant 1; the fp8
forward's V is keys-contiguous); the PTX is compared without its debug sections and line labels,
and each variant's registers and stack (cuobjdump -res-usage of the cubin Triton built) are printed
for both trees. With those specializations the fp8 forward's resources and loads match the kernels
Triton 3.6 built on the H200 (stack 0 / 304 B, 64 / 128 byte loads of V, session 23).

    python benchmarks/experiments/triton_ptx_compare.py OLD_TREE NEW_TREE
"""

import os
import re
import shutil
import subprocess
import sys

PTRS = {"Lse": "*fp32", "Delta": "*fp32", "CuQ": "*i32", "CuK": "*i32", "Slopes": "*fp32", "Rng": "*i64",
        "Descales": "*fp32"}
FLOATS = {"scale", "softcap", "keep_scale"}
COMMON = dict(BLOCK_D=128, VARLEN=False, HAS_SOFTCAP=False, HAS_ALIBI=False, HAS_DROPOUT=False,
              DOT_PRECISION="ieee", PAD_D=False)
# name: (kernel, its constexprs, launch options, pointer types that differ from bf16, unit strides)
LAUNCH = dict(num_warps=8, num_stages=2)
FP8_POINTERS = {"Q": "*fp8e4nv", "K": "*fp8e4nv", "V": "*fp8e4nv"}
CASES = {
    "attention_forward_kernel": ("attention_forward_kernel", dict(BLOCK_M=128, BLOCK_N=64, IS_FP8=False,
                                                                  INTERPRETER_ROUNDING=False), LAUNCH, {},
                                 ("stride_vd",)),
    "attention_backward_dkdv_kernel": ("attention_backward_dkdv_kernel", dict(BLOCK_M=64, BLOCK_N=128), LAUNCH, {},
                                       ()),
    "attention_backward_dq_kernel": ("attention_backward_dq_kernel", dict(BLOCK_M=128, BLOCK_N=64), LAUNCH, {}, ()),
    "fp8_forward": ("attention_forward_kernel", dict(BLOCK_M=128, BLOCK_N=64, IS_FP8=True, INTERPRETER_ROUNDING=False),
                    dict(num_warps=4, num_stages=3), FP8_POINTERS, ("stride_vs",)),
}
# Integer arguments a launch does not pass as multiples of 16 (so the JIT does not mark them).
NOT_DIVISIBLE = {"total_q", "total_k", "left", "right", "keep_threshold"}


def signature(fn, pointers):
    """Argument types by the kernels' naming: capitalized pointers (bf16 unless listed), float scalars
    by name, the rest i32."""
    def kind(p):
        if p.is_constexpr:
            return "constexpr"
        if p.name in PTRS or p.name in pointers:
            return {**PTRS, **pointers}[p.name]
        if p.name[0].isupper():
            return "*bf16"
        return "fp32" if p.name in FLOATS else "i32"
    return {p.name: kind(p) for p in fn.params}


def specialized(fn, pointers, constexprs, unit_strides):
    """(signature, constexprs, attrs) as Triton's JIT specializes a launch: the unit strides become
    the constant 1, pointers and the other integer arguments (but NOT_DIVISIBLE) divisible by 16."""
    types = signature(fn, pointers)
    constexprs = dict(constexprs)
    for name in unit_strides:
        types[name] = "constexpr"
        constexprs[name] = 1
    attrs = {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name, kind in types.items()
             if kind.startswith("*") or (kind == "i32" and name not in NOT_DIVISIBLE)}
    return types, constexprs, attrs


def instructions(ptx):
    """The PTX's instruction lines: no debug sections, source locations, comments or line labels."""
    lines = []
    for line in ptx.split(".section\t.debug")[0].splitlines():
        line = line.strip()
        if line and not line.startswith(("//", ".loc", ".file")) and not re.match(r"^\$L__tmp\d+:$", line):
            lines.append(re.sub(r"\$L__tmp\d+", "$T", line))
    return "\n".join(lines)


def dump(tree, out):
    sys.path.insert(0, tree)
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from flash_attn.triton import kernels
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    for name, (kernel, tiles, launch, pointers, unit_strides) in CASES.items():
        fn = getattr(kernels, kernel)
        for left in (False, True):
            for right in (False, True):
                consts = {k: v for k, v in dict(COMMON, **tiles, CLIP_LEFT=left, CLIP_RIGHT=right).items()
                          if k in fn.arg_names}
                types, consts, attrs = specialized(fn, pointers, consts, unit_strides)
                compiled = triton.compile(ASTSource(fn, types, constexprs=consts, attrs=attrs),
                                          target=GPUTarget("cuda", 90, 32), options=launch)
                stem = os.path.join(out, f"{name}_{int(left)}{int(right)}")
                with open(stem + ".ptx", "w") as f:
                    f.write(instructions(compiled.asm["ptx"]))
                with open(stem + ".regs", "w") as f:
                    f.write(cubin_resources(compiled.asm["cubin"], stem + ".cubin"))


def cubin_resources(cubin, path):
    """'REG:n STACK:n SHARED:n LOCAL:n ...' of the kernel Triton's ptxas built (cuobjdump -res-usage
    of its cubin: LOCAL is the spill space)."""
    import triton
    with open(path, "wb") as f:
        f.write(cubin)
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    report = subprocess.run([cuobjdump, "-res-usage", path], capture_output=True, text=True, check=True).stdout
    return re.search(r"REG:\d+ STACK:\d+ SHARED:\d+ LOCAL:\d+", report).group(0)


def main():
    if sys.argv[1] == "--dump":
        dump(sys.argv[2], sys.argv[3])
        return
    outs = []
    for i, tree in enumerate(sys.argv[1:3]):
        out = f"/tmp/triton_ptx_{i}"
        subprocess.run([sys.executable, __file__, "--dump", os.path.abspath(tree), out], check=True)
        outs.append(out)
    same = True
    for name in sorted(n for n in os.listdir(outs[0]) if n.endswith(".ptx")):
        a, b = (open(os.path.join(o, name)).read() for o in outs)
        regs = [open(os.path.join(o, name[:-4] + ".regs")).read() for o in outs]
        same &= a == b
        print(f"{name}: {'identical' if a == b else 'DIFFERS'} ({a.count(chr(10)) + 1} lines); "
              f"{regs[0]} -> {regs[1]}")
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
