#!/usr/bin/env bash
# scripts/test_neon.sh: cross-compiles tests/cpp/test_matmul for aarch64 with the NEON kernels and
# runs it under qemu-user, so the NEON code is tested on an x86 machine.
# Needs (Debian): apt-get install g++-aarch64-linux-gnu qemu-user
# Flags mirror CMakeLists.txt: cpu/arm/*_neon.cpp get -march=armv8.2-a+dotprod+fp16, the rest baseline.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${EMBER_NEON_BUILD_DIR:-$root/tests/.cache/build-neon}"
cxx="${CXX_AARCH64:-aarch64-linux-gnu-g++}"
mkdir -p "$out"
cd "$root"

common=(-O2 -std=c++20 -Icpp -DEMBER_HAS_X86=0 -DEMBER_HAS_ARM=1 -DEMBER_HAS_AMX=0 -Wall -Wextra -Wno-unused-parameter)
# The registry (isa_registry.cpp) names the op tables too, so their scalar kernels come along.
sources=(cpp/core/thread_pool.cpp cpp/quant/*.cpp cpp/cpu/cpu_features.cpp cpp/cpu/quantize_act.cpp
         cpp/cpu/vec_dot_scalar.cpp cpp/cpu/isa_registry.cpp cpp/cpu/matmul.cpp cpp/cpu/weight_pack.cpp
         cpp/cpu/op_kernels.cpp cpp/cpu/attention.cpp cpp/cpu/store_kv.cpp cpp/cpu/elementwise.cpp
         cpp/cpu/arm/*_neon.cpp tests/cpp/test_matmul.cpp)
objects=()
for src in "${sources[@]}"; do
  obj="$out/$(echo "$src" | tr / _).o"
  flags=("${common[@]}")
  [[ "$src" == *_neon.cpp ]] && flags+=(-march=armv8.2-a+dotprod+fp16)
  "$cxx" "${flags[@]}" -c "$src" -o "$obj" &
  objects+=("$obj")
  while (( $(jobs -rp | wc -l) >= 2 )); do wait -n; done
done
wait
"$cxx" "${objects[@]}" -o "$out/test_matmul" -lpthread

# qemu's default aarch64 CPU model ("max") has dotprod; the loader and libraries come from the
# cross toolchain's sysroot.
EMBER_TEST_SHAPES="${EMBER_TEST_SHAPES:-small}" qemu-aarch64 -L /usr/aarch64-linux-gnu "$out/test_matmul"
