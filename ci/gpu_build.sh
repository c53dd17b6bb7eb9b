#!/usr/bin/env bash
# Sourced by the GPU measurement scripts: `gpu_build OUT_DIR DEPS_DIR` builds build-gpu/ with
# ci/gpu.sh (no parts run) unless MIXBENCH_NO_BUILD is set and build-gpu/mixbench exists; the build
# log goes to OUT_DIR/build.log.
gpu_build() {
  local out=$1 deps=$2
  mkdir -p "$out"
  if [ -x build-gpu/mixbench ] && [ -n "${MIXBENCH_NO_BUILD:-}" ]; then return 0; fi
  MIXBENCH_GPU_PARTS=none bash ci/gpu.sh "$out/build" "$deps" > "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; return 1; }
  rm -rf "$out/build"
}

# `gpu_build_tests LOG_DIR DEPS_DIR`: configures build-gpu/ (Release, CUDA for sm_90, DEPS_DIR's
# staged dependencies when the folder exists) and builds mixbench and mixbench_tests; logs in
# LOG_DIR/cmake.log and LOG_DIR/build.log, their errors printed on failure (exit status 1).
gpu_build_tests() {
  local logs=$1 deps=$2
  local cmake_deps=()
  mkdir -p "$logs"
  [ -d "$deps" ] && cmake_deps=(-DMIXBENCH_DEPS="$(cd "$deps" && pwd)")
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DMIXBENCH_CUDA=ON -DMIXBENCH_CUDA_ARCH=90 "${cmake_deps[@]}" \
      > "$logs/cmake.log" 2>&1 || { tail -30 "$logs/cmake.log"; return 1; }
  ninja -C build-gpu -j"$(nproc)" mixbench mixbench_tests > "$logs/build.log" 2>&1 ||
      { grep -E "error|FAILED" "$logs/build.log" | head -30; return 1; }
}
