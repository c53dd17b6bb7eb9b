// Attention benchmarks: full causal vs sliding windows (512, 2048 keys) through the registered op,
// forward and forward+backward, H = 16, hd = 128, B·T = 64K tokens per call so launch overhead does
// not decide the result. On CUDA: bf16, CUDA events, inputs rotated between two sets larger than
// L2; the ceilings (bf16 8192³ matmul, device copy) are measured in the same binary. On CPU: fp32,
// a small grid. Counters: tokens/s, TFLOP/s (FlashAttention convention on visible pairs:
// fwd 4·D per pair per head, fwd+bwd 3.5× that).
#include <benchmark/benchmark.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <fmt/format.h>

#include "harness/registry.h"
#include "mixers/common/layers.h"

#if defined(MIXBENCH_WITH_CUDA)
#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime_api.h>
#endif

namespace {

using namespace mixbench;

struct Timer {
  bool cuda;
#if defined(MIXBENCH_WITH_CUDA)
  cudaEvent_t a{}, b{};
#endif
  std::chrono::steady_clock::time_point t0;
  explicit Timer(bool c) : cuda(c) {
#if defined(MIXBENCH_WITH_CUDA)
    if (cuda) {
      cudaEventCreate(&a);
      cudaEventCreate(&b);
    }
#endif
  }
  ~Timer() {
#if defined(MIXBENCH_WITH_CUDA)
    if (cuda) {
      cudaEventDestroy(a);
      cudaEventDestroy(b);
    }
#endif
  }
  void start() {
#if defined(MIXBENCH_WITH_CUDA)
    if (cuda) {
      cudaEventRecord(a, at::cuda::getCurrentCUDAStream());
      return;
    }
#endif
    t0 = std::chrono::steady_clock::now();
  }
  double stop() {  // seconds
#if defined(MIXBENCH_WITH_CUDA)
    if (cuda) {
      cudaEventRecord(b, at::cuda::getCurrentCUDAStream());
      cudaEventSynchronize(b);
      float ms = 0;
      cudaEventElapsedTime(&ms, a, b);
      return ms / 1e3;
    }
#endif
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
};

// args: T, window, backward(0/1), cuda(0/1)
void BM_attention(benchmark::State& state) {
  const int64_t T = state.range(0), window = state.range(1);
  const bool backward = state.range(2) != 0, cuda = state.range(3) != 0;
  if (cuda && !at::hasCUDA()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  const int64_t H = 16, D = 128;
  const int64_t B = std::max<int64_t>(1, (cuda ? 65536 : 4096) / T);
  auto opts = at::TensorOptions().dtype(cuda ? at::kBFloat16 : at::kFloat).device(cuda ? at::kCUDA : at::kCPU);
  const OpSpec& op = Registry::get().op("attention");
  Config p = op.params.defaults().with("window", window);
  std::vector<TensorMap> sets;
  for (int i = 0; i < 2; ++i)
    sets.push_back({{"q", at::randn({B, T, H, D}, opts).requires_grad_(backward)},
                    {"k", at::randn({B, T, H, D}, opts).requires_grad_(backward)},
                    {"v", at::randn({B, T, H, D}, opts).requires_grad_(backward)}});
  auto run = [&](const TensorMap& in) {
    at::Tensor o = (cuda ? op.cuda : op.cpu)(in, p).at("o");
    if (backward) torch::autograd::grad({o}, {in.at("q"), in.at("k"), in.at("v")}, {at::ones_like(o)});
  };
  for (int i = 0; i < 3; ++i) run(sets[size_t(i % 2)]);
  Timer timer(cuda);
  int64_t it = 0;
  for (auto _ : state) {
    timer.start();
    run(sets[size_t(it++ % 2)]);
    state.SetIterationTime(timer.stop());
  }
  const double pairs = layers::mean_visible(T, window) * double(T) * double(B * H);
  const double flops = 4.0 * D * pairs * (backward ? 3.5 : 1.0);
  state.counters["tokens_per_s"] = benchmark::Counter(double(B * T), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["TFLOPs"] = benchmark::Counter(flops / 1e12, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["B"] = double(B);
  state.counters["visible_pairs"] = pairs;
  state.SetLabel(fmt::format("B={} T={} H={} D={} window={} {}", B, T, H, D, window, backward ? "fwd+bwd" : "fwd"));
}

void attention_args(benchmark::internal::Benchmark* b, bool cuda) {
  const std::vector<int64_t> Ts = cuda ? std::vector<int64_t>{1024, 2048, 4096, 8192, 16384, 32768}
                                       : std::vector<int64_t>{256, 1024, 4096};
  const std::vector<int64_t> windows = cuda ? std::vector<int64_t>{0, 512, 2048} : std::vector<int64_t>{0, 128};
  for (int64_t bwd : {0, 1})
    for (int64_t w : windows)
      for (int64_t T : Ts) b->Args({T, w, bwd, cuda ? 1 : 0});
  b->UseManualTime()->Unit(benchmark::kMillisecond);
  if (cuda) b->MinTime(0.2);
}

BENCHMARK(BM_attention)->Name("attention_cpu")->Apply([](auto* b) { attention_args(b, false); });

#if defined(MIXBENCH_WITH_CUDA)
BENCHMARK(BM_attention)->Name("attention_cuda")->Apply([](auto* b) { attention_args(b, true); });

// Ceilings measured in the same run: bf16 matmul rate and device-to-device copy bandwidth.
void BM_ceiling_matmul(benchmark::State& state) {
  if (!at::hasCUDA()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  const int64_t n = 8192;
  auto o = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
  at::Tensor a = at::randn({n, n}, o), b = at::randn({n, n}, o);
  at::mm(a, b);
  Timer t(true);
  for (auto _ : state) {
    t.start();
    at::mm(a, b);
    state.SetIterationTime(t.stop());
  }
  state.counters["TFLOPs"] = benchmark::Counter(2.0 * n * n * n / 1e12, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_ceiling_matmul)->Name("ceiling_cuda/matmul_bf16_8192")->UseManualTime()->Unit(benchmark::kMillisecond);

void BM_ceiling_copy(benchmark::State& state) {
  if (!at::hasCUDA()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  const int64_t bytes = int64_t(1) << 30;
  auto o = at::TensorOptions().dtype(at::kByte).device(at::kCUDA);
  at::Tensor a = at::empty({bytes}, o), b = at::empty({bytes}, o);
  b.copy_(a);
  Timer t(true);
  for (auto _ : state) {
    t.start();
    b.copy_(a);
    state.SetIterationTime(t.stop());
  }
  state.counters["GBps_rw"] = benchmark::Counter(2.0 * double(bytes) / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_ceiling_copy)->Name("ceiling_cuda/copy_1GiB")->UseManualTime()->Unit(benchmark::kMillisecond);
#endif

}  // namespace
