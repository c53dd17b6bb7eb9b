// The loop family: the loop plan (prelude once, core n_loops times, coda once), windows that follow
// the unrolled position, the Xavier init rule, and the registered loop methods.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include <cmath>

#include "tests/source_dir.h"
#include "harness/backbone.h"
#include "harness/cli/cli.h"
#include "harness/errors.h"
#include "harness/plan.h"
#include "harness/registry.h"
#include "harness/residual.h"
#include "harness/safetensors.h"
#include "mixers/loop/deeploop.h"
#include "mixers/loop/loop_common.h"
#include "suites/account.h"
#include "suites/conformance.h"
#include "suites/conformance_subject.h"

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

// ---------------------------------------------------------------- fixed_recursive
const char* kSmall = "d_model=32,head_dim=16,vocab=32,seq_len=16,short_window=4,mlp_hidden=32";

TEST(FixedRecursive, OneApplicationIsTheUnloopedModelAndTwoDiffer) {
  const MethodSpec& fr = Registry::get().method("fixed_recursive");
  const MethodSpec& dense = Registry::get().method("dense");
  EXPECT_EQ(fr.family, "loop");
  EXPECT_TRUE(fr.model_level());
  const std::string small = std::string("n_layer=4,") + kSmall;
  const Config once_cfg = fr.config.parse(small + ",n_loops=1");
  at::Generator g = gen_of(21);
  Model once = build_model(fr, once_cfg, g, kF64, /*random_nonzero=*/true);
  Model plain = build_model(dense, dense.config.parse(small), g, kF64, true);
  ASSERT_EQ(once.params.size(), plain.params.size());
  for (const auto& [n, t] : once.params) plain.params.set(n, t);
  at::Tensor idx = at::randint(32, {2, 13}, g, at::TensorOptions().dtype(at::kLong));
  const at::Tensor y1 = model_forward(once, idx, Backend::CPU);
  EXPECT_LT((y1 - model_forward(plain, idx, Backend::CPU)).abs().max().item<double>(), 1e-12);

  // the default: block 0 once, blocks 1-2 twice, block 3 once
  const Config cfg = fr.config.parse(small);
  EXPECT_EQ(cfg.i("n_loops"), 2);
  EXPECT_EQ(loop_split(cfg, "n_prelude"), 1);
  EXPECT_EQ(loop_split(cfg, "n_coda"), 1);
  Model twice = build_model(fr, cfg, g, kF64, true);
  EXPECT_EQ(blocks_of(twice.plan), (std::vector<int64_t>{0, 1, 2, 1, 2, 3}));
  EXPECT_EQ(twice.params.at("resid_lambdas").numel(), 6) << "one resid scale per unrolled step";
  for (const auto& [n, t] : once.params)
    if (n != "resid_lambdas" && n != "x0_lambdas") twice.params.set(n, t);
  const at::Tensor y2 = model_forward(twice, idx, Backend::CPU);
  EXPECT_GT((y2 - y1).abs().max().item<double>(), 1e-6);
  // the FP64 reference path runs the same loop through every layer's reference
  EXPECT_LT((model_forward(twice, idx, Backend::Reference) - y2).abs().max().item<double>(), 1e-10);
}

TEST(FixedRecursive, SharedCoreTakesTheWindowOfEachUnrolledStep) {
  const MethodSpec& fr = Registry::get().method("fixed_recursive");
  const Config cfg = fr.config.parse(std::string("n_layer=4,") + kSmall);
  CostQuery q;
  q.T = 16;
  q.context = 16;
  ModelCost mc = account_model(fr, cfg, q);
  ASSERT_EQ(mc.layers.size(), 6u);
  // steps 0..5 run blocks 0,1,2,1,2,3 with SSSL by step: S S S L S L(last)
  const std::vector<bool> full = {false, false, false, true, false, true};
  for (size_t s = 0; s < 6; ++s)
    EXPECT_EQ(mc.layers[s].formula.rfind("full", 0) == 0, full[s]) << "step " << s << ": " << mc.layers[s].formula;
  // FLOPs per application, parameters per block: the core's two blocks cost twice
  const MethodSpec& dense = Registry::get().method("dense");
  ModelCost plain = account_model(dense, dense.config.parse(std::string("n_layer=4,") + kSmall), q);
  EXPECT_EQ(mc.params.matmul, plain.params.matmul);
  EXPECT_EQ(mc.params.total(), plain.params.total() + 4) << "two more resid and two more x0 scales";
  EXPECT_GT(mc.fwd_flops, plain.fwd_flops);
  // below 3 blocks the default split loops the whole stack
  EXPECT_EQ(blocks_of(loop_plan(fr.config.parse(std::string("n_layer=2,") + kSmall))), (std::vector<int64_t>{0, 1, 0, 1}));
  EXPECT_EQ(blocks_of(loop_plan(fr.config.parse(std::string("n_layer=1,d_model=32,head_dim=16")))),
            (std::vector<int64_t>{0, 0}));
}

TEST(LoopMethods, AccountantPassesTheAudit) {
  for (const char* name : {"fixed_recursive", "deeploop"}) {
    AccountOptions opt;
    opt.method = name;
    opt.config = "n_layer=4,d_model=64,head_dim=32,vocab=64,seq_len=32";
    opt.audit = true;
    AccountResult r = run_account(opt);
    EXPECT_TRUE(r.row["audit"]["params_match"].get<bool>()) << name;
    EXPECT_LT(r.row["audit"]["fwd_flops_rel_diff"].get<double>(), 0.02) << name;
    EXPECT_TRUE(r.audit_passed()) << name;
  }
}

// ---------------------------------------------------------------- deeploop
TEST(DeepLoop, AlphaBetaAndInitRules) {
  EXPECT_DOUBLE_EQ(deeploop_alpha(4), std::sqrt(8.0));
  EXPECT_DOUBLE_EQ(deeploop_beta(4), 1.0 / std::sqrt(32.0));
  const MethodSpec& m = Registry::get().method("deeploop");
  const Config cfg = m.config.parse(std::string("n_layer=2,") + kSmall);
  at::Generator g = gen_of(2);
  Model model = build_model(m, cfg, g, kF64, /*random_nonzero=*/false);
  EXPECT_EQ(blocks_of(model.plan), (std::vector<int64_t>{0, 1, 0, 1})) << "the whole stack twice";
  const double beta = 1.0 / std::sqrt(8.0 * 4.0);  // N = 4 unrolled layers
  for (const char* n : {"layers.0.mixer.c_v", "layers.1.mixer.c_proj", "layers.0.mlp.c_fc", "layers.1.mlp.c_proj"}) {
    EXPECT_EQ(model.defs.at(n).init, "xavier_normal") << n;
    EXPECT_DOUBLE_EQ(model.defs.at(n).init_a, beta) << n;
  }
  // Q/K keep nanochat's uniform init; the VE table's range is scaled by β
  const MethodSpec& dense = Registry::get().method("dense");
  Model plain = build_model(dense, dense.config.parse(std::string("n_layer=2,") + kSmall), g, kF64, false);
  for (const char* n : {"layers.0.mixer.c_q", "layers.1.mixer.c_k"}) {
    EXPECT_EQ(model.defs.at(n).init, plain.defs.at(n).init) << n;
    EXPECT_EQ(model.defs.at(n).init_b, plain.defs.at(n).init_b) << n;
  }
  ASSERT_TRUE(model.defs.count("ve.1"));
  EXPECT_DOUBLE_EQ(model.defs.at("ve.1").init_b, beta * plain.defs.at("ve.1").init_b);
  EXPECT_LE(model.params.at("ve.1").abs().max().item<double>(), beta * plain.defs.at("ve.1").init_b);
  EXPECT_GT(model.params.at("layers.0.mlp.c_proj").abs().max().item<double>(), 0.0) << "not nanochat's zero init";
  // nanochat's resid/x0 mixing is off; its backout stays
  EXPECT_FALSE(model.params.has("resid_lambdas"));
  EXPECT_FALSE(model.params.has("x0_lambdas"));
  EXPECT_TRUE(model.params.has("backout_lambda"));
}

// x ← RMSNorm(α·x + y) after every sublayer, by hand on d = 4; the backout keeps the state after
// the unrolled midpoint's MLP.
TEST(DeepLoop, PostNormUpdateByHand) {
  auto stream = deeploop_stream();
  const int64_t n_steps = 2;  // α = √4 = 2
  for (Backend b : {Backend::CPU, Backend::Reference}) {
    at::Tensor x = at::tensor({1.0, -2.0, 0.5, 3.0}, kF64).view({1, 1, 4});
    at::Tensor y = at::tensor({0.5, 1.0, -1.0, 2.0}, kF64).view({1, 1, 4});
    TensorMap P{{"backout_lambda", at::tensor({0.25}, kF64)}};
    TensorMap st = stream->begin(x, P, b);
    Sublayer mix{0, n_steps, 0, Sublayer::Kind::Mixer, 0, 1, b};
    EXPECT_TRUE(stream->read(st, mix, P).equal(x));
    stream->write(st, mix, y, P);
    // z = 2x + y = (2.5, -3, 0, 8); mean z² = (6.25 + 9 + 0 + 64)/4 = 19.8125
    const double z[4] = {2.5, -3.0, 0.0, 8.0};
    const double r = 1.0 / std::sqrt(19.8125 + kRmsEps);
    at::Tensor got = stream->read(st, mix, P).view({4});
    for (int i = 0; i < 4; ++i) EXPECT_NEAR(got[i].item<double>(), z[i] * r, 1e-14) << backend_name(b) << " " << i;
    // the midpoint is step 1 of 2: no backout kept after step 0
    Sublayer mlp1{1, n_steps, 1, Sublayer::Kind::Mlp, 0, 1, b};
    at::Tensor before = stream->read(st, mlp1, P);
    stream->write(st, mlp1, y, P);
    at::Tensor kept = (before * 2.0 + y);
    kept = kept / at::sqrt(kept.square().mean(-1, true) + kRmsEps);
    at::Tensor fin = stream->finish(st, P, b);
    EXPECT_LT((fin - (kept - 0.25 * kept)).abs().max().item<double>(), 1e-14) << backend_name(b);
  }
}

// ---------------------------------------------------------------- conformance and bad input
// Thousands of tiny FP64 ops (finite differences over every parameter) run on one intra-op
// thread, as the trainer runs small CPU models; the previous count is restored.
template <class F>
void on_one_thread(F&& f) {
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  f();
  at::set_num_threads(threads);
}

TEST(LoopConformance, ModelsMatchTheFp64ReferenceWithFiniteDifferencesAndDecode) {
  ConformanceOptions opt;
  opt.methods = {"fixed_recursive", "deeploop"};
  opt.dtype = "fp64";
  opt.fd_directions = 1;
  ConformanceSummary s;
  nlohmann::json r;
  on_one_thread([&] { r = run_conformance(opt, s); });
  EXPECT_EQ(s.failed, 0);
  EXPECT_EQ(s.errors, 0);
  int model = 0, fd = 0, decode = 0;
  for (const auto& x : r) {
    EXPECT_EQ(x["status"], "pass") << x.dump();
    if (x["level"] == "model") ++model;
    if (x["level"] == "fd") ++fd;
    if (x["level"] == "invariant") ++decode;
  }
  EXPECT_EQ(model, 4);
  EXPECT_EQ(fd, 4);
  EXPECT_EQ(decode, 4) << "prefill + decode against forward on every case";
}

// A fast path with the wrong α fails the model-level check: the reference derives α on its own.
TEST(LoopConformance, WrongAlphaFails) {
  MethodSpec m = Registry::get().method("deeploop");
  m.residual = [](const Config&) { return deeploop_stream(1.5); };
  ConformanceOptions opt;
  opt.dtype = "fp64";
  opt.finite_differences = false;
  ConformanceSummary s;
  on_one_thread([&] { conformance_detail::run_subjects({conformance_detail::model_subject(m, opt)}, opt, s); });
  EXPECT_GT(s.failed, 0);
}

// A plan that applies the shared blocks the wrong number of times (same step count) is caught by
// fixed_recursive's model golden: the logits differ from the stored ones.
TEST(LoopConformance, WrongPlanFailsTheModelGolden) {
  const std::string path = std::string(mixbench_test::source_dir()) + "/tests/goldens/model/fixed_recursive.safetensors";
  SafetensorsFile f = read_safetensors(path);
  MethodSpec m = Registry::get().method("fixed_recursive");
  const Config cfg = m.config.parse(f.metadata.at("config"));
  ASSERT_EQ(blocks_of(loop_plan(cfg)), (std::vector<int64_t>{0, 1, 0, 1}));
  auto logits_with = [&](std::function<ExecPlan(const Config&)> plan) {
    m.plan = std::move(plan);
    at::Generator g = gen_of(1);
    Model model = build_model(m, cfg, g, kF64, /*random_nonzero=*/true);
    for (const auto& [n, t] : f.tensors)
      if (n.rfind("param.", 0) == 0) model.params.set(n.substr(6), t.to(at::kDouble));
    return model_forward(model, f.tensors.at("idx.T17"), Backend::CPU);
  };
  const at::Tensor want = f.tensors.at("logits.T17");
  EXPECT_LT((logits_with(loop_plan) - want).abs().max().item<double>(), 1e-10);
  // block 0 once, block 1 three times: the core is not the stack applied twice
  EXPECT_GT((logits_with([](const Config&) { return ExecPlan::from_blocks(2, {0, 1, 1, 1}); }) - want)
                .abs().max().item<double>(),
            1e-6);
}

TEST(LoopMethods, BadLoopConfigExitsTwoThroughTheCli) {
  for (const char* cfg : {"n_layer=4,n_loops=0", "n_layer=4,n_prelude=2,n_coda=2", "n_layer=4,n_prelude=3,n_coda=1"}) {
    testing::internal::CaptureStdout();
    testing::internal::CaptureStderr();
    const int rc = run_cli({"account", "--method", "fixed_recursive", "--config", cfg});
    testing::internal::GetCapturedStdout();
    const std::string err = testing::internal::GetCapturedStderr();
    EXPECT_EQ(rc, 2) << cfg;
    EXPECT_NE(err.find(std::string(cfg).find("n_loops") != std::string::npos ? "n_loops" : "n_prelude"), std::string::npos)
        << err;
  }
}

TEST(LoopMethods, CircleLoopIsListedOnlyAsUnregistered) {
  EXPECT_FALSE(Registry::get().has_method("circle_loop"));
  testing::internal::CaptureStdout();
  ASSERT_EQ(run_cli({"list", "--all"}), 0);
  const std::string all = testing::internal::GetCapturedStdout();
  const size_t at = all.find("circle_loop");
  ASSERT_NE(at, std::string::npos);
  EXPECT_NE(all.find("no public definition", at), std::string::npos);
  testing::internal::CaptureStdout();
  ASSERT_EQ(run_cli({"list"}), 0);
  EXPECT_EQ(testing::internal::GetCapturedStdout().find("circle_loop"), std::string::npos);
  testing::internal::CaptureStdout();
  ASSERT_EQ(run_cli({"list"}), 0);
  const std::string plain = testing::internal::GetCapturedStdout();
  for (const char* m : {"fixed_recursive", "deeploop"}) EXPECT_NE(plain.find(m), std::string::npos) << m;
}

}  // namespace
}  // namespace mixbench
