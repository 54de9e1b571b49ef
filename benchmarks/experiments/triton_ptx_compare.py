"""Whether two trees' Triton kernels compile to the same sm_90 PTX, on a machine without a GPU: for a
change meant to leave the generated code alone (a refactor of kernels.py). Each tree's forward,
dK/dV and dQ kernels (bf16, hd 128, one tile each, the four CLIP_LEFT / CLIP_RIGHT variants) go
through triton.compile for GPUTarget("cuda", 90, 32); the PTX is compared without its debug
sections and line labels.

    python benchmarks/experiments/triton_ptx_compare.py OLD_TREE NEW_TREE
"""

import os
import re
import subprocess
import sys

PTRS = {"Lse": "*fp32", "Delta": "*fp32", "CuQ": "*i32", "CuK": "*i32", "Slopes": "*fp32", "Rng": "*i64",
        "Descales": "*fp32"}
FLOATS = {"scale", "softcap", "keep_scale"}
COMMON = dict(BLOCK_D=128, VARLEN=False, HAS_SOFTCAP=False, HAS_ALIBI=False, HAS_DROPOUT=False,
              DOT_PRECISION="ieee", PAD_D=False)
CASES = {"attention_forward_kernel": dict(BLOCK_M=128, BLOCK_N=64, IS_FP8=False, INTERPRETER_ROUNDING=False),
         "attention_backward_dkdv_kernel": dict(BLOCK_M=64, BLOCK_N=128),
         "attention_backward_dq_kernel": dict(BLOCK_M=128, BLOCK_N=64)}


def signature(fn):
    """Argument types by the kernels' naming: capitalized pointers (bf16 unless listed), float scalars
    by name, the rest i32."""
    def kind(p):
        if p.is_constexpr:
            return "constexpr"
        if p.name in PTRS:
            return PTRS[p.name]
        if p.name[0].isupper():
            return "*bf16"
        return "fp32" if p.name in FLOATS else "i32"
    return {p.name: kind(p) for p in fn.params}


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
    os.makedirs(out, exist_ok=True)
    for name, tiles in CASES.items():
        fn = getattr(kernels, name)
        for left in (False, True):
            for right in (False, True):
                consts = {k: v for k, v in dict(COMMON, **tiles, CLIP_LEFT=left, CLIP_RIGHT=right).items()
                          if k in fn.arg_names}
                compiled = triton.compile(ASTSource(fn, signature(fn), constexprs=consts),
                                          target=GPUTarget("cuda", 90, 32), options=dict(num_warps=8, num_stages=2))
                with open(os.path.join(out, f"{name}_{int(left)}{int(right)}.ptx"), "w") as f:
                    f.write(instructions(compiled.asm["ptx"]))


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
    for name in sorted(os.listdir(outs[0])):
        a, b = (open(os.path.join(o, name)).read() for o in outs)
        same &= a == b
        print(f"{name}: {'identical' if a == b else 'DIFFERS'} ({a.count(chr(10)) + 1} lines)")
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
