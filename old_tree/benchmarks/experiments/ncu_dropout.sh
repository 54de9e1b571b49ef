#!/usr/bin/env bash
# Nsight Compute on the dropout backward against the plain one (GPU machine, one call): the
# Hopper cp.async backward (the kernel dropout selects) with and without dropout 0.1, and, where
# ./old_tree holds another tree (git archive REV | tar -x -C old_tree), its dropout backward too.
# bf16, b=2 s=4k h=16 hd 128, non-causal; one launch each. Full reports go to $OUT (or /tmp),
# the lines that compare them to stdout.
# Usage: benchmarks/experiments/ncu_dropout.sh   (SKIP_BUILD=1: the package is already built)
#   SASS=1: instead, per-SASS-instruction executed counts and stall samples (ncu's source page, CSV)
#   of the plain and dropout kernels, $OUT/sass_*.csv, for an opcode histogram.
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD out=${OUT:-/tmp}
[[ ${SKIP_BUILD:-0} == 1 ]] || FLASH_ATTN_HDIMS="128" FLASH_ATTN_DTYPES=bf16 NVCC_APPEND_FLAGS=-lineinfo STAGES=build \
  scripts/gpu_check.sh | tail -n 3
cat > /tmp/one_dropout_backward.py <<'PY'
import sys
import torch
import flash_attn
print("package:", flash_attn.__file__)
dropout_p = float(sys.argv[1])
q, k, v = (torch.randn(2, 4096, 16, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
flash_attn.flash_attn_func(q, k, v, dropout_p=dropout_p).sum().backward()
torch.cuda.synchronize()
PY
profile() {  # profile NAME DROPOUT_P [PYTHONPATH]
  (cd /tmp && FLASH_ATTN_SM90_BWD=cpasync PYTHONPATH=${3:-} ncu --clock-control none \
    --kernel-name "regex:bwd_kernel_sm90" --launch-count 1 --print-details all \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section LaunchStats \
    --section InstructionStats --section MemoryWorkloadAnalysis_Tables --section SourceCounters \
    python3 /tmp/one_dropout_backward.py "$2" > "$out/ncu_$1.txt" 2>&1)
  echo "===== $1"
  grep -E "package:|Duration|Executed Instructions  |Issue Slots Busy|Issued Warp Per Scheduler|No Eligible|Registers Per|Local Memory Spilling|Warp Cycles Per Issued|Stall [A-Za-z ]+ *cycle" \
    "$out/ncu_$1.txt" | sed -e 's/  \+/  /g' | head -40
}
sass() {  # sass NAME DROPOUT_P
  (cd /tmp && FLASH_ATTN_SM90_BWD=cpasync ncu --clock-control none --kernel-name "regex:bwd_kernel_sm90" \
    --launch-count 1 --section SourceCounters --import-source no -f -o "/tmp/rep_$1" \
    python3 /tmp/one_dropout_backward.py "$2" > /dev/null 2>&1)
  ncu -i "/tmp/rep_$1.ncu-rep" --page source --csv --print-source sass > "$out/sass_$1.csv" 2>&1
  echo "===== $1: $(wc -l < "$out/sass_$1.csv") lines"; head -c 600 "$out/sass_$1.csv"; echo
}
if [[ ${SASS:-0} == 1 ]]; then
  sass plain 0
  sass dropout 0.1
  exit 0
fi
if [[ -d old_tree ]]; then
  (cd old_tree && FLASH_ATTN_HDIMS="128" FLASH_ATTN_DTYPES=bf16 NVCC_APPEND_FLAGS=-lineinfo \
    python3 setup.py build_ext --inplace 2>&1 | grep -E "error|Error"; true)
fi
profile plain 0
profile dropout 0.1
[[ -d old_tree ]] && profile dropout_old_tree 0.1 "$root/old_tree"
true
