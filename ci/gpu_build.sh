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
