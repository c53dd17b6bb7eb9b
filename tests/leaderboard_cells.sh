#!/usr/bin/env bash
# ci/leaderboard_cells.sh end to end on the CPU: two methods' cells in parallel processes and their
# combined report; a rerun keeps the finished cells; past the deadline a removed cell stays missing
# (exit 1); options the script sets itself are refused (exit 2).
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

"$SCRIPT" --methods dense_full "$OUT" 2 -- --out x.json > "$OUT/run4.txt" 2>&1
check "--out among the leaderboard options exits 2" "[ $? -eq 2 ]"
"$SCRIPT" "$OUT" 2 > "$OUT/run5.txt" 2>&1
check "no methods exits 2" "[ $? -eq 2 ]"

if [ $fails -gt 0 ]; then
  for f in "$OUT"/run*.txt; do echo "== $f"; cat "$f"; done
  exit 1
fi
