#!/usr/bin/env bash
# On a CUDA machine: tokens/s and MFU of every registered method's training step at a preset, each
# calibrated to the anchor's FLOPs/token (`mixbench leaderboard` over one method per process, so a
# method that fails cannot disturb the others; one that fails under CUDA-graph replay is run again
# with --graph off). Writes OUT_DIR/lb/<method>.json and the table OUT_DIR/mfu.{json,md}.
# Usage: ci/gpu_mfu.sh OUT_DIR [DEPS_DIR]
#   MIXBENCH_MFU_ARGS     leaderboard options (default "--preset gpu-d12 --steps 3 --batch 64 --probes 0 --data synthetic")
#   MIXBENCH_MFU_METHODS  methods (default: every registered method)
#   MIXBENCH_MFU_BUDGET_S stop starting new methods after this many seconds (default 480)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: ci/gpu_mfu.sh OUT_DIR [DEPS_DIR]}
DEPS=${2:-$PWD/.deps}
source ci/gpu_build.sh
gpu_build "$OUT" "$DEPS" || exit 1
mkdir -p "$OUT/lb"
MB=build-gpu/mixbench
METHODS=${MIXBENCH_MFU_METHODS:-$($MB list --json | python3 -c 'import json,sys; print(" ".join(m["name"] for m in json.load(sys.stdin)["methods"]))')}
ARGS=${MIXBENCH_MFU_ARGS:---preset gpu-d12 --steps 3 --batch 64 --probes 0 --data synthetic}
start=$(date +%s)
for m in $METHODS; do
  if [ $(( $(date +%s) - start )) -gt "${MIXBENCH_MFU_BUDGET_S:-480}" ]; then echo "time budget spent before $m"; break; fi
  # shellcheck disable=SC2086
  $MB leaderboard --methods "$m" --device cuda $ARGS --quiet --out "$OUT/lb/$m.json" > "$OUT/lb/$m.log" 2>&1 ||
    $MB leaderboard --methods "$m" --device cuda $ARGS --graph off --quiet --out "$OUT/lb/$m.json" > "$OUT/lb/$m.off.log" 2>&1
  echo "$m done at $(( $(date +%s) - start ))s"
done
python3 - "$OUT" "$ARGS" <<'PY'
import json, os, sys
out, args = sys.argv[1], sys.argv[2]
rows = []
for f in sorted(os.listdir(os.path.join(out, "lb"))):
    if not f.endswith(".json"):
        continue
    rep = json.load(open(os.path.join(out, "lb", f)))
    for r in rep["results"]:
        rows.append({k: r.get(k) for k in ("method", "status", "message", "tokens_per_s", "mfu", "train_flops_per_token_nanochat",
                                           "cuda_graph", "cuda_graph_scope", "cuda_graph_reason", "micro_batch", "dtype", "first_step_s")}
                    | {"gpu": r.get("matmul_peak", {}).get("device_name"), "peak_flop_per_s": r.get("matmul_peak", {}).get("flop_per_s"),
                       "git_commit": rep.get("git_commit")})
rows.sort(key=lambda r: -(r["mfu"] or 0))
json.dump({"command": f"ci/gpu_mfu.sh OUT  (mixbench leaderboard --methods M --device cuda {args})", "rows": rows},
          open(os.path.join(out, "mfu.json"), "w"), indent=1)
with open(os.path.join(out, "mfu.md"), "w") as md:
    md.write("| method | tok/s | MFU | FLOPs/token | CUDA graph | note |\n|---|---:|---:|---:|---|---|\n")
    for r in rows:
        if r["status"] != "ok":
            md.write(f"| {r['method']} | - | - | - | - | {r['status']}: {(r['message'] or '')[:120]} |\n")
            continue
        md.write(f"| {r['method']} | {r['tokens_per_s']:.0f} | {100 * r['mfu']:.1f}% | {r['train_flops_per_token_nanochat']:.3g} | "
                 f"{r.get('cuda_graph_scope') or ('yes' if r['cuda_graph'] else 'no')} | {r['cuda_graph_reason'] or ''} |\n")
print(open(os.path.join(out, "mfu.md")).read())
PY
