#!/usr/bin/env bash
# On a CUDA machine: the same-process comparison of mixbench (through torch.ops.mixbench) and its
# peers (ci/peers.py), with its short table printed last.
#   ci/gpu_compare.sh --build-only     configure and build libmixbench_torch_ops.so in build-gpu (Release,
#                                      sm_90; ci/gpu.sh's build folder and options), nothing else
#   ci/gpu_compare.sh OUT [ARGS...]    build (incremental), install the peers' wheels (ci/gpu_wheels.sh:
#                                      parts copied earlier under /tmp/mixbench_whl, or .whl), check the
#                                      operators on CUDA and in CUDA graphs (OUT/torch_ops_cuda.txt), then
#                                      ci/peers.py ARGS --out OUT/comparison.json --timings
#                                      OUT/peer_timings.json, its rows given what is left of
#                                      MIXBENCH_COMPARE_LIMIT_S (default 540 s) after the build
# DEPS_DIR (default .deps when present): ci/gpu_stage.sh's dependencies for machines without the
# Debian packages.
set -uo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
LIMIT=${MIXBENCH_COMPARE_LIMIT_S:-540}
OUT=${1:?usage: ci/gpu_compare.sh --build-only | OUT [peers.py args]}
shift
DEPS=${DEPS_DIR:-$PWD/.deps}
CMAKE_DEPS=()
[ -d "$DEPS" ] && CMAKE_DEPS=(-DMIXBENCH_DEPS="$(cd "$DEPS" && pwd)")
BUILD_LOG=/tmp/mixbench_compare_build.log
echo "== $(date +%H:%M:%S) build libmixbench_torch_ops.so"
{ cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DMIXBENCH_CUDA=ON -DMIXBENCH_CUDA_ARCH=90 \
        "${CMAKE_DEPS[@]}" && ninja -C build-gpu -j"$(nproc)" mixbench_torch_ops; } > "$BUILD_LOG" 2>&1 \
  || { grep -E "error|FAILED|Error" "$BUILD_LOG" | head -30; exit 1; }
echo "== $(date +%H:%M:%S) built in $(( $(date +%s) - START )) s"
[ "$OUT" = "--build-only" ] && exit 0
mkdir -p "$OUT"
cp "$BUILD_LOG" "$OUT/build.log" 2>/dev/null
source ci/gpu_wheels.sh "$OUT/wheels.log"
# the operators on CUDA: against their CPU fp64 results, captured in CUDA graphs (forward, backward)
echo "== $(date +%H:%M:%S) tests/python/test_torch_ops.py Cuda"
MIXBENCH_TORCH_OPS_LIB=$PWD/build-gpu/libmixbench_torch_ops.so timeout 150 \
  python3 tests/python/test_torch_ops.py Cuda > "$OUT/torch_ops_cuda.txt" 2>&1
cuda_rc=$?
tail -3 "$OUT/torch_ops_cuda.txt"
BUDGET=$(( LIMIT - ($(date +%s) - START) - 45 ))
[ "$BUDGET" -lt 60 ] && BUDGET=60
echo "== $(date +%H:%M:%S) ci/peers.py (rows started within ${BUDGET} s)"
# a row still running at the limit is stopped; the files hold every row finished before it
MIXBENCH_TORCH_OPS_LIB=$PWD/build-gpu/libmixbench_torch_ops.so PYTHONUNBUFFERED=1 \
  timeout $(( BUDGET + 40 )) python3 ci/peers.py --budget-s "$BUDGET" "$@" --out "$OUT/comparison.json" \
  --timings "$OUT/peer_timings.json" > "$OUT/peers.log" 2>&1
rc=$?
if ! grep -q '^GPU ' "$OUT/peers.log" && [ -f "$OUT/peer_timings.json" ]; then
  echo "peers.py stopped (exit $rc): the report from the rows it finished" | tee -a "$OUT/peers.log"
  python3 ci/compare.py "$OUT/peer_timings.json" --out "$OUT/comparison.json" >> "$OUT/peers.log" 2>&1
fi
grep -E "Error|error" "$OUT/peers.log" | grep -v '^{' | tail -5
[ $cuda_rc -eq 0 ] || echo "torch.ops.mixbench CUDA checks failed (exit $cuda_rc): $OUT/torch_ops_cuda.txt"
[ $rc -eq 0 ] && rc=$cuda_rc
# the table (the last lines peers.py prints)
sed -n '/^GPU /,$p' "$OUT/peers.log"
exit $rc
