// Host side shared by the launchers of the tensor-core chunk kernels (chunk_walk.cu, chunk_forward.cu,
// chunk_backward.cu, chunk_wy.cu): error checks, the shared-memory opt-in, the dispatch on dtype and
// head dims, and the launch choices (chunk_launch.cu: the built-in rules, tuned on an H200, which a
// Tuning set through set_tuning overrides).
#pragma once

#include "mixers/linear/chunk_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <type_traits>

namespace mixbench::linear::tc {

// Throws std::runtime_error naming `what` when e is an error.
void check(cudaError_t e, const char* what);
// Streaming multiprocessors of the current device (read once).
int sm_count();
// Throws std::invalid_argument when B·H or the number of chunks exceeds a grid dimension.
void check_grid(const Dims& d);

// One chunk of prefetch: 3 and 4 measured no faster on an H200 at any length (the walk is bound by
// its instructions per step, not by the load latency), and cost CTAs per SM at 8K.
constexpr int kWalkStages = 2;

// V tile of walk_fwd and walk_bwd: 32 or 64.
int walk_tile(const Dims& d);
// V tile of walk_bwd_delta: 32 or 64.
int delta_bwd_tile(const Dims& d);
// Whether fused_fwd splits V = 128 into two tiles of 64.
bool fused_split(const Dims& d);
// Whether chunk_output splits V = 128 into two tiles of 64.
bool output_split(const Dims& d);

template <typename Kern>
void set_smem(Kern kernel, size_t bytes) {
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)),
        "cudaFuncSetAttribute");
}

template <typename F>
void by_dtype(Dtype dt, F&& f) {
  if (dt == Dtype::BF16) f(__nv_bfloat16{});
  else f(__half{});
}
template <typename F>
void by_kv(int K, int V, F&& f) {
  if (K == 64 && V == 64) f(std::integral_constant<int, 64>{}, std::integral_constant<int, 64>{});
  else if (K == 64) f(std::integral_constant<int, 64>{}, std::integral_constant<int, 128>{});
  else if (V == 64) f(std::integral_constant<int, 128>{}, std::integral_constant<int, 64>{});
  else f(std::integral_constant<int, 128>{}, std::integral_constant<int, 128>{});
}

// A per-chunk kernel family (one CTA of 256 threads per chunk and b·h) for launch_per_chunk: NAME's
// smem() and kernel() are SMEM and KERNEL instantiated for the dtype and head dims at hand.
#define MIXBENCH_PER_CHUNK_KERNEL(NAME, KERNEL, SMEM)               \
  struct NAME {                                                      \
    template <typename T, int K, int V>                              \
    static constexpr size_t smem() { return SMEM<T, K, V>(); }       \
    template <typename T, int K, int V>                              \
    static auto kernel() { return KERNEL<T, K, V>; }                 \
  };

// Launches the per-chunk kernel family Kern (MIXBENCH_PER_CHUNK_KERNEL) over NT chunks and B·H heads.
template <typename Kern, typename Args>
void launch_per_chunk(Dtype dt, const Args& a, const Dims& d, int NT, void* stream, const char* what) {
  auto s = static_cast<cudaStream_t>(stream);
  by_dtype(dt, [&](auto t) {
    using T = decltype(t);
    by_kv(d.K, d.V, [&](auto kc, auto vc) {
      constexpr int K = decltype(kc)::value, V = decltype(vc)::value;
      constexpr size_t sm = Kern::template smem<T, K, V>();
      auto kern = Kern::template kernel<T, K, V>();
      set_smem(kern, sm);
      kern<<<dim3(NT, d.B * d.H), 256, sm, s>>>(a);
    });
  });
  check_launch(what);
}

}  // namespace mixbench::linear::tc
