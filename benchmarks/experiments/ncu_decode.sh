#!/usr/bin/env bash
# Nsight Compute on the decode (GPU machine, one call): builds bf16 hd 128 with line info, then
# profiles one flash_attn_with_kvcache call (split-KV + combine kernels) and one SDPA cuDNN call per
# shape (GQA 32/8, hd 128, bf16, as the decode suite), each after ncu's own cache flush, with the
# sections that say what bounds a bandwidth-bound kernel: DRAM and L2 throughput, warp states,
# scheduler issue, occupancy and, for ours, the top stall sites (SourceCounters).
# Usage: benchmarks/experiments/ncu_decode.sh [batch:context ...] (default 32:4096 1:131072)
#   SKIP_BUILD=1 reuses the build; PAGED=16 profiles ours on a paged cache of that page size too.
set -uo pipefail
cd "$(dirname "$0")/../.."
[[ ${SKIP_BUILD:-0} == 1 ]] || FLASH_ATTN_HDIMS=128 FLASH_ATTN_DTYPES=bf16 NVCC_APPEND_FLAGS=-lineinfo STAGES=build \
  scripts/gpu_check.sh | tail -n 3
cat > /tmp/one_decode.py <<'PY'
import sys
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from flash_attn import flash_attn_with_kvcache
batch, context, page = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
def randn(*shape):
    return torch.randn(*shape, dtype=torch.bfloat16, device="cuda")
q, k, v = randn(batch, 1, 32, 128), randn(batch, context, 8, 128), randn(batch, context, 8, 128)
seqlens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
calls = [lambda: flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens)]
if page:
    pages = batch * context // page
    order = torch.randperm(pages, device="cuda")
    kp, vp = torch.empty_like(k).view(pages, page, 8, 128), torch.empty_like(v).view(pages, page, 8, 128)
    kp[order] = k.view(pages, page, 8, 128)
    vp[order] = v.view(pages, page, 8, 128)
    table = order.view(batch, -1).int()
    calls.append(lambda: flash_attn_with_kvcache(q, kp, vp, cache_seqlens=seqlens, block_table=table))
qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
def cudnn():
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
calls.append(cudnn)
for fn in calls:
    fn()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
for fn in calls:
    fn()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
PY
metrics=dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sector_hit_rate.pct,\
sm__throughput.avg.pct_of_peak_sustained_elapsed,smsp__issue_active.avg.pct_of_peak_sustained_elapsed,\
sm__warps_active.avg.pct_of_peak_sustained_active,gpu__time_duration.sum,sm__cycles_active.avg
for shape in ${@:-32:4096 1:131072}; do
  batch=${shape%%:*}; context=${shape##*:}
  echo "===== ncu decode batch=$batch context=$context page=${PAGED:-0}"
  ncu --clock-control none --profile-from-start off --print-details all \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
    --section LaunchStats --section Occupancy --metrics $metrics \
    python3 /tmp/one_decode.py "$batch" "$context" "${PAGED:-0}" 2>&1 | grep -v "^==PROF==" | sed -e 's/  \+/  /g'
  echo "===== stall sites: splitkv_kernel batch=$batch context=$context"
  ncu --clock-control none --profile-from-start off --kernel-name regex:splitkv_kernel --launch-count 1 \
    --section SourceCounters --print-details all \
    python3 /tmp/one_decode.py "$batch" "$context" 0 2>&1 | grep -v "^==PROF==" | sed -e 's/  \+/  /g'
done
