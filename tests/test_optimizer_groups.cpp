// The optimizer groups of mixer parameters (docs/optimizer-groups.md): per-head stacks of linear
// maps go to Muon with each head orthogonalised as its own matrix; decay parameters, biases, norm
// gains and conv taps go to AdamW groups with flash-linear-attention's recipe; `train --dry-run`
// lists every parameter of every registered method once, with its group's lr, betas, eps and decay.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <map>
#include <set>

#include "harness/backbone.h"
#include "harness/cli/cli.h"
#include "harness/registry.h"
#include "suites/train.h"

using namespace mixbench;

namespace {

Model tiny_model(const std::string& method, at::ScalarType dtype = at::kFloat, const std::string& extra = "") {
  const MethodSpec& ms = Registry::get().method(method);
  Config cfg = ms.config.parse(train_preset("tiny").config_for(method) + extra);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(0);
  return build_model(ms, cfg, gen, at::TensorOptions().dtype(dtype));
}

// Gives every parameter a fresh random gradient.
void random_grads(Model& m, at::Generator& gen) {
  for (const auto& [n, t] : m.params) t.mutable_grad() = at::randn(t.sizes(), gen, t.options().requires_grad(false));
}

double rel(const at::Tensor& a, const at::Tensor& b) { return ((a - b).norm() / b.norm()).item<double>(); }

// Per-head stacks of linear maps, found by their real names in the models.
const std::vector<std::pair<const char*, const char*>> kHeadStacks = {
    {"seer", "layers.0.mixer.seer_wq"}, {"seer", "layers.0.mixer.seer_wk"}};

TEST(OptimizerGroups, PerHeadStacksAndBlockMapsAreMuonMatrices) {
  for (const auto& [method, name] : kHeadStacks) {
    Model m = tiny_model(method);
    ASSERT_TRUE(m.params.has(name)) << name;
    ASSERT_EQ(m.params.at(name).dim(), 3) << name;
    TrainHyper h;
    Optimizer opt(m, 1024, h);
    EXPECT_EQ(opt.group_of(name), "muon") << name;
  }
  // NSA's compression maps φ (l·d_k → d_k) are matrices the accountant does not count per token
  Model nsa = tiny_model("nsa");
  TrainHyper h;
  Optimizer opt(nsa, 1024, h);
  for (const char* n : {"layers.0.mixer.nsa_cmp_k", "layers.0.mixer.nsa_cmp_v"}) {
    ASSERT_TRUE(nsa.params.has(n)) << n;
    EXPECT_EQ(opt.group_of(n), "muon") << n;
  }
  // conv taps are no matrix, whatever their rank
  ParamDef taps{"layers.0.mixer.q_conv", {8, 1, 4}, ParamGroup::TransformerMatrix, false, "uniform", -1, 1};
  EXPECT_EQ(resolve_optim_rule(taps).kind, OptimKind::AdamW);
  EXPECT_EQ(resolve_optim_rule(taps).group, "mixer_conv");
}

// Two Muon steps of the optimizer on a per-head stack equal two steps of each head alone (its own
// momentum, its own NorMuon buffer, its own norms and nanochat's lr·max(1, rows/cols)^½ for the
// head's shape), fp64 with Polar Express in fp64.
TEST(OptimizerGroups, EachHeadIsOrthogonalisedAsItsOwnMatrix) {
  for (const auto& [method, name] : kHeadStacks) {
    Model m = tiny_model(method, at::kDouble, ",n_layer=1");
    for (const auto& [n, t] : m.params) t.requires_grad_(true);
    TrainHyper h;
    h.muon_bf16 = false;
    h.batch_tokens_ref = 1024;
    h.schedule.steps = 10;
    h.schedule.warmup = 1;
    Optimizer opt(m, 1024, h);
    ASSERT_EQ(opt.group_of(name), "muon");
    const at::Tensor W0 = m.params.at(name).detach().clone();
    const int64_t H = W0.size(0), rows = W0.size(1), cols = W0.size(2);
    at::Tensor heads = W0.clone();
    at::Tensor b1 = at::zeros_like(W0);
    at::Tensor b2 = rows >= cols ? at::zeros({H, rows, 1}, W0.options()) : at::zeros({H, 1, cols}, W0.options());
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(7);
    at::Tensor G0, after0;
    for (int64_t it = 0; it < 2; ++it) {
      random_grads(m, gen);
      const at::Tensor G = m.params.at(name).grad().clone();
      if (it == 0) G0 = G;
      opt.step(m, it);
      if (it == 0) after0 = m.params.at(name).detach().clone();
      for (int64_t k = 0; k < H; ++k) {
        at::Tensor p = heads[k], buf = b1[k], buf2 = b2[k];
        muon_update(p, G[k], buf, buf2, muon_momentum(h.schedule, it), 0.02 * lr_multiplier(h.schedule, it),
                    muon_weight_decay(h.schedule, it, h.muon_wd), 0.9, false);
      }
      const at::Tensor got = m.params.at(name).detach();
      EXPECT_LT(rel(got, heads), 1e-12) << name << " step " << it;
      // the update moved every head (the comparison is not of two unchanged tensors)
      for (int64_t k = 0; k < H; ++k) EXPECT_GT(rel(got[k], W0[k]), 1e-3) << name << " head " << k;
    }
    // one matrix over all heads ([H·rows, cols]) would not give the first step's update
    at::Tensor whole = W0.reshape({H * rows, cols}).clone(), wb1 = at::zeros_like(whole);
    at::Tensor wb2 = at::zeros({H * rows, 1}, W0.options());
    muon_update(whole, G0.reshape({H * rows, cols}), wb1, wb2, muon_momentum(h.schedule, 0),
                0.02 * lr_multiplier(h.schedule, 0), muon_weight_decay(h.schedule, 0, h.muon_wd), 0.9, false);
    EXPECT_GT(rel(whole.view({H, rows, cols}) - W0, after0 - W0), 1e-2) << name;
  }
}

// The GPU's batching (every Muon matrix of one shape in one stack, the heads of per-head stacks
// among them) gives the same parameters and optimizer state as one parameter at a time, here on the
// CPU: seer's two layers batch their [128, 32] query-gate heads (2 × 4), their [128, 96] key-gate
// heads and their attention and MLP matrices by shape.
TEST(OptimizerGroups, BatchedMatricesEqualOneParameterAtATime) {
  Model a = tiny_model("seer", at::kDouble, ",n_layer=2");
  Model b = tiny_model("seer", at::kDouble, ",n_layer=2");
  for (auto* m : {&a, &b})
    for (const auto& [n, t] : m->params) t.requires_grad_(true);
  TrainHyper h;
  h.muon_bf16 = false;
  h.schedule.steps = 10;
  h.schedule.warmup = 1;
  Optimizer one(a, 1024, h);
  h.muon_batch_on_cpu = true;
  Optimizer batched(b, 1024, h);
  at::Generator ga = at::make_generator<at::CPUGeneratorImpl>(3), gb = at::make_generator<at::CPUGeneratorImpl>(3);
  for (int64_t it = 0; it < 2; ++it) {
    random_grads(a, ga);
    random_grads(b, gb);
    one.step(a, it);
    batched.step(b, it);
  }
  for (const auto& [n, t] : a.params) {
    if (one.group_of(n) != "muon") continue;
    EXPECT_LT(rel(b.params.at(n).detach(), t.detach()), 1e-12) << n;
  }
  const TensorMap sa = one.state(), sb = batched.state();
  for (const auto& [k, t] : sa) EXPECT_LT((sb.at(k).to(at::kDouble) - t.to(at::kDouble)).abs().max().item<double>(), 1e-12) << k;
}

// gdn and kda: A_log and dt_bias in the no-decay group at flame's lr 3e-4·√(B/B_ref), betas
// (0.9, 0.95), eps 1e-15; conv taps AdamW with decay 0.1; the output norm's gain without decay.
TEST(OptimizerGroups, DecayParamsConvTapsAndNormsFollowFla) {
  const double bs = std::sqrt(4096.0 / 1024.0);
  for (const char* method : {"gdn", "kda"}) {
    Model m = tiny_model(method);
    TrainHyper h;
    h.batch_tokens_ref = 1024;
    Optimizer opt(m, 4096, h);
    std::map<std::string, Optimizer::ParamSetting> rows;
    for (const auto& s : opt.settings(m)) rows[s.param] = s;
    auto expect = [&](const std::string& leaf, const char* group, double wd) {
      const std::string name = "layers.0.mixer." + leaf;
      ASSERT_TRUE(rows.count(name)) << method << " " << name;
      const Optimizer::ParamSetting& s = rows.at(name);
      EXPECT_EQ(s.group, group) << method << " " << name;
      EXPECT_EQ(s.optimizer, "adamw") << method << " " << name;
      EXPECT_EQ(s.lr, 3e-4 * bs) << method << " " << name;
      EXPECT_EQ(s.beta1, 0.9) << method << " " << name;
      EXPECT_EQ(s.beta2, 0.95) << method << " " << name;
      EXPECT_EQ(s.eps, 1e-15) << method << " " << name;
      EXPECT_EQ(s.weight_decay, wd) << method << " " << name;
    };
    expect("A_log", "mixer_decay", 0.0);
    expect("dt_bias", "mixer_decay", 0.0);
    expect("q_conv", "mixer_conv", 0.1);
    expect("v_conv", "mixer_conv", 0.1);
    expect("o_norm", "mixer_norm", 0.0);
    if (std::string(method) == "kda") expect("g_proj2_bias", "mixer_bias", 0.0);
  }
  // In the step: with no gradient, A_log and dt_bias stay where they are while conv taps decay by
  // 1 − lr·0.1 (the decay is applied, not only reported).
  Model m = tiny_model("gdn");
  for (const auto& [n, t] : m.params) t.requires_grad_(true);
  TrainHyper h;
  h.batch_tokens_ref = 512;
  h.schedule.steps = 10;
  h.schedule.warmup = 1;
  Optimizer opt(m, 512, h);
  const at::Tensor a0 = m.params.at("layers.0.mixer.A_log").detach().clone();
  const at::Tensor d0 = m.params.at("layers.0.mixer.dt_bias").detach().clone();
  const at::Tensor c0 = m.params.at("layers.0.mixer.q_conv").detach().clone();
  opt.step(m, 0);  // no .grad() anywhere: zero gradients
  EXPECT_TRUE(at::equal(m.params.at("layers.0.mixer.A_log"), a0));
  EXPECT_TRUE(at::equal(m.params.at("layers.0.mixer.dt_bias"), d0));
  EXPECT_TRUE(at::allclose(m.params.at("layers.0.mixer.q_conv"), c0 * (1 - 3e-4 * 0.1), 1e-7, 0));
  EXPECT_FALSE(at::equal(m.params.at("layers.0.mixer.q_conv"), c0));
}

// The dry-run JSON of every registered method: each parameter of the model once, in the group the
// optimizer puts it in, with lr, betas, eps (AdamW) and weight decay; Muon rows with the matrices
// they orthogonalise; one set of hyper-parameters per group name.
TEST(OptimizerGroups, DryRunListsEveryParameterOfEveryMethod) {
  for (const MethodSpec* ms : Registry::get().methods()) {
    TrainOptions o;
    o.method = ms->name;
    o.preset = "tiny";
    const nlohmann::json s = optimizer_settings(o);
    const Model m = tiny_model(ms->name);
    TrainHyper h = train_preset("tiny").hyper;
    const Optimizer opt(m, s["batch_tokens"].get<int64_t>(), h);
    std::map<std::string, nlohmann::json> rows;
    std::map<std::string, nlohmann::json> group_values;
    for (const auto& r : s["params"]) {
      const std::string p = r["param"].get<std::string>();
      EXPECT_TRUE(rows.emplace(p, r).second) << ms->name << ": " << p << " listed twice";
      for (const char* f : {"group", "optimizer", "lr", "beta1", "beta2", "eps", "weight_decay", "shape"})
        EXPECT_TRUE(r.contains(f)) << ms->name << " " << p << " lacks " << f;
      const bool muon = r["optimizer"] == "muon";
      EXPECT_TRUE(muon || r["optimizer"] == "adamw") << ms->name << " " << p;
      EXPECT_GT(r["lr"].get<double>(), 0.0) << ms->name << " " << p;
      EXPECT_GT(r["beta1"].get<double>(), 0.0) << ms->name << " " << p;
      EXPECT_GT(r["beta2"].get<double>(), 0.0) << ms->name << " " << p;
      EXPECT_GE(r["weight_decay"].get<double>(), 0.0) << ms->name << " " << p;
      if (muon) {
        EXPECT_TRUE(r["eps"].is_null()) << ms->name << " " << p;
        const auto shape = r["shape"].get<std::vector<int64_t>>();
        const auto mat = r["matrix"].get<std::vector<int64_t>>();
        ASSERT_GE(shape.size(), 2u) << ms->name << " " << p;
        ASSERT_EQ(mat.size(), 2u) << ms->name << " " << p;
        int64_t numel = 1;
        for (int64_t x : shape) numel *= x;
        EXPECT_EQ(r["matrices"].get<int64_t>() * mat[0] * mat[1], numel) << ms->name << " " << p;
        EXPECT_EQ(r["matrix_lr"].get<double>(),
                  r["lr"].get<double>() * std::sqrt(std::max(1.0, double(mat[0]) / double(mat[1]))));
      } else {
        EXPECT_GT(r["eps"].get<double>(), 0.0) << ms->name << " " << p;
      }
      nlohmann::json v = {r["optimizer"], r["lr"], r["beta1"], r["beta2"], r["eps"], r["weight_decay"]};
      auto [it, fresh] = group_values.emplace(r["group"].get<std::string>(), v);
      EXPECT_TRUE(fresh || it->second == v) << ms->name << ": group " << r["group"] << " has two settings";
    }
    EXPECT_EQ(rows.size(), m.params.size()) << ms->name;
    for (const auto& [name, t] : m.params) {
      ASSERT_TRUE(rows.count(name)) << ms->name << ": " << name << " is not listed";
      EXPECT_EQ(rows[name]["group"], opt.group_of(name)) << ms->name << " " << name;
    }
  }
}

// The table form prints eps and, for a per-head stack, how many matrices of which shape at which lr.
TEST(OptimizerGroups, DryRunTableShowsEpsAndHeadMatrices) {
  testing::internal::CaptureStdout();
  ASSERT_EQ(run_cli({"train", "--method", "seer", "--preset", "tiny", "--dry-run"}), 0);
  const std::string table = testing::internal::GetCapturedStdout();
  EXPECT_NE(table.find(" eps "), std::string::npos) << table;
  Model m = tiny_model("seer");
  const at::Tensor& wq = m.params.at("layers.0.mixer.seer_wq");
  const std::string line = table.substr(table.find("layers.0.mixer.seer_wq"));
  const std::string heads = std::to_string(wq.size(0)) + "x" + std::to_string(wq.size(1)) + "x" + std::to_string(wq.size(2));
  EXPECT_NE(line.substr(0, line.find('\n')).find(heads + " @ "), std::string::npos) << line;
  testing::internal::CaptureStdout();
  ASSERT_EQ(run_cli({"train", "--method", "gdn", "--preset", "tiny", "--dry-run"}), 0);
  const std::string gdn = testing::internal::GetCapturedStdout();
  const std::string a_log = gdn.substr(gdn.find("layers.0.mixer.A_log"));
  EXPECT_NE(a_log.substr(0, a_log.find('\n')).find("1e-15"), std::string::npos) << a_log;
}

}  // namespace
