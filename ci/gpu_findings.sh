#!/usr/bin/env bash
# On a CUDA machine: build (ci/gpu.sh's build only), then run the task-suite settings behind the
# README's findings as many `mixbench tasks` processes at once (the 2-layer task models leave one
# GPU mostly idle, so the processes share it): one per method and task, or with
# MIXBENCH_FINDINGS_SPLIT=1 one per method, task, MQAR pair count and seed, so that what finished
# before a time limit is kept. Each writes OUT_DIR/<task>/<name>.json with its .md, .html and log.
# Usage: ci/gpu_findings.sh OUT_DIR [DEPS_DIR]
#   MIXBENCH_FINDINGS_MQAR  methods on the MQAR grid (default "dense_full gla retnet deltanet gdn kda")
#   MIXBENCH_FINDINGS_S5    methods on S5 (default "dense_full gla retnet deltanet gdn kda lt2_gdn")
#   MIXBENCH_FINDINGS_SEEDS seeds (default 3: seeds 0, 1, 2)
#   MIXBENCH_MQAR_LENGTHS / MIXBENCH_MQAR_PAIRS / MIXBENCH_MQAR_WIDTHS  the MQAR grid (default 256 / "8 32 64" / 128)
#   MIXBENCH_TASK_TIMEOUT   seconds each process may run (default 520)
#   MIXBENCH_TASK_ARGS      more `mixbench tasks` options for every process (e.g. "--vocab 64 --steps 4000 --lr 3e-3")
#   MIXBENCH_FINDINGS_TAG   a prefix of every output name (several protocols side by side in one OUT_DIR)
#   MIXBENCH_FINDINGS_JOBS  processes at once (default: the CPU cores; each keeps one core busy launching kernels)
#   MIXBENCH_FINDINGS_DEADLINE_S  seconds after the start past which no further process is started (what
#                                 is left is listed as not run; default: none)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: ci/gpu_findings.sh OUT_DIR [DEPS_DIR]}
DEPS=${2:-$PWD/.deps}
source ci/gpu_build.sh
gpu_build "$OUT" "$DEPS" || exit 1
MQAR=${MIXBENCH_FINDINGS_MQAR-dense_full gla retnet deltanet gdn kda}
S5=${MIXBENCH_FINDINGS_S5-dense_full gla retnet deltanet gdn kda lt2_gdn}
SEEDS=${MIXBENCH_FINDINGS_SEEDS:-3}
LENGTHS=${MIXBENCH_MQAR_LENGTHS:-256}
PAIRS=${MIXBENCH_MQAR_PAIRS:-8 32 64}
WIDTHS=${MIXBENCH_MQAR_WIDTHS:-128}
SPLIT=${MIXBENCH_FINDINGS_SPLIT:-}
LIMIT=${MIXBENCH_TASK_TIMEOUT:-520}
read -r -a EXTRA <<< "${MIXBENCH_TASK_ARGS:-}"
TAG=${MIXBENCH_FINDINGS_TAG:-}
JOBS=${MIXBENCH_FINDINGS_JOBS:-$(nproc)}
export OMP_NUM_THREADS=1
DEADLINE=${MIXBENCH_FINDINGS_DEADLINE_S:-}
START=$(date +%s)
pids=()
not_run=()
launch() {  # task name args...
  local task=$1 name=$TAG$2; shift 2
  mkdir -p "$OUT/$task"
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do sleep 0.5; done
  if [ -n "$DEADLINE" ] && [ $(( $(date +%s) - START )) -ge "$DEADLINE" ]; then not_run+=("$task/$name"); return; fi
  timeout "$LIMIT" build-gpu/mixbench tasks --preset gpu --device cuda --tasks "$task" "$@" "${EXTRA[@]}" \
      --out "$OUT/$task/$name.json" --quiet > "$OUT/$task/$name.log" 2>&1 &
  pids+=("$!:$task/$name")
}
csv() { echo "$*" | tr ' ' ','; }
echo "== $(date +%H:%M:%S) launching"
grid=(--lengths "$(csv $LENGTHS)" --widths "$(csv $WIDTHS)")
for m in $MQAR; do
  if [ -z "$SPLIT" ]; then launch mqar "$m" --methods "$m" --seeds "$SEEDS" "${grid[@]}" --pairs "$(csv $PAIRS)"; continue; fi
  for p in $PAIRS; do
    for ((s = 0; s < SEEDS; ++s)); do launch mqar "${m}_p${p}_s$s" --methods "$m" --seed "$s" --seeds 1 "${grid[@]}" --pairs "$p"; done
  done
done
for m in $S5; do
  if [ -z "$SPLIT" ]; then launch s5 "$m" --methods "$m" --seeds "$SEEDS"; continue; fi
  for ((s = 0; s < SEEDS; ++s)); do launch s5 "${m}_s$s" --methods "$m" --seed "$s" --seeds 1; done
done
rc=0
for entry in "${pids[@]}"; do
  pid=${entry%%:*}
  if ! wait "$pid"; then rc=1; echo "failed or timed out: ${entry#*:}"; tail -3 "$OUT/${entry#*:}.log"; fi
done
[ ${#not_run[@]} -gt 0 ] && echo "not run (past the deadline): ${not_run[*]}"
echo "== $(date +%H:%M:%S) done"
exit $rc
