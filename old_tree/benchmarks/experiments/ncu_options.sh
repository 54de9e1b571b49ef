#!/usr/bin/env bash
# Nsight Compute on the sm90 kernels with and without dropout / deterministic (GPU machine, one
# call, after a build): one forward and one backward each (and the backward's preprocess and dQ
# convert passes), b=2 s=4096 h=16 hd 128 bf16 non-causal unless NCU_SHAPE="batch seqlen heads
# headdim" says otherwise; NCU_MODES picks among plain, dropout and deterministic. Prints per kernel
# the duration, issue-slot use, instructions, tensor-pipe use and the stall reasons; the whole
# report (with the top stall sites, SourceCounters) goes to $OUT/ncu_options.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp}
cat > /tmp/one_step.py <<'PY'
import sys
import torch
import flash_attn
mode = sys.argv[1]
batch, seqlen, heads, headdim = (int(x) for x in sys.argv[2:6])
q, k, v = (torch.randn(batch, seqlen, heads, headdim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
           for _ in range(3))
options = {"plain": {}, "dropout": {"dropout_p": 0.1}, "deterministic": {"deterministic": True}}[mode]
flash_attn.flash_attn_func(q, k, v, **options).sum().backward()
torch.cuda.synchronize()
PY
shape=${NCU_SHAPE:-"2 4096 16 128"}
for mode in ${NCU_MODES:-plain dropout deterministic}; do
  echo "===== $mode ($shape)"
  ncu --clock-control none --kernel-name "regex:(fwd|bwd)_kernel_sm90|bwd_preprocess|convert_dq" --launch-count 4 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
    --section InstructionStats --section SourceCounters python3 /tmp/one_step.py $mode $shape 2>&1 | grep -v "^==PROF==" | sed -e 's/  \+/  /g' \
    | tee -a "$OUT/ncu_options.txt" \
    | grep -E "_kernel_sm90|bwd_preprocess|convert_dq|Duration|Issue Slots Busy|Executed Instructions  |Issued Ipc Active|Warp Cycles Per Issued|No Eligible|Compute \(SM\) Throughput|Stall|stalled|Registers Per"
done
