#!/usr/bin/env bash
# Executed-instruction counts per SASS instruction (and per source line) of our forward at chosen
# shapes: Nsight Compute's source page as CSV, $OUT/src_HD_SEQLEN_CAUSAL.csv (SASS) and
# srcmix_*.csv (CUDA source interleaved). Needs the build and /tmp/one_call.py of ncu_shapes.sh
# (run that first, in the same call; its build has -lineinfo).
# Usage: benchmarks/experiments/ncu_source.sh HD:SEQLEN:CAUSAL ...
set -uo pipefail
OUT=${OUT:-$PWD/ncu_out}
for shape in "$@"; do
  IFS=: read -r hd seqlen causal <<< "$shape"
  rep=/tmp/rep_${hd}_${seqlen}_${causal}
  ncu --clock-control none --kernel-name regex:fwd_kernel --launch-count 1 --section SourceCounters \
    --section InstructionStats --import-source yes -f -o "$rep" \
    python3 /tmp/one_call.py "$hd" "$seqlen" "$causal" fwd ours > /dev/null 2>&1
  ncu -i "$rep.ncu-rep" --page source --csv --print-source sass > "$OUT/src_${hd}_${seqlen}_${causal}.csv"
  ncu -i "$rep.ncu-rep" --page source --csv --print-source cuda,sass > "$OUT/srcmix_${hd}_${seqlen}_${causal}.csv"
  wc -l "$OUT"/src*_"${hd}_${seqlen}_${causal}".csv
done
