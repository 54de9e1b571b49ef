#!/usr/bin/env bash
# FlashAttention 4 (flash-attn-4 4.0.0b36, CuTe DSL) as a peer column on the GPU machine, which has
# no network. Its wheels and the ones it needs that the machine lacks are ~101 MB, 92 MB of it the
# CUDA 13 compiler wheel (a 193 MB MLIR library and a 44 MB runtime); a device call carries 64 MiB
# with the working tree. So:
#
#   benchmarks/experiments/fa4_peer.sh pack          # here, with network: peers/fa4/ (git-ignored)
#   benchmarks/experiments/fa4_peer.sh unpack DIR    # there: installs into DIR once, prints the
#                                                    # PYTHONPATH (also when DIR is there): this
#                                                    # tree first, or a script run from elsewhere
#                                                    # finds FA4's namespace folder flash_attn first
#   benchmarks/experiments/fa4_peer.sh hold          # here, before a call that carries peers/fa4:
#                                                    # moves HELD out of the checkout, prints the size
#   benchmarks/experiments/fa4_peer.sh restore       # here, after the call: moves them back
#
# pack: the two libraries xz-compressed with the x86 filter (48.1 + 13.0 MB), the rest unpacked, trimmed
# of what neither import nor kernel compilation reads (tvm-ffi's C++ sources, the cutlass profiler
# iket, torch-c-dlpack-ext's prebuilt add-ons, which stop at torch 2.9 while the machine has 2.11),
# then xz-compressed (3.6 MB). 64.7 MB in all: the tree that travels with it must stay under ~2.4 MB,
# so a call that carries it leaves benchmarks/results/ (9 MB), benchmarks/NOTES.md and tests/ out of
# the checkout for its duration (benchmarks/NOTES.md v39). The versions are those of
# ../shared/docs/PEERS.md's FA4 column.
set -euo pipefail
cd "$(dirname "$0")/../.."
PACK=peers/fa4
IR=nvidia_cutlass_dsl/dsl_packages/cutlass/_mlir/_mlir_libs/_cutlass_ir.cu13.cpython-312-x86_64-linux-gnu.so
RUNTIME=nvidia_cutlass_dsl/cu13/lib/libcute_dsl_runtime.so
WHEELS=(flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1
        nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 quack-kernels==0.6.5
        apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5)

# What a call carrying the pack leaves behind (tracked, so it would travel), and where it waits.
HELD=(benchmarks/results benchmarks/NOTES.md tests)
HOLD=peers/held
LIMIT_BYTES=$((64 * 1024 * 1024))

pack() {
  local work; work=$(mktemp -d)
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    -d "$work/wheels" "${WHEELS[@]}"
  mkdir -p "$work/site" "$PACK"
  for wheel in "$work"/wheels/*.whl; do unzip -q -o "$wheel" -d "$work/site"; done
  local pack; pack=$PWD/$PACK
  (cd "$work/site"
   # the x86 filter (branch addresses made absolute) before LZMA2 takes ~3% off machine code
   xz --x86 --lzma2=preset=9e -T1 -c "$IR" > "$pack/ir.so.xz" & local ir=$!
   xz --x86 --lzma2=preset=9e -T1 -c "$RUNTIME" > "$pack/runtime.so.xz" & local runtime=$!
   tar --exclude="./$IR" --exclude="./$RUNTIME" --exclude=./nvidia_cutlass_dsl/dsl_packages/iket \
       --exclude=./tvm_ffi/3rdparty --exclude=./tvm_ffi/include --exclude=./tvm_ffi/src \
       --exclude=./tvm_ffi/cython --exclude=./tvm_ffi/share \
       --exclude='./torch_c_dlpack_ext/*.so' --exclude='*.pyi' -cf - . | xz -9e -T1 > "$pack/rest.tar.xz"
   wait $ir; wait $runtime)
  rm -rf "$work"
  du -cb "$PACK"/*
}

unpack() {
  local dest=$1
  if [[ ! -f $dest/.unpacked ]]; then
    mkdir -p "$dest"
    tar -xJf "$PACK/rest.tar.xz" -C "$dest"
    xz -dc "$PACK/ir.so.xz" > "$dest/$IR"
    xz -dc "$PACK/runtime.so.xz" > "$dest/$RUNTIME"
    chmod +x "$dest/$IR" "$dest/$RUNTIME"
    touch "$dest/.unpacked"
  fi
  # the cutlass wheel's .pth puts its dsl_packages on sys.path, which PYTHONPATH does not read
  echo "$PWD:$dest:$dest/nvidia_cutlass_dsl/dsl_packages"
}

travel_bytes() {  # tracked and untracked-not-ignored files present (du skips the held ones), plus the pack
  local tree pack
  tree=$({ git ls-files -z; git ls-files -z --others --exclude-standard; } | du -cb --files0-from=- 2>/dev/null \
    | tail -n 1 | cut -f1) || true
  pack=$(du -cb "$PACK"/* | tail -n 1 | cut -f1)
  echo $((tree + pack))
}

hold() {
  [[ ! -e $HOLD ]] || { echo "$HOLD exists: restore first" >&2; exit 1; }
  mkdir -p "$HOLD"
  for path in "${HELD[@]}"; do mkdir -p "$HOLD/$(dirname "$path")"; mv "$path" "$HOLD/$path"; done
  local bytes; bytes=$(travel_bytes)
  echo "travels: $bytes bytes of $LIMIT_BYTES"
  ((bytes < LIMIT_BYTES)) || { echo "over the limit: restore, and trim more" >&2; exit 1; }
}

restore() {
  for path in "${HELD[@]}"; do
    [[ ! -e $path ]] || { echo "$path exists: not overwritten" >&2; exit 1; }
    mv "$HOLD/$path" "$path"
  done
  rm -rf "$HOLD"
}

case ${1:-} in
  pack) pack ;;
  unpack) unpack "${2:?unpack needs the install folder}" ;;
  hold) hold ;;
  restore) restore ;;
  *) echo "usage: $0 pack | unpack DIR | hold | restore" >&2; exit 2 ;;
esac
