#!/usr/bin/env bash
# On a CUDA machine, in one go: build (LibTorch from the machine's python torch, nvcc, sm_90),
# run the conformance suite on CUDA at fp32 and bf16 for every registered op and method, run the
# GPU benchmarks and the peer timings, and write every JSON into OUT_DIR.
# Usage: ci/gpu.sh OUT_DIR [DEPS_DIR]   (DEPS_DIR from ci/gpu_stage.sh when the machine lacks the
# Debian packages; default .deps if present). MIXBENCH_GPU_PARTS (default
# "conformance,bench,peers,chunk,sanitizer") picks the parts to run after the build; "peers" is the
# same-process comparison through torch.ops.mixbench (ci/peers.py, comparison.json; the peers'
# wheels from ci/gpu_stage.sh joined by ci/wheels.py); "fla_bwd" (not in the default: several minutes
# of Triton autotuning) has chunk_check.py time flash-linear-attention's forward + backward with its
# Hopper refusal lifted next to the chunk kernels; "gtests" builds the unit tests and runs those that
# need a GPU (MIXBENCH_GTEST_FILTER).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: ci/gpu.sh OUT_DIR [DEPS_DIR]}
DEPS=${2:-$PWD/.deps}
LOGS=${MIXBENCH_LOG_DIR:-$(mktemp -d)}
mkdir -p "$OUT" "$LOGS"
log() { echo "== $(date +%H:%M:%S) $*"; }
PARTS=",${MIXBENCH_GPU_PARTS:-conformance,bench,peers,chunk,sanitizer},"
part() { [[ "$PARTS" == *",$1,"* ]]; }
CMAKE_DEPS=()
[ -d "$DEPS" ] && CMAKE_DEPS=(-DMIXBENCH_DEPS="$(cd "$DEPS" && pwd)")
log configure
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DMIXBENCH_CUDA=ON -DMIXBENCH_CUDA_ARCH=90 \
      "${CMAKE_DEPS[@]}" > "$LOGS/cmake.log" 2>&1 || { tail -40 "$LOGS/cmake.log"; exit 1; }
log build
CHUNK_LIB=/tmp/mixbench_chunk.so
CHUNK_BUILD=
if part chunk || part sanitizer || part fla_bwd; then
  # the kernels' stand-alone library for chunk_check.py, built alongside the project
  python3 ci/kernels/chunk_check.py --build-only --lib "$CHUNK_LIB" > "$LOGS/chunk_build.log" 2>&1 &
  CHUNK_BUILD=$!
fi
ninja -C build-gpu -j"$(nproc)" mixbench mixbench_bench mixbench_torch_ops > "$LOGS/build.log" 2>&1 || { grep -E "error|FAILED" "$LOGS/build.log" | head -40; exit 1; }
MB=build-gpu/mixbench
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
$MB list
rc=0
for dtype in $(part conformance && echo fp32 bf16); do
  log "conformance cuda $dtype"
  $MB conformance --methods all --device cuda --dtype "$dtype" --no-fd --quiet \
      --golden tests/goldens/*.safetensors --out "$OUT/conformance_cuda_$dtype.json" || rc=1
done
if part gtests; then
  # the unit tests that need a GPU (skipped on CPU-only machines): fused kernels against LibTorch,
  # the optimizer's device scalars and the training step's CUDA-graph scopes
  log "GPU unit tests"
  ninja -C build-gpu -j"$(nproc)" mixbench_tests > "$LOGS/build_tests.log" 2>&1 || { grep -E "error|FAILED" "$LOGS/build_tests.log" | head -20; exit 1; }
  build-gpu/mixbench_tests --gtest_filter="${MIXBENCH_GTEST_FILTER:-CudaElementwise.*:SimpleGlaCudaKernel.*:TrainFast.DeviceConstants*:TrainFast.CudaGraph*:OptimizerDeviceScalars.Cuda*:DecodeCuda.*}" \
      --gtest_output="json:$OUT/gtests_cuda.json" 2>&1 | tail -25 || rc=1
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
fi
if part bench; then
log benchmarks
build-gpu/mixbench_bench --benchmark_filter="${MIXBENCH_BENCH_FILTER:-^(attention_cuda|linear_cuda|ceiling_cuda)/}" \
    --benchmark_format=json --benchmark_out="$OUT/bench_cuda.json" --benchmark_out_format=json \
    > "$LOGS/bench_cuda.txt" 2>&1 || rc=1
tail -40 "$LOGS/bench_cuda.txt"
# every op's CUDA path (auto-registered, case-sized shapes, fp32), two lengths
build-gpu/mixbench_bench --benchmark_filter='/cuda_fwd(_bwd)?/(1024|8192)(/|$)' --benchmark_min_time=0.05 \
    --benchmark_format=json --benchmark_out="$OUT/bench_ops_cuda.json" --benchmark_out_format=json \
    > "$LOGS/bench_ops_cuda.txt" 2>&1 || rc=1
fi
source ci/gpu_wheels.sh "$LOGS/wheels.log"   # the peers' wheels, when present
if part peers; then
  log "peers: same-process comparison through torch.ops.mixbench"
  MIXBENCH_TORCH_OPS_LIB=$PWD/build-gpu/libmixbench_torch_ops.so python3 ci/peers.py \
      --out "$OUT/comparison.json" --timings "$OUT/peer_timings.json" > "$LOGS/peers.txt" 2>&1 || rc=1
  grep -v '^{' "$LOGS/peers.txt" | tail -40
fi
if [ -n "$CHUNK_BUILD" ] && ! wait "$CHUNK_BUILD"; then
  echo "building the chunk kernels' library failed:"; tail -20 "$LOGS/chunk_build.log"; exit 1
fi
if part chunk; then
log "chunk kernels: check against float64 and time next to flash-linear-attention"
PREBUILT=1 python3 ci/kernels/chunk_check.py --quick --sweep --lib "$CHUNK_LIB" --out "$OUT/chunk_kernels.json" \
    > "$LOGS/chunk.txt" 2>&1 || rc=1
grep -vi warn "$LOGS/chunk.txt" | grep -v '^{' | tail -6
fi
if part fla_bwd; then
  log "flash-linear-attention forward + backward, its refusal lifted, next to the chunk kernels"
  PREBUILT=1 python3 ci/kernels/chunk_check.py --no-check --fla-bwd --lib "$CHUNK_LIB" \
      --out "$OUT/chunk_fla_bwd.json" > "$LOGS/fla_bwd.txt" 2>&1 || { rc=1; tail -5 "$LOGS/fla_bwd.txt"; }
fi
if part sanitizer && command -v compute-sanitizer > /dev/null; then
  log "compute-sanitizer (memcheck, racecheck) on the chunk kernels"
  : > "$OUT/sanitizer.txt"
  # the same small run without the sanitizer first
  PREBUILT=1 python3 ci/kernels/chunk_check.py --sanitize --lib "$CHUNK_LIB" \
      > "$LOGS/sanitize_plain.txt" 2>&1
  echo "plain exit=$? $(tail -1 "$LOGS/sanitize_plain.txt")" >> "$OUT/sanitizer.txt"
  for tool in memcheck racecheck; do
    PREBUILT=1 compute-sanitizer --tool "$tool" --error-exitcode 3 \
      python3 ci/kernels/chunk_check.py --sanitize --lib "$CHUNK_LIB" > "$LOGS/sanitizer_$tool.txt" 2>&1
    src=$?
    echo "$tool exit=$src $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$LOGS/sanitizer_$tool.txt" | tail -1)" >> "$OUT/sanitizer.txt"
    [ $src -eq 0 ] || rc=1
  done
  cat "$OUT/sanitizer.txt"
fi
log done
exit $rc
