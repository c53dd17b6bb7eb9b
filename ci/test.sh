#!/usr/bin/env bash
# Set up, build and run every test (GoogleTest through CTest).  Usage: ci/test.sh [BUILD_DIR]
# The test build is its own folder (default build-test) compiled at -O1 (MIXBENCH_OPT; see
# CMakeLists.txt); ci/main.sh's build/ keeps Release's -O3.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build-test}
MIXBENCH_OPT=${MIXBENCH_OPT--O1} bash ci/setup.sh "$BUILD_DIR"
cd "$BUILD_DIR"
ctest --output-on-failure -j"${MIXBENCH_JOBS:-$(nproc)}" --timeout 1200
