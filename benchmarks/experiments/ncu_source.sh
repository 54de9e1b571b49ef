#!/usr/bin/env bash
# Executed-instruction counts and stall samples per SASS instruction (and per source line) of our
# forward or backward at chosen shapes: Nsight Compute's source page as CSV,
# src_PASS_WHO_HD_SEQLEN_CAUSAL.csv (SASS) and srcmix_*.csv (CUDA source interleaved), packed with
# any earlier ones into $OUT/source_pages.tgz (the device tool brings back 8 files at most; session
# 21 lost its CSVs to that limit). benchmarks/experiments/ncu_source_summary.py reads them. Needs the
# build and /tmp/one_call.py of ncu_shapes.sh (run that first, in the same call; its build has
# -lineinfo).
# Usage: benchmarks/experiments/ncu_source.sh HD:SEQLEN:CAUSAL[:PASS[:WHO]] ...  (PASS fwd | bwd,
#   default fwd; WHO ours | ours-det, default ours)
set -uo pipefail
OUT=${OUT:-$PWD/ncu_out}
for shape in "$@"; do
  IFS=: read -r hd seqlen causal pass_ who <<< "$shape"
  pass_=${pass_:-fwd}; who=${who:-ours}
  tag=${pass_}_${who}_${hd}_${seqlen}_${causal}
  rep=/tmp/rep_$tag
  ncu --clock-control none --kernel-name "regex:${pass_}_kernel" --launch-count 1 --section SourceCounters \
    --section InstructionStats --section WarpStateStats --import-source yes -f -o "$rep" \
    python3 /tmp/one_call.py "$hd" "$seqlen" "$causal" "$pass_" "$who" > /dev/null 2>&1
  ncu -i "$rep.ncu-rep" --page source --csv --print-source sass > "$OUT/src_$tag.csv"
  ncu -i "$rep.ncu-rep" --page source --csv --print-source cuda,sass > "$OUT/srcmix_$tag.csv"
  wc -lc "$OUT"/src*_"$tag".csv
done
(cd "$OUT" && { [[ -f source_pages.tgz ]] && gzip -dc source_pages.tgz > source_pages.tar || true; } \
  && tar rf source_pages.tar src_*.csv srcmix_*.csv && gzip -c source_pages.tar > source_pages.tgz \
  && rm -f source_pages.tar src_*.csv srcmix_*.csv && ls -l source_pages.tgz)
