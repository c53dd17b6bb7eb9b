#!/usr/bin/env bash
# A leaderboard's (method, seed) cells trained in parallel processes on one machine, then combined.
#
# Usage: ci/leaderboard_cells.sh [--methods a,b|all] [--seeds N] [--seed S] OUT_DIR JOBS [-- LEADERBOARD_ARGS...]
#   --methods   the methods (comma list, or all: every registered method; also $MIXBENCH_CELLS_METHODS; required)
#   --seeds N   seeds per method, S..S+N-1 (default 1; also $MIXBENCH_CELLS_SEEDS)
#   --seed S    the first seed (default 0)
#   JOBS        cells trained at once (xargs -P)
#   LEADERBOARD_ARGS  the other `mixbench leaderboard` options (--preset, --steps, --device, ...), the
#               same for every cell; not --methods, --seed, --seeds, --out, --from or --no-train
# Environment:
#   MIXBENCH_BIN               the mixbench binary (default build/mixbench)
#   MIXBENCH_CELLS_DEADLINE_S  launch no cell later than this many seconds after the start (default: no limit);
#                              running cells finish, the rest stay missing until the next run
#   MIXBENCH_CELLS_STOP_S      launch no cell whose estimated time would end it later than this many seconds
#                              after the start (the estimate: the longest finished cell of its method in
#                              OUT_DIR, else the median of the others'); cells start longest first
#   MIXBENCH_CELLS_MEM_GB      the device memory the cells share (default: the first GPU's total from
#                              nvidia-smi when the cells train on cuda, else none): a method whose finished
#                              cells peaked above MEM/JOBS (their reports' memory.peak_bytes), or whose last
#                              attempt ran out of memory with no finished cell, trains in a second pass, as
#                              many at a time as fit (one when its peak is unknown)
#
# Each cell is `mixbench leaderboard LEADERBOARD_ARGS --methods M --seed S --seeds 1
# --out OUT_DIR/cells/M.sS.json --cell-checkpoints OUT_DIR/ckpt` (its log in OUT_DIR/logs/M.sS.log);
# a cell whose file already holds a finished cell is skipped, and a cell stopped part-way resumes
# from its checkpoint in OUT_DIR/ckpt/, so a stopped run continues where it was; a cell that ran out
# of memory beside the others is tried once more after them, at half as many at a time. Then the cells are
# combined, training nothing: `mixbench leaderboard LEADERBOARD_ARGS --methods ... --seed S --seeds N
# --from <cell files> --no-train --out OUT_DIR/leaderboard.json` (and .md, .html); a cell without a
# file is listed as missing there. Running this script again trains the missing cells.
#
# Cells trained concurrently share the machine: on one GPU their tokens/s and MFU are measured while
# sharing it with the other cells (and on the CPU, its cores), so they are not a lone run's. The
# validation values do not depend on it.
#
# Exit status: 0 when every cell is in the combined report and none failed; 1 when a cell failed or
# is missing; 2 for bad arguments (or a combine that refuses its inputs).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
usage() { sed -n '4,5p' "$0" | sed 's/^# //' >&2; exit 2; }

methods=${MIXBENCH_CELLS_METHODS:-}
seeds=${MIXBENCH_CELLS_SEEDS:-1}
seed=0
pos=()
while [ $# -gt 0 ]; do
  case "$1" in
    --methods) [ $# -ge 2 ] || usage; methods=$2; shift 2 ;;
    --methods=*) methods=${1#*=}; shift ;;
    --seeds) [ $# -ge 2 ] || usage; seeds=$2; shift 2 ;;
    --seeds=*) seeds=${1#*=}; shift ;;
    --seed) [ $# -ge 2 ] || usage; seed=$2; shift 2 ;;
    --seed=*) seed=${1#*=}; shift ;;
    --) shift; break ;;
    -h|--help) sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "leaderboard_cells.sh: unknown option $1" >&2; usage ;;
    *) pos+=("$1"); shift ;;
  esac
done
[ ${#pos[@]} -eq 2 ] || usage
OUT=${pos[0]}
JOBS=${pos[1]}
LB_ARGS=("$@")
fail() { echo "leaderboard_cells.sh: $*" >&2; exit 2; }
[[ "$JOBS" =~ ^[1-9][0-9]*$ ]] || fail "JOBS must be a positive integer, not '$JOBS'"
[[ "$seeds" =~ ^[1-9][0-9]*$ ]] || fail "--seeds must be a positive integer, not '$seeds'"
[[ "$seed" =~ ^[0-9]+$ ]] || fail "--seed must be a non-negative integer, not '$seed'"
[ -n "$methods" ] || fail "no methods: give --methods a,b (or all) or MIXBENCH_CELLS_METHODS"
deadline=${MIXBENCH_CELLS_DEADLINE_S:-}
[ -z "$deadline" ] || [[ "$deadline" =~ ^[0-9]+$ ]] || fail "MIXBENCH_CELLS_DEADLINE_S must be whole seconds, not '$deadline'"
stop=${MIXBENCH_CELLS_STOP_S:-}
[ -z "$stop" ] || [[ "$stop" =~ ^[0-9]+$ ]] || fail "MIXBENCH_CELLS_STOP_S must be whole seconds, not '$stop'"
for a in "${LB_ARGS[@]}"; do
  case "$a" in
    --methods|--methods=*|--seed|--seed=*|--seeds|--seeds=*|--out|--out=*|--from|--from=*|--no-train)
      fail "$a is set by this script (give --methods/--seed/--seeds before OUT_DIR)" ;;
  esac
done
BIN=${MIXBENCH_BIN:-$ROOT/build/mixbench}
[ -x "$BIN" ] || fail "no mixbench binary at '$BIN' (set MIXBENCH_BIN)"

# the cells: every method (all: every registered one) at every seed
if [ "$methods" = all ]; then
  names=$("$BIN" list --json | python3 -c 'import json, sys; print(" ".join(m["name"] for m in json.load(sys.stdin)["methods"]))') ||
    fail "'$BIN list --json' failed"
else
  names=${methods//,/ }
fi
mkdir -p "$OUT/cells" "$OUT/logs" || exit 2
START=$(date +%s)
export BIN OUT START deadline stop
LB_ARGS_Q=""
[ ${#LB_ARGS[@]} -eq 0 ] || LB_ARGS_Q=$(printf '%q ' "${LB_ARGS[@]}")
export LB_ARGS_Q

# shellcheck disable=SC2317  # run by xargs
# One cell: skipped when its file holds a finished cell, not started past the deadline.
run_cell() {
  local m=$1 s=$2 est=${3:-0} file="$OUT/cells/$1.s$2.json" log="$OUT/logs/$1.s$2.log"
  if [ -f "$file" ] && python3 - "$file" <<'PY' 2>/dev/null; then
import json, sys
r = json.load(open(sys.argv[1]))
ok = r["summary"]["complete"] and all(x.get("status") == "ok" for x in r["results"])
sys.exit(0 if ok else 1)
PY
    echo "cell $m seed $s: finished before, kept"
    return 0
  fi
  if [ -n "$deadline" ] && [ $(( $(date +%s) - START )) -ge "$deadline" ]; then
    echo "cell $m seed $s: not started (past MIXBENCH_CELLS_DEADLINE_S=$deadline)"
    return 0
  fi
  if [ -n "$stop" ] && [ $(( $(date +%s) - START + est )) -gt "$stop" ]; then
    echo "cell $m seed $s: not started (its estimated ${est} s would pass MIXBENCH_CELLS_STOP_S=$stop)"
    return 0
  fi
  local t0 rc
  t0=$(date +%s)
  eval "\"\$BIN\" leaderboard $LB_ARGS_Q --methods \"\$m\" --seed \"\$s\" --seeds 1 --out \"\$file\" --cell-checkpoints \"\$OUT/ckpt\"" > "$log" 2>&1
  rc=$?
  if [ "$rc" -eq 0 ]; then
    echo "cell $m seed $s: trained in $(( $(date +%s) - t0 )) s"
  else
    echo "cell $m seed $s: failed (exit $rc; $log)"
  fi
  return 0
}
export -f run_cell

# the device memory the cells share (GiB): MIXBENCH_CELLS_MEM_GB, else the first GPU's when they train on cuda
mem_gb=${MIXBENCH_CELLS_MEM_GB:-}
[ -z "$mem_gb" ] || [[ "$mem_gb" =~ ^[0-9]+([.][0-9]+)?$ ]] || fail "MIXBENCH_CELLS_MEM_GB must be a number of GiB, not '$mem_gb'"
if [ -z "$mem_gb" ] && [[ " ${LB_ARGS[*]} " == *" cuda "* || " ${LB_ARGS[*]} " == *"--device=cuda"* ]] && command -v nvidia-smi > /dev/null; then
  mem_gb=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2> /dev/null | head -1 | awk '{printf "%.1f", $1 / 1024}')
fi

# shellcheck disable=SC2016  # $1, $2: run_cell's arguments in the child shell
PASS1="$OUT/logs/cells.pass1.txt"
# The cells, the longest first: a method's estimate is the longest of its finished cells here
# (phase_seconds.total, or the training seconds + 25 s of reports before they were recorded); a
# method without one takes the median of the others' (60 s when there are none). With a memory
# budget, a method too large to run JOBS at a time (its finished cells' peak memory above MEM/JOBS,
# or an out-of-memory last attempt and no finished cell) goes to the second pass, with as many at a
# time as its peak allows (1 when unknown). Each line: method seed estimate pass jobs.
python3 - "$OUT" "$seed" "$seeds" "$JOBS" "${mem_gb:-0}" $names <<'PY' > "$OUT/logs/cells.order.txt" || exit 2
import glob, json, os, statistics, sys
out, first, n, jobs, mem = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]) * 2**30
names = sys.argv[6:]
est, peak = {}, {}
for f in glob.glob(os.path.join(out, "cells", "*.json")):
    try:
        r = json.load(open(f))["results"][0]
    except Exception:
        continue
    if r.get("status") != "ok":
        continue
    for run in r.get("runs") or [r]:
        ps = run.get("phase_seconds") or {}
        t = ps.get("total") or (run.get("seconds", 0) + 25 if run.get("seconds") else None)
        if t:
            est[r["method"]] = max(est.get(r["method"], 0), t)
        p = (run.get("memory") or {}).get("peak_bytes")
        if p:
            peak[r["method"]] = max(peak.get(r["method"], 0), p)
def ran_out(m):  # the last attempt of one of its cells ran out of memory
    for k in range(n):
        try:
            if "out of memory" in open(os.path.join(out, "logs", f"{m}.s{first + k}.log"), errors="replace").read().lower():
                return True
        except OSError:
            pass
    return False
default = statistics.median(est.values()) if est else 60
order = sorted(((est.get(m, default), i, m) for i, m in enumerate(names)), key=lambda x: (-x[0], x[1]))
for e, _, m in order:
    p, j = 1, jobs
    if mem > 0 and ((m in peak and peak[m] > 0.9 * mem / jobs) or (m not in peak and ran_out(m))):
        p, j = 2, max(1, min(jobs, int(0.9 * mem // peak[m]))) if m in peak else 1
    for k in range(n):
        print(m, first + k, int(e + 0.5), p, j)
PY
# the first pass: JOBS at a time
awk '$4 == 1' "$OUT/logs/cells.order.txt" | while read -r m s e _ _; do printf '%s\0%s\0%s\0' "$m" "$s" "$e"; done |
  xargs -0 -n 3 -P "$JOBS" bash -c 'run_cell "$1" "$2" "$3"' _ | tee "$PASS1"
# the second pass: the large methods, each method's cells as many at a time as fit
for j in $(awk '$4 == 2 {print $5}' "$OUT/logs/cells.order.txt" | sort -rn | uniq); do
  echo "large cells: $(awk -v j="$j" '$4 == 2 && $5 == j' "$OUT/logs/cells.order.txt" | wc -l) at $j at a time"
  awk -v j="$j" '$4 == 2 && $5 == j' "$OUT/logs/cells.order.txt" | while read -r m s e _ _; do printf '%s\0%s\0%s\0' "$m" "$s" "$e"; done |
    xargs -0 -n 3 -P "$j" bash -c 'run_cell "$1" "$2" "$3"' _ | tee -a "$PASS1"
done

# cells that ran out of memory beside the others: once more, at half as many at a time
retry=()
while read -r m s; do
  grep -qi "out of memory" "$OUT/logs/$m.s$s.log" 2> /dev/null && retry+=("$m" "$s")
done < <(sed -n 's/^cell \(.*\) seed \([0-9]*\): failed.*/\1 \2/p' "$PASS1")
rm -f "$PASS1"
if [ ${#retry[@]} -gt 0 ]; then
  echo "retrying $(( ${#retry[@]} / 2 )) cell(s) that ran out of memory, $(( (JOBS + 1) / 2 )) at a time"
  printf '%s\0' "${retry[@]}" | xargs -0 -n 2 -P $(( (JOBS + 1) / 2 )) bash -c 'run_cell "$1" "$2"' _
fi

# the combine: the cell files there are, training nothing (the combined report is made afresh from them)
files=()
for m in $names; do
  for ((k = 0; k < seeds; k++)); do
    f="$OUT/cells/$m.s$((seed + k)).json"
    [ -f "$f" ] && files+=("$f")
  done
done
rm -f "$OUT/leaderboard.json"
if [ ${#files[@]} -eq 0 ]; then
  echo "no cell finished: nothing to combine" >&2
  exit 1
fi
"$BIN" leaderboard "${LB_ARGS[@]}" --methods "$methods" --seed "$seed" --seeds "$seeds" --from "${files[@]}" --no-train \
  --out "$OUT/leaderboard.json" > "$OUT/logs/combine.log" 2>&1
rc=$?
cat "$OUT/logs/combine.log" >&2
[ $rc -eq 2 ] && exit 2
python3 - "$OUT/leaderboard.json" <<'PY' || exit 1
import json, sys
s = json.load(open(sys.argv[1]))["summary"]
print(f"{s['cells_done']} of {s['cells']} cells in {sys.argv[1]}" +
      (f"; missing: {', '.join(f'{m} seed {k}' for m, k in s['missing'])}" if s["missing"] else ""))
sys.exit(0 if s["complete"] else 1)
PY
exit $rc
