#!/usr/bin/env bash
# The main job on built-in defaults: set up, build, run the full conformance suite on the CPU
# (fp64 and fp32, every registered op and method, the flash-linear-attention goldens), then the
# tiny equal-FLOP training leaderboard (6 methods, about 4 minutes on 2 shared cores), and write JSON
# reports plus Markdown summaries (and the leaderboard's HTML page).
# Usage: ci/main.sh [OUT_DIR]   (default: out)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-out}
mkdir -p "$OUT"
bash ci/setup.sh build
MB=./build/mixbench
$MB list
rc=0
for dtype in fp64 fp32; do
  echo "== conformance on cpu, $dtype"
  $MB conformance --methods all --device cpu --dtype "$dtype" --golden tests/goldens/*.safetensors \
      --out "$OUT/conformance_cpu_$dtype.json" || rc=$?
  $MB report "$OUT/conformance_cpu_$dtype.json" > "$OUT/conformance_cpu_$dtype.md"
done
$MB account --method dense --config n_layer=24 --seq-len 2048 --out "$OUT/account_dense_d24.json"
echo "== leaderboard, preset tiny (cpu)"
$MB leaderboard --preset tiny --quiet --out "$OUT/leaderboard_tiny.json" || rc=$?
echo "== reports in $OUT/"
exit $rc
