// The loop family: the loop plan (prelude once, core n_loops times, coda once), windows that follow
// the unrolled position, the Xavier init rule, and the registered loop methods.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>

#include "harness/backbone.h"
#include "harness/errors.h"
#include "harness/plan.h"
#include "harness/registry.h"

namespace mixbench {
namespace {

const at::TensorOptions kF64 = at::TensorOptions().dtype(at::kDouble);
at::Generator gen_of(uint64_t s) { return at::make_generator<at::CPUGeneratorImpl>(s); }

std::vector<int64_t> blocks_of(const ExecPlan& p) {
  std::vector<int64_t> b;
  for (const auto& s : p.steps) b.push_back(s.block);
  return b;
}

TEST(LoopPlan, PreludeCoreTimesLoopsCoda) {
  ExecPlan p = ExecPlan::loop(5, 1, 1, 3);
  EXPECT_EQ(blocks_of(p), (std::vector<int64_t>{0, 1, 2, 3, 1, 2, 3, 1, 2, 3, 4}));
  EXPECT_EQ(p.n_blocks, 5);
  EXPECT_EQ(p.n_slots, 11);
  EXPECT_EQ(p.steps[4].iteration, 1);
  EXPECT_EQ(p.steps[4].n_iterations, 3);
  EXPECT_EQ(p.steps[10].n_iterations, 1);
  EXPECT_EQ(blocks_of(ExecPlan::loop(2, 0, 0, 2)), (std::vector<int64_t>{0, 1, 0, 1}));
  EXPECT_EQ(blocks_of(ExecPlan::loop(3, 1, 1, 1)), blocks_of(ExecPlan::stack(3)));
}

TEST(LoopPlan, BadSplitsAreInputErrors) {
  EXPECT_THROW(ExecPlan::loop(4, 1, 1, 0), InputError);
  EXPECT_THROW(ExecPlan::loop(4, 1, 1, -1), InputError);
  EXPECT_THROW(ExecPlan::loop(4, 2, 2, 2), InputError);  // no core block
  EXPECT_THROW(ExecPlan::loop(4, 3, 1, 2), InputError);
  EXPECT_THROW(ExecPlan::loop(4, -1, 1, 2), InputError);
  EXPECT_NO_THROW(ExecPlan::loop(4, 3, 0, 2));
}

// dense (SSSL) with a plan: the window of each application follows its plan step.
MethodSpec dense_with_plan(std::function<ExecPlan(const Config&)> plan) {
  MethodSpec m = Registry::get().method("dense");
  m.plan = std::move(plan);
  return m;
}

TEST(LoopWindows, FollowTheUnrolledPositionAndTheLastStepIsLong) {
  MethodSpec m = dense_with_plan([](const Config&) { return ExecPlan::loop(2, 0, 0, 2); });
  Config cfg = m.config.parse("n_layer=2,d_model=32,head_dim=16,vocab=32,seq_len=16,short_window=4,mlp_hidden=32");
  CostQuery q;
  q.T = 16;
  q.context = 16;
  ModelCost mc = account_model(m, cfg, q);
  ASSERT_EQ(mc.layers.size(), 4u);
  // SSSL by unrolled step: steps 0-2 short (block 1 at step 1 too), step 3 (block 1 again) long
  for (int s = 0; s < 3; ++s) EXPECT_EQ(mc.layers[size_t(s)].formula.rfind("window 5 keys", 0), 0u) << s;
  EXPECT_EQ(mc.layers[3].formula.rfind("full", 0), 0u);
  // the forward pass uses the same windows: a windowed application keeps 5 keys in its cache
  at::Generator g = gen_of(3);
  Model model = build_model(m, cfg, g, kF64, /*random_nonzero=*/true);
  at::Tensor idx = at::randint(32, {1, 12}, g, at::TensorOptions().dtype(at::kLong));
  ModelCache cache;
  model_prefill(model, idx, Backend::CPU, &cache);
  ASSERT_EQ(cache.layers.size(), 4u);
  EXPECT_EQ(cache.layers[1].at("k").size(1), 5) << "block 1 at step 1 is a short-window application";
  EXPECT_EQ(cache.layers[3].at("k").size(1), 12) << "block 1 at the last step is long";
  // a plain stack is unchanged: SSSL by layer
  ModelCost plain = account_model(Registry::get().method("dense"), cfg.with("n_layer", int64_t(4)), q);
  ASSERT_EQ(plain.layers.size(), 4u);
  EXPECT_EQ(plain.layers[2].formula.rfind("window", 0), 0u);
  EXPECT_EQ(plain.layers[3].formula.rfind("full", 0), 0u);
}

TEST(LoopInit, XavierNormalRuleHasTheGainTimesXavierStd) {
  ParamDef d{"w", {256, 128}, ParamGroup::TransformerMatrix, true, "xavier_normal", 0.25, 0};
  at::Generator g = gen_of(5);
  at::Tensor t = at::empty({256, 128}, kF64);
  init_param(t, d, g);
  const double want = 0.25 * std::sqrt(2.0 / (256.0 + 128.0));
  EXPECT_NEAR(t.std().item<double>(), want, 0.02 * want);
  EXPECT_NEAR(t.mean().item<double>(), 0.0, 0.02 * want);
  ParamDef v = d;
  v.shape = {8};
  at::Tensor vec = at::empty({8}, kF64);
  EXPECT_THROW(init_param(vec, v, g), std::logic_error);
}

}  // namespace
}  // namespace mixbench
