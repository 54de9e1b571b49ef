#!/usr/bin/env bash
# Nsight Compute on the sm90 kernels with and without dropout / deterministic (GPU machine, one
# call, after a build): one forward and one backward each, b=2 s=4096 h=16 hd 128 bf16,
# non-causal. Prints per kernel the duration, issue-slot use, instructions, tensor-pipe use and the
# stall reasons; the whole report goes to $OUT/ncu_options.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp}
cat > /tmp/one_step.py <<'PY'
import sys
import torch
import flash_attn
mode = sys.argv[1]
q, k, v = (torch.randn(2, 4096, 16, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
options = {"plain": {}, "dropout": {"dropout_p": 0.1}, "deterministic": {"deterministic": True}}[mode]
flash_attn.flash_attn_func(q, k, v, **options).sum().backward()
torch.cuda.synchronize()
PY
for mode in plain dropout deterministic; do
  echo "===== $mode"
  ncu --clock-control none --kernel-name "regex:(fwd|bwd)_kernel_sm90" --launch-count 2 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
    --section InstructionStats python3 /tmp/one_step.py $mode 2>&1 | grep -v "^==PROF==" | sed -e 's/  \+/  /g' \
    | tee -a "$OUT/ncu_options.txt" \
    | grep -E "_kernel_sm90|Duration|Issue Slots Busy|Executed Instructions  |Issued Ipc Active|Warp Cycles Per Issued|No Eligible|Compute \(SM\) Throughput|Stall|stalled|Registers Per"
done
