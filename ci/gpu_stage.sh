#!/usr/bin/env bash
# Stages the build dependencies a GPU machine may lack (nlohmann/json and fmt headers, GoogleTest
# sources, Google Benchmark headers and static library) into a folder that is copied there with
# the source tree.  Usage: ci/gpu_stage.sh [DEPS_DIR]   (default: .deps, git-ignored)
set -euo pipefail
cd "$(dirname "$0")/.."
DEPS=${1:-.deps}
bash ci/setup.sh build >/dev/null   # makes sure the Debian packages are present here
rm -rf "$DEPS" && mkdir -p "$DEPS/include" "$DEPS/lib"
cp -r /usr/include/nlohmann "$DEPS/include/"
cp -r /usr/include/fmt "$DEPS/include/"
cp -r /usr/include/benchmark "$DEPS/include/"
cp /usr/lib/x86_64-linux-gnu/libbenchmark.a "$DEPS/lib/"
cp -r /usr/src/googletest "$DEPS/googletest"
du -sh "$DEPS"
