#!/usr/bin/env bash
# ci/leaderboard_cells.sh end to end on the CPU: two methods' cells in parallel processes and their
# combined report; a rerun keeps the finished cells; past the deadline a removed cell stays missing
# (exit 1); a cell that ran out of memory is retried, another failure is not; the longest cells start
# first and none that would pass MIXBENCH_CELLS_STOP_S; with a memory budget the large methods train
# in a second pass, fewer at a time; cells get their checkpoint folder; options the script sets
# itself are refused (exit 2).
# Usage: tests/leaderboard_cells.sh MIXBENCH_BINARY
set -uo pipefail
export MIXBENCH_BIN=${1:?usage: tests/leaderboard_cells.sh MIXBENCH_BINARY}
export OMP_NUM_THREADS=1
SCRIPT="$(cd "$(dirname "$0")/.." && pwd)/ci/leaderboard_cells.sh"
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
fails=0
check() { if eval "$2"; then echo "ok: $1"; else echo "FAILED: $1"; fails=$((fails + 1)); fi; }
ARGS=(--config seq_len=32 --steps 1 --batch 1 --probes 0 --quiet)
value() { python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$@"; }

"$SCRIPT" --methods dense_full,mqa --seeds 1 "$OUT" 2 -- "${ARGS[@]}" > "$OUT/run1.txt" 2>&1
check "first run exits 0" "[ $? -eq 0 ]"
check "cell files" "[ -f '$OUT/cells/dense_full.s0.json' ] && [ -f '$OUT/cells/mqa.s0.json' ] && [ -f '$OUT/logs/mqa.s0.log' ]"
check "two trained cells" "[ \$(grep -c 'trained in' '$OUT/run1.txt') -eq 2 ]"
check "combined report" "[ \"\$(value '$OUT/leaderboard.json' '[x[\"method\"] for x in r[\"results\"]]')\" = \"['dense_full', 'mqa']\" ]"
check "merged_from" "[ \"\$(value '$OUT/leaderboard.json' 'len(r[\"merged_from\"])')\" = 2 ]"
check "complete" "[ \"\$(value '$OUT/leaderboard.json' 'r[\"summary\"][\"complete\"]')\" = True ]"
check ".md and .html" "[ -f '$OUT/leaderboard.md' ] && [ -f '$OUT/leaderboard.html' ]"
bpb1=$(value "$OUT/leaderboard.json" '[x["val_bpb"] for x in r["results"]]')

"$SCRIPT" --methods dense_full,mqa "$OUT" 2 -- "${ARGS[@]}" > "$OUT/run2.txt" 2>&1
check "rerun exits 0" "[ $? -eq 0 ]"
check "rerun keeps both cells" "[ \$(grep -c 'finished before, kept' '$OUT/run2.txt') -eq 2 ]"
check "rerun's values" "[ \"\$(value '$OUT/leaderboard.json' '[x[\"val_bpb\"] for x in r[\"results\"]]')\" = \"$bpb1\" ]"

rm "$OUT/cells/mqa.s0.json"
MIXBENCH_CELLS_DEADLINE_S=0 "$SCRIPT" --methods dense_full,mqa "$OUT" 2 -- "${ARGS[@]}" > "$OUT/run3.txt" 2>&1
check "a missing cell exits 1" "[ $? -eq 1 ]"
check "not started past the deadline" "grep -q 'cell mqa seed 0: not started' '$OUT/run3.txt'"
check "listed missing" "[ \"\$(value '$OUT/leaderboard.json' 'r[\"summary\"][\"missing\"]')\" = \"[['mqa', 0]]\" ]"

# a cell that runs out of memory is tried once more after the others; one that fails otherwise is not
FAKE="$OUT/fails_once.sh"
cat > "$FAKE" <<EOF
#!/usr/bin/env bash
# the mqa cell's first run fails with \$FAIL_WITH, later runs are the real binary's
if [[ " \$* " == *" --methods mqa "* ]] && [ ! -f "$OUT/failed_once" ]; then
  touch "$OUT/failed_once"; echo "mixbench: error: \$FAIL_WITH" >&2; exit 1
fi
exec "$MIXBENCH_BIN" "\$@"
EOF
chmod +x "$FAKE"
rm -f "$OUT/cells/mqa.s0.json"
FAIL_WITH="CUDA out of memory. Tried to allocate 24.00 MiB" MIXBENCH_BIN="$FAKE" "$SCRIPT" --methods dense_full,mqa "$OUT" 2 -- "${ARGS[@]}" > "$OUT/run6.txt" 2>&1
check "an out-of-memory cell retried exits 0" "[ $? -eq 0 ]"
check "retried once" "grep -q 'cell mqa seed 0: failed' '$OUT/run6.txt' && grep -q 'retrying 1 cell(s) that ran out of memory, 1 at a time' '$OUT/run6.txt' && grep -q 'cell mqa seed 0: trained in' '$OUT/run6.txt'"
rm -f "$OUT/cells/mqa.s0.json" "$OUT/failed_once"
FAIL_WITH="no such thing" MIXBENCH_BIN="$FAKE" "$SCRIPT" --methods dense_full,mqa "$OUT" 2 -- "${ARGS[@]}" > "$OUT/run7.txt" 2>&1
check "another failure exits 1" "[ $? -eq 1 ]"
check "and is not retried" "! grep -q retrying '$OUT/run7.txt' && [ \$(grep -c 'cell mqa seed 0' '$OUT/run7.txt') -eq 1 ]"

# the longest cells first, by the finished cells' times; none started that would pass MIXBENCH_CELLS_STOP_S
O2="$OUT/order"
mkdir -p "$O2/cells"
cp "$OUT/cells/dense_full.s0.json" "$O2/cells/"
python3 - "$OUT/cells/dense_full.s0.json" "$O2/cells/mqa.s0.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for x in [r["results"][0]] + r["results"][0].get("runs", []):
    x["method"] = "mqa"
    x["phase_seconds"] = {"setup": 1, "steps": 990, "eval": 9, "checkpoint": 0, "total": 1000}
json.dump(r, open(sys.argv[2], "w"))
PY
"$SCRIPT" --methods dense_full,mqa --seeds 2 "$O2" 1 -- "${ARGS[@]}" > "$OUT/run8.txt" 2>&1
check "the longer method's cell first" "[ \"\$(grep -o 'cell [a-z_]* seed 1: trained' '$OUT/run8.txt' | head -1)\" = 'cell mqa seed 1: trained' ]"
check "the order file" "[ \"\$(head -1 '$O2/logs/cells.order.txt')\" = 'mqa 0 1000 1 1' ]"
rm -f "$O2/cells/mqa.s1.json" "$O2/cells/dense_full.s1.json"
MIXBENCH_CELLS_STOP_S=500 "$SCRIPT" --methods dense_full,mqa --seeds 2 "$O2" 1 -- "${ARGS[@]}" > "$OUT/run9.txt" 2>&1
check "a cell that would pass the stop is not started" "grep -q 'cell mqa seed 1: not started (its estimated 1000 s would pass MIXBENCH_CELLS_STOP_S=500)' '$OUT/run9.txt'"
check "a shorter one is" "grep -q 'cell dense_full seed 1: trained' '$OUT/run9.txt'"
MIXBENCH_CELLS_STOP_S=soon "$SCRIPT" --methods dense_full "$O2" 1 -- "${ARGS[@]}" > "$OUT/run10.txt" 2>&1
check "a bad MIXBENCH_CELLS_STOP_S exits 2" "[ $? -eq 2 ]"

# with a memory budget, the methods too large to run JOBS at a time train after the others, as many at
# a time as fit: mqa peaked at 8 GiB of 10 (1 at a time), gqa's last attempt ran out of memory with no
# finished cell (1 at a time); every cell is given its checkpoint folder
O3="$OUT/mem"
mkdir -p "$O3/cells" "$O3/logs"
cp "$OUT/cells/dense_full.s0.json" "$O3/cells/"
python3 - "$OUT/cells/dense_full.s0.json" "$O3/cells/mqa.s0.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for x in [r["results"][0]] + r["results"][0].get("runs", []):
    x["method"] = "mqa"
    x["memory"] = {"source": "cuda_allocator", "peak_bytes": 8 * 2**30, "delta_bytes": 8 * 2**30, "peak_reset": True}
json.dump(r, open(sys.argv[2], "w"))
PY
echo "mixbench: error: gqa: seed 0: CUDA out of memory. Tried to allocate 1.50 GiB" > "$O3/logs/gqa.s0.log"
ARGLOG="$OUT/args.log"
printf '#!/usr/bin/env bash\necho "$*" >> "%s"\nexec "%s" "$@"\n' "$ARGLOG" "$MIXBENCH_BIN" > "$OUT/logs_args.sh"
chmod +x "$OUT/logs_args.sh"
MIXBENCH_CELLS_MEM_GB=10 MIXBENCH_BIN="$OUT/logs_args.sh" "$SCRIPT" --methods dense_full,mqa,gqa --seeds 2 "$O3" 2 -- "${ARGS[@]}" > "$OUT/run11.txt" 2>&1
check "a memory-planned run exits 0" "[ $? -eq 0 ]"
check "mqa in the second pass, one at a time" "grep -q '^mqa 1 [0-9]* 2 1$' '$O3/logs/cells.order.txt'"
check "gqa (out of memory before) too" "grep -q '^gqa 0 [0-9]* 2 1$' '$O3/logs/cells.order.txt'"
check "dense_full in the first pass" "grep -q '^dense_full 1 [0-9]* 1 2$' '$O3/logs/cells.order.txt'"
check "the second pass after the first" "grep -q 'large cells: 4 at 1 at a time' '$OUT/run11.txt' && [ \$(grep -n 'large cells' '$OUT/run11.txt' | cut -d: -f1) -gt \$(grep -n 'cell dense_full seed 1: trained' '$OUT/run11.txt' | cut -d: -f1) ]"
check "every missing cell trained" "[ \$(grep -c 'trained in' '$OUT/run11.txt') -eq 4 ]"
check "cells get their checkpoint folder" "[ \$(grep -c -- '--cell-checkpoints $O3/ckpt' '$ARGLOG') -eq 4 ]"
check "finished cells leave no checkpoint" "[ -z \"\$(ls -A '$O3/ckpt' 2> /dev/null)\" ]"
MIXBENCH_CELLS_MEM_GB=lots "$SCRIPT" --methods dense_full "$O3" 1 -- "${ARGS[@]}" > "$OUT/run12.txt" 2>&1
check "a bad MIXBENCH_CELLS_MEM_GB exits 2" "[ $? -eq 2 ]"

"$SCRIPT" --methods dense_full "$OUT" 2 -- --out x.json > "$OUT/run4.txt" 2>&1
check "--out among the leaderboard options exits 2" "[ $? -eq 2 ]"
"$SCRIPT" "$OUT" 2 > "$OUT/run5.txt" 2>&1
check "no methods exits 2" "[ $? -eq 2 ]"

if [ $fails -gt 0 ]; then
  for f in "$OUT"/run*.txt; do echo "== $f"; cat "$f"; done
  exit 1
fi
