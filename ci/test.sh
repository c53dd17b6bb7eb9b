#!/usr/bin/env bash
# Set up, build and run every test (GoogleTest through CTest).  Usage: ci/test.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build}
bash ci/setup.sh "$BUILD_DIR"
cd "$BUILD_DIR"
ctest --output-on-failure -j"${MIXBENCH_JOBS:-$(nproc)}" --timeout 1200
