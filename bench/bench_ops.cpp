// Google Benchmark binary over every registered op: for each op with a CPU path, benchmarks of
//   <op>/cpu_fwd/T        optimized CPU path, forward only (FP32, no autograd)
//   <op>/cpu_fwd_bwd/T    optimized CPU path, forward + backward of Σ o·do over all outputs (FP32)
//   <op>/ref_fwd/T        FP64 reference, forward only (T ≤ 4096: it is a per-token loop)
//   <op>/cuda_fwd/T       CUDA path (OpSpec::cuda), forward only (FP32, no autograd)
//   <op>/cuda_fwd_bwd/T   CUDA path, forward + backward of Σ o·do over all outputs (FP32)
// over T = 1K, 2K, 4K, 8K, 16K with B = 1. The op's inputs come from its make_inputs with its
// default params overridden, where the op has such fields, by H=4, Hkv=4, K=V=D=64 (the linear-op
// shape). Ops whose inputs cannot be built for that config are skipped. items/s = tokens/s.
// CPU timing is wall-clock (UseRealTime): LibTorch runs intra-op threads. The CUDA cases exist in a
// build with CUDA when a GPU is present (otherwise they are not registered, with one note on
// stderr); they are timed with CUDA events on the current stream (manual time, each iteration
// synchronized on its end event) and alternate between two input sets drawn with different seeds.
//   ./build/mixbench_bench --benchmark_filter='^simple_gla/' --benchmark_format=json
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <benchmark/benchmark.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <iostream>

#if defined(MIXBENCH_WITH_CUDA)
#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime_api.h>
#endif

#include "harness/registry.h"

namespace mixbench {
namespace {

// With --benchmark_repetitions, a "min" aggregate beside mean/median/stddev: on a shared CPU other
// work only ever adds time, so the fastest repetition is the least disturbed one.
double min_of(const std::vector<double>& v) { return v.empty() ? 0.0 : *std::min_element(v.begin(), v.end()); }

Config bench_config(const OpSpec& op) {
  Config c = op.params.defaults();
  const std::vector<std::pair<const char*, int64_t>> shape = {{"H", 4}, {"Hkv", 4}, {"K", 64}, {"V", 64}, {"D", 64}, {"Dv", 64}};
  for (const auto& [n, v] : shape)
    if (op.params.find(n)) c.set(n, v);
  op.params.validate(c);
  return c;
}

TensorMap inputs_for(const OpSpec& op, const Config& c, int64_t T, at::ScalarType dt, bool grad,
                     at::Device dev = at::kCPU, uint64_t seed = 1000) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed + uint64_t(T));
  TensorMap raw = op.make_inputs(c, 1, T, gen), out;
  for (const auto& [n, t] : raw) {
    at::Tensor x = at::isFloatingType(t.scalar_type()) ? t.to(dev, dt) : t.to(dev);
    bool diff = true;
    for (const auto& d : op.inputs)
      if (d.name == n) diff = d.differentiable;
    if (grad && diff && at::isFloatingType(x.scalar_type())) x.requires_grad_(true);
    out.set(n, x);
  }
  return out;
}

void bench_fwd(benchmark::State& st, const OpSpec* op, Config c, int64_t T, bool reference) {
  TensorMap in = inputs_for(*op, c, T, reference ? at::kDouble : at::kFloat, false);
  c10::NoGradGuard ng;
  for (auto _ : st) {
    TensorMap o = reference ? op->reference(in, c) : op->cpu(in, c);
    benchmark::DoNotOptimize(o.begin()->second.data_ptr());
  }
  st.SetItemsProcessed(int64_t(st.iterations()) * T);
}

// Forward + backward of Σ o·do: the leaves that need a gradient, cotangents drawn once.
struct FwdBwd {
  std::vector<at::Tensor> leaves;
  TensorMap cot;
  FwdBwd(const OpFn& fn, const TensorMap& in, const Config& c) {
    for (const auto& [n, t] : in)
      if (t.requires_grad()) leaves.push_back(t);
    c10::NoGradGuard ng;
    TensorMap o = fn(in, c);
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(uint64_t(7));
    for (const auto& [n, t] : o)
      if (at::isFloatingType(t.scalar_type()))
        cot.set(n, at::randn(t.sizes(), gen, t.options().device(at::kCPU)).to(t.device()));
  }
  std::vector<at::Tensor> run(const OpFn& fn, const TensorMap& in, const Config& c) const {
    TensorMap o = fn(in, c);
    at::Tensor loss;
    for (const auto& [n, t] : o) {
      if (!cot.has(n) || !t.requires_grad()) continue;
      at::Tensor term = (t * cot.at(n)).sum();
      loss = loss.defined() ? loss + term : term;
    }
    if (!loss.defined() || leaves.empty()) return {};
    return torch::autograd::grad({loss}, leaves, {}, false, false, /*allow_unused=*/true);
  }
};

void bench_fwd_bwd(benchmark::State& st, const OpSpec* op, Config c, int64_t T) {
  TensorMap in = inputs_for(*op, c, T, at::kFloat, true);
  FwdBwd fb(op->cpu, in, c);
  for (auto _ : st) {
    auto g = fb.run(op->cpu, in, c);
    benchmark::DoNotOptimize(g.data());
  }
  st.SetItemsProcessed(int64_t(st.iterations()) * T);
}

#if defined(MIXBENCH_WITH_CUDA)
// Seconds between two events recorded on the current CUDA stream around each iteration.
class CudaEventTimer {
 public:
  CudaEventTimer() {
    cudaEventCreate(&a_);
    cudaEventCreate(&b_);
  }
  ~CudaEventTimer() {
    cudaEventDestroy(a_);
    cudaEventDestroy(b_);
  }
  CudaEventTimer(const CudaEventTimer&) = delete;
  CudaEventTimer& operator=(const CudaEventTimer&) = delete;
  void start() { cudaEventRecord(a_, at::cuda::getCurrentCUDAStream()); }
  double stop() {
    cudaEventRecord(b_, at::cuda::getCurrentCUDAStream());
    cudaEventSynchronize(b_);
    float ms = 0;
    cudaEventElapsedTime(&ms, a_, b_);
    return double(ms) / 1e3;
  }

 private:
  cudaEvent_t a_{}, b_{};
};

// The op's CUDA path on two input sets (seeds differ) used alternately; forward only (no autograd)
// or forward + backward. Three untimed warm-up calls; a failing call skips the case with its message.
void bench_cuda(benchmark::State& st, const OpSpec* op, Config c, int64_t T, bool backward) {
  std::vector<TensorMap> sets;
  std::vector<FwdBwd> fbs;
  int64_t it = 0;
  try {
    for (uint64_t seed : {1000, 2000}) sets.push_back(inputs_for(*op, c, T, at::kFloat, backward, at::kCUDA, seed));
    if (backward)
      for (const auto& in : sets) fbs.emplace_back(op->cuda, in, c);
    auto call = [&](size_t i) {
      if (backward) {
        auto g = fbs[i].run(op->cuda, sets[i], c);
        benchmark::DoNotOptimize(g.data());
      } else {
        c10::NoGradGuard ng;
        TensorMap o = op->cuda(sets[i], c);
        benchmark::DoNotOptimize(o.begin()->second.data_ptr());
      }
    };
    for (int w = 0; w < 3; ++w) call(size_t(w % 2));
    at::cuda::getCurrentCUDAStream().synchronize();
    CudaEventTimer timer;
    for (auto _ : st) {
      timer.start();
      call(size_t(it++ % 2));
      st.SetIterationTime(timer.stop());
    }
  } catch (const std::exception& e) {
    st.SkipWithError(e.what());
    return;
  }
  st.SetItemsProcessed(int64_t(st.iterations()) * T);
}

bool cuda_device_present() {
  static const bool present = [] {
    const bool p = at::hasCUDA();
    if (!p) std::cerr << "no CUDA device: the <op>/cuda_* benchmarks are not registered\n";
    return p;
  }();
  return present;
}
#endif

void register_all() {
  const std::vector<int64_t> lengths = {1024, 2048, 4096, 8192, 16384};
  for (const OpSpec* op : Registry::get().ops()) {
    if ((!op->cpu && !op->cuda) || !op->make_inputs) continue;
    Config c;
    try {
      c = bench_config(*op);
      inputs_for(*op, c, 8, at::kFloat, false);
    } catch (const std::exception& e) {
      std::cerr << fmt::format("skipping op '{}': {}\n", op->name, e.what());
      continue;
    }
    for (int64_t T : lengths) {
#if defined(MIXBENCH_WITH_CUDA)
      if (op->cuda && cuda_device_present()) {
        benchmark::RegisterBenchmark(fmt::format("{}/cuda_fwd/{}", op->name, T).c_str(), bench_cuda, op, c, T, false)
            ->Unit(benchmark::kMillisecond)->UseManualTime();
        benchmark::RegisterBenchmark(fmt::format("{}/cuda_fwd_bwd/{}", op->name, T).c_str(), bench_cuda, op, c, T, true)
            ->Unit(benchmark::kMillisecond)->UseManualTime();
      }
#endif
      if (!op->cpu) continue;
      benchmark::RegisterBenchmark(fmt::format("{}/cpu_fwd/{}", op->name, T).c_str(), bench_fwd, op, c, T, false)
          ->Unit(benchmark::kMillisecond)->UseRealTime()->ComputeStatistics("min", min_of);
      benchmark::RegisterBenchmark(fmt::format("{}/cpu_fwd_bwd/{}", op->name, T).c_str(), bench_fwd_bwd, op, c, T)
          ->Unit(benchmark::kMillisecond)->UseRealTime()->ComputeStatistics("min", min_of);
      if (T <= 4096 && op->reference)
        benchmark::RegisterBenchmark(fmt::format("{}/ref_fwd/{}", op->name, T).c_str(), bench_fwd, op, c, T, true)
            ->Unit(benchmark::kMillisecond)->UseRealTime()->ComputeStatistics("min", min_of);
    }
  }
}

}  // namespace
}  // namespace mixbench

int main(int argc, char** argv) {
  mixbench::register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
