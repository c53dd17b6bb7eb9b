// The work one static-cache decode step launches, counted on the CPU (tests/op_count.h): the proxy
// of CUDA kernels per token that a captured decode step replays. A d12-shaped model (12 layers,
// 6 heads; narrow enough for the CPU: the count per layer does not depend on the width).
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include "harness/backbone.h"
#include "harness/fused_ops.h"
#include "harness/metrics.h"
#include "harness/op_scope.h"
#include "harness/registry.h"
#include "tests/op_count.h"

using namespace mixbench;
using mixbench::testing::OpCount;
using mixbench::testing::OpCounter;

namespace {

struct StepCount {
  OpCount count;
  double err_vs_eager = 0;  // rel-RMS of the static step's logits against the eager step's
};

// One decode step over a static cache after a prefill of 8 tokens, counted; the same step through
// the eager (growing) cache for comparison. `unprepared`: the weights the prefill prepared for the
// step ("w." cache entries) are dropped first, so that the step takes the layers' unfused path
// (the decode step as it was before them; its values are not compared: a delta layer's conv tails
// start again from zeros).
StepCount count_decode_step(const std::string& method, bool unprepared = false) {
  const at::ScalarType dt = at::kFloat;
  c10::NoGradGuard ng;
  const MethodSpec& m = Registry::get().method(method);
  const Config cfg = m.config.parse("n_layer=12,d_model=96,head_dim=16,seq_len=64,vocab=64");
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const Model model = build_model(m, cfg, gen, at::TensorOptions().dtype(dt), /*random_nonzero=*/true);
  const at::Tensor idx = at::randint(64, {1, 9}, gen, at::TensorOptions().dtype(at::kLong));
  ModelCache eager, fixed;
  model_prefill(model, idx.slice(1, 0, 8), Backend::CPU, &eager);
  const at::Tensor want = model_decode_step(model, idx.slice(1, 8, 9), eager, Backend::CPU);
  model_prefill(model, idx.slice(1, 0, 8), Backend::CPU, &fixed, 32);
  if (unprepared)
    for (auto& l : fixed.layers) {
      std::vector<std::string> names;
      for (const auto& [n, t] : l)
        if (n.rfind("w.", 0) == 0) names.push_back(n);
      for (const auto& n : names) l.erase(n);
    }
  StepCount out;
  at::Tensor got;
  {
    OpCounter counter;
    got = model_decode_step(model, idx.slice(1, 8, 9), fixed, Backend::CPU);
    out.count = counter.result();
  }
  out.err_vs_eager = compare(want, got).rel_rms;
  return out;
}

int64_t max_layer(const OpCount& c) {
  int64_t n = 0;
  for (int64_t i = 0; i < 12; ++i) n = std::max(n, c.layer(i));
  return n;
}

}  // namespace

TEST(OpCount, CountsLaunchesNotViewsAndMixbenchOpsOnce) {
  c10::NoGradGuard ng;
  const at::Tensor x = at::randn({2, 3, 8}), w = at::randn({5, 8});
  OpCounter counter;
  {
    SectionScope s("views");
    (void)x.view({6, 8}).transpose(0, 1).slice(0, 1).unsqueeze(0).contiguous();  // copies once (clone)
  }
  {
    SectionScope s("linear");
    (void)at::linear(x, w);  // one GEMM
  }
  {
    SectionScope s("fused");
    (void)relu_square(x);  // one mixbench op, whatever its CPU stand-in runs
    (void)(x * 2.0 + 1.0);  // two element-wise ops
  }
  const OpCount c = counter.result();
  EXPECT_EQ(c.in("views"), 1) << c.table();
  EXPECT_EQ(c.in("linear"), 1) << c.table();
  EXPECT_EQ(c.in("fused"), 3) << c.table();
  EXPECT_EQ(c.ops.at("fused").front(), "mixbench::relu_square");
  EXPECT_EQ(c.total(), 5);
}

// Prints the per-layer counts of the step with and without the prepared weights and holds the step
// to bounds: a change that adds launches back to the static decode step fails here (raise a bound
// only with the reason in the commit).
TEST(OpCount, StaticDecodeStepsStayFused) {
  struct Bound {
    std::string method;
    int64_t per_layer, total;
  };
  for (const Bound& b : {Bound{"dense_full", 6, 76}, Bound{"gdn", 6, 76}, Bound{"mla", 18, 220}}) {
    for (const bool unprepared : {true, false}) {
      const StepCount s = count_decode_step(b.method, unprepared);
      std::string per_layer;
      for (int64_t i = 0; i < 12; ++i) per_layer += fmt::format(" {}", s.count.layer(i));
      std::cout << fmt::format("{} ({}): {} ops per decode step; per layer:{}\n{}", b.method,
                               unprepared ? "unfused layers" : "static decode step", s.count.total(), per_layer,
                               s.count.table());
      EXPECT_GT(s.count.layer(0), 0) << b.method;
      EXPECT_GT(s.count.in("head"), 0) << b.method;
      if (unprepared) continue;
      EXPECT_LT(s.err_vs_eager, 1e-5) << b.method << ": the static step differs from the eager step";
      EXPECT_LE(max_layer(s.count), b.per_layer) << b.method << "\n" << s.count.table();
      EXPECT_LE(s.count.total(), b.total) << b.method << "\n" << s.count.table();
    }
  }
}
