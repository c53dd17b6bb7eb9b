#!/usr/bin/env bash
# Installs what mixbench needs on a Debian/Ubuntu machine (missing packages only), then configures
# and builds it.  Usage: ci/setup.sh [BUILD_DIR]   (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build}
TORCH_VERSION=2.11.0   # the LibTorch version pinned for the CPU build (same as the GPU machines')

need=()
for pkg in cmake ninja-build g++ ccache nlohmann-json3-dev libfmt-dev googletest libgtest-dev libbenchmark-dev python3-pip; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "== installing: ${need[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
if ! $PY -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('${TORCH_VERSION%.*}') else 1)" 2>/dev/null; then
  echo "== installing torch==${TORCH_VERSION} (provides LibTorch)"
  $PY -m pip install -q "torch==${TORCH_VERSION}" 2>&1 | grep -v -i "warning" || true
  $PY -c "import torch" || { echo "torch ${TORCH_VERSION} could not be installed" >&2; exit 1; }
fi

export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
export CCACHE_BASEDIR="$PWD"
# MIXBENCH_OPT: the C++ optimisation flag in place of Release's -O3 (ci/test.sh: -O1)
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMIXBENCH_OPT="${MIXBENCH_OPT:-}" ${MIXBENCH_CMAKE_ARGS:-} >/dev/null
ninja -C "$BUILD_DIR" -j"${MIXBENCH_JOBS:-$(nproc)}"
