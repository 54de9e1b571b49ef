#!/usr/bin/env bash
# Nsight Compute on the attention kernels (GPU machine, one call): builds bf16 hd 64/128 with line
# info, then profiles one launch per configuration (bf16, 8k, 16 heads x hd 128 or 32 x hd 64,
# one forward + backward) with the sections that locate a stall: throughput, warp states,
# shared-memory conflicts and the top stall sites (SourceCounters).
# Usage: benchmarks/experiments/ncu_kernels.sh [kernel-regex, default bwd_kernel; e.g. fwd_kernel_sm90]
#   HEADDIMS="128 64" (default), CAUSALS="0" (default; "0 1" profiles both), SKIP_BUILD=1,
#   OPTIONS="none softcap=30 dropout_p=0.1" (default none): flash_attn_func keyword arguments per
#   profile, each "name=value" (one per profile)
set -uo pipefail
cd "$(dirname "$0")/../.."
regex=${1:-bwd_kernel}
[[ ${SKIP_BUILD:-0} == 1 ]] || FLASH_ATTN_HDIMS="64;128" FLASH_ATTN_DTYPES=bf16 NVCC_APPEND_FLAGS=-lineinfo STAGES=build \
  scripts/gpu_check.sh | tail -n 3
cat > /tmp/one_backward.py <<'PY'
import sys
import torch
import flash_attn
headdim, causal = int(sys.argv[1]), sys.argv[2] == "1"
options = {}
if sys.argv[3] != "none":
    name, value = sys.argv[3].split("=")
    options[name] = float(value)
heads = 2048 // headdim
q, k, v = (torch.randn(2, 8192, heads, headdim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
           for _ in range(3))
flash_attn.flash_attn_func(q, k, v, causal=causal, **options).sum().backward()
torch.cuda.synchronize()
PY
# Tensor-pipe metrics of this GPU whose names mention gmma (wgmma), read if they exist.
gmma_metrics=$(ncu --query-metrics 2>/dev/null | awk '{print $1}' | grep -E "^[a-z0-9_]+gmma[a-z0-9_]*$" \
  | sed 's/$/.sum/' | head -8 | paste -sd, -)
echo "gmma metrics: ${gmma_metrics:-none}"
for hd in ${HEADDIMS:-128 64}; do
for causal in ${CAUSALS:-0}; do
for option in ${OPTIONS:-none}; do
  echo "===== ncu: $regex hd$hd causal=$causal options=$option"
  ncu --clock-control none --kernel-name "regex:$regex" --launch-count 1 --print-details all \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
    --section WarpStateStats --section SchedulerStats --section LaunchStats --section SourceCounters \
    ${gmma_metrics:+--metrics $gmma_metrics} \
    python3 /tmp/one_backward.py $hd $causal $option 2>&1 | grep -v "^==PROF==" | sed -e 's/  \+/  /g'
done
done
done
