#!/usr/bin/env bash
# Stages the build dependencies a GPU machine may lack (nlohmann/json and fmt headers, GoogleTest
# sources, Google Benchmark headers and shared library) into a folder that is copied there with
# the source tree.  Usage: ci/gpu_stage.sh [DEPS_DIR]   (default: .deps, git-ignored)
set -euo pipefail
cd "$(dirname "$0")/.."
DEPS=${1:-.deps}
bash ci/setup.sh build >/dev/null   # makes sure the Debian packages are present here
rm -rf "$DEPS" && mkdir -p "$DEPS/include" "$DEPS/lib"
cp -r /usr/include/nlohmann "$DEPS/include/"
cp -r /usr/include/fmt "$DEPS/include/"
cp -r /usr/include/benchmark "$DEPS/include/"
cp -L /usr/lib/x86_64-linux-gnu/libbenchmark.so.1debian "$DEPS/lib/"   # Debian ships it shared
cp -r /usr/src/googletest "$DEPS/googletest"
# Wheels of the peers timed by ci/peers.py (pure Python; the GPU machine's torch and triton are used).
WHEELS=${WHEELS_DIR:-.whl}
mkdir -p "$WHEELS"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d "$WHEELS" fla-core==0.6.0 einops packaging
du -sh "$DEPS" "$WHEELS"
