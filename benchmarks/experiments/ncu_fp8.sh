#!/usr/bin/env bash
# Nsight Compute on the warp-specialized Hopper forward, bf16 against fp8 (e4m3), one launch each
# (GPU machine, after a build): hd HEADDIM (default 128), batch 2 x seqlen 8k, 2048 / hd heads,
# non-causal; throughput, warp states, scheduler and instruction statistics, and the tensor pipe's
# wgmma metrics where this ncu has them.
#   HEADDIM=256 benchmarks/experiments/ncu_fp8.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
hd=${HEADDIM:-128}
cat > /tmp/one_fp8_forward.py <<'PY'
import sys
import torch
import flash_attn
headdim, dtype = int(sys.argv[1]), sys.argv[2]
q, k, v = (torch.randn(2, 8192, 2048 // headdim, headdim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
if dtype == "fp8":
    q, k, v = (t.to(torch.float8_e4m3fn) for t in (q, k, v))
flash_attn.flash_attn_func(q, k, v)
torch.cuda.synchronize()
PY
gmma_metrics=$(ncu --query-metrics 2>/dev/null | awk '{print $1}' | grep -E "^[a-z0-9_]+gmma[a-z0-9_]*$" \
  | sed 's/$/.avg.pct_of_peak_sustained_active/' | head -4 | paste -sd, -)
for dtype in bf16 fp8; do
  echo "===== ncu: forward hd$hd $dtype"
  ncu --clock-control none --kernel-name "regex:fwd_(fp8_)?kernel_sm90_ws" --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section InstructionStats \
    ${gmma_metrics:+--metrics $gmma_metrics} python3 /tmp/one_fp8_forward.py "$hd" "$dtype" 2>&1 \
    | grep -vE "^==PROF==|^\s*$|^    ---" | head -90
done
