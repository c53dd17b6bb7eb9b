#!/usr/bin/env bash
# Build and run ci/kernels/simple_gla_standalone.cu (needs nvcc and a GPU; no LibTorch).
set -euo pipefail
cd "$(dirname "$0")"
W=$(mktemp -d)
# the kernel part of the .cu: from the first constant to the host launcher
sed -n '/^constexpr int kC = 64;/,/^void check_cuda/p' ../../mixers/linear/simple_gla_cuda.cu | sed '$d' > "$W/kernel_body.inc"
nvcc -std=c++17 -O3 -arch=sm_90 -Xptxas -v -I"$W" simple_gla_standalone.cu -o "$W/sgla" 2>&1 | grep -E "error|spill|registers" || true
"$W/sgla"
