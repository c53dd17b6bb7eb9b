#!/usr/bin/env bash
# On a CUDA machine: build (tests included), the block-sparse attention GPU tests (kernels against
# the FP64 reference, the captured forward + backward, d12 shapes at T = 32K with their timings),
# compute-sanitizer memcheck and racecheck on the small cases, and the op's conformance on the GPU.
# Usage: ci/gpu_sparse.sh OUT_DIR [DEPS_DIR]   (DEPS_DIR from ci/gpu_stage.sh; default .deps if present)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: ci/gpu_sparse.sh OUT_DIR [DEPS_DIR]}
DEPS=${2:-$PWD/.deps}
mkdir -p "$OUT/sanitizer" "$OUT/logs"
CMAKE_DEPS=()
[ -d "$DEPS" ] && CMAKE_DEPS=(-DMIXBENCH_DEPS="$(cd "$DEPS" && pwd)")
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DMIXBENCH_CUDA=ON -DMIXBENCH_CUDA_ARCH=90 "${CMAKE_DEPS[@]}" \
    > "$OUT/logs/cmake.log" 2>&1 || { tail -30 "$OUT/logs/cmake.log"; exit 1; }
ninja -C build-gpu -j"$(nproc)" mixbench mixbench_tests > "$OUT/logs/build.log" 2>&1 || { grep -E "error|FAILED" "$OUT/logs/build.log" | head -30; exit 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
rc=0
T=build-gpu/mixbench_tests
$T --gtest_filter='SparseCuda.*' --gtest_output="json:$OUT/gtests_sparse_cuda.json" > "$OUT/logs/gtests.log" 2>&1 || rc=1
grep -E "^\[ timing \]|FAILED|Failure" "$OUT/logs/gtests.log" | head -40
tail -3 "$OUT/logs/gtests.log"
# compute-sanitizer on the small cases
san() { # name tool filter
  timeout "${MIXBENCH_SANITIZER_LIMIT:-300}" compute-sanitizer --tool "$2" --error-exitcode 9 $T --gtest_filter="$3" \
    > "$OUT/sanitizer/$1.log" 2>&1 || rc=1
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/sanitizer/$1.log" | tail -1 | sed "s/^/$1: /"
}
san memcheck_small memcheck 'SparseCuda.BlockSparseSmall*'
san racecheck_small racecheck 'SparseCuda.BlockSparseSmall*'
san memcheck_empty memcheck 'SparseCuda.BlockSparseEmptyRows'
# the op on the GPU against its FP64 reference (the kernel cases: D = 64, 128)
for dt in fp32 bf16; do
  build-gpu/mixbench conformance --ops block_sparse_attention --device cuda --dtype $dt --no-fd \
    > "$OUT/logs/conformance_$dt.log" 2>&1 || rc=1
  tail -4 "$OUT/logs/conformance_$dt.log"
done
exit $rc
