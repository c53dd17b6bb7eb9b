// Tests of the task suite's training step (suites/tasks.h train_task): on the CPU it is the eager
// loop the suite always ran (bit for bit against that loop written out here), the report rows carry
// steps_per_s and the CUDA-graph fields, PlainAdamW's device scalars give its host values' bits, and
// step_dependence names the layers a graph cannot replay. On a GPU: the captured whole step trains as
// the eager step from the same seed, the rows record the graph, a step that cannot be captured (a
// host synchronisation, a loop depth sampled per step) trains eagerly with its reason, and the
// shared capture (suites/step_graph.h) recovers from a failed capture.
#include <gtest/gtest.h>
#include <fmt/format.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "harness/backbone.h"
#include "harness/cli/cli.h"
#include "harness/errors.h"
#include "harness/registry.h"
#include "harness/report.h"
#include "harness/tf32_scope.h"
#include "suites/optimizer.h"
#include "suites/step_graph.h"
#include "suites/tasks.h"
#include "suites/tasks_data.h"

using namespace mixbench;
using Json = nlohmann::json;

namespace {

// A small MQAR setting: length 16, 2 pairs, width 64, 16 token ids.
const TaskSetting kMqar{"mqar", 16, 2, 64, 16, {16}};

TasksPreset small_preset(int64_t batch) {
  TasksPreset P = tasks_preset("cpu-tiny");
  P.batch = batch;
  return P;
}

Config task_cfg(const std::string& method, const TasksPreset& P, const TaskSetting& s, const std::string& extra = "") {
  const MethodSpec& ms = Registry::get().method(method);
  return ms.config.parse(task_model_config(ms, P, s) + extra);
}

// The suite's training loop as it was before the step could be captured (host AdamW values, the
// batch built and moved each step, the loss read back each step): the reference the CPU path must
// reproduce bit for bit. Returns the losses; `trained` gets the parameters.
std::vector<double> eager_reference(const std::string& method, const TasksPreset& P, const TaskSetting& s,
                                    uint64_t seed, int64_t steps, Model& trained) {
  const MethodSpec& ms = Registry::get().method(method);
  const Config cfg = task_cfg(method, P, s);
  const int64_t bos = task_vocab(s);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  Model model = build_model(ms, cfg, gen, at::TensorOptions().dtype(at::kFloat));
  std::vector<std::string> names;
  for (const auto& [n, t] : model.params) names.push_back(n);
  std::map<std::string, std::pair<at::Tensor, at::Tensor>> moments;
  for (const auto& n : names) {
    at::Tensor p = model.params.at(n);
    p.requires_grad_(true);
    model.params.set(n, p);
    moments[n] = {at::zeros_like(p, at::kFloat), at::zeros_like(p, at::kFloat)};
  }
  Schedule sched;
  sched.steps = steps;
  sched.warmup = std::max<int64_t>(1, steps / 10);
  sched.warmdown_ratio = 0.2;
  std::vector<double> losses;
  for (int64_t it = 0; it < steps; ++it) {
    std::vector<ProbeSeq> seqs;
    for (int64_t b = 0; b < P.batch; ++b)
      seqs.push_back(task_instance(s, seed, TaskSplit::Train, it * P.batch + b, s.length));
    size_t longest = 0;
    for (const auto& q : seqs) longest = std::max(longest, q.tokens.size());
    at::Tensor x, y;
    task_batch(seqs, int64_t(longest) + 1, bos, x, y);
    model.step = it;
    at::Tensor lm;
    model_loss(model, x, y, Backend::CPU, &lm).backward();
    losses.push_back(lm.item<double>());
    const double lr = P.lr * lr_multiplier(sched, it);
    for (const auto& n : names) {
      at::Tensor p = model.params.at(n);
      if (!p.grad().defined()) continue;
      auto& [m1, m2] = moments[n];
      adamw_update(p, p.grad(), m1, m2, it + 1, lr, 0.9, 0.999, 1e-8, p.dim() >= 2 ? P.weight_decay : 0.0);
      p.mutable_grad() = at::Tensor();
    }
  }
  trained = model;
  return losses;
}

// One intra-op thread while a test runs (the reductions then split the same way in every run).
struct OneThread {
  int saved = at::get_num_threads();
  OneThread() { at::set_num_threads(1); }
  ~OneThread() { at::set_num_threads(saved); }
};

double max_rel(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor x = a.detach().cpu().to(at::kDouble), y = b.detach().cpu().to(at::kDouble);
  return ((x - y).abs().max() / x.abs().max().clamp_min(1e-30)).item<double>();
}

}  // namespace

// ------------------------------------------------------------------ CPU
TEST(TaskGraph, CpuTrainingIsTheEagerLoopBitForBit) {
  const OneThread one;
  const TasksPreset P = small_preset(8);
  for (const std::string method : {"dense_full", "gdn", "retnet"}) {
    SCOPED_TRACE(method);
    Model ref;
    const std::vector<double> want = eager_reference(method, P, kMqar, 5, 7, ref);
    for (const std::string graph : {"auto", "off"}) {  // no graph on the CPU either way
      const TaskTraining got =
          train_task(Registry::get().method(method), task_cfg(method, P, kMqar), kMqar, P, 5, 7, "cpu", graph);
      ASSERT_EQ(got.losses.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got.losses[i], want[i]) << "step " << i;
      for (const auto& [n, t] : ref.params) EXPECT_TRUE(at::equal(got.model.params.at(n).detach(), t.detach())) << n;
      for (const auto& [n, t] : got.model.params) EXPECT_FALSE(t.grad().defined()) << n;
      EXPECT_FALSE(got.graph);
      EXPECT_EQ(got.graph_reason, "not on a GPU");
      EXPECT_GT(got.seconds, 0.0);
      EXPECT_GT(got.steps_per_s, 0.0);
    }
  }
  EXPECT_THROW(train_task(Registry::get().method("dense_full"), task_cfg("dense_full", P, kMqar), kMqar, P, 5, 2,
                          "cpu", "fwd-bwd"),
               UsageError);
}

// The rows carry the rate and the graph fields (and pass the report schema); the CPU numbers are the
// ones the suite gave before the step could be captured: final losses of this run as the pre-graph
// build printed them on an x86 CPU at one thread (to 1e-5 relative: another CPU may round its SIMD
// reductions differently; the bit-for-bit check against the loop itself is the test above).
TEST(TaskGraph, RowsCarryRateAndGraphFieldsAndTheCpuNumbersAreUnchanged) {
  TasksOptions o;
  o.methods = {"dense_full", "gdn"};
  o.tasks = {"mqar"};
  o.mqar_lengths = {16};
  o.mqar_pairs = {2};
  o.mqar_widths = {64};
  o.mqar_vocab = 16;
  o.steps = 5;
  const Json rows = run_tasks(o);
  ASSERT_EQ(rows.size(), 2u);
  const std::map<std::string, double> golden = {{"dense_full", 2.4750401973724365}, {"gdn", 2.5100643634796143}};
  for (const auto& r : rows) {
    SCOPED_TRACE(r.dump());
    ASSERT_EQ(r["status"], "ok");
    ASSERT_TRUE(r.contains("steps_per_s"));
    EXPECT_GT(r["steps_per_s"].get<double>(), 0.0);
    EXPECT_EQ(r["cuda_graph"], false);
    EXPECT_EQ(r["cuda_graph_reason"], "not on a GPU");
    const double want = golden.at(r["method"].get<std::string>());
    EXPECT_NEAR(r["final_loss"].get<double>(), want, 1e-5 * want);
  }
  RunInfo info;
  info.kind = "tasks";
  info.argv = {"mixbench", "tasks"};
  const Json report = make_report(info, rows);
  EXPECT_TRUE(validate_json(report, report_schema()).empty());
  Json broken = report;
  broken["results"][0]["cuda_graph"] = "yes";
  EXPECT_FALSE(validate_json(broken, report_schema()).empty());
  broken = report;
  broken["results"][0]["steps_per_s"] = -1.0;
  EXPECT_FALSE(validate_json(broken, report_schema()).empty());
  // --graph takes auto or off
  o.graph = "fwd-bwd";
  EXPECT_THROW(run_tasks(o), UsageError);
  EXPECT_EQ(run_cli({"tasks", "--tasks", "mqar", "--graph", "sometimes", "--quiet"}), 2);
}

// A sparse method's full-attention warm-up is resolved from its fraction of the run, as the trainer
// does: the suite trains it (a warm-up left at −1 stopped the whole command at its first step).
TEST(TaskGraph, SparseWarmupIsResolvedFromTheRunLength) {
  TasksOptions o;
  o.methods = {"dsa"};
  o.tasks = {"mqar"};
  o.mqar_lengths = {16};
  o.mqar_pairs = {2};
  o.mqar_widths = {64};
  o.mqar_vocab = 16;
  o.steps = 3;
  o.config = "dsa_topk=8,idx_heads=2,idx_dim=8,idx_rope_dim=4";
  const Json rows = run_tasks(o);
  ASSERT_EQ(rows.size(), 1u);
  ASSERT_EQ(rows[0]["status"], "ok") << rows[0].dump();
  EXPECT_EQ(rows[0]["config"]["full_attention_warmup_steps"], 0);  // round(512/46875 · 3)
  EXPECT_TRUE(std::isfinite(rows[0]["final_loss"].get<double>()));
}

// PlainAdamW with device scalars (here on the CPU) gives the host values' bits at every step of a
// schedule, leaves a parameter without a gradient alone, and its kernels read the buffer.
TEST(TaskGraph, PlainAdamWDeviceScalarsEqualHostValues) {
  const TasksPreset P = small_preset(4);
  const MethodSpec& ms = Registry::get().method("gdn");
  const Config cfg = task_cfg("gdn", P, kMqar);
  auto make = [&] {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(2);
    Model m = build_model(ms, cfg, gen, at::TensorOptions().dtype(at::kFloat));
    for (const auto& [n, t] : m.params) t.requires_grad_(true);
    return m;
  };
  Model a = make(), b = make();
  PlainAdamW host(a, 0.9, 0.999, 1e-8, 0.1), dev(b, 0.9, 0.999, 1e-8, 0.1);
  EXPECT_THROW(dev.apply(b), std::logic_error);
  EXPECT_THROW(dev.write_scalars(0, 1e-3), std::logic_error);
  dev.use_device_scalars();
  EXPECT_TRUE(dev.device_scalars());
  EXPECT_FALSE(host.device_scalars());
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(9);
  const std::string skipped = "wte";
  const at::Tensor wte0 = a.params.at(skipped).detach().clone();
  bool matrices = false, vectors = false;
  for (int64_t it = 0; it < 6; ++it) {
    const double lr = 3e-3 * double(it + 1) / 6.0;
    for (const auto& [n, t] : a.params) {
      at::Tensor g;
      if (n != skipped) g = at::randn(t.sizes(), gen, at::TensorOptions().dtype(at::kFloat));
      t.mutable_grad() = g;
      b.params.at(n).mutable_grad() = g.defined() ? g.clone() : at::Tensor();
      (t.dim() >= 2 ? matrices : vectors) = true;
    }
    host.step(a, it, lr);
    dev.step(b, it, lr);
    for (const auto& [n, t] : a.params)
      EXPECT_TRUE(at::equal(t.detach(), b.params.at(n).detach())) << n << " step " << it;
  }
  EXPECT_TRUE(matrices && vectors);  // both weight-decay slots were exercised
  EXPECT_TRUE(at::equal(a.params.at(skipped).detach(), wte0));
  // apply() reads whatever the buffer holds: another step's values give other parameters
  for (const auto& [n, t] : a.params) {
    at::Tensor g = at::ones(t.sizes(), at::TensorOptions().dtype(at::kFloat));
    t.mutable_grad() = g;
    b.params.at(n).mutable_grad() = g.clone();
  }
  host.step(a, 6, 1e-3);
  dev.write_scalars(0, 1e-2);
  dev.apply(b);
  EXPECT_FALSE(at::equal(a.params.at("layers.0.mixer.o_proj").detach(), b.params.at("layers.0.mixer.o_proj").detach()));
}

// adamw_step_values are the values adamw_update derives (1 − lr·wd, 1 − β2^t, its reciprocal, −lr/(1 − β1^t)).
TEST(TaskGraph, AdamwStepValues) {
  const auto v = adamw_step_values(2e-3, 0.1, 0.9, 0.999, 3, false);
  EXPECT_DOUBLE_EQ(v[0], 1 - 2e-3 * 0.1);
  EXPECT_DOUBLE_EQ(v[1], 1 - std::pow(0.999, 3));
  EXPECT_DOUBLE_EQ(v[2], 1 / (1 - std::pow(0.999, 3)));
  EXPECT_DOUBLE_EQ(v[3], -2e-3 / (1 - std::pow(0.9, 3)));
  const auto s = adamw_step_values(2e-3, 0.1, 0.9, 0.999, 3, true);
  EXPECT_EQ(s[2], double(1.0f / float(1 - std::pow(0.999, 3))));
}

// Which layers a graph cannot replay: a sparse method's full-attention warm-up until it ends, a loop
// depth sampled per step at every step; plain layers never.
TEST(TaskGraph, StepDependence) {
  const TasksPreset P = small_preset(4);
  auto model = [&](const std::string& method, const std::string& extra) {
    const MethodSpec& ms = Registry::get().method(method);
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(1);
    const std::string c = task_model_config(ms, P, kMqar) + extra;
    return build_model(ms, ms.config.parse(c), gen, at::TensorOptions().dtype(at::kFloat));
  };
  const Model dense = model("dense_full", "");
  EXPECT_EQ(step_dependence(dense, 0), "");
  EXPECT_EQ(step_dependence(dense, 1000), "");
  const Model loop = model("huginn", ",n_layer=3");  // a prelude, a core and a coda block
  EXPECT_NE(step_dependence(loop, 5).find("loop depth"), std::string::npos);
  const Model dsa = model("dsa", ",dsa_topk=8,idx_heads=2,idx_dim=8,idx_rope_dim=4,full_attention_warmup_steps=3");
  EXPECT_NE(step_dependence(dsa, 2).find("full-attention warm-up"), std::string::npos);
  EXPECT_EQ(step_dependence(dsa, 3), "");
}

// ------------------------------------------------------------------ GPU
// The whole step captured and replayed trains as the eager step from the same seed: dense attention
// and a gated delta rule on a small MQAR setting, 20 steps of 16 instances (a 2-step warm-up and a
// 4-step warm-down of the learning rate, so a replay of a stale learning rate or bias correction
// would show at once). fp32 compute with TF32 matmuls as the suite runs; the runs differ only in
// non-deterministic accumulation orders and in the AdamW values' route (host values for eager, the
// device buffer for the graph, the same bits), ~1e-7 per step: the losses agree to 1e-4 relative,
// as the trainer's graph test asks, and the trained models' logits on held-out instances to 1e-3 of
// their largest magnitude.
TEST(TaskGraph, CudaCapturedStepTrainsAsEager) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const Tf32Scope tf32(true);
  const TaskSetting s{"mqar", 32, 4, 64, 64, {32}};
  TasksPreset P = tasks_preset("gpu");
  P.batch = 16;
  P.lr = 3e-3;
  const int64_t steps = 20;
  for (const std::string method : {"dense_full", "gdn"}) {
    SCOPED_TRACE(method);
    const MethodSpec& ms = Registry::get().method(method);
    const Config cfg = task_cfg(method, P, s);
    const TaskTraining g = train_task(ms, cfg, s, P, 3, steps, "cuda", "auto");
    const TaskTraining e = train_task(ms, cfg, s, P, 3, steps, "cuda", "off");
    EXPECT_TRUE(g.graph) << g.graph_reason;
    EXPECT_EQ(g.graph_reason, "");
    EXPECT_FALSE(e.graph);
    EXPECT_EQ(e.graph_reason, "--graph off");
    ASSERT_EQ(g.losses.size(), size_t(steps));
    ASSERT_EQ(e.losses.size(), size_t(steps));
    for (int64_t i = 0; i < steps; ++i) {
      EXPECT_TRUE(std::isfinite(g.losses[size_t(i)])) << i;
      EXPECT_NEAR(g.losses[size_t(i)], e.losses[size_t(i)], 1e-4 * std::abs(e.losses[size_t(i)])) << "step " << i;
    }
    EXPECT_LT(g.losses.back(), g.losses.front());  // it trains
    for (const auto& [n, t] : g.model.params) {
      EXPECT_TRUE(t.is_cuda()) << n;
      EXPECT_FALSE(t.grad().defined()) << n;  // the graph's buffers went back before evaluation
    }
    // the trained models agree on held-out instances
    std::vector<ProbeSeq> held;
    for (int64_t i = 0; i < 32; ++i) held.push_back(task_instance(s, 3, TaskSplit::HeldOut, i, s.length));
    at::Tensor x, y;
    task_batch(held, s.length + 1, task_vocab(s), x, y);
    c10::NoGradGuard ng;
    const at::Tensor lg = model_forward(g.model, x.cuda(), Backend::CUDA);
    const at::Tensor le = model_forward(e.model, x.cuda(), Backend::CUDA);
    EXPECT_LE(max_rel(le, lg), 1e-3);
    EXPECT_GT(g.steps_per_s, 0.0);
    EXPECT_GT(e.steps_per_s, 0.0);
    std::cout << fmt::format("[ INFO     ] {}: {:.0f} steps/s captured, {:.0f} steps/s eager\n", method, g.steps_per_s,
                             e.steps_per_s);
  }
}

// Through run_tasks on a GPU: the rows say the graph held the steps (and why not with --graph off),
// and the two runs end at the same loss.
TEST(TaskGraph, CudaRowsRecordTheGraph) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  TasksOptions o;
  o.preset = "gpu";
  o.methods = {"dense_full"};
  o.tasks = {"mqar"};
  o.mqar_lengths = {32};
  o.mqar_pairs = {4};
  o.mqar_widths = {64};
  o.mqar_vocab = 64;
  o.seeds = 1;
  o.steps = 12;
  o.device = "cuda";
  const Json g = run_tasks(o);
  o.graph = "off";
  const Json e = run_tasks(o);
  ASSERT_EQ(g.size(), 1u);
  ASSERT_EQ(e.size(), 1u);
  ASSERT_EQ(g[0]["status"], "ok") << g[0].dump();
  ASSERT_EQ(e[0]["status"], "ok") << e[0].dump();
  EXPECT_EQ(g[0]["cuda_graph"], true) << g[0]["cuda_graph_reason"];
  EXPECT_EQ(g[0]["cuda_graph_reason"], "");
  EXPECT_EQ(e[0]["cuda_graph"], false);
  EXPECT_EQ(e[0]["cuda_graph_reason"], "--graph off");
  EXPECT_GT(g[0]["steps_per_s"].get<double>(), 0.0);
  const double lg = g[0]["final_loss"].get<double>(), le = e[0]["final_loss"].get<double>();
  EXPECT_NEAR(lg, le, 1e-4 * std::abs(le));
  RunInfo info;
  info.kind = "tasks";
  info.argv = {"mixbench", "tasks"};
  EXPECT_TRUE(validate_json(make_report(info, g), report_schema()).empty());
}

// A sparse method in its full-attention warm-up runs eagerly; the step is captured when the warm-up
// ends and then trains as the eager run (to 5% relative, as the trainer's sparse graph test: the
// top-k selections may flip on the non-deterministic rounding of near-equal scores).
TEST(TaskGraph, CudaSparseWarmupThenCapture) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const Tf32Scope tf32(true);
  const TasksPreset P = small_preset(8);
  const MethodSpec& ms = Registry::get().method("dsa");
  const Config cfg =
      task_cfg("dsa", P, kMqar, ",dsa_topk=8,idx_heads=2,idx_dim=8,idx_rope_dim=4,full_attention_warmup_steps=3");
  const TaskTraining g = train_task(ms, cfg, kMqar, P, 2, 10, "cuda", "auto");
  const TaskTraining e = train_task(ms, cfg, kMqar, P, 2, 10, "cuda", "off");
  EXPECT_TRUE(g.graph) << g.graph_reason;
  ASSERT_EQ(g.losses.size(), 10u);
  ASSERT_EQ(e.losses.size(), 10u);
  for (size_t i = 0; i < 10; ++i) {
    EXPECT_TRUE(std::isfinite(g.losses[i])) << i;
    EXPECT_NEAR(g.losses[i], e.losses[i], 0.05 * std::abs(e.losses[i])) << "step " << i;
  }
  // a run that ends inside the warm-up captures nothing and says why
  const TaskTraining w = train_task(ms, cfg, kMqar, P, 2, 3, "cuda", "auto");
  EXPECT_FALSE(w.graph);
  EXPECT_NE(w.graph_reason.find("full-attention warm-up"), std::string::npos) << w.graph_reason;
}

// A looped method samples its depth per step: no graph, every step eager, the reason in the result,
// and the run completes (huginn at 3 layers: the suite's 2 leave it no core block).
TEST(TaskGraph, CudaLoopDepthPerStepTrainsEagerly) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const TasksPreset P = small_preset(8);
  const MethodSpec& ms = Registry::get().method("huginn");
  const TaskTraining t = train_task(ms, task_cfg("huginn", P, kMqar, ",n_layer=3"), kMqar, P, 1, 4, "cuda", "auto");
  EXPECT_FALSE(t.graph);
  EXPECT_NE(t.graph_reason.find("no step was captured: a loop depth sampled per step"), std::string::npos)
      << t.graph_reason;
  ASSERT_EQ(t.losses.size(), 4u);
  for (double l : t.losses) EXPECT_TRUE(std::isfinite(l));
}

// The shared capture: a body that synchronises with the host (a value read back) cannot be captured;
// capture() returns the reason, runs the undo, holds nothing, and the device works on: eager kernels
// run, and a capturable body is then captured and replays with the values its input buffer holds
// at each replay. A body that throws gives its message's first line.
TEST(TaskGraph, CudaStepGraphRecoversFromAFailedCapture) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const auto opt = at::TensorOptions().dtype(at::kFloat).device(at::kCUDA);
  at::Tensor in = at::ones({64}, opt), out;
  StepGraph g;
  g.warm_up([&] { out = in * 2; });
  bool undone = false;
  const std::string failed = g.capture([&] { out = in * (in.sum().item<float>()); }, [&] { undone = true; out = at::Tensor(); });
  EXPECT_FALSE(failed.empty());
  EXPECT_EQ(failed.find('\n'), std::string::npos);
  EXPECT_TRUE(undone);
  EXPECT_FALSE(g.held());
  EXPECT_EQ((in + 1).sum().item<float>(), 128.0f);  // the device still runs eager work
  const std::string thrown = g.capture([&] { throw std::runtime_error("first line\nsecond line"); }, [] {});
  EXPECT_EQ(thrown, "first line");
  EXPECT_FALSE(g.held());
  g.warm_up([&] { out = in * 3 + 1; });
  ASSERT_EQ(g.capture([&] { out = in * 3 + 1; }, [] {}), "");
  EXPECT_TRUE(g.held());
  for (float v : {1.0f, 2.0f, -4.0f}) {
    in.fill_(v);
    g.replay();
    EXPECT_EQ(out.cpu()[7].item<float>(), 3 * v + 1);
  }
  g.reset();
  EXPECT_FALSE(g.held());
  EXPECT_THROW(g.replay(), std::logic_error);
}
