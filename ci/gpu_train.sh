#!/usr/bin/env bash
# On a CUDA machine: build (ci/gpu.sh's build only), then time the training step of each method at a
# preset: `mixbench train` for a few steps, its train.json (tokens/s, MFU, the matmul probe) and its
# progress lines into OUT_DIR/<method>/. Methods whose run fails keep their log and the rest go on.
# Usage: ci/gpu_train.sh OUT_DIR [DEPS_DIR]
#   MIXBENCH_TRAIN_METHODS  methods (default "dense_full gdn")
#   MIXBENCH_TRAIN_ARGS     extra train options (default "--preset gpu-d12 --steps 6 --probes 0 --data synthetic")
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: ci/gpu_train.sh OUT_DIR [DEPS_DIR]}
DEPS=${2:-$PWD/.deps}
source ci/gpu_build.sh
gpu_build "$OUT" "$DEPS" || exit 1
rc=0
for m in ${MIXBENCH_TRAIN_METHODS:-dense_full gdn}; do
  echo "== $(date +%H:%M:%S) $m"
  # shellcheck disable=SC2086
  build-gpu/mixbench train --method "$m" --device cuda ${MIXBENCH_TRAIN_ARGS:---preset gpu-d12 --steps 6 --probes 0 --data synthetic} \
      --out "$OUT/$m" > "$OUT/$m.log" 2>&1 || { rc=1; tail -5 "$OUT/$m.log"; }
  python3 - "$OUT/$m/train.json" <<'PY' || true
import json, sys
r = json.load(open(sys.argv[1]))["results"][0]
print(f"{r['method']}: {r['tokens_per_s']:.0f} tok/s, mfu {100*r['mfu']:.1f}% of {r['matmul_peak']['flop_per_s']/1e12:.0f} TFLOP/s "
      f"({r['matmul_peak']['device_name']}, {r['dtype']}), first step {r['first_step_s']:.2f}s, "
      f"{r['train_flops_per_token_nanochat']:.3g} FLOPs/token, micro-batch {r['micro_batch']}")
PY
done
exit $rc
