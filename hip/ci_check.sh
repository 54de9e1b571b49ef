#!/usr/bin/env bash
# CI stage for AMD (issue #11), on a CPU-only Debian 12 machine: hipify csrc/flash into build/hip,
# compile the CDNA probe (hip/probe_attention_block.hip), the sm80-family forward
# (hip/fwd_kernels_cdna.hip: fwd_kernel.cuh for fp16 / bf16, head dims 32 to 256, plain and
# score-extras), the sm80-family backward (hip/bwd_kernels_cdna.hip: bwd_kernel.cuh with its
# preprocess and dQ convert, fp16 / bf16, head dims 32 to 256, plain and score-extras), the split-KV
# decode (hip/kvcache_kernels_cdna.hip: the append / rotary, split-KV (contiguous and paged cache)
# and combine kernels, fp16 / bf16, head dims 32 to 256) and the arch layer's compile-only coverage
# (tests/hip/cdna_api_compile.hip) and the shared kernels (dropout mask, fp8 V layout) against that tree for
#   gfx90a (MI200) with Debian's hipcc (ROCm 5.2, clang 15), and
#   gfx942 (MI300) with clang-19, which knows gfx942, on the same ROCm 5.2 headers and device
#   libraries plus an oclc_isa_version_942.bc that Debian lacks,
# then check the ISA and resource report of every probe, forward, backward and decode kernel
# (hip/check_isa.py). Run from .ci/run with the venv active (hipify is torch's); PYTHON overrides
# the interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
python=${PYTHON:-python}
out=$PWD/build/hip
probe=$PWD/hip/probe_attention_block.hip
forward=$PWD/hip/fwd_kernels_cdna.hip
backward=$PWD/hip/bwd_kernels_cdna.hip
decode=$PWD/hip/kvcache_kernels_cdna.hip
api_coverage=$PWD/tests/hip/cdna_api_compile.hip

install_toolchain() {
  local missing=()
  command -v hipcc >/dev/null || missing+=(hipcc)
  command -v clang++-19 >/dev/null || missing+=(clang-19)
  command -v ld.lld-19 >/dev/null || missing+=(lld-19)
  command -v clang-offload-bundler-19 >/dev/null || missing+=(clang-tools-19)  # bundles the device code
  [ ${#missing[@]} -eq 0 ] && return
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq
  # without recommends: clang-19's pull in llvm-19-dev (43 MB download) that no step here uses
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# Debian's device libraries stop at gfx940. gfx942 differs from it, for the libraries, only in the
# ISA version constant that oclc_isa_version_<n>.bc defines (9400 -> 9402); the copy is made by
# round-tripping the bitcode through LLVM IR with clang-19 itself.
make_gfx942_device_libs() {
  local source=$1 target=$2
  rm -rf "$target"
  mkdir -p "$target"
  cp "$source"/*.bc "$target"/
  local ir=$target/oclc_isa_version_940.ll
  clang-19 -nogpulib --target=amdgcn-amd-amdhsa -x ir -S -emit-llvm -O0 "$source/oclc_isa_version_940.bc" -o "$ir"
  grep -q '@__oclc_ISA_version = .* constant i32 9400,' "$ir" || { echo "unexpected oclc_isa_version_940.bc"; exit 1; }
  sed 's/\(@__oclc_ISA_version = .* constant i32 \)9400,/\19402,/' "$ir" > "$target/oclc_isa_version_942.ll"
  clang-19 -nogpulib --target=amdgcn-amd-amdhsa -x ir -c -emit-llvm -O0 "$target/oclc_isa_version_942.ll" \
    -o "$target/oclc_isa_version_942.bc"
  rm "$target"/*.ll
}

# torch's flags for hipcc (no implicit half conversions), so code relying on them fails here.
flags=(-O3 -std=c++17 -I "$out" -D__HIP_PLATFORM_AMD__=1 -DUSE_ROCM=1 -D__HIP_NO_HALF_OPERATORS__=1
       -D__HIP_NO_HALF_CONVERSIONS__=1)

# compile_checked TARGET SOURCE COMMAND...: SOURCE in $out/TARGET (where --save-temps leaves the
# .s), its resource remarks to <source name>.remarks.txt.
compile_checked() {
  local target=$1 source=$2
  shift 2
  local name
  name=$(basename "$source" .hip)
  (cd "$out/$target" && "$@" "${flags[@]}" --save-temps -Rpass-analysis=kernel-resource-usage -c "$source" \
    -o "$name.o" 2> "$name.remarks.txt") || { cat "$out/$target/$name.remarks.txt"; exit 1; }
}

# The kernels every build compiles once (build_config.SHARED_KERNEL_SOURCES: the dropout mask, the
# fp8 forward's V layout), as hipify leaves them in $out.
shared_sources=$("$python" -c "import build_config, os
print(*(os.path.join('$out', 'flash', os.path.basename(s)[:-3] + '.hip') for s in build_config.SHARED_KERNEL_SOURCES))")

# compile TARGET COMMAND...: the probe, the forward, the backward and the decode, then the arch
# layer's compile-only coverage and the shared kernels (device code only).
compile() {
  local target=$1 source
  shift
  mkdir -p "$out/$target"
  compile_checked "$target" "$probe" "$@"
  compile_checked "$target" "$forward" "$@"
  compile_checked "$target" "$backward" "$@"
  compile_checked "$target" "$decode" "$@"
  "$@" "${flags[@]}" --cuda-device-only -c "$api_coverage" -o "$out/$target/cdna_api_compile.o"
  for source in $shared_sources; do
    "$@" "${flags[@]}" --cuda-device-only -c "$source" -o "$out/$target/$(basename "$source" .hip).o"
  done
}

check() {
  local target=$1 source name
  for source in "$probe" "$forward" "$backward" "$decode"; do
    name=$(basename "$source" .hip)
    "$python" hip/check_isa.py --target "$target" --remarks "$out/$target/$name.remarks.txt" \
      --isa "$out/$target/$name-hip-amdgcn-amd-amdhsa-$target.s"
  done
}

install_toolchain
echo "== hip: toolchain ready: $((SECONDS - start)) s"
"$python" hip/hipify_sources.py --out "$out"
echo "== hip: hipified: $((SECONDS - start)) s"

# hipconfig picks the nvidia platform when /usr/local/cuda exists.
export HIP_PLATFORM=amd
device_libs=${ROCM_DEVICE_LIB_PATH:-/usr/lib/$(gcc -print-multiarch)/amdgcn/bitcode}
make_gfx942_device_libs "$device_libs" "$out/device-libs-gfx942"
# The two targets build side by side: CI's machine has 2 cores (the backward took the stage from
# 21 s to 32 s built one after the other).
compile gfx90a hipcc --offload-arch=gfx90a &
gfx90a_build=$!
compile gfx942 clang++-19 -x hip --offload-arch=gfx942 --hip-path=/usr --rocm-device-lib-path="$out/device-libs-gfx942" &
gfx942_build=$!
wait "$gfx90a_build"
wait "$gfx942_build"
check gfx90a
check gfx942
echo "== hip: probe, forward, backward and decode compiled and checked for gfx90a and gfx942: $((SECONDS - start)) s"
