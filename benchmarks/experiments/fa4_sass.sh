#!/usr/bin/env bash
# FlashAttention 4's step loops and ours in SASS, side by side (GPU machine, one call, FA4's pack
# carried: benchmarks/experiments/fa4_peer.sh hold / restore around it). Why: ncu counted 28% more
# instructions in our hd 128 backward than in FA4's over the same key blocks but could not name them
# by opcode (benchmarks/NOTES.md v41 item 7); the SASS names them.
#
#   benchmarks/experiments/fa4_sass.sh HD SEQLEN CAUSAL PASS     # e.g. 128 8192 0 bwd
#
# FA4 compiles its kernels on first use; CUTE_DSL_KEEP=cubin keeps each cubin in CUTE_DSL_DUMP_DIR
# (cutlass/base_dsl/env_manager.py of nvidia-cutlass-dsl 4.8.1). Ours: the built extension
# (flash_attn._C; SKIP_BUILD=1 keeps an installed build, else hd HD bf16 is built). Both go through
# cuobjdump -sass (the triton wheel's) and sass_loops.py; to $OUT: fa4.sass, ours.sass and
# loops.txt (the step loops of both, with their opcode mix, local-memory and R2UR counts). First run
# in session 38 (H200, 128 8192 0 bwd; NOTES.md v43 item 4): FA4's cubins were kept as described.
# FA4's mbarrier waits retry in out-of-line blocks that branch back to the loop head, so the
# innermost "loop" sass_loops.py lists for it may run past the step's own back edge (there
# 0x2170-0x4d70 for a step of 0x2100-0x3de0): read the listing around the HGMMAs.
set -uo pipefail
cd "$(dirname "$0")/../.."
[[ $# == 4 ]] || { echo "usage: $0 HD SEQLEN CAUSAL PASS" >&2; exit 2; }
OUT=${OUT:-$PWD/fa4_sass_out}
mkdir -p "$OUT"
export PYTHONPATH=$(benchmarks/experiments/fa4_peer.sh unpack /tmp/fa4) || exit 1
[[ ${SKIP_BUILD:-0} == 1 ]] || FLASH_ATTN_HDIMS=$1 FLASH_ATTN_DTYPES=bf16 STAGES=build scripts/gpu_check.sh | tail -n 3
cuobjdump=$(python3 -c "import os, triton; print(os.path.join(os.path.dirname(triton.__file__), 'backends', 'nvidia', 'bin', 'cuobjdump'))")
dump=$(mktemp -d)
CUTE_DSL_KEEP=cubin CUTE_DSL_DUMP_DIR=$dump python3 benchmarks/experiments/one_call.py "$1" "$2" "$3" "$4" fa4
find "$dump" -name '*.cubin' | sort | while read -r cubin; do "$cuobjdump" -sass "$cubin"; done > "$OUT/fa4.sass"
so=$(python3 -c "import flash_attn._C as c; print(c.__file__)")
"$cuobjdump" -sass "$so" > "$OUT/ours.sass"
ours_kernel=$([[ $4 == fwd ]] && echo "fwd_kernel_sm90_ws" || echo "bwd_kernel_sm90_ws")
{
  echo "== FA4 ($(find "$dump" -name '*.cubin' | wc -l) cubins kept)"
  python3 benchmarks/experiments/sass_loops.py "$OUT/fa4.sass" --most 30
  echo "== ours ($ours_kernel, hd $1)"
  python3 benchmarks/experiments/sass_loops.py "$OUT/ours.sass" --function "${ours_kernel}.*Li$1E" --most 30
} | tee "$OUT/loops.txt"
