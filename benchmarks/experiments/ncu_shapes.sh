#!/usr/bin/env bash
# Nsight Compute at chosen shapes (GPU machine, one call): our forward or backward kernel and, for
# comparison, the kernels SDPA's cuDNN backend runs on the same inputs (bf16, hidden 2048, batch x
# seqlen = 16k). Each profile goes to $OUT/ncu_<who>_<pass>_hd<hd>_<seqlen>_c<causal>.txt.
# Usage: benchmarks/experiments/ncu_shapes.sh "HD:SEQLEN:CAUSAL:PASS:WHO ..."
#   PASS fwd | bwd, WHO ours | ours-det (deterministic=True) | ours-fp8 (e4m3 q, k, v; forward) | cudnn |
#   fa4 (FlashAttention 4: FA4=1, the pack of benchmarks/experiments/fa4_peer.sh carried); e.g.
#   "128:16384:0:fwd:ours 128:512:1:fwd:cudnn"
#   SKIP_BUILD=1 keeps the installed build; FLASH_ATTN_HDIMS as for the build (default "64;128;256").
#   SECTIONS overrides the ncu sections (default: throughput, memory, occupancy, scheduler, warp states,
#   launch facts); SOURCE=1 adds the top stall sites (SourceCounters; the build has -lineinfo);
#   METRICS (comma-separated) adds metrics, e.g. with SECTIONS=LaunchStats for a short report.
#   LAUNCHES: kernels profiled per shape (default 2: a pass's first matching launches). NCU_ARGS: more
#   ncu options, e.g. "--print-metric-instances values" with METRICS=sass__inst_executed_per_opcode:
#   the executed instructions per opcode, sorted, but printed without the opcodes' names (ncu 2025 on
#   the GPU machine, NOTES.md v41 item 7).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/ncu_out}
mkdir -p "$OUT"
if [[ -n ${FA4:-} ]]; then  # this tree, then FA4 (fa4_peer.sh says why)
  export PYTHONPATH=$(benchmarks/experiments/fa4_peer.sh unpack /tmp/fa4) || exit 1
fi
[[ ${SKIP_BUILD:-0} == 1 ]] || FLASH_ATTN_HDIMS=${FLASH_ATTN_HDIMS:-"64;128;256"} FLASH_ATTN_DTYPES=bf16 \
  NVCC_APPEND_FLAGS=-lineinfo STAGES=build scripts/gpu_check.sh | tail -n 3
cat > /tmp/one_call.py <<'PY'
import sys
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import flash_attn
headdim, seqlen, causal, pass_, who = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4], sys.argv[5]
shape = (16384 // seqlen, seqlen, 2048 // headdim, headdim)
q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=pass_ == "bwd") for _ in range(3))
if who == "ours-fp8":
    out = flash_attn.flash_attn_func(*(t.to(torch.float8_e4m3fn) for t in (q, k, v)), causal=causal)
elif who == "fa4":
    from flash_attn.benchmark import impls
    out = impls.fa4_forward(q, k, v, causal)
elif who.startswith("ours"):
    out = flash_attn.flash_attn_func(q, k, v, causal=causal, deterministic=who == "ours-det")
else:
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=causal)
if pass_ == "bwd":
    out.backward(torch.randn_like(out))
torch.cuda.synchronize()
PY
sections=${SECTIONS:-"SpeedOfLight MemoryWorkloadAnalysis Occupancy SchedulerStats WarpStateStats LaunchStats"}
[[ ${SOURCE:-0} == 1 ]] && sections="$sections SourceCounters"
section_args=$(for s in $sections; do printf -- "--section %s " "$s"; done)
[[ -n ${METRICS:-} ]] && section_args="$section_args --metrics $METRICS"
for shape in $1; do
  IFS=: read -r hd seqlen causal pass_ who <<< "$shape"
  if [[ $who == ours* ]]; then
    regex=$([[ $pass_ == fwd ]] && echo "fwd_(fp8_)?kernel" || echo "bwd_kernel")
  elif [[ $who == fa4 ]]; then
    # CuTe DSL names its kernels after the Python class; any of the backward's three (preprocess, main,
    # postprocess) matches, so LAUNCHES=3 takes all of them
    regex=$([[ $pass_ == fwd ]] && echo "Forward" || echo "Backward")
  else
    regex=$([[ $pass_ == fwd ]] && echo "fprop|fwd" || echo "dgrad|bprop|bwd")
  fi
  file=$OUT/ncu_${who}_${pass_}_hd${hd}_${seqlen}_c${causal}.txt
  echo "===== ncu $who $pass_ hd$hd seqlen $seqlen causal $causal (kernels matching $regex)" | tee "$file"
  ncu --clock-control none --kernel-name "regex:$regex" --launch-count "${LAUNCHES:-2}" --print-details all $section_args ${NCU_ARGS:-} \
    python3 /tmp/one_call.py "$hd" "$seqlen" "$causal" "$pass_" "$who" 2>&1 | grep -v "^==PROF==" \
    | sed -e 's/  \+/  /g' >> "$file"
  grep -E "^  [a-z_0-9]+.*\(|^  [a-z]+__|Duration|DRAM Throughput|L2 Hit Rate|Registers Per|Grid Size|Block Size|Dynamic Shared|Compute \(SM\) Throughput|Achieved Occupancy|Issued Warp Per|No Eligible" "$file" | head -40
done
