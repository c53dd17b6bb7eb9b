// Tests of the optimizer rules parameters declare (ParamDef::optim): today's nanochat groups and lrs
// for the backbone and the mixers, a new parameter with its own AdamW group and init rule trained
// with no change to the optimizer, and the declarations the optimizer refuses.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <set>

#include "harness/backbone.h"
#include "harness/registry.h"
#include "suites/train.h"

using namespace mixbench;

namespace {

Model tiny_model(const std::string& method) {
  const MethodSpec& ms = Registry::get().method(method);
  Config cfg = ms.config.parse(train_preset("tiny").config);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(0);
  return build_model(ms, cfg, gen, at::TensorOptions().dtype(at::kFloat));
}

// The groups and lrs nanochat's table gives each parameter by its role, at batch scale bs and width
// scale ds: the pinned expectation for every parameter of a model.
std::pair<std::string, double> pinned_group(const std::string& name, const ParamDef& d, double bs, double ds) {
  if (name == "wte") return {"wte", 0.3 * bs * ds};
  if (name == "lm_head") return {"lm_head", 0.008 * bs * ds};
  if (name.rfind("ve.", 0) == 0) return {"value_embeds", 0.15 * bs * ds};
  if (name == "resid_lambdas") return {"resid_lambdas", 0.005 * bs};
  if (name == "x0_lambdas") return {"x0_lambdas", 0.5 * bs};
  if (name == "smear_gate" || name == "smear_lambda" || name == "backout_lambda") return {"smear", 0.2};
  if (d.matmul && d.shape.size() == 2) return {"muon", 0.02 * bs};
  // mixer vectors: flash-linear-attention's AdamW lr (3e-4 at 2^19 tokens), by kind
  const std::string leaf = name.substr(name.rfind('.') + 1);
  if (leaf == "A_log" || leaf == "dt_bias") return {"mixer_decay", 3e-4 * bs};
  if (leaf == "q_conv" || leaf == "k_conv" || leaf == "v_conv") return {"mixer_conv", 3e-4 * bs};
  if (leaf == "o_norm") return {"mixer_norm", 3e-4 * bs};
  return {"unexpected parameter " + name, 0.0};
}

TEST(TrainOptimRules, GroupsAndLrsOfEveryParameterArePinned) {
  for (const char* method : {"dense", "gdn", "moba_hybrid"}) {
    Model m = tiny_model(method);
    TrainHyper h;
    h.batch_tokens_ref = 1024;
    Optimizer opt(m, 4096, h);  // batch scale 2
    const double bs = std::sqrt(4096.0 / 1024.0);
    const double ds = std::pow(double(m.dims.d_model) / 768.0, -0.5);
    std::set<std::string> groups;
    for (const auto& [name, t] : m.params) {
      const auto [g, lr] = pinned_group(name, m.defs.at(name), bs, ds);
      EXPECT_EQ(opt.group_of(name), g) << method << " " << name;
      EXPECT_EQ(opt.base_lr(name), lr) << method << " " << name;  // bit for bit
      groups.insert(g);
    }
    EXPECT_TRUE(groups.count("muon") && groups.count("smear") && groups.count("value_embeds")) << method;
    if (std::string(method) == "gdn")
      EXPECT_TRUE(groups.count("mixer_decay") && groups.count("mixer_conv") && groups.count("mixer_norm"));
  }
}

TEST(TrainOptimRules, RampInitIsNanochatsLambdas) {
  Model m = tiny_model("dense");
  const at::Tensor r = m.params.at("resid_lambdas"), x = m.params.at("x0_lambdas");
  const int64_t L = r.size(0);
  ASSERT_EQ(L, 4);
  for (int64_t i = 0; i < L; ++i) {
    const double frac = double(i) / double(L - 1);
    EXPECT_EQ(r[i].item<float>(), float(1.15 - 0.10 * frac)) << i;
    EXPECT_EQ(x[i].item<float>(), float(0.20 - 0.15 * frac)) << i;
  }
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(0);
  at::Tensor one = at::empty({1}, at::kDouble);
  init_param(one, ParamDef{"g", {1}, ParamGroup::Scalar, false, "ramp", 0.5, 9.0}, gen);
  EXPECT_EQ(one.item<double>(), 0.5);  // a single element is the start of the ramp
}

TEST(TrainOptimRules, NewParameterTrainsInItsDeclaredGroup) {
  Model m = tiny_model("dense");
  // A parameter the backbone has never had: logits scaled by its mean; its own AdamW group and a
  // ramp init, declared as data only.
  ParamDef def{"logit_gain", {4}, ParamGroup::Scalar, false, "ramp", 1.0, 0.5,
               adamw_rule("logit_gain", 0.07, 0.8, 0.95, 0.0, false, false)};
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(1);
  at::Tensor gain = at::empty({4}, at::kFloat);
  init_param(gain, def, gen);
  EXPECT_EQ(gain[3].item<float>(), 1.5f);
  m.params.set(def.name, gain);
  m.defs[def.name] = def;
  for (const auto& [n, t] : m.params) t.requires_grad_(true);
  TrainHyper h;
  h.batch_tokens_ref = 2 * 128;
  h.schedule.steps = 3;
  h.schedule.warmup = 1;
  Optimizer opt(m, 2 * 128, h);
  EXPECT_EQ(opt.group_of("logit_gain"), "logit_gain");
  EXPECT_EQ(opt.base_lr("logit_gain"), 0.07);  // as declared: no width or batch scaling
  EXPECT_EQ(opt.group_of("wte"), "wte");
  const at::Tensor gain0 = gain.detach().clone(), wte0 = m.params.at("wte").detach().clone();
  at::Tensor idx = at::randint(0, 257, {2, 129}, gen, at::TensorOptions().dtype(at::kLong));
  for (int64_t it = 0; it < 3; ++it) {
    at::Tensor logits = model_forward(m, idx.slice(1, 0, 128), Backend::CPU) * m.params.at("logit_gain").mean();
    at::Tensor loss = at::cross_entropy_loss(logits.reshape({-1, 257}), idx.slice(1, 1).reshape({-1}));
    loss.backward();
    opt.step(m, it);
    for (const auto& [n, p] : m.params) p.mutable_grad() = at::Tensor();
  }
  EXPECT_FALSE(at::equal(m.params.at("logit_gain"), gain0));
  EXPECT_FALSE(at::equal(m.params.at("wte"), wte0));
  // its optimizer state is checkpointed under the usual names
  EXPECT_TRUE(opt.state().has("m1.logit_gain"));
  EXPECT_TRUE(opt.state().has("m2.logit_gain"));
}

TEST(TrainOptimRules, ConflictingOrImpossibleRulesAreRefused) {
  TrainHyper h;
  {
    Model m = tiny_model("dense");
    // same group name as wte, another lr
    ParamDef def{"extra", {8}, ParamGroup::Scalar, false, "const", 0.0, 0,
                 adamw_rule("wte", 0.1, 0.8, 0.995, 0.001, true, true)};
    m.params.set(def.name, at::zeros({8}));
    m.defs[def.name] = def;
    EXPECT_THROW(Optimizer(m, 512, h), std::logic_error);
  }
  {
    Model m = tiny_model("dense");
    ParamDef def{"extra", {8}, ParamGroup::Scalar, false, "const", 0.0, 0, muon_rule()};  // Muon needs a matrix
    m.params.set(def.name, at::zeros({8}));
    m.defs[def.name] = def;
    EXPECT_THROW(Optimizer(m, 512, h), std::logic_error);
  }
  {
    Model m = tiny_model("dense");
    // the same rule under the same name joins the group
    ParamDef def{"extra", {8}, ParamGroup::Scalar, false, "const", 0.0, 0,
                 adamw_rule("smear", 0.2, 0.8, 0.95, 0.0, false, false)};
    m.params.set(def.name, at::zeros({8}));
    m.defs[def.name] = def;
    Optimizer opt(m, 512, h);
    EXPECT_EQ(opt.group_of("extra"), "smear");
  }
}

}  // namespace
