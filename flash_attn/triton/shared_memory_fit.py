"""Fixed launches that fit the GPU's shared memory (issue #9: a portable backend).

The fixed tiles (attention.py's tables, the portable blocks) were chosen on Hopper, whose blocks may
take 227 KB of shared memory. Other GPUs offer less to a block: A100 163 KB, the sm_86 / sm_89 /
sm_120 parts 99 KB, AMD's CDNA 64 KB of LDS. Triton 3.6's offline compiles
(benchmarks/experiments/triton_static_regs.py, NOTES.md v50) need more than that for many of them: at
hd 128 the bf16 forward's 128 x 128 tile 160 KB on sm_80 / sm_89, the backward's 129 / 128 KB, the
portable 64 x 64 backward tiles 105 KB on sm_89; the bf16 hd 256 dQ tile 168 KB on sm_80; the
portable tiles of fp32 inputs at hd 128 / 256 164-209 KB (over A100's limit too); the split-KV kernel
in fp32 at hd 128 / 256 66-68 KB on gfx942. Triton refuses such a kernel when it loads it, before
anything launches (OutOfResources), as its autotuner refuses the configs it then skips. A fixed launch
refused so tries smaller_launches' options in turn and keeps the first that loads, remembered per
kernel, device and options, so that only a shape's first call pays the refused compiles. Shared
memory is not monotonic in num_stages (hd 256 dK / dV 64 x 64 on sm_89: 137 KB at 2 stages, 160 KB
at 1), hence the trials rather than an estimate. No GPU short of Hopper's shared memory has run
this; on Hopper no table tile is refused.
"""

import torch

try:
    from triton.runtime.errors import OutOfResources
except ImportError:  # a Triton without it refuses nothing this way
    OutOfResources = None

from .direct_launch import launch_kernel

# A halved block stops at tl.dot's smallest side, 16 (fp32 dK / dV at hd 256 on sm_89 fits only below
# 32 x 32: 132 KB there with 1 or 2 stages), unless the caller names a larger smallest size.
SMALLEST_BLOCK = 16
HALVED_TILE_WARPS = 4  # the portable tiles' warps: a halved tile runs at most these
DEFAULT_STAGES = 2 if torch.version.hip else 3  # Triton's num_stages where a launch names none (HIP's, CUDA's)

# The blocks of the attention kernels (forward, dK / dV, dQ), both of which their grids follow, by
# their smallest size.
ATTENTION_BLOCKS = {"BLOCK_M": SMALLEST_BLOCK, "BLOCK_N": SMALLEST_BLOCK}

# kernel -> {(device, the refused options' items): the options that loaded}; a kernel appears only
# once a GPU refused one of its launches, so that the others skip building the key
_fitted = {}


def smaller_launches(options, shrinkable=None):
    """The launch options to try, in order, after `options` was refused: the same blocks with fewer
    stages (down to 1); then the larger of the shrinkable blocks ({name: smallest size} of the blocks
    whose size the grid follows or the kernel reads at run time, and that no host-made descriptor
    fixes) halved, BLOCK_M on a tie, while one is above its smallest, each at most HALVED_TILE_WARPS
    warps, without a register cap, again from the original stages down."""
    shrinkable = shrinkable or {}
    stages = options.get("num_stages", DEFAULT_STAGES)
    for fewer in range(stages - 1, 0, -1):
        yield {**options, "num_stages": fewer}
    blocks = dict(options)
    blocks.pop("maxnreg", None)
    while True:
        halvable = [name for name, smallest in shrinkable.items() if blocks[name] > smallest]
        if not halvable:
            return
        larger = max(halvable, key=lambda name: (blocks[name], name == "BLOCK_M"))
        blocks = {**blocks, larger: blocks[larger] // 2,
                  "num_warps": min(blocks.get("num_warps", HALVED_TILE_WARPS), HALVED_TILE_WARPS)}
        for fewer in range(stages, 0, -1):
            yield {**blocks, "num_stages": fewer}


def _key(options):
    """The memo's key of a launch of one kernel: the current GPU and every option."""
    device = torch.cuda.current_device() if torch.cuda.is_available() else None
    return device, tuple(sorted(options.items()))


def launch_fitted(kernel, grid, args, options, bound=None, shrinkable=None):
    """kernel[grid](*args, **options) through launch_kernel, or where the GPU refuses it for shared
    memory, the first of smaller_launches(options, shrinkable) that it takes (remembered); raises the
    first refusal where none is taken. grid: a function of the launch's meta-parameters wherever a
    block it depends on is shrinkable."""
    refused_before = _fitted.get(kernel)
    fitted = refused_before.get(_key(options)) if refused_before else None
    if fitted is not None:
        launch_kernel(kernel, grid, args, fitted, bound)
        return
    try:
        launch_kernel(kernel, grid, args, options, bound)
        return
    except Exception as refusal:
        if not _refused_for_shared_memory(refusal):
            raise
        first_refusal = refusal
    for smaller in smaller_launches(options, shrinkable):
        try:
            launch_kernel(kernel, grid, args, smaller, bound)
        except Exception as refusal:
            if not _refused_for_shared_memory(refusal):
                raise
            continue
        _fitted.setdefault(kernel, {})[_key(options)] = smaller
        return
    raise first_refusal


def _refused_for_shared_memory(error):
    """Whether `error` is Triton's refusal to load a kernel for its shared memory."""
    return OutOfResources is not None and isinstance(error, OutOfResources) and error.name == "shared memory"
