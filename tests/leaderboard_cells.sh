#!/usr/bin/env bash
# ci/leaderboard_cells.sh end to end on the CPU: two methods' cells in parallel processes and their
# combined report; a rerun keeps the finished cells; past the deadline a removed cell stays missing
# (exit 1); a cell that ran out of memory is retried, another failure is not; the longest cells start
# first and none that would pass MIXBENCH_CELLS_STOP_S; options the script sets itself are refused
# (exit 2).
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
check "the order file" "[ \"\$(head -1 '$O2/logs/cells.order.txt')\" = 'mqa 0 1000' ]"
rm -f "$O2/cells/mqa.s1.json" "$O2/cells/dense_full.s1.json"
MIXBENCH_CELLS_STOP_S=500 "$SCRIPT" --methods dense_full,mqa --seeds 2 "$O2" 1 -- "${ARGS[@]}" > "$OUT/run9.txt" 2>&1
check "a cell that would pass the stop is not started" "grep -q 'cell mqa seed 1: not started (its estimated 1000 s would pass MIXBENCH_CELLS_STOP_S=500)' '$OUT/run9.txt'"
check "a shorter one is" "grep -q 'cell dense_full seed 1: trained' '$OUT/run9.txt'"
MIXBENCH_CELLS_STOP_S=soon "$SCRIPT" --methods dense_full "$O2" 1 -- "${ARGS[@]}" > "$OUT/run10.txt" 2>&1
check "a bad MIXBENCH_CELLS_STOP_S exits 2" "[ $? -eq 2 ]"

"$SCRIPT" --methods dense_full "$OUT" 2 -- --out x.json > "$OUT/run4.txt" 2>&1
check "--out among the leaderboard options exits 2" "[ $? -eq 2 ]"
"$SCRIPT" "$OUT" 2 > "$OUT/run5.txt" 2>&1
check "no methods exits 2" "[ $? -eq 2 ]"

if [ $fails -gt 0 ]; then
  for f in "$OUT"/run*.txt; do echo "== $f"; cat "$f"; done
  exit 1
fi
