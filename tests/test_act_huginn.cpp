// Looped methods with adaptive or sampled depth: ut_act (Universal Transformer ACT) and huginn
// (recurrent depth with a sampled loop count and truncated backpropagation).
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <set>

#include "harness/backbone.h"
#include "harness/cli/cli.h"
#include "harness/errors.h"
#include "harness/registry.h"
#include "mixers/loop/act.h"
#include "mixers/loop/huginn.h"

namespace mixbench {
namespace {

const at::TensorOptions kF64 = at::TensorOptions().dtype(at::kDouble);
at::Generator gen_of(uint64_t s) { return at::make_generator<at::CPUGeneratorImpl>(s); }
double max_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

// prelude, one core block, coda at d 32
const char* kLoopCfg = "n_layer=3,d_model=32,head_dim=16,seq_len=32,vocab=32,mlp_hidden=32,short_window=4";
const char* kActCfg = kLoopCfg;
const char* kHuginnCfg = kLoopCfg;

// A small FP64 model of a looped method with random, never-zero parameters.
Model loop_model(const std::string& method, const std::string& extra, uint64_t seed) {
  const MethodSpec& m = Registry::get().method(method);
  at::Generator g = gen_of(seed);
  return build_model(m, m.config.parse(std::string(kLoopCfg) + "," + extra), g, kF64, /*random_nonzero=*/true);
}
Model act_model(const std::string& extra, uint64_t seed) { return loop_model("ut_act", extra, seed); }
Model huginn_model(const std::string& extra, uint64_t seed) { return loop_model("huginn", extra, seed); }

// The accountant's numbers at T = context = 32.
ModelCost cost_at(const MethodSpec& m, const Config& c) {
  CostQuery q;
  q.T = 32;
  q.context = 32;
  return account_model(m, c, q);
}
// Forward FLOPs per token of one application of the first core block (plan step 1): mixer and MLP.
double core_step_flops(const ModelCost& mc, const Config& c) {
  const ModelDims d = model_dims(c);
  return mc.layers[1].fwd_flops + 2.0 * 2.0 * double(d.d_model * d.mlp_hidden);
}

// Three positions through three ACT steps (ε = 0.01): p = 0.5, 0.5 halts at step 1 with R = 0.5;
// p = 0.2, 0.3, 0.1 runs to the last step, which spends the remainder 0.5; p = 0.995 halts at once.
TEST(ActArithmetic, HandCase) {
  act::Halting st{at::zeros({1, 3}, kF64), at::zeros({1, 3}, kF64), at::zeros({1, 3}, kF64)};
  const std::vector<std::vector<double>> p = {{0.5, 0.2, 0.995}, {0.5, 0.3, 0.7}, {0.9, 0.1, 0.4}};
  const std::vector<std::vector<double>> u = {{0.5, 0.2, 1.0}, {0.5, 0.3, 0.0}, {0.0, 0.5, 0.0}};
  at::Tensor usum = at::zeros({1, 3}, kF64);
  for (size_t k = 0; k < 3; ++k) {
    at::Tensor uk = act::act_step(st, at::tensor(p[k], kF64).view({1, 3}), /*last=*/k == 2);
    for (int64_t i = 0; i < 3; ++i) EXPECT_NEAR(uk[0][i].item<double>(), u[k][size_t(i)], 1e-15) << "step " << k << " pos " << i;
    usum = usum + uk;
  }
  const std::vector<double> h = {1, 1, 1}, R = {0.5, 0.5, 1.0}, N = {2, 3, 1};
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(st.h[0][i].item<double>(), h[size_t(i)]);
    EXPECT_NEAR(st.R[0][i].item<double>(), R[size_t(i)], 1e-15);
    EXPECT_EQ(st.N[0][i].item<double>(), N[size_t(i)]);
    EXPECT_NEAR(usum[0][i].item<double>(), 1.0, 1e-15) << "the update weights of a position sum to 1";
  }
  EXPECT_NEAR(act::ponder_cost(st).item<double>(), 0.01 * (2.5 + 3.5 + 2.0) / 3.0, 1e-15);
}

// With the halting bias huge every position halts at the first step (p = 1, R = 1): the model
// equals the same model with one core application, however many candidates follow.
TEST(UtAct, HaltingAtTheFirstStepEqualsOneApplication) {
  Model many = act_model("max_steps=3", 5), one = act_model("max_steps=1", 5);
  ASSERT_EQ(many.plan.n_steps(), 5);
  ASSERT_EQ(one.plan.n_steps(), 3);
  for (const auto& [n, t] : many.params) one.params.set(n, t);
  for (const char* n : {"resid_lambdas", "x0_lambdas"})  // prelude, first core application, coda
    one.params.set(n, at::cat({many.params.at(n).slice(0, 0, 2), many.params.at(n).slice(0, 4, 5)}));
  at::Generator g = gen_of(9);
  const at::Tensor idx = at::randint(32, {2, 11}, g, at::TensorOptions().dtype(at::kLong));
  for (Backend b : {Backend::CPU, Backend::Reference}) {
    many.params.set("act_halt_b", at::full({1}, 1000.0, kF64));
    ModelAux a1, a3;
    const at::Tensor y1 = model_forward(one, idx, b, &a1), y3 = model_forward(many, idx, b, &a3);
    EXPECT_LT(max_diff(y1, y3), 1e-12) << backend_name(b);
    EXPECT_NEAR(a3.aux_loss.item<double>(), 0.01 * 2.0, 1e-15) << "N = 1, R = 1 everywhere";
    EXPECT_NEAR(a1.aux_loss.item<double>(), 0.01 * 2.0, 1e-15);
    // the later candidates matter once positions keep running (p ≈ 1e-13: every position runs to the end)
    const at::Tensor w = many.params.at("act_halt_w");
    many.params.set("act_halt_w", at::zeros_like(w));
    many.params.set("act_halt_b", at::full({1}, -30.0, kF64));
    ModelAux a;
    EXPECT_GT(max_diff(model_forward(many, idx, b, &a), y1), 1e-6) << backend_name(b);
    EXPECT_NEAR(a.aux_loss.item<double>(), 0.01 * 4.0, 1e-12) << "N = 3, R = 1 everywhere";
    many.params.set("act_halt_w", w);
  }
}

TEST(UtAct, ReferenceMatchesTheFastPathAndDecodeMatchesForward) {
  Model m = act_model("max_steps=3", 11);
  m.params.set("act_halt_b", at::full({1}, 0.3, kF64));
  m.params.set("act_halt_w", m.params.at("act_halt_w") * 0.05);  // gates spread over (0, 1)
  at::Generator g = gen_of(12);
  const at::Tensor idx = at::randint(32, {2, 10}, g, at::TensorOptions().dtype(at::kLong));
  ModelAux ar, ac;
  const at::Tensor ref = model_forward(m, idx, Backend::Reference, &ar), cpu = model_forward(m, idx, Backend::CPU, &ac);
  EXPECT_LT(max_diff(ref, cpu), 1e-10);
  EXPECT_NEAR(ar.aux_loss.item<double>(), ac.aux_loss.item<double>(), 1e-14);
  EXPECT_GT(ac.aux_loss.item<double>(), 0.01 * 2.0 + 1e-6) << "some positions run more than one step";
  ModelCache cache;
  const at::Tensor pre = model_prefill(m, idx.slice(1, 0, 7), Backend::CPU, &cache);
  ASSERT_EQ(cache.layers.size(), 5u) << "one cache slot per unrolled step";
  EXPECT_LT(max_diff(pre, cpu.slice(1, 6, 7)), 1e-10);
  for (int64_t t = 7; t < 10; ++t)
    EXPECT_LT(max_diff(model_decode_step(m, idx.slice(1, t, t + 1), cache, Backend::CPU), cpu.slice(1, t, t + 1)), 1e-10)
        << "t=" << t;
}

// Every candidate step is billed: two more candidates cost two core applications and two gates.
TEST(UtAct, AccountantBillsEveryCandidate) {
  const MethodSpec& m = Registry::get().method("ut_act");
  // all layers full, so every application costs the same (windows follow the unrolled position)
  const Config c3 = m.config.parse(std::string(kActCfg) + ",max_steps=3,window_pattern=L"),
               c1 = c3.with("max_steps", int64_t(1));
  const ModelCost a3 = cost_at(m, c3), a1 = cost_at(m, c1);
  const ModelDims d = model_dims(c3);
  ASSERT_EQ(a1.layers.size(), 3u);
  const double core = core_step_flops(a1, c1);
  EXPECT_NEAR(a3.fwd_flops - a1.fwd_flops, 2.0 * core + 2.0 * 2.0 * double(d.d_model), 1e-9 * a3.fwd_flops);
  EXPECT_EQ(a3.params.total(), a1.params.total() + 4) << "parameters per block; two more resid and x0 scales";
  at::Generator g = gen_of(1);
  EXPECT_EQ(a3.params.total(), count_params(build_model(m, c3, g, kF64)).total());
}

// ---------------------------------------------------------------- huginn

TEST(Huginn, DepthSequenceIsReproducibleFromTheSeed) {
  std::vector<int64_t> a, b, c;
  for (int64_t step = 0; step < 64; ++step) {
    a.push_back(huginn::sample_depth(1234, step, 3.0, 4));
    b.push_back(huginn::sample_depth(1234, step, 3.0, 4));
    c.push_back(huginn::sample_depth(1235, step, 3.0, 4));
  }
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  for (int64_t r : a) {
    EXPECT_GE(r, 1);
    EXPECT_LE(r, 4);
  }
  EXPECT_GT(std::set<int64_t>(a.begin(), a.end()).size(), 2u) << "the depth varies from step to step";
  EXPECT_EQ(huginn::eval_depth(3.0, 4), 3);
  EXPECT_EQ(huginn::eval_depth(2.6, 4), 3);
  EXPECT_EQ(huginn::eval_depth(9.0, 4), 4);
}

// The accountant bills core application k by P(r > k), which the sampler reproduces.
TEST(Huginn, ExpectedDepthBilling) {
  std::vector<int64_t> over(4, 0);
  const int64_t n = 20000;
  for (int64_t step = 0; step < n; ++step) {
    const int64_t r = huginn::sample_depth(5, step, 3.0, 4);
    for (int64_t k = 0; k < 4; ++k) over[size_t(k)] += r > k;
  }
  EXPECT_EQ(huginn::run_probability(0, 3.0), 1.0);
  for (int64_t k = 1; k < 4; ++k) {
    const double p = huginn::run_probability(k, 3.0);
    EXPECT_NEAR(double(over[size_t(k)]) / double(n), p, 0.015) << "k=" << k;
    EXPECT_LT(p, huginn::run_probability(k - 1, 3.0));
  }
  const MethodSpec& m = Registry::get().method("huginn");
  // all layers full, so every application costs the same (windows follow the unrolled position)
  const Config c = m.config.parse(std::string(kHuginnCfg) + ",max_loops=4,mean_loops=3,window_pattern=L");
  const Config deep = c.with("mean_loops", 64.0);  // nearly every application runs
  const ModelCost a = cost_at(m, c), b = cost_at(m, deep);
  const ModelDims d = model_dims(c);
  ASSERT_EQ(b.layers.size(), 6u);
  const double core = core_step_flops(b, deep);
  const double adapter = 4.0 * double(d.d_model * d.d_model);
  double skipped = 0;
  for (int64_t k = 1; k < 4; ++k) {
    skipped += huginn::run_probability(k, 64.0) - huginn::run_probability(k, 3.0);
    EXPECT_GT(huginn::run_probability(k, 64.0), 0.999);
  }
  EXPECT_NEAR(b.fwd_flops - a.fwd_flops, skipped * (core + adapter), 1e-9 * a.fwd_flops);
  EXPECT_EQ(a.params.total(), b.params.total());
  at::Generator g = gen_of(2);
  EXPECT_EQ(a.params.total(), count_params(build_model(m, c, g, kF64)).total());
  EXPECT_NE(a.layers[4].formula.find("share of training passes"), std::string::npos) << a.layers[4].formula;
}

TEST(Huginn, InitialStateIsSeededPerGlobalRowAndPosition) {
  const at::Tensor two = huginn::initial_state(7, 0, 2, 0, 9, 32, kF64);
  EXPECT_LT(max_diff(huginn::initial_state(7, 1, 1, 0, 9, 32, kF64)[0], two[1]), 1e-300) << "row 1 alone";
  EXPECT_LT(max_diff(huginn::initial_state(7, 0, 1, 6, 3, 32, kF64)[0], two[0].slice(0, 6, 9)), 1e-300)
      << "positions 6..8 alone (decoding)";
  EXPECT_GT(max_diff(huginn::initial_state(8, 0, 2, 0, 9, 32, kF64), two), 1e-3) << "another seed";
  const double sigma = std::sqrt(2.0 / (5.0 * 32.0));
  EXPECT_LE(two.abs().max().item<double>(), 3.0 * sigma);
  EXPECT_NEAR(two.std().item<double>(), sigma * 0.986, 0.1 * sigma) << "truncated at ±3σ";
}

// Outside training r = round(r̄): the plan's fourth application is skipped, so the model equals the
// same model with three applications in its plan.
TEST(Huginn, ApplicationsBeyondTheDepthAreSkipped) {
  Model four = huginn_model("max_loops=4,mean_loops=3", 3), three = huginn_model("max_loops=3,mean_loops=3", 3);
  for (const auto& [n, t] : four.params) three.params.set(n, t);
  for (const char* n : {"resid_lambdas", "x0_lambdas"})
    three.params.set(n, at::cat({four.params.at(n).slice(0, 0, 4), four.params.at(n).slice(0, 5, 6)}));
  at::Generator g = gen_of(4);
  const at::Tensor idx = at::randint(32, {2, 9}, g, at::TensorOptions().dtype(at::kLong));
  for (Backend b : {Backend::CPU, Backend::Reference}) {
    const at::Tensor y4 = model_forward(four, idx, b), y3 = model_forward(three, idx, b);
    EXPECT_LT(max_diff(y4, y3), 1e-12) << backend_name(b);
    four.params.set("huginn_adapter", four.params.at("huginn_adapter") * 1.5);  // the adapter acts
    EXPECT_GT(max_diff(model_forward(four, idx, b), y3), 1e-6) << backend_name(b);
    four.params.set("huginn_adapter", three.params.at("huginn_adapter"));
  }
  EXPECT_LT(max_diff(model_forward(four, idx, Backend::Reference), model_forward(four, idx, Backend::CPU)), 1e-10);
}

// A training step whose sampled depth is 4 runs the first two applications without gradient: the
// residual scales only those steps use get none, the last two's do; the values are those of the
// untruncated depth-4 model.
TEST(Huginn, TruncatedBackpropagation) {
  Model m = huginn_model("max_loops=4,mean_loops=3,grad_loops=2", 6);
  m.seed = 99;
  int64_t step4 = -1;
  for (int64_t s = 0; s < 200 && step4 < 0; ++s)
    if (huginn::sample_depth(m.seed, s, 3.0, 4) == 4) step4 = s;
  ASSERT_GE(step4, 0);
  at::Generator g = gen_of(8);
  const at::Tensor idx = at::randint(32, {2, 8}, g, at::TensorOptions().dtype(at::kLong));
  const at::Tensor tgt = at::randint(32, {2, 8}, g, at::TensorOptions().dtype(at::kLong));
  auto grads = [&](Model& mm) {
    for (auto& [n, t] : mm.params) {
      t.requires_grad_(true);
      if (t.grad().defined()) t.mutable_grad().reset();
    }
    at::Tensor loss = model_loss(mm, idx, tgt, Backend::CPU);
    loss.backward();
    at::Tensor gr = mm.params.at("resid_lambdas").grad();
    return std::make_pair(loss.detach(), gr.defined() ? gr.clone() : at::zeros({6}, kF64));
  };
  m.step = step4;
  auto [loss_t, g_t] = grads(m);
  // steps: prelude 0, applications 1..4, coda 5
  EXPECT_EQ(g_t[1].item<double>(), 0.0);
  EXPECT_EQ(g_t[2].item<double>(), 0.0);
  EXPECT_NE(g_t[3].item<double>(), 0.0);
  EXPECT_NE(g_t[4].item<double>(), 0.0);
  EXPECT_NE(g_t[0].item<double>(), 0.0);
  // not training: r = round(4.0) = 4 with gradients through all four
  Model full = huginn_model("max_loops=4,mean_loops=4,grad_loops=2", 6);
  full.seed = 99;
  for (const auto& [n, t] : m.params) full.params.set(n, t.detach().clone());
  auto [loss_f, g_f] = grads(full);
  EXPECT_LT(max_diff(loss_t, loss_f), 1e-12) << "truncation changes gradients, not values";
  EXPECT_NE(g_f[1].item<double>(), 0.0);
  EXPECT_NE(g_f[2].item<double>(), 0.0);
}

TEST(Huginn, DecodeMatchesForward) {
  Model m = huginn_model("max_loops=4,mean_loops=3", 13);
  at::Generator g = gen_of(14);
  const at::Tensor idx = at::randint(32, {2, 10}, g, at::TensorOptions().dtype(at::kLong));
  const at::Tensor full = model_forward(m, idx, Backend::CPU);
  ModelCache cache;
  const at::Tensor pre = model_prefill(m, idx.slice(1, 0, 6), Backend::CPU, &cache);
  ASSERT_EQ(cache.layers.size(), 6u);
  EXPECT_LT(max_diff(pre, full.slice(1, 5, 6)), 1e-10);
  for (int64_t t = 6; t < 10; ++t)
    EXPECT_LT(max_diff(model_decode_step(m, idx.slice(1, t, t + 1), cache, Backend::CPU), full.slice(1, t, t + 1)), 1e-10)
        << "t=" << t;
}

int cli_rc(const std::vector<std::string>& args) {
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  const int rc = run_cli(args);
  testing::internal::GetCapturedStdout();
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_FALSE(err.empty());
  return rc;
}

TEST(LoopMethods, BadLoopConfigsExitTwo) {
  const std::string base = "n_layer=3,d_model=32,head_dim=16,seq_len=32,vocab=32";
  for (const std::string& bad : {base + ",max_steps=0", base + ",max_steps=-2", base + ",prelude=2",
                                 base + ",prelude=1,coda=2", base + ",prelude=0"})
    EXPECT_EQ(cli_rc({"account", "--method", "ut_act", "--config", bad}), 2) << bad;
  for (const std::string& bad : {base + ",max_loops=0", base + ",max_loops=-1", base + ",mean_loops=0",
                                 base + ",grad_loops=0", base + ",coda=2"})
    EXPECT_EQ(cli_rc({"account", "--method", "huginn", "--config", bad}), 2) << bad;
  const MethodSpec& m = Registry::get().method("ut_act");
  try {
    m.config.parse(base + ",prelude=2");
    FAIL() << "a split that leaves no core block";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("no core block"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mixbench
