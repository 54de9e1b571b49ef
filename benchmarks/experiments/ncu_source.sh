#!/usr/bin/env bash
# Executed-instruction counts and stall samples per SASS instruction (and per source line) of our
# forward or backward at chosen shapes: Nsight Compute's source page as CSV,
# src_PASS_WHO_HD_SEQLEN_CAUSAL.csv (SASS) and srcmix_*.csv (CUDA source interleaved), packed with
# those of earlier invocations in the same call into $OUT/source_pages.tgz (the device tool brings
# back 8 files at most; session 21 lost its CSVs to that limit).
# benchmarks/experiments/ncu_source_summary.py reads them. Needs the build of ncu_shapes.sh (run that
# first, in the same call; its build has -lineinfo); the call profiled is one_call.py's.
# Usage: benchmarks/experiments/ncu_source.sh HD:SEQLEN:CAUSAL[:PASS[:WHO]] ...  (PASS fwd | bwd,
#   default fwd; WHO ours | ours-det | ours-fp8, default ours)
set -uo pipefail
OUT=${OUT:-$PWD/ncu_out}
one_call=$(dirname "$0")/one_call.py
pages=/tmp/ncu_source_pages  # every shape of this call, earlier invocations included
mkdir -p "$pages"
for shape in "$@"; do
  IFS=: read -r hd seqlen causal pass_ who <<< "$shape"
  pass_=${pass_:-fwd}; who=${who:-ours}
  tag=${pass_}_${who}_${hd}_${seqlen}_${causal}
  rep=/tmp/rep_$tag
  ncu --clock-control none --kernel-name "regex:${pass_}_(fp8_)?kernel" --launch-count 1 --section SourceCounters \
    --section InstructionStats --section WarpStateStats --import-source yes -f -o "$rep" \
    python3 "$one_call" "$hd" "$seqlen" "$causal" "$pass_" "$who" > /dev/null 2>&1
  ncu -i "$rep.ncu-rep" --page source --csv --print-source sass > "$pages/src_$tag.csv"
  ncu -i "$rep.ncu-rep" --page source --csv --print-source cuda,sass > "$pages/srcmix_$tag.csv"
  wc -lc "$pages"/src*_"$tag".csv
done
tar czf "$OUT/source_pages.tgz" -C "$pages" . && ls -l "$OUT/source_pages.tgz"
