#!/usr/bin/env bash
# On a CUDA machine: build (tests included), the sparse GPU tests (the kernels' SparseCuda.* and
# SparseTokenCuda.*, the layers' SparseLayersCuda.*: conformance, no host synchronisation, a captured
# forward + backward, the teachers' memory at 64K), layer and model conformance of every sparse
# method and sparse hybrid on CUDA at fp32 and bf16, compute-sanitizer memcheck and racecheck on the
# kernels' small cases, and the training and prefill sweeps at 2K…64K of the sparse methods beside
# dense_full (gpu-d12, bf16), each sweep with its plot.
# Usage: ci/gpu_sparse.sh OUT_DIR [DEPS_DIR]   (DEPS_DIR from ci/gpu_stage.sh; default .deps if present)
# Every part after the build runs under its own time limit (seconds, overridable), in all at most
# 10 minutes of GPU time with the defaults:
#   MIXBENCH_SPARSE_TESTS_LIMIT        the GoogleTests (default 160)
#   MIXBENCH_SPARSE_CONFORMANCE_LIMIT  each conformance run, fp32 and bf16 (default 60)
#   MIXBENCH_SANITIZER_LIMIT           each of the four sanitizer runs (default 35)
#   MIXBENCH_SPARSE_TRAIN_LIMIT        the training sweep (default 120)
#   MIXBENCH_SPARSE_PREFILL_LIMIT      the prefill sweep (default 60)
# A part stopped by its limit counts as a failure (exit 1); a sweep stopped by its limit keeps its
# finished points in its report (summary.complete false), and running the script again with the same
# OUT_DIR continues it (--resume). The part's log under OUT_DIR/logs says how far it got.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: ci/gpu_sparse.sh OUT_DIR [DEPS_DIR]}
DEPS=${2:-$PWD/.deps}
mkdir -p "$OUT/sweeps" "$OUT/sanitizer" "$OUT/logs"
. ci/gpu_build.sh
gpu_build_tests "$OUT/logs" "$DEPS" || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
rc=0
T=build-gpu/mixbench_tests
MB=build-gpu/mixbench
# the sparse methods and the hybrids built on them
SPARSE=dsa,moba,qsa,nsa,seer
HYBRIDS=qsa_hybrid,moba_hybrid,lt2_hybrid_gdn_dsa
# (SparseLayersCuda.Conformance* is the conformance runs below, left out here)
timeout "${MIXBENCH_SPARSE_TESTS_LIMIT:-160}" $T \
    --gtest_filter='SparseCuda.*:SparseTokenCuda.*:SparseLayersCuda.*-SparseLayersCuda.Conformance*' \
    --gtest_output="json:$OUT/gtests_sparse_cuda.json" > "$OUT/logs/gtests.log" 2>&1 || rc=1
tail -3 "$OUT/logs/gtests.log"
# conformance on CUDA: layer level for the sparse methods (the reference on the CUDA path's
# selection, the selection checked tie-aware), the hybrids as whole models at fp32 (at bf16 their
# layer methods at layer level)
for dtype in fp32 bf16; do
  timeout "${MIXBENCH_SPARSE_CONFORMANCE_LIMIT:-60}" $MB conformance --methods "$SPARSE,$HYBRIDS" --device cuda \
      --dtype "$dtype" --no-fd --quiet --out "$OUT/conformance_sparse_cuda_$dtype.json" \
      > "$OUT/logs/conformance_$dtype.log" 2>&1 || rc=1
  tail -1 "$OUT/logs/conformance_$dtype.log" | sed "s/^/conformance $dtype: /"
done
# compute-sanitizer on the kernels' small cases
san() { # name tool filter
  timeout "${MIXBENCH_SANITIZER_LIMIT:-35}" \
    compute-sanitizer --tool "$2" --error-exitcode 9 $T --gtest_filter="$3" > "$OUT/sanitizer/$1.log" 2>&1 || rc=1
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/sanitizer/$1.log" | tail -1 | sed "s/^/$1: /"
}
san memcheck_block memcheck 'SparseCuda.*Small*'
san racecheck_block racecheck 'SparseCuda.*Small*'
san memcheck_token memcheck 'SparseTokenCuda.*Small*'
san racecheck_token racecheck 'SparseTokenCuda.*Small*'
# the sweeps (gpu-d12, bf16, one row), the sparse methods beside dense_full
sw() { # name limit args...
  local n=$1 limit=$2
  shift 2
  timeout "$limit" $MB sweep --preset gpu-d12 --device cuda --dtype bf16 --batch 1 --lengths 2k:64k --reps 5 --warmup 2 \
      --methods "dense_full,$SPARSE" "$@" --out "$OUT/sweeps/$n.json" --resume >> "$OUT/logs/$n.log" 2>&1 || rc=1
  [ -f "$OUT/sweeps/$n.json" ] || echo "$n: no report (stopped at ${limit}s before its first point, or failed; see logs/$n.log)"
  [ -f "$OUT/sweeps/$n.json" ] && $MB plot "$OUT/sweeps/$n.json" --out "$OUT/sweeps/$n.html" > /dev/null 2>&1
}
sw train_sparse "${MIXBENCH_SPARSE_TRAIN_LIMIT:-120}" --mode train
sw prefill_sparse "${MIXBENCH_SPARSE_PREFILL_LIMIT:-60}" --mode prefill
exit $rc
