// GPU timings of DSA's CUDA paths on d12's shapes: token-sparse attention (sparse_attention_fast:
// the token_sparse kernels; H = Hkv = 6, D = 128, K = 256 keys per query, bf16) forward and
// forward+backward, and the indexer (dsa_indexer_fast: H_I = 3, D_I = 128, top-256), at B = 1 and
// T = 2K … 32K; CUDA events. Random distinct causal selections are drawn once per length.
#if defined(MIXBENCH_WITH_CUDA)
#include <benchmark/benchmark.h>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/autograd.h>

#include <functional>

#include "mixers/sparse/sparse.h"
#include "bench/cuda_timing.h"

namespace {
using namespace mixbench;

constexpr int64_t kH = 6, kD = 128, kTopk = 256, kHI = 3;

// [1,T,K] int64: min(K, t+1) distinct keys ≤ t per query (uniform), −1 padded — the top-k of random
// causal scores, on the device.
at::Tensor random_selection(int64_t T, int64_t K) {
  auto f = at::TensorOptions().dtype(at::kFloat).device(at::kCUDA);
  at::Tensor out = at::full({1, T, K}, -1, f.dtype(at::kLong));
  for (int64_t q0 = 0; q0 < T; q0 += 1024) {
    const int64_t q1 = std::min(T, q0 + 1024);
    at::Tensor r = at::rand({q1 - q0, q1}, f);
    at::Tensor s = at::arange(q1, f.dtype(at::kLong)).view({1, q1}), t = at::arange(q0, q1, f.dtype(at::kLong)).view({-1, 1});
    r.masked_fill_(s > t, -1.0);
    const int64_t k = std::min(K, q1);
    auto [v, i] = at::topk(r, k, -1);
    out.slice(1, q0, q1).slice(2, 0, k).copy_(i.masked_fill(v < 0, -1).unsqueeze(0));
  }
  return out;
}

void time_calls(benchmark::State& state, const std::function<void()>& run) {
  try {
    for (int i = 0; i < 2; ++i) run();
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  mixbench_bench::time_cuda_iterations(state, run);
}

void BM_token_sparse(benchmark::State& state, bool backward) {
  if (!at::hasCUDA()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  const int64_t T = state.range(0);
  auto o = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
  at::Tensor q = at::randn({1, T, kH, kD}, o).requires_grad_(backward);
  at::Tensor k = at::randn({1, T, kH, kD}, o).requires_grad_(backward);
  at::Tensor v = at::randn({1, T, kH, kD}, o).requires_grad_(backward);
  const at::Tensor idx = random_selection(T, kTopk), dout = at::randn({1, T, kH, kD}, o);
  time_calls(state, [&] {
    at::Tensor out = sparse_attention_fast(q, k, v, idx, 1.0 / std::sqrt(double(kD)));
    if (backward) torch::autograd::grad({out}, {q, k, v}, {dout});
  });
  // 4·H·K·D per query forward (scores and P·V); forward + backward counts 3× the forward (the
  // training FLOPs' convention)
  const double flops = 4.0 * double(T * kH * kTopk * kD) * (backward ? 3.0 : 1.0);
  state.counters["T"] = double(T);
  state.counters["TFLOPs"] = benchmark::Counter(flops / 1e12, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(fmt::format("B=1 T={} H={} D={} K={} bf16 {}", T, kH, kD, kTopk, backward ? "fwd+bwd" : "fwd"));
}

void BM_indexer(benchmark::State& state) {
  if (!at::hasCUDA()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  const int64_t T = state.range(0);
  auto o = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
  const at::Tensor q = at::randn({1, T, kHI, kD}, o), k = at::randn({1, T, kD}, o), w = at::randn({1, T, kHI}, o);
  time_calls(state, [&] { dsa_indexer_fast(q, k, w, kTopk, 1.0 / std::sqrt(double(kD)), true); });
  state.counters["T"] = double(T);
  state.SetLabel(fmt::format("B=1 T={} H_I={} D_I={} top-{} bf16", T, kHI, kD, kTopk));
}

int register_sparse() {
  for (bool bwd : {false, true})
    benchmark::RegisterBenchmark(fmt::format("sparse_cuda/token_sparse/{}", bwd ? "fwd_bwd" : "fwd").c_str(),
                                 BM_token_sparse, bwd)
        ->Arg(2048)->Arg(8192)->Arg(32768)
        ->UseManualTime()->Unit(benchmark::kMillisecond)->MinTime(0.2);
  benchmark::RegisterBenchmark("sparse_cuda/dsa_indexer", BM_indexer)
      ->Arg(2048)->Arg(8192)->Arg(32768)
      ->UseManualTime()->Unit(benchmark::kMillisecond)->MinTime(0.2);
  return 0;
}
const int registered = register_sparse();
}  // namespace
#endif
