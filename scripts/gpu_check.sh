#!/usr/bin/env bash
# One call on the GPU machine: build, GPU tests, quick benchmark; the short tables print last.
#
#   scripts/gpu_check.sh                 # all stages
#   STAGES="build test" scripts/gpu_check.sh
#   PYTEST_ARGS="-k fwd" BENCH_ARGS="--suite speed" scripts/gpu_check.sh
#   TEST_PATHS="tests/test_gpu_sm90.py tests/test_gpu_features.py" TEST_K="sm90 or determin" scripts/gpu_check.sh
#   STAGES="sweep" scripts/gpu_check.sh  # tile sweep only (benchmarks/experiments/tile_sweep.cu)
#   STAGES="build sanitize" scripts/gpu_check.sh  # compute-sanitizer memcheck of the varlen and kvcache bad-metadata tests
#   STAGES="triton" scripts/gpu_check.sh  # the Triton backend's tests alone (tests/test_triton_*.py, no build
#     needed): ~11 s a case on an H100, mostly kernel compilation, so the test stage leaves those files to this stage
#   STAGES="triton_suite" scripts/gpu_check.sh  # the GPU suite (attention, features, kvcache, compile) against
#     the Triton backend (FLASH_ATTN_TEST_BACKEND=triton, tests/helpers.py), TRITON_SUITE_WORKERS pytest-xdist workers
#   STAGES="triton_peer" scripts/gpu_check.sh  # issue #9's comparison with Triton's fused-attention tutorial
#     (carry peers/triton_fused_attention_tutorial.py; no build needed): kernel time of the forward and the
#     backward (benchmarks/experiments/triton_kernel_time.py, PEER_ROUNDS rounds, default 2), then the
#     do_bench table (triton_tutorial_peer.py --no-fp8), at PEER_SEQLENS (default "1024 2048 4096")
#   STAGES="triton_fp8" scripts/gpu_check.sh  # issue #9's fp8 target: the fp8 / bf16 forward at hd 128
#     from 4k keys by kernel time (FP8_ROUNDS rounds, default 2; fp8 in groups of one, of 8 and of 16 MiB,
#     FP8_CANDIDATES), the do_bench sweep (triton_fp8_speed.py, default and 16 MiB groups), then
#     tests/test_triton_fp8.py with the schedule's 16 MiB groups forced on every fp8 call
#   STAGES="sweep" SWEEP_ARGS="64 8192 0;128 2048 1" scripts/gpu_check.sh
#   STAGES="build ab" AB_SCRIPT=benchmarks/experiments/scheduler_ab.py scripts/gpu_check.sh
#     before/after: builds the baseline tree in ./old_tree (an ignored export of the whole commit
#     before, `git archive REV | tar -x -C old_tree`, carried with the call; the stage stops if it
#     does not build) in place (AB_HDIMS, AB_DTYPES: 64;128 and bf16), runs AB_SCRIPT with AB_BASE_ARGS on it and on this tree,
#     each in its own process, one after the other, AB_ROUNDS times (default 1)
#
#   FA4=1 STAGES=bench BENCH_ARGS="--impls ours,cudnn,fa4" scripts/gpu_check.sh  # carry peers/fa4
#     (benchmarks/experiments/fa4_peer.sh pack): FlashAttention 4 unpacked to /tmp/fa4 and put on
#     PYTHONPATH for the benchmark's fa4 column
#
# Build variables pass through (FLASH_ATTN_HDIMS, FLASH_ATTN_DTYPES, FLASH_ATTN_CUDA_ARCHS, default
# here: 90, the machine's arch). The build and test logs (check.log) and the benchmark results
# (bench/, 6 files) go to $OUT, which the device tool brings back (8 files at most), else to
# ./gpu_check_out.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_check_out}
mkdir -p "$OUT"; export OUT
STAGES=${STAGES:-"build test bench"}
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
export FLASH_ATTN_CUDA_ARCHS=${FLASH_ATTN_CUDA_ARCHS:-90}
summary=()

LOG=$OUT/check.log
if [[ -n ${FA4:-} ]]; then
  fa4_path=$(benchmarks/experiments/fa4_peer.sh unpack /tmp/fa4) || exit 1
  export PYTHONPATH=$fa4_path${PYTHONPATH:+:$PYTHONPATH}  # this tree, then FA4 (fa4_peer.sh says why)
fi
# Per-stage time limits (seconds) so one stuck stage leaves time for the others' output. The bench
# stage's allows for the benchmark's 250 ms idle before each measurement (--idle-ms, since session 35;
# its cost on the quick set is not yet measured).
declare -A LIMIT=([build]=${BUILD_LIMIT:-300} [test]=${TEST_LIMIT:-300} [bench]=${BENCH_LIMIT:-360}
                  [sweep]=${SWEEP_LIMIT:-150} [sanitize]=${SANITIZE_LIMIT:-200} [ab]=${AB_LIMIT:-300}
                  [triton]=${TRITON_LIMIT:-480} [triton_suite]=${TRITON_SUITE_LIMIT:-540}
                  [triton_peer]=${TRITON_PEER_LIMIT:-540} [triton_fp8]=${TRITON_FP8_LIMIT:-540})
has_stage() { [[ " $STAGES " == *" $1 "* ]]; }  # STAGES lists stage names separated by spaces
stage() {  # stage NAME COMMAND...: runs, appends its output to $LOG, records wall time and status
  local name=$1; shift
  local start=$SECONDS
  echo "===== $name" >> "$LOG"
  timeout "${LIMIT[$name]}" "$@" 2>&1 | tee /tmp/.stage.log >> "$LOG"
  local status=${PIPESTATUS[0]}
  summary+=("$name: exit $status in $((SECONDS - start)) s")
  return $status
}

check_kernels() {  # check_kernels [TREE]: the flash_attn imported (with PYTHONPATH=TREE, as the ab stage's
  # "before" runs) has CUDA kernels
  local code="import flash_attn.ops as o; assert o.has_cuda_kernels(), '${1:-this tree}: ' + o.cuda_kernels_unavailable_reason()"
  if [[ -n ${1:-} ]]; then PYTHONPATH=$1 python3 -c "$code"; else python3 -c "$code"; fi
}
export -f check_kernels

build() {
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  echo "MAX_JOBS=$MAX_JOBS FLASH_ATTN_CUDA_ARCHS=$FLASH_ATTN_CUDA_ARCHS FLASH_ATTN_HDIMS=${FLASH_ATTN_HDIMS:-all}" \
       "FLASH_ATTN_DTYPES=${FLASH_ATTN_DTYPES:-all}"
  rm -rf build
  # peak machine memory in use during the build, sampled each second (parallel nvcc jobs add up)
  local base; base=$(free -m | awk '/Mem:/ {print $3}')
  (peak=0; while sleep 1; do used=$(free -m | awk '/Mem:/ {print $3}'); ((used > peak)) && peak=$used; \
    echo "$peak" > /tmp/.build_peak_mb; done) &
  local sampler=$! start=$SECONDS
  python3 -m pip install --no-build-isolation --no-deps -e . 2>&1 | grep -E "error|Error|Successfully|warning: C" || true
  kill $sampler
  echo "build wall time: $((SECONDS - start)) s; peak memory in use: $(cat /tmp/.build_peak_mb) MB (before: $base MB)"
  check_kernels && python3 -c "import flash_attn.ops as o; \
print('compiled', sorted((str(d), h) for d, h in o.compiled_configs()))"
}

if has_stage build; then
  export -f build
  stage build bash -c build; cat /tmp/.stage.log
fi
if has_stage test; then
  # TEST_PATHS narrows what is collected (default: tests/ whole); TEST_K is pytest's -k expression,
  # apart from PYTEST_ARGS because an expression with spaces does not survive word splitting
  stage test python3 -m pytest -q --maxfail=10 --durations=15 -p no:cacheprovider ${TEST_PATHS:-tests} \
    --ignore-glob='tests/test_triton_*.py' ${TEST_K:+-k "$TEST_K"} ${PYTEST_ARGS:-}
  tail -n 40 /tmp/.stage.log
fi
if has_stage triton; then
  stage triton python3 -m pytest -q --maxfail=10 -p no:cacheprovider tests/test_triton_*.py ${PYTEST_ARGS:-}
  tail -n 20 /tmp/.stage.log
fi
if has_stage triton_suite; then  # the GPU suite's public-function tests against the Triton backend
  stage triton_suite env FLASH_ATTN_TEST_BACKEND=triton python3 -m pytest -q --maxfail=20 -p no:cacheprovider \
    -n "${TRITON_SUITE_WORKERS:-14}" tests/test_gpu_attention.py tests/test_gpu_features.py tests/test_gpu_kvcache.py \
    tests/test_gpu_compile.py ${PYTEST_ARGS:-}
  tail -n 30 /tmp/.stage.log
fi
if has_stage triton_fp8; then
  triton_fp8() {
    local tool=benchmarks/experiments candidates=${FP8_CANDIDATES:-"default default:8 default:16"}
    python3 $tool/triton_kernel_time.py --fp8 --headdims 128 --seqlens 4096 8192 16384 \
      --rounds "${FP8_ROUNDS:-2}" --candidates $candidates > "$OUT/triton_fp8_kernel.md"
    python3 $tool/triton_fp8_speed.py --fp8-tiles default default:16 --bf16-tiles default \
      > "$OUT/triton_fp8_do_bench.md"
    grep -h "^| " "$OUT"/triton_fp8_*.md
    FLASH_ATTENTION_TRITON_SCHEDULE_GROUP_MB=16 python3 -m pytest -q -n 8 tests/test_triton_fp8.py 2>&1 | tail -3
  }
  export -f triton_fp8
  stage triton_fp8 env FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE PYTHONPATH="$PWD" bash -c triton_fp8
  cat /tmp/.stage.log
fi

if has_stage triton_peer; then
  triton_peer() {
    local seqlens=${PEER_SEQLENS:-"1024 2048 4096"} tool=benchmarks/experiments
    python3 $tool/triton_kernel_time.py --headdims 64 128 --seqlens $seqlens --rounds "${PEER_ROUNDS:-2}" \
      > "$OUT/triton_peer_forward_kernel.md"
    python3 $tool/triton_kernel_time.py --backward --headdims 64 128 --seqlens $seqlens \
      --rounds "${PEER_ROUNDS:-2}" > "$OUT/triton_peer_backward_kernel.md"
    python3 $tool/triton_tutorial_peer.py --no-fp8 --seqlens $seqlens > "$OUT/triton_peer_do_bench.md"
    grep -h "^| \|not loaded" "$OUT"/triton_peer_*.md
  }
  export -f triton_peer
  stage triton_peer env FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE PYTHONPATH="$PWD" bash -c triton_peer
  cat /tmp/.stage.log
fi
if has_stage sanitize; then  # memcheck: no kernel reads or writes outside its tensors
  stage sanitize compute-sanitizer --tool memcheck --error-exitcode 1 python3 -m pytest -q -p no:cacheprovider \
    tests/test_gpu_features.py tests/test_gpu_kvcache.py -k sanitizer
  tail -n 30 /tmp/.stage.log
fi
if has_stage bench; then
  set_flag=--quick; [[ " ${BENCH_ARGS:-} " == *" --full "* ]] && set_flag=  # the two exclude each other
  stage bench python3 -m flash_attn.benchmark $set_flag --out "$OUT/bench" ${BENCH_ARGS:-}
  grep -v "^\[" /tmp/.stage.log | tail -n 150
fi
if has_stage sweep; then  # tile-configuration sweep, torch-free (benchmarks/experiments)
  # SWEEP_ARGS: selections separated by ';', each "headdim [seqlen [causal]]" (default: all)
  stage sweep bash -c "nvcc -O3 --expt-relaxed-constexpr -I csrc -gencode=arch=compute_90a,code=sm_90a \
    benchmarks/experiments/tile_sweep.cu -o /tmp/tile_sweep && IFS=';' && for args in \${SWEEP_ARGS:-''}; do \
    IFS=' '; /tmp/tile_sweep \$args; done"
  cat /tmp/.stage.log
fi
if has_stage ab; then
  ab() {
    (cd old_tree && FLASH_ATTN_HDIMS=${AB_HDIMS:-"64;128"} FLASH_ATTN_DTYPES=${AB_DTYPES:-bf16} \
      python3 setup.py build_ext --inplace 2>&1 | grep -E "error|Error" ; true)
    # from /tmp, so that neither tree's directory shadows PYTHONPATH
    local root=$PWD
    # a failed baseline build must stop the A/B: its "before" would not run the baseline's kernels
    # (session 34's old_tree lacked build_config.py: its build failed unseen and its "before" numbers
    # came from some other path than the baseline's kernels)
    (cd /tmp && check_kernels "$root/old_tree") || return 1
    for round in $(seq "${AB_ROUNDS:-1}"); do  # rounds alternate the two, so that drift shows
      (cd /tmp && PYTHONPATH=$root/old_tree python3 "$root/$AB_SCRIPT" --label before ${AB_BASE_ARGS:-})
      (cd /tmp && python3 "$root/$AB_SCRIPT" --label after ${AB_ARGS:-})
    done
  }
  export -f ab
  stage ab bash -c ab; cat /tmp/.stage.log
fi
printf '%s\n' "${summary[@]}"
