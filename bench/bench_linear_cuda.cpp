// GPU timings of the linear ops' CUDA paths (simple_gla, gated_delta_rule) on the shapes of the
// peer comparison: B·T = 64K tokens per call, H = 16, K = V = 128, bf16, forward and
// forward+backward, CUDA events, inputs rotated between two sets (each larger than L2).
// ci/peers.py times flash-linear-attention on the same shapes; ci/compare.py merges both.
#if defined(MIXBENCH_WITH_CUDA)
#include <benchmark/benchmark.h>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/autograd.h>

#include "harness/registry.h"
#include "mixers/linear/delta_chunk.h"
#include "mixers/linear/gla_ops.h"
#include "bench/cuda_timing.h"

namespace {
using namespace mixbench;

// FLOPs of one forward call from the ops' accountant functions (mixers/linear): the chunked
// algorithm's matrix products per padded chunk and head (simple_gla), or per token with the
// unit-triangular solve (the delta rule). Forward + backward counts 3× the forward, the convention
// of the training FLOPs (harness/backbone.h, ModelCost::train_flops_nanochat).
double linear_fwd_flops(const std::string& op, int64_t B, int64_t T, int64_t H, int64_t D) {
  if (op == "gated_delta_rule") return linear::delta_chunk_flops(T, H, D, D).total() * double(B * T);
  return linear::simple_gla_chunk_flops(D, D) * double(linear::gla_padded_len(T) / linear::kGlaChunk) * double(B * H);
}

mixbench::TensorMap linear_inputs(const std::string& op, int64_t B, int64_t T, int64_t H, int64_t D, bool grad) {
  auto o = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
  auto f = at::TensorOptions().dtype(at::kFloat).device(at::kCUDA);
  at::Tensor q = at::randn({B, T, H, D}, o), k = at::randn({B, T, H, D}, o), v = at::randn({B, T, H, D}, o);
  TensorMap in;
  if (op == "gated_delta_rule") {
    // the delta rule expects L2-normalised keys (the layers normalise q and k)
    q = (q.to(at::kFloat) / q.to(at::kFloat).norm(2, -1, true)).to(at::kBFloat16);
    k = (k.to(at::kFloat) / k.to(at::kFloat).norm(2, -1, true)).to(at::kBFloat16);
    in.set("beta", at::sigmoid(at::randn({B, T, H}, f)).to(at::kBFloat16).requires_grad_(grad));
  }
  in.set("q", q.requires_grad_(grad));
  in.set("k", k.requires_grad_(grad));
  in.set("v", v.requires_grad_(grad));
  in.set("g", (at::log_sigmoid(at::randn({B, T, H}, f)) / 16.0).to(at::kBFloat16).requires_grad_(grad));
  return in;
}

void BM_linear_cuda(benchmark::State& state, std::string op_name, bool backward) {
  const int64_t T = state.range(0), H = 16, D = 128, B = std::max<int64_t>(1, 65536 / T);
  const OpSpec& op = Registry::get().op(op_name);
  if (!op.cuda || !at::hasCUDA()) {
    state.SkipWithError(op.cuda ? "no CUDA device" : "no CUDA path");
    return;
  }
  Config p = op.params.defaults();
  std::vector<TensorMap> sets = {linear_inputs(op_name, B, T, H, D, backward), linear_inputs(op_name, B, T, H, D, backward)};
  auto run = [&](const TensorMap& in) {
    TensorMap out = op.cuda(in, p);
    if (backward) {
      std::vector<at::Tensor> xs;
      for (const auto& [n, t] : in)
        if (t.requires_grad()) xs.push_back(t);
      torch::autograd::grad({out.at("o")}, xs, {at::ones_like(out.at("o"))}, false, false, true);
    }
  };
  try {
    for (int i = 0; i < 3; ++i) run(sets[size_t(i % 2)]);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  int64_t it = 0;
  mixbench_bench::time_cuda_iterations(state, [&] { run(sets[size_t(it++ % 2)]); });
  state.counters["tokens_per_s"] = benchmark::Counter(double(B * T), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["B"] = double(B);
  state.counters["T"] = double(T);
  state.counters["H"] = double(H);
  state.counters["D"] = double(D);
  const double flops = linear_fwd_flops(op_name, B, T, H, D) * (backward ? 3.0 : 1.0);
  state.counters["flops_per_call"] = flops;
  state.counters["TFLOPs"] = benchmark::Counter(flops / 1e12, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(fmt::format("{} B={} T={} H={} D={} bf16 {}", op_name, B, T, H, D, backward ? "fwd+bwd" : "fwd"));
}

int register_linear() {
  for (const char* op : {"simple_gla", "gated_delta_rule"})
    for (bool bwd : {false, true})
      benchmark::RegisterBenchmark(fmt::format("linear_cuda/{}/{}", op, bwd ? "fwd_bwd" : "fwd").c_str(),
                                   BM_linear_cuda, std::string(op), bwd)
          ->Arg(2048)->Arg(8192)->Arg(32768)
          ->UseManualTime()->Unit(benchmark::kMillisecond)->MinTime(0.2);
  return 0;
}
const int registered = register_linear();
}  // namespace
#endif
