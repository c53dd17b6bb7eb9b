#!/usr/bin/env bash
# On a CUDA machine: build (ci/gpu.sh's build only), then time the training step with the whole step
# (forward, backward, optimizer) in one CUDA graph (--graph auto) against forward + backward only
# (--graph fwd-bwd, the optimizer eager) and no graph (--graph off): `mixbench train` per method,
# preset and scope into OUT_DIR/<method>_<preset>_<scope>/, and the table OUT_DIR/graph.md.
# Usage: ci/gpu_graph.sh OUT_DIR [DEPS_DIR]
#   MIXBENCH_GRAPH_RUNS   "method:preset:steps ..." (default "dense_full:small:60 gdn:small:60 dense_full:gpu-d12:8 gdn:gpu-d12:8")
#   MIXBENCH_GRAPH_SCOPES scopes (default "auto fwd-bwd off")
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: ci/gpu_graph.sh OUT_DIR [DEPS_DIR]}
DEPS=${2:-$PWD/.deps}
source ci/gpu_build.sh
gpu_build "$OUT" "$DEPS" || exit 1
rc=0
for run in ${MIXBENCH_GRAPH_RUNS:-dense_full:small:60 gdn:small:60 dense_full:gpu-d12:8 gdn:gpu-d12:8}; do
  IFS=: read -r m preset steps <<< "$run"
  for scope in ${MIXBENCH_GRAPH_SCOPES:-auto fwd-bwd off}; do
    d="$OUT/${m}_${preset}_${scope}"
    echo "== $(date +%H:%M:%S) $m $preset --graph $scope"
    build-gpu/mixbench train --method "$m" --preset "$preset" --device cuda --steps "$steps" --probes 0 \
        --data synthetic --graph "$scope" --out "$d" > "$d.log" 2>&1 || { rc=1; tail -5 "$d.log"; }
  done
done
python3 - "$OUT" <<'PY' || rc=1
import json, os, sys
out = sys.argv[1]
rows = []
for d in sorted(os.listdir(out)):
    f = os.path.join(out, d, "train.json")
    if not os.path.isfile(f):
        continue
    r = json.load(open(f))["results"][0]
    rows.append((d, r))
with open(os.path.join(out, "graph.md"), "w") as md:
    md.write("| run | steps | tok/s | MFU | graph scope | reason | first step s | final loss |\n|---|---:|---:|---:|---|---|---:|---:|\n")
    for d, r in rows:
        md.write(f"| {d} | {r['steps']} | {r['tokens_per_s']:.0f} | {100 * r['mfu']:.1f}% | {r['cuda_graph_scope']} | "
                 f"{r['cuda_graph_reason']} | {r['first_step_s']:.2f} | {r['loss_curve'][-1]:.4f} |\n")
print(open(os.path.join(out, "graph.md")).read())
PY
exit $rc
