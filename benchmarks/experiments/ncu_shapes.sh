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
    python3 benchmarks/experiments/one_call.py "$hd" "$seqlen" "$causal" "$pass_" "$who" 2>&1 | grep -v "^==PROF==" \
    | sed -e 's/  \+/  /g' >> "$file"
  grep -E "^  [a-z_0-9]+.*\(|^  [a-z]+__|Duration|DRAM Throughput|L2 Hit Rate|Registers Per|Grid Size|Block Size|Dynamic Shared|Compute \(SM\) Throughput|Achieved Occupancy|Issued Warp Per|No Eligible" "$file" | head -40
done
