#!/usr/bin/env bash
# Model-level sweeps on a CUDA machine (d12 nanochat backbone, bf16), after ci/gpu.sh has built
# build-gpu/: decode latency over context and batch (dense_full vs linear and hybrid methods, the shape of
# LT2's Fig. 4) and batch-1 prefill to 512K tokens (the shape of HypeNet's long-context sweep).
# OOM points are recorded in the JSON and the sweep steps past them. Each sweep runs under a time
# limit (seconds, default 150) so that one slow point cannot take the whole run; a sweep that
# hits it keeps its finished points in its report (rewritten atomically after every point,
# summary.complete false), and running the script again with the same OUT_DIR continues it (--resume).
# Usage: ci/gpu_sweeps.sh OUT_DIR [LIMIT_SECONDS]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: ci/gpu_sweeps.sh OUT_DIR [LIMIT_SECONDS]}
LIMIT=${2:-150}
M=build-gpu/mixbench
mkdir -p "$OUT"
rc=0
timeout "$LIMIT" $M sweep --mode decode --preset gpu-d12 --methods dense_full,gdn,gdn_hybrid,lightning,retnet \
    --lengths 1k,4k,16k,64k,128k --batch 1,2,4,8 --reps 5 --warmup 2 --out "$OUT/sweep_decode_d12.json" --resume || rc=1
# the other hybrids and MLA (latent KV cache), fewer points
timeout "$LIMIT" $M sweep --mode decode --preset gpu-d12 --methods dense_full,mla,hypenet,kda_hybrid,gdn_hybrid_swa \
    --lengths 1k,16k,64k --batch 1,8 --reps 3 --warmup 1 --out "$OUT/sweep_decode_hybrids_d12.json" --resume || rc=1
timeout "$LIMIT" $M sweep --mode prefill --preset gpu-d12 --methods dense_full,gdn,gdn_hybrid,lightning \
    --lengths 64k,128k,256k,512k --batch 1 --reps 2 --warmup 1 --out "$OUT/sweep_prefill_long_d12.json" --resume || rc=1
for f in "$OUT"/sweep_*.json; do
  [ -f "$f" ] && $M plot "$f" --out "${f%.json}.html"
done
exit $rc
