#!/usr/bin/env bash
# On a CUDA machine: build (ci/gpu.sh's build only), then run the task-suite settings behind the
# README's findings, one `mixbench tasks` process per method and task at once (the 2-layer task
# models leave one GPU mostly idle, so the processes share it), each writing OUT_DIR/<task>/<method>.json
# with its .md and .html. A process that fails keeps its log and the others go on.
# Usage: ci/gpu_findings.sh OUT_DIR [DEPS_DIR]
#   MIXBENCH_FINDINGS_MQAR  methods on the MQAR grid (default "dense_full gla retnet deltanet gdn kda")
#   MIXBENCH_FINDINGS_S5    methods on S5 (default "dense_full gla retnet deltanet gdn kda lt2_gdn")
#   MIXBENCH_FINDINGS_ARGS  options of every run (default "--seeds 3")
#   MIXBENCH_MQAR_ARGS      the MQAR grid (default "--lengths 256 --pairs 8,32,64 --widths 128")
#   MIXBENCH_TASK_TIMEOUT   seconds each process may run (default 520)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: ci/gpu_findings.sh OUT_DIR [DEPS_DIR]}
DEPS=${2:-$PWD/.deps}
source ci/gpu_build.sh
gpu_build "$OUT" "$DEPS" || exit 1
MQAR=${MIXBENCH_FINDINGS_MQAR-dense_full gla retnet deltanet gdn kda}
S5=${MIXBENCH_FINDINGS_S5-dense_full gla retnet deltanet gdn kda lt2_gdn}
ARGS=${MIXBENCH_FINDINGS_ARGS:---seeds 3}
GRID=${MIXBENCH_MQAR_ARGS:---lengths 256 --pairs 8,32,64 --widths 128}
LIMIT=${MIXBENCH_TASK_TIMEOUT:-520}
export OMP_NUM_THREADS=1
pids=()
launch() {  # task method extra-args...
  local task=$1 m=$2; shift 2
  mkdir -p "$OUT/$task"
  # shellcheck disable=SC2086
  timeout "$LIMIT" build-gpu/mixbench tasks --preset gpu --device cuda --tasks "$task" --methods "$m" $ARGS "$@" \
      --out "$OUT/$task/$m.json" --quiet > "$OUT/$task/$m.log" 2>&1 &
  pids+=("$!:$task/$m")
}
echo "== $(date +%H:%M:%S) launching"
for m in $MQAR; do launch mqar "$m" $GRID; done
for m in $S5; do launch s5 "$m"; done
rc=0
for entry in "${pids[@]}"; do
  pid=${entry%%:*}
  if ! wait "$pid"; then rc=1; echo "failed or timed out: ${entry#*:}"; tail -3 "$OUT/${entry#*:}.log"; fi
done
echo "== $(date +%H:%M:%S) done"
exit $rc
