#!/usr/bin/env bash
# On a machine with several CUDA GPUs: training tokens/s on one GPU against N GPUs data-parallel
# (`mixbench train --nproc N`, NCCL) at a preset. Writes OUT_DIR/<method>_<n>gpu/train.json and
# OUT_DIR/scaling.{json,md}.
# Usage: ci/gpu_ddp.sh OUT_DIR [DEPS_DIR]
#   MIXBENCH_DDP_METHODS  methods (default "dense_full gdn")
#   MIXBENCH_DDP_ARGS     train options (default "--preset gpu-d12 --steps 6 --probes 0 --data synthetic")
#   MIXBENCH_DDP_NPROC    ranks (default: the visible GPUs)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: ci/gpu_ddp.sh OUT_DIR [DEPS_DIR]}
DEPS=${2:-$PWD/.deps}
source ci/gpu_build.sh
gpu_build "$OUT" "$DEPS" || exit 1
N=${MIXBENCH_DDP_NPROC:-$(nvidia-smi -L | wc -l)}
ARGS=${MIXBENCH_DDP_ARGS:---preset gpu-d12 --steps 6 --probes 0 --data synthetic}
rc=0
for m in ${MIXBENCH_DDP_METHODS:-dense_full gdn}; do
  for run in "1gpu_eager:--graph off" "1gpu:" "${N}gpu:--nproc $N"; do
    name=${run%%:*}
    # shellcheck disable=SC2086
    build-gpu/mixbench train --method "$m" --device cuda $ARGS ${run#*:} --out "$OUT/${m}_$name" > "$OUT/${m}_$name.log" 2>&1 ||
      { rc=1; tail -5 "$OUT/${m}_$name.log"; }
    rm -f "$OUT/${m}_$name/checkpoint.safetensors"
  done
done
python3 - "$OUT" "$N" "$ARGS" <<'PY'
import json, os, sys
out, n, args = sys.argv[1], sys.argv[2], sys.argv[3]
rows = []
for d in sorted(os.listdir(out)):
    p = os.path.join(out, d, "train.json")
    if os.path.isfile(p):
        rep = json.load(open(p))
        r = rep["results"][0]
        rows.append({"run": d, "method": r["method"], "world_size": r.get("world_size", 1), "tokens_per_s": r["tokens_per_s"],
                     "mfu": r["mfu"], "cuda_graph": r.get("cuda_graph"), "loss_curve": r["loss_curve"],
                     "git_commit": rep.get("git_commit")})
json.dump({"command": f"ci/gpu_ddp.sh OUT  (mixbench train --method M --device cuda {args} [--graph off | --nproc {n}])",
           "rows": rows}, open(os.path.join(out, "scaling.json"), "w"), indent=1)
with open(os.path.join(out, "scaling.md"), "w") as md:
    md.write("| run | ranks | tok/s | MFU (per GPU) | CUDA graph | speed-up vs 1 GPU eager / graphed |\n|---|---:|---:|---:|---|---|\n")
    for r in rows:
        base = {x["run"].rsplit("_", 1)[1]: x["tokens_per_s"] for x in rows if x["method"] == r["method"]}
        e, g = base.get("eager") or base.get("1gpu"), base.get("1gpu")
        md.write(f"| {r['run']} | {r['world_size']} | {r['tokens_per_s']:.0f} | {100 * r['mfu']:.1f}% | "
                 f"{'yes' if r['cuda_graph'] else 'no'} | {r['tokens_per_s'] / e:.2f}x / {r['tokens_per_s'] / g:.2f}x |\n")
print(open(os.path.join(out, "scaling.md")).read())
PY
exit $rc
