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
# Wheels of the peers timed by ci/peers.py, for the GPU machine's Python 3.12 on manylinux x86-64 (its
# own torch, triton, numpy, transformers, tqdm, psutil, ml-dtypes, cloudpickle are used):
# flash-linear-attention and fla-core, FlashQLA with TileLang and TileLang's needs (apache-tvm-ffi,
# torch-c-dlpack-ext, z3-solver). Where one transfer to the GPU machine holds at most 64 MiB with the
# working tree, ci/wheels.py splits the wheels larger than what a transfer has left (at most 30 MB a
# part) and groups them into WHEELS/call1, call2, ...: copy each to /tmp/mixbench_whl/ on the GPU
# machine, then ci/gpu_wheels.sh joins and installs them (README, GPU).
WHEELS=${WHEELS_DIR:-.whl}
rm -rf "$WHEELS" && mkdir -p "$WHEELS"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$WHEELS" \
  fla-core==0.6.0 flash-linear-attention==0.6.0 flash-qla==0.1.3 tilelang==0.1.15 apache-tvm-ffi==0.1.12 \
  torch-c-dlpack-ext==0.1.5 z3-solver==4.15.4.0
# MIXBENCH_WHEEL_RESERVE_MB: room kept in each transfer for other copied folders (e.g. .deps)
python3 ci/wheels.py split "$WHEELS" --part-mb "${MIXBENCH_WHEEL_PART_MB:-30}" --fit --reserve-mb "${MIXBENCH_WHEEL_RESERVE_MB:-0}"
python3 ci/wheels.py batches "$WHEELS" --reserve-mb "${MIXBENCH_WHEEL_RESERVE_MB:-0}"
du -sh "$DEPS" "$WHEELS"
