// loopformer_fixed2 (LoopFormer at two loops): the plan with its auxiliary short route, the (t, Δt)
// conditioning, the adaLN-Zero identity at initialisation and the plain looped stack at unit
// gates, the shortcut-consistency objective and where its gradient stops, the training loss,
// decoding, the accountant and its audit, model-level conformance, training and bad input.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>

#include "harness/backbone.h"
#include "harness/cli/cli.h"
#include "harness/errors.h"
#include "harness/flop_counter.h"
#include "harness/plan.h"
#include "harness/registry.h"
#include "mixers/loop/loopformer.h"
#include "suites/account.h"
#include "suites/conformance.h"
#include "suites/conformance_subject.h"
#include "tests/model_conformance.h"
#include "suites/leaderboard.h"

namespace mixbench {
namespace {

const at::TensorOptions kF64 = at::TensorOptions().dtype(at::kDouble);
const at::TensorOptions kLong = at::TensorOptions().dtype(at::kLong);
at::Generator gen_of(uint64_t s) { return at::make_generator<at::CPUGeneratorImpl>(s); }
double max_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

const char* kName = "loopformer_fixed2";
// two blocks looped twice, d 32
const char* kCfg = "n_layer=2,d_model=32,head_dim=16,seq_len=32,vocab=32,mlp_hidden=32";
const int64_t kD = 32;

const MethodSpec& spec() { return Registry::get().method(kName); }
Config config(const std::string& extra = "") { return spec().config.parse(std::string(kCfg) + (extra.empty() ? "" : "," + extra)); }
Model model(const std::string& extra, uint64_t seed, bool random = true) {
  at::Generator g = gen_of(seed);
  return build_model(spec(), config(extra), g, kF64, random);
}
at::Tensor tokens(uint64_t seed, int64_t B, int64_t T) {
  at::Generator g = gen_of(seed);
  return at::randint(32, {B, T}, g, kLong);
}

// adaLN with no dependence on the conditioning: every gate `gate`, every scale `scale`
void set_modulation(Model& m, double gate, double scale) {
  const at::Tensor w = m.params.at("loopformer_ada_w");
  m.params.set("loopformer_ada_w", at::zeros_like(w));
  at::Tensor b = at::empty({w.size(0), 4 * kD}, kF64);
  b.narrow(1, 0, 2 * kD).fill_(gate);
  b.narrow(1, 2 * kD, 2 * kD).fill_(scale);
  m.params.set("loopformer_ada_b", b);
}

std::vector<int64_t> blocks_of(const ExecPlan& p, int64_t route) {
  std::vector<int64_t> b;
  for (const auto& s : p.steps)
    if (s.route == route) b.push_back(s.block);
  return b;
}

// ---------------------------------------------------------------- plan
TEST(LoopFormerPlan, TwoLoopsThenTheOneLoopRoute) {
  const Model m = model("", 1);
  const ExecPlan& p = m.plan;
  EXPECT_EQ(blocks_of(p, 0), (std::vector<int64_t>{0, 1, 0, 1}));
  EXPECT_EQ(blocks_of(p, 1), (std::vector<int64_t>{0, 1})) << "the shorter schedule: one loop of Δt = 1";
  EXPECT_TRUE(p.has_aux_routes());
  EXPECT_EQ(p.n_slots, 4) << "one decode-cache slot per unrolled step of the model's route";
  for (int64_t s = 4; s < 6; ++s) {
    EXPECT_EQ(p.steps[size_t(s)].slot, -1);
    EXPECT_EQ(p.steps[size_t(s)].iteration, 0) << "iterations count within the route";
    EXPECT_EQ(p.steps[size_t(s)].n_iterations, 1);
    EXPECT_EQ(p.route_pos(s).index, s - 4);
    EXPECT_EQ(p.route_pos(s).length, 2);
  }
  EXPECT_EQ(p.route_pos(3).index, 3);
  EXPECT_EQ(p.route_pos(3).length, 4);
  EXPECT_EQ(m.params.at("resid_lambdas").numel(), 4) << "nanochat's scales per step of the full route";
  // one loop: no shorter schedule, no auxiliary route; a prelude stays outside both loops
  EXPECT_FALSE(model("n_loops=1", 1).plan.has_aux_routes());
  const Model pre = model("n_layer=3,n_prelude=1", 1);
  EXPECT_EQ(blocks_of(pre.plan, 0), (std::vector<int64_t>{0, 1, 2, 1, 2}));
  EXPECT_EQ(blocks_of(pre.plan, 1), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(pre.params.at("loopformer_ada_w").size(0), 2) << "adaLN maps for the two looped blocks only";
}

TEST(LoopFormerPlan, AuxiliaryRoutesAreValidated) {
  ExecPlan p = ExecPlan::loop(2, 0, 0, 2);
  ExecPlan slot = p;
  slot.add_route({0, 1});
  slot.steps[4].slot = 0;
  EXPECT_THROW(slot.validate(), InputError) << "an auxiliary step takes no cache slot";
  ExecPlan order = p;
  order.add_route({0});
  order.steps.push_back({1, 4, 0, 1, 0});
  order.n_slots = 5;
  EXPECT_THROW(order.validate(), InputError) << "the model's route comes first, in one run";
  ExecPlan iters = p;
  iters.add_route({0, 0});
  iters.steps[5].iteration = 0;
  EXPECT_THROW(iters.validate(), InputError) << "iterations count within the route";
  ExecPlan partial = p;
  EXPECT_NO_THROW(partial.add_route({1})) << "an auxiliary route may apply some blocks only";
  EXPECT_THROW(partial.add_route({}), InputError);
}

// ---------------------------------------------------------------- conditioning
TEST(LoopFormerCondition, FrequencyEmbeddingAndTheTwoEmbedders) {
  const at::Tensor e = loopformer::frequency_embedding(0.5, 2, kF64);
  ASSERT_EQ(e.size(0), 2);
  ASSERT_EQ(e.size(1), 256);
  for (int64_t i : {0, 1, 64, 127}) {
    const double f = std::pow(10000.0, -double(i) / 128.0);
    EXPECT_NEAR(e[1][i].item<double>(), std::cos(0.5 * f), 1e-15) << "cosines first, " << i;
    EXPECT_NEAR(e[0][128 + i].item<double>(), std::sin(0.5 * f), 1e-15) << i;
  }
  EXPECT_LT(max_diff(loopformer::ref_frequency_embedding(0.5, 2, kF64), e), 1e-15);
  EXPECT_LT(max_diff(loopformer::frequency_embedding(0.0, 1, kF64).slice(1, 0, 128), at::ones({1, 128}, kF64)), 1e-15);

  const Model m = model("", 3);
  const at::Tensor c00 = loopformer::condition(m.params, 0.0, 0.5, 2, kF64);
  ASSERT_EQ(c00.size(0), 2);
  ASSERT_EQ(c00.size(1), kD);
  EXPECT_LT(max_diff(loopformer::ref_condition(m.params, 0.0, 0.5, 2, kF64), c00), 1e-13);
  // c = te(t) + dte(Δt), each Linear → SiLU → Linear
  auto embed = [&](const std::string& e, double t) {
    const at::Tensor f = loopformer::frequency_embedding(t, 2, kF64);
    const at::Tensor h = at::linear(f, m.params.at("loopformer_" + e + "_w1"), m.params.at("loopformer_" + e + "_b1"));
    return at::linear(h * at::sigmoid(h), m.params.at("loopformer_" + e + "_w2"), m.params.at("loopformer_" + e + "_b2"));
  };
  EXPECT_LT(max_diff(c00, embed("t", 0.0) + embed("dt", 0.5)), 1e-13);
  EXPECT_GT(max_diff(c00, embed("t", 0.0) + embed("t", 0.5)), 1e-3) << "t and Δt have their own embedders";
  EXPECT_GT(max_diff(c00, loopformer::condition(m.params, 0.5, 0.5, 2, kF64)), 1e-3) << "t enters";
  EXPECT_GT(max_diff(c00, loopformer::condition(m.params, 0.0, 1.0, 2, kF64)), 1e-3) << "Δt enters";
  // adaLN: SiLU(c)·Wⱼᵀ + bⱼ, one map per looped block
  const at::Tensor mod = loopformer::modulation(m.params, 1, c00);
  EXPECT_LT(max_diff(mod, at::linear(at::silu(c00), m.params.at("loopformer_ada_w")[1], m.params.at("loopformer_ada_b")[1])), 1e-13);
  EXPECT_LT(max_diff(loopformer::ref_modulation(m.params, 1, c00), mod), 1e-13);
  EXPECT_GT(max_diff(mod, loopformer::modulation(m.params, 0, c00)), 1e-3);
}

// The schedule each route runs: the full route at t ∈ {0, ½} with Δt = ½, the short route at
// t = 0 with Δt = 1. An embedder's first matrix W1 sees t only through f(t) (256 features): a
// change u·vᵀ of W1 with v orthogonal to f(t) for every t a route uses leaves that route's
// logits exactly as they were, and changes them when the route uses some t with v·f(t) ≠ 0.
TEST(LoopFormerCondition, EachRouteRunsItsSchedule) {
  const Model m = model("", 71);
  const at::Tensor idx = tokens(72, 2, 8);
  auto f = [](double t) { return loopformer::frequency_embedding(t, 1, kF64)[0]; };
  at::Generator g = gen_of(73);
  const at::Tensor u = at::randn({kD}, g, kF64), r = at::randn({loopformer::kFreqDim}, g, kF64);
  // r made orthogonal to each f(t) of `ts` (Gram–Schmidt)
  auto orth = [&](std::vector<double> ts) {
    std::vector<at::Tensor> basis;
    at::Tensor v = r.clone();
    for (double t : ts) {
      at::Tensor e = f(t);
      for (const at::Tensor& b : basis) e = e - at::dot(e, b) * b;
      e = e / e.norm();
      basis.push_back(e);
    }
    for (const at::Tensor& b : basis) v = v - at::dot(v, b) * b;
    return v;
  };
  auto exits = [&](const Model& mm) {
    ModelAux a;
    model_forward(mm, idx, Backend::CPU, &a);
    return a.exit_logits;
  };
  const at::Tensor base = exits(m);
  // {full route changed, short route changed} after W1 of embedder `e` moves by u·vᵀ
  auto changed = [&](const char* e, const at::Tensor& v) {
    Model p = m;
    const std::string w = std::string("loopformer_") + e + "_w1";
    p.params.set(w, m.params.at(w) + at::outer(u, v));
    const at::Tensor got = exits(p);
    return std::pair<double, double>{max_diff(got[0], base[0]), max_diff(got[1], base[1])};
  };
  auto expect = [&](const char* e, std::vector<double> ts, bool full, bool shrt) {
    const auto [df, ds] = changed(e, orth(ts));
    if (full) EXPECT_GT(df, 1e-6) << e << ", v orthogonal to " << ts.size() << " values: the full route";
    else EXPECT_LT(df, 1e-12) << e << ", v orthogonal to " << ts.size() << " values: the full route";
    if (shrt) EXPECT_GT(ds, 1e-6) << e << ", v orthogonal to " << ts.size() << " values: the short route";
    else EXPECT_LT(ds, 1e-12) << e << ", v orthogonal to " << ts.size() << " values: the short route";
  };
  expect("t", {0.0, 0.5}, false, false);   // t takes no other value
  expect("t", {0.0}, true, false);         // the full route's second loop runs at t = ½, the short route at 0 only
  expect("t", {0.5}, true, true);          // both run a loop at t = 0
  expect("dt", {0.5, 1.0}, false, false);  // Δt takes no other value
  expect("dt", {0.5}, false, true);        // the full route's loops take Δt = ½ (both)
  expect("dt", {1.0}, true, false);        // the short route's one loop Δt = 1
  // loop k of L at t = k/L, Δt = 1/L; the short route one loop at t = 0, Δt = 1
  loopformer::Layout l;
  l.loops = 3;
  EXPECT_DOUBLE_EQ(l.t_of(0, 2), 2.0 / 3.0);
  EXPECT_DOUBLE_EQ(l.dt_of(0), 1.0 / 3.0);
  EXPECT_DOUBLE_EQ(l.t_of(1, 0), 0.0);
  EXPECT_DOUBLE_EQ(l.dt_of(1), 1.0);
}

// ---------------------------------------------------------------- identities
// adaLN-Zero: at the training initialisation every gate is 0, so the looped blocks contribute
// nothing — the logits do not depend on any block parameter; with the looped blocks' output
// projections non-zero the gates still receive a gradient (with nanochat's zero projections
// they would not).
TEST(LoopFormer, AtInitialisationTheLoopedBlocksContributeNothing) {
  Model m = model("", 5, /*random=*/false);
  EXPECT_EQ(m.params.at("loopformer_ada_w").abs().max().item<double>(), 0.0);
  EXPECT_EQ(m.params.at("loopformer_ada_b").abs().max().item<double>(), 0.0);
  const at::Tensor idx = tokens(6, 2, 9);
  const at::Tensor y0 = model_forward(m, idx, Backend::CPU);
  auto scramble = [](Model& mm, uint64_t seed) {
    at::Generator g = gen_of(seed);
    for (const auto& [n, t] : mm.params)
      if (n.rfind("layers.", 0) == 0) mm.params.set(n, at::randn(t.sizes(), g, kF64));
  };
  Model s = m;
  scramble(s, 7);
  EXPECT_LT(max_diff(model_forward(s, idx, Backend::CPU), y0), 1e-13) << "zero gates: the blocks do not enter";
  // the identity rests on the zero gates: a gate of 0.3 lets the scrambled blocks in
  Model g = m;
  set_modulation(g, 0.3, 0.0);
  Model gs = g;
  scramble(gs, 7);
  EXPECT_GT(max_diff(model_forward(gs, idx, Backend::CPU), model_forward(g, idx, Backend::CPU)), 1e-3);

  // gradients at the initialisation: none for the blocks, some for the adaLN biases (gates)
  // fresh leaves (a copied Model shares its tensors, and .grad accumulates across backward calls)
  auto grads = [&](Model mm) {
    TensorMap leaves;
    for (const auto& [n, t] : mm.params) leaves.set(n, t.detach().clone().requires_grad_(true));
    mm.params = leaves;
    const at::Tensor tgt = tokens(8, 2, 9);
    model_loss(mm, idx, tgt, Backend::CPU).backward();
    return mm;
  };
  const Model gm = grads(m);
  EXPECT_EQ(gm.params.at("layers.0.mlp.c_fc").grad().abs().max().item<double>(), 0.0);
  EXPECT_GT(gm.params.at("loopformer_ada_b").grad().narrow(1, 0, 2 * kD).abs().max().item<double>(), 1e-8);
  // the looped blocks' output projections take N(0, 0.02/√(2·n_layer)): with nanochat's zeros
  // the gates would get no gradient
  Model z = m;
  for (const char* n : {"layers.0.mixer.c_proj", "layers.1.mixer.c_proj", "layers.0.mlp.c_proj", "layers.1.mlp.c_proj"}) {
    EXPECT_GT(m.params.at(n).abs().max().item<double>(), 0.0) << n;
    z.params.set(n, at::zeros_like(m.params.at(n)));
  }
  EXPECT_EQ(grads(z).params.at("loopformer_ada_b").grad().abs().max().item<double>(), 0.0);
}

TEST(LoopFormer, OutputProjectionsTakeTheOriginalsInit) {
  at::Generator g = gen_of(9);
  const Config c = spec().config.parse("n_layer=3,n_prelude=1,d_model=128,head_dim=32,seq_len=32,vocab=32");
  const Model m = build_model(spec(), c, g, kF64);
  const double want = 0.02 / std::sqrt(6.0);
  for (const char* n : {"layers.1.mlp.c_proj", "layers.2.mlp.c_proj", "layers.1.mixer.c_proj"})
    EXPECT_NEAR(m.params.at(n).std().item<double>(), want, 0.05 * want) << n;
  EXPECT_EQ(m.params.at("layers.0.mlp.c_proj").abs().max().item<double>(), 0.0) << "the prelude keeps nanochat's zeros";
  EXPECT_NEAR(m.params.at("loopformer_t_w1").std().item<double>(), 0.02, 0.001);
  EXPECT_EQ(m.params.at("loopformer_t_b1").abs().max().item<double>(), 0.0);
}

// The plain two-loop looped stack: dense_full's blocks under ExecPlan::loop(n, 0, 0, 2) with
// nanochat's stream; loopformer_fixed2 with unit gates and zero scales computes it.
TEST(LoopFormer, UnitGatesAndZeroScalesAreThePlainTwoLoopStack) {
  MethodSpec plain = Registry::get().method("dense_full");
  plain.plan = [](const Config& c) { return ExecPlan::loop(c.i("n_layer"), 0, 0, 2); };
  Model lf = model("", 11);
  at::Generator g = gen_of(12);
  Model pm = build_model(plain, plain.config.parse(kCfg), g, kF64, true);
  for (const auto& [n, t] : pm.params) pm.params.set(n, lf.params.at(n));
  const at::Tensor idx = tokens(13, 2, 11);
  set_modulation(lf, 1.0, 0.0);
  const at::Tensor want = model_forward(pm, idx, Backend::CPU);
  EXPECT_LT(max_diff(model_forward(lf, idx, Backend::CPU), want), 1e-12);
  EXPECT_LT(max_diff(model_forward(lf, idx, Backend::Reference), want), 1e-10);
  // the check fails when a gate or a scale differs
  set_modulation(lf, 0.5, 0.0);
  EXPECT_GT(max_diff(model_forward(lf, idx, Backend::CPU), want), 1e-3);
  set_modulation(lf, 1.0, 0.25);
  EXPECT_GT(max_diff(model_forward(lf, idx, Backend::CPU), want), 1e-3);
}

// ---------------------------------------------------------------- the short route
TEST(LoopFormer, ShortRouteRunsWhenAuxiliaryLossesAreCollected) {
  const Model m = model("", 21);
  const at::Tensor idx = tokens(22, 2, 10);
  ModelAux ac, ar;
  const at::Tensor cpu = model_forward(m, idx, Backend::CPU, &ac), ref = model_forward(m, idx, Backend::Reference, &ar);
  ASSERT_TRUE(ac.exit_logits.defined());
  ASSERT_EQ(ac.exit_logits.size(0), 2);
  EXPECT_LT(max_diff(ref, cpu), 1e-10);
  EXPECT_LT(max_diff(ar.exit_logits, ac.exit_logits), 1e-10);
  ASSERT_TRUE(ac.aux_loss.defined() && ar.aux_loss.defined());
  EXPECT_NEAR(ar.aux_loss.item<double>(), ac.aux_loss.item<double>(), 1e-10);
  EXPECT_TRUE(at::equal(cpu, ac.exit_logits[0])) << "every token reads the full schedule";
  EXPECT_GT(max_diff(ac.exit_logits[0], ac.exit_logits[1]), 1e-3) << "the one-loop schedule reads out differently";
  EXPECT_GT(ac.aux_loss.item<double>(), 1e-6);
  // without collecting auxiliary losses (evaluation): the full route alone, the same logits
  EXPECT_LT(max_diff(model_forward(m, idx, Backend::CPU), cpu), 1e-13);
  // one loop: no shorter schedule, no auxiliary loss
  ModelAux one;
  model_forward(model("n_loops=1", 21), idx, Backend::CPU, &one);
  EXPECT_FALSE(one.exit_logits.defined());
  EXPECT_FALSE(one.aux_loss.defined());
}

TEST(LoopFormerConsistency, ZeroWhenTheRoutesAgreeAndDetachedAtTheFullRoute) {
  at::Generator g = gen_of(31);
  const at::Tensor a = at::randn({2, 5, kD}, g, kF64), b = at::randn({2, 5, kD}, g, kF64);
  auto norm = [](const at::Tensor& x) { return x * at::rsqrt(x.pow(2).mean(-1, true) + 1.1920928955078125e-07); };
  const double want = 0.1 * (norm(a) - norm(b)).pow(2).mean().item<double>();
  EXPECT_NEAR(loopformer::consistency_loss(a, b).item<double>(), want, 1e-14);
  EXPECT_NEAR(loopformer::ref_consistency_loss(a, b).item<double>(), want, 1e-14);
  EXPECT_EQ(loopformer::consistency_loss(a, a).item<double>(), 0.0);
  EXPECT_NEAR(loopformer::consistency_loss(a, 3.0 * a).item<double>(), 0.0, 1e-15) << "compared after the final norm";
  for (bool ref : {false, true}) {
    const at::Tensor la = a.clone().requires_grad_(true), lb = b.clone().requires_grad_(true);
    (ref ? loopformer::ref_consistency_loss(la, lb) : loopformer::consistency_loss(la, lb)).backward();
    EXPECT_FALSE(la.grad().defined()) << "the full route's read-out is the target (detached), ref " << ref;
    EXPECT_GT(lb.grad().abs().max().item<double>(), 0.0);
  }

  // A model whose routes agree: zero gates and nanochat scales at the identity, so both routes
  // read the embedding — no consistency loss, the same logits; a gate makes them differ.
  Model m = model("", 32);
  set_modulation(m, 0.0, 0.0);
  m.params.set("resid_lambdas", at::ones({4}, kF64));
  m.params.set("x0_lambdas", at::zeros({4}, kF64));
  const at::Tensor idx = tokens(33, 2, 7);
  ModelAux same;
  model_forward(m, idx, Backend::CPU, &same);
  EXPECT_EQ(same.aux_loss.item<double>(), 0.0);
  EXPECT_LT(max_diff(same.exit_logits[0], same.exit_logits[1]), 1e-14);
  set_modulation(m, 0.5, 0.1);
  ModelAux diff;
  model_forward(m, idx, Backend::CPU, &diff);
  EXPECT_GT(diff.aux_loss.item<double>(), 1e-6);
}

// The consistency term's gradient stops at the full route (train.py's x1.detach()): the scales of
// the second loop's steps, which only the full route uses, get none from it; the same term without
// the detach would give them one.
TEST(LoopFormerConsistency, GradientStopsAtTheFullRoute) {
  for (Backend b : {Backend::CPU, Backend::Reference}) {
    Model m = model("", 41);
    for (auto& [n, t] : m.params) t.requires_grad_(true);
    const at::Tensor idx = tokens(42, 2, 6);
    ModelAux a;
    model_forward(m, idx, b, &a);
    const at::Tensor h_long = a.exits.hidden[0], h_short = a.exits.hidden[1];
    const at::Tensor& rl = m.params.at("resid_lambdas");
    auto grad_of = [&](const at::Tensor& loss) {
      return torch::autograd::grad({loss}, {rl}, {}, /*retain_graph=*/true, false, /*allow_unused=*/true)[0];
    };
    auto norm = [](const at::Tensor& x) { return x * at::rsqrt(x.pow(2).mean(-1, true) + 1.1920928955078125e-07); };
    const at::Tensor g_stream = grad_of(a.aux_loss);
    const at::Tensor g_detached = grad_of(0.1 * (norm(h_long).detach() - norm(h_short)).pow(2).mean());
    const at::Tensor g_through = grad_of(0.1 * (norm(h_long) - norm(h_short)).pow(2).mean());
    EXPECT_LT(max_diff(g_stream, g_detached), 1e-12) << backend_name(b);
    EXPECT_EQ(g_stream.slice(0, 2, 4).abs().max().item<double>(), 0.0) << "steps 2, 3: the second loop, full route only";
    EXPECT_GT(g_stream.slice(0, 0, 2).abs().max().item<double>(), 1e-8) << "steps 0, 1: shared with the short route";
    EXPECT_GT(g_through.slice(0, 2, 4).abs().max().item<double>(), 1e-8) << "without the detach the full route would learn";
  }
}

// model_loss is train.py's objective: CE(full) + 0.1·CE(short) + 0.1·MSE; the logged loss CE(full).
TEST(LoopFormer, ModelLossIsTheOriginalsObjective) {
  const Model m = model("", 51);
  const at::Tensor idx = tokens(52, 2, 8);
  at::Tensor tgt = tokens(53, 2, 8);
  tgt[1][2].fill_(-1);
  const at::Tensor valid = tgt != -1;
  for (Backend b : {Backend::CPU, Backend::Reference}) {
    at::Tensor lm;
    ModelAux a;
    const at::Tensor loss = model_loss(m, idx, tgt, b, &lm, &a);
    const at::Tensor logp = at::log_softmax(a.exit_logits, -1);
    const at::Tensor ce = -logp.gather(-1, tgt.clamp_min(0).unsqueeze(0).unsqueeze(-1).expand({2, -1, -1, 1})).squeeze(-1);
    const double n = valid.sum().item<double>();
    const double ce_long = (ce[0] * valid).sum().item<double>() / n, ce_short = (ce[1] * valid).sum().item<double>() / n;
    const double mse = loopformer::consistency_loss(a.exits.hidden[0], a.exits.hidden[1]).item<double>();
    EXPECT_NEAR(lm.item<double>(), ce_long, 1e-12) << backend_name(b);
    EXPECT_NEAR(a.aux_loss.item<double>(), 0.1 * ce_short + mse, 1e-12) << backend_name(b);
    EXPECT_NEAR(loss.item<double>(), ce_long + 0.1 * ce_short + mse, 1e-12) << backend_name(b);
  }
  // one loop: the cross-entropy alone
  const Model one = model("n_loops=1", 51);
  at::Tensor lm1;
  ModelAux a1;
  const at::Tensor l1 = model_loss(one, idx, tgt, Backend::CPU, &lm1, &a1);
  EXPECT_EQ(l1.item<double>(), lm1.item<double>());
  EXPECT_FALSE(a1.aux_loss.defined());
}

TEST(LoopFormer, PrefillAndDecodeRunTheFullScheduleOnly) {
  const Model m = model("", 61);
  const at::Tensor idx = tokens(62, 2, 10);
  const at::Tensor full = model_forward(m, idx, Backend::CPU);
  ModelCache cache;
  std::vector<at::Tensor> last = {model_prefill(m, idx.slice(1, 0, 6), Backend::CPU, &cache)};
  ASSERT_EQ(cache.layers.size(), 4u);
  while (cache.pos < 10) last.push_back(model_decode_step(m, idx.slice(1, cache.pos, cache.pos + 1), cache, Backend::CPU));
  EXPECT_LT(max_diff(at::cat(last, 1), full.slice(1, 5, 10)), 1e-10);
}

// ---------------------------------------------------------------- accountant
TEST(LoopFormer, AccountantBillsTheConditioningAndTheShortRouteToTraining) {
  MethodSpec plain = Registry::get().method("dense_full");
  plain.plan = [](const Config& c) { return ExecPlan::loop(c.i("n_layer"), 0, 0, 2); };
  CostQuery q;
  q.T = 32;
  q.context = 32;
  const ModelCost a2 = account_model(spec(), config(), q), a1 = account_model(spec(), config("n_loops=1"), q);
  const ModelCost p2 = account_model(plain, plain.config.parse(kCfg), q);
  const double d = double(kD), T = 32, C = 2;
  // per row (÷T per token): each loop's two embedders and each looped block's adaLN map; per
  // token: the scale and gate products
  const double per_row = 2 * (4 * (256 * d + d * d) + C * 8 * d * d), products = 2 * C * 4 * d;
  EXPECT_NEAR(a2.fwd_flops - p2.fwd_flops, per_row / T + products, 1e-9 * a2.fwd_flops);
  EXPECT_NEAR(a2.uncounted_flops - p2.uncounted_flops, products, 1e-9);
  EXPECT_NEAR(a2.decode_flops - p2.decode_flops, per_row + products, 1e-9 * a2.decode_flops) << "per row at every decode step";
  // the short route is the one-loop model's forward (its blocks, conditioning and head) but the
  // embedding's smear gate (24 matmul parameters), which it shares with the full route; billed to training
  const double smear = 2 * 24;
  EXPECT_NEAR(a2.aux_route_fwd_flops, a1.fwd_flops - smear, 1e-12 * a1.fwd_flops);
  EXPECT_EQ(a1.aux_route_fwd_flops, 0.0);
  EXPECT_NEAR(a2.train_flops_nanochat,
              p2.train_flops_nanochat + 3 * (per_row / T + products) + a1.train_flops_nanochat - 3 * smear,
              1e-12 * a2.train_flops_nanochat);
  EXPECT_EQ(a2.cache_bytes_per_token, p2.cache_bytes_per_token) << "no cache for the short route";
  // parameters once per block, plus the conditioning
  const int64_t cond = 2 * (256 * kD + kD + kD * kD + kD) + 2 * (4 * kD * kD + 4 * kD);
  EXPECT_EQ(a2.params.total(), p2.params.total() + cond);
  EXPECT_EQ(a2.params.matmul, p2.params.matmul);
  at::Generator g = gen_of(1);
  EXPECT_EQ(a2.params.total(), count_params(build_model(spec(), config(), g, kF64)).total());
  // the model's route takes nanochat's per-step layer costs; the short route's two steps are listed after
  ASSERT_EQ(a2.layers.size(), 6u);
  EXPECT_NE(a2.layers[4].formula.find("auxiliary route 1"), std::string::npos);
}

TEST(LoopFormer, AuditCountsBothPasses) {
  for (const std::string extra : {"", ",n_layer=3,n_prelude=1,n_loops=3"}) {
    AccountOptions o;
    o.method = kName;
    o.config = std::string("n_layer=2,d_model=64,head_dim=32,seq_len=48,vocab=64") + extra;
    o.audit = true;
    o.audit_batch = 2;
    const AccountResult r = run_account(o);
    EXPECT_TRUE(r.audit_passed()) << r.row.dump();
    const auto& a = r.row["audit"];
    EXPECT_LE(a["fwd_flops_rel_diff"].get<double>(), 0.02);
    ASSERT_TRUE(a.contains("aux_route_fwd_flops_rel_diff"));
    EXPECT_LE(a["aux_route_fwd_flops_rel_diff"].get<double>(), 0.02);
    EXPECT_NEAR(a["aux_route_fwd_flops_counted_per_token"].get<double>(), r.cost.aux_route_fwd_flops,
                0.05 * r.cost.aux_route_fwd_flops)
        << "the second count runs the short route";
  }
  EXPECT_EQ(run_cli({"account", "--method", kName, "--config", "n_layer=2,d_model=64,head_dim=32,seq_len=32,vocab=64",
                     "--audit"}),
            0);
}

// ---------------------------------------------------------------- conformance
ConformanceSummary conformance(const std::string& dtype, const std::string& fault) {
  return test_support::model_conformance(spec(), dtype, fault);
}

TEST(LoopFormerConformance, ModelLevelAtFp64AndFp32) {
  for (const char* dtype : {"fp64", "fp32"}) {
    const ConformanceSummary s = conformance(dtype, "");
    EXPECT_EQ(s.failed, 0) << dtype;
    EXPECT_EQ(s.errors, 0) << dtype;
    // four cases; decode checks where T ≥ 2 (three), finite differences at fp64 (four)
    EXPECT_EQ(s.passed, std::string(dtype) == "fp64" ? 11 : 7) << dtype;
  }
  for (const char* fault : {"output", "gradient"}) EXPECT_GT(conformance("fp64", fault).failed, 0) << fault;
}

// ---------------------------------------------------------------- training
TEST(LoopFormerTrain, TrainsAndRefusesBadInput) {
  auto train = [](const std::string& cfg, const std::string& steps) {
    return run_cli({"train", "--method", kName, "--config", "n_layer=2,d_model=64,head_dim=32,seq_len=32" + cfg,
                    "--steps", steps, "--batch", "2", "--eval-batches", "1", "--quiet"});
  };
  EXPECT_EQ(train("", "3"), 0);
  EXPECT_EQ(train(",n_loops=0", "2"), 2);
  EXPECT_EQ(train(",n_loops=-1", "2"), 2);
  EXPECT_EQ(train(",n_prelude=2", "2"), 2) << "a prelude of both blocks leaves no looped block";
  EXPECT_EQ(train(",n_prelude=1,n_coda=1", "2"), 2);
  EXPECT_EQ(train(",n_coda=-2", "2"), 2);
  EXPECT_EQ(run_cli({"account", "--method", kName, "--config", "n_layer=3,n_prelude=3"}), 2);
}

TEST(LoopFormerTrain, CalibratesAtEveryPreset) {
  for (const char* preset : {"tiny", "small", "gpu-d12"}) {
    const Calibration c = calibrate(kName, preset);
    EXPECT_TRUE(c.within) << preset << " residual " << c.residual;
  }
}

}  // namespace
}  // namespace mixbench
