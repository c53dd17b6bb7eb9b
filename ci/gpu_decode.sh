#!/usr/bin/env bash
# On a CUDA machine: build (tests included), the decode GPU tests (the split-KV kernel, the fused
# backbone kernels, captured steps against eager ones), compute-sanitizer memcheck and racecheck on the decode kernels, and the
# decode sweeps with the step captured (and the eager baseline), each sweep with its plot.
# Usage: ci/gpu_decode.sh OUT_DIR [DEPS_DIR]   (DEPS_DIR from ci/gpu_stage.sh; default .deps if present)
#   MIXBENCH_DECODE_LIMIT  seconds the sweeps may take in all (default 300); a sweep that would pass it
#                          is not started; one that is stopped keeps its finished points in its report
#                          (summary.complete false), and running the script again with the same OUT_DIR
#                          continues it (--resume)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: ci/gpu_decode.sh OUT_DIR [DEPS_DIR]}
DEPS=${2:-$PWD/.deps}
mkdir -p "$OUT/sweeps" "$OUT/sanitizer" "$OUT/logs"
. ci/gpu_build.sh
gpu_build_tests "$OUT/logs" "$DEPS" || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
rc=0
T=build-gpu/mixbench_tests
$T --gtest_filter='DecodeCuda.*:DecodeFusedCuda.*:SparseDecodeCuda.*:StaticDecodeModels.*:MlaVariants.*:OpCount.*' \
  --gtest_output="json:$OUT/gtests_decode_cuda.json" > "$OUT/logs/gtests.log" 2>&1 || rc=1
tail -3 "$OUT/logs/gtests.log"
# compute-sanitizer on the small cases (MIXBENCH_DECODE_SMALL) and one method per kernel family
san() { # name tool test methods
  MIXBENCH_DECODE_SMALL=1 MIXBENCH_DECODE_METHODS=$4 timeout "${MIXBENCH_SANITIZER_LIMIT:-240}" \
    compute-sanitizer --tool "$2" --error-exitcode 9 $T --gtest_filter="$3" > "$OUT/sanitizer/$1.log" 2>&1 || rc=1
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/sanitizer/$1.log" | tail -1 | sed "s/^/$1: /"
}
san memcheck_splitkv memcheck 'DecodeCuda.SplitKv*' dense
san racecheck_splitkv racecheck 'DecodeCuda.SplitKv*' dense
san memcheck_listed memcheck 'SparseDecodeCuda.ListedKeys*' dense
san racecheck_listed racecheck 'SparseDecodeCuda.ListedKeys*' dense
san memcheck_steps_dense memcheck 'DecodeCuda.CapturedSteps*' dense
san memcheck_steps_gdn memcheck 'DecodeCuda.CapturedSteps*' gdn
san racecheck_steps_gdn racecheck 'DecodeCuda.CapturedSteps*' gdn
# the backbone's fused kernels (residual norms with their GEMVs, embedding, softcap, gdn step, split-KV merge)
san memcheck_fused memcheck 'DecodeFusedCuda.*:-DecodeFusedCuda.CapturedD12*' dense
san racecheck_fused racecheck 'DecodeFusedCuda.*:-DecodeFusedCuda.CapturedD12*' dense
# the sweeps (d12, bf16)
START=$(date +%s)
LIMIT=${MIXBENCH_DECODE_LIMIT:-300}
sw() { # name args...
  local n=$1 left; shift
  left=$(( LIMIT - ($(date +%s) - START) ))
  [ "$left" -lt 30 ] && { echo "not run (time): $n"; rc=1; return; }
  timeout "$left" build-gpu/mixbench sweep --mode decode --preset gpu-d12 --device cuda --dtype bf16 --reps 20 --warmup 3 \
      "$@" --out "$OUT/sweeps/$n.json" --resume >> "$OUT/logs/$n.log" 2>&1 || rc=1
  [ -f "$OUT/sweeps/$n.json" ] && build-gpu/mixbench plot "$OUT/sweeps/$n.json" --out "$OUT/sweeps/$n.html" > /dev/null 2>&1
}
sw eager_targets --methods dense_full,gdn --batch 1,8 --lengths 1k,8k --graph off
# the same points with the defaults and with the decode knobs changed (harness/decode_knobs.h):
# ordinary launches instead of programmatic ones, ATen's argmax and a copy instead of the greedy
# kernel, the GEMV kernels instead of cuBLAS (with and without programmatic launches), shorter
# attention splits, splits counted over the query heads or over the KV heads alone (grouped-query
# attention; the default takes the larger of the KV rows and one batch's query heads)
sw knob_default --methods dense_full,gdn,mla --batch 1,8 --lengths 1k,32k
MIXBENCH_DECODE_PDL=0 sw knob_pdl_off --methods dense_full,gdn,mla --batch 1,8 --lengths 1k,32k
MIXBENCH_DECODE_ARGMAX_KERNEL=0 sw knob_argmax_aten --methods dense_full,gdn --batch 1,8 --lengths 1k
MIXBENCH_DECODE_GEMV_ROWS=8 sw knob_gemv_on --methods dense_full,gdn,mla --batch 1,8 --lengths 1k,32k
MIXBENCH_DECODE_GEMV_ROWS=8 MIXBENCH_DECODE_PDL=0 sw knob_gemv_on_pdl_off --methods dense_full,gdn --batch 1,8 --lengths 1k
MIXBENCH_DECODE_SPLIT_MIN=64 sw knob_split64 --methods dense_full --batch 1,8 --lengths 1k,32k
MIXBENCH_DECODE_SPLIT_BY=query sw knob_split_by_query --methods gqa,mqa,dense_full --batch 1,8 --lengths 8k,32k
MIXBENCH_DECODE_SPLIT_BY=kv sw knob_split_by_kv --methods gqa,mqa --batch 1,2,4,8 --lengths 8k,32k
sw knob_split_auto --methods gqa,mqa --batch 1,2,4,8 --lengths 8k,32k
sw decode_attention --methods dense_full,gdn,gdn_hybrid,dense,gqa,mqa --batch 1,2,4,8 --lengths 1k,4k,16k,64k,128k
sw decode_linear --methods lightning,retnet,deltanet,kda,gla,elu_norm --batch 1,8 --lengths 1k,16k,128k
sw decode_hybrids --methods gdn_hybrid_swa,hypenet,deltanet_hybrid,mla,kda_hybrid --batch 1,8 --lengths 1k,16k,128k
sw decode_512k --methods dense_full,gdn --batch 1 --lengths 256k,512k
exit $rc
