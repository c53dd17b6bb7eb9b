// Google Benchmark binary over every registered op: for each op with a CPU path, benchmarks of
//   <op>/cpu_fwd/T        optimized CPU path, forward only (FP32, no autograd)
//   <op>/cpu_fwd_bwd/T    optimized CPU path, forward + backward of Σ o·do over all outputs (FP32)
//   <op>/ref_fwd/T        FP64 reference, forward only (T ≤ 4096: it is a per-token loop)
// over T = 1K, 2K, 4K, 8K, 16K with B = 1. The op's inputs come from its make_inputs with its
// default params overridden, where the op has such fields, by H=4, Hkv=4, K=V=D=64 (the linear-op
// shape). Ops whose inputs cannot be built for that config are skipped. items/s = tokens/s.
// Timing is wall-clock (UseRealTime): LibTorch runs intra-op threads.
//   ./build/mixbench_bench --benchmark_filter='^simple_gla/' --benchmark_format=json
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <benchmark/benchmark.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/autograd.h>

#include <iostream>

#include "harness/registry.h"

namespace mixbench {
namespace {

Config bench_config(const OpSpec& op) {
  Config c = op.params.defaults();
  const std::vector<std::pair<const char*, int64_t>> shape = {{"H", 4}, {"Hkv", 4}, {"K", 64}, {"V", 64}, {"D", 64}, {"Dv", 64}};
  for (const auto& [n, v] : shape)
    if (op.params.find(n)) c.set(n, v);
  op.params.validate(c);
  return c;
}

TensorMap inputs_for(const OpSpec& op, const Config& c, int64_t T, at::ScalarType dt, bool grad) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(uint64_t(1000 + T));
  TensorMap raw = op.make_inputs(c, 1, T, gen), out;
  for (const auto& [n, t] : raw) {
    at::Tensor x = at::isFloatingType(t.scalar_type()) ? t.to(dt) : t;
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

void bench_fwd_bwd(benchmark::State& st, const OpSpec* op, Config c, int64_t T) {
  TensorMap in = inputs_for(*op, c, T, at::kFloat, true);
  std::vector<at::Tensor> leaves;
  for (const auto& [n, t] : in)
    if (t.requires_grad()) leaves.push_back(t);
  TensorMap cot;
  {
    c10::NoGradGuard ng;
    TensorMap o = op->cpu(in, c);
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(uint64_t(7));
    for (const auto& [n, t] : o)
      if (at::isFloatingType(t.scalar_type())) cot.set(n, at::randn(t.sizes(), gen, t.options()));
  }
  for (auto _ : st) {
    TensorMap o = op->cpu(in, c);
    at::Tensor loss;
    for (const auto& [n, t] : o) {
      if (!cot.has(n) || !t.requires_grad()) continue;
      at::Tensor term = (t * cot.at(n)).sum();
      loss = loss.defined() ? loss + term : term;
    }
    auto g = torch::autograd::grad({loss}, leaves, {}, false, false, /*allow_unused=*/true);
    benchmark::DoNotOptimize(g.data());
  }
  st.SetItemsProcessed(int64_t(st.iterations()) * T);
}

void register_all() {
  const std::vector<int64_t> lengths = {1024, 2048, 4096, 8192, 16384};
  for (const OpSpec* op : Registry::get().ops()) {
    if (!op->cpu || !op->make_inputs) continue;
    Config c;
    try {
      c = bench_config(*op);
      inputs_for(*op, c, 8, at::kFloat, false);
    } catch (const std::exception& e) {
      std::cerr << fmt::format("skipping op '{}': {}\n", op->name, e.what());
      continue;
    }
    for (int64_t T : lengths) {
      benchmark::RegisterBenchmark(fmt::format("{}/cpu_fwd/{}", op->name, T).c_str(), bench_fwd, op, c, T, false)
          ->Unit(benchmark::kMillisecond)->UseRealTime();
      benchmark::RegisterBenchmark(fmt::format("{}/cpu_fwd_bwd/{}", op->name, T).c_str(), bench_fwd_bwd, op, c, T)
          ->Unit(benchmark::kMillisecond)->UseRealTime();
      if (T <= 4096 && op->reference)
        benchmark::RegisterBenchmark(fmt::format("{}/ref_fwd/{}", op->name, T).c_str(), bench_fwd, op, c, T, true)
            ->Unit(benchmark::kMillisecond)->UseRealTime();
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
