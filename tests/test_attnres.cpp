// Block Attention Residuals (method attnres, mixers/residual/attnres.h): the grouping rule, the
// depth mix by hand, the reduction to the plain pre-norm residual, reference against fast path,
// conformance catching a broken fast path, decode, the accountant, the CLI's refusal of a grouping
// that does not fit, and the pseudo-queries' optimizer group.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>

#include <cmath>

#include "harness/backbone.h"
#include "harness/cli/cli.h"
#include "harness/errors.h"
#include "harness/flop_counter.h"
#include "harness/registry.h"
#include "mixers/residual/attnres.h"
#include "suites/conformance.h"
#include "suites/conformance_subject.h"
#include "suites/optimizer.h"

namespace mixbench {
namespace {

const at::TensorOptions kF64 = at::TensorOptions().dtype(at::kDouble);
at::Generator gen_of(uint64_t s) { return at::make_generator<at::CPUGeneratorImpl>(s); }
const MethodSpec& attnres() { return Registry::get().method("attnres"); }

TEST(AttnRes, GroupingRuleReproducesSeed001) {
  // seed 001: 23 layers = 46 sublayers in blocks of 3,3,3,3,3,3,3,2 layers
  EXPECT_EQ(attnres_block_size(23, 0), 6);
  EXPECT_EQ(attnres_groups(46, 6), (std::vector<int64_t>{6, 6, 6, 6, 6, 6, 6, 4}));
  // the same rule at other depths: about 8 blocks of whole layers
  EXPECT_EQ(attnres_groups(48, attnres_block_size(24, 0)), std::vector<int64_t>(8, 6));
  EXPECT_EQ(attnres_groups(24, attnres_block_size(12, 0)), std::vector<int64_t>(6, 4));
  EXPECT_EQ(attnres_groups(8, attnres_block_size(4, 0)), std::vector<int64_t>(4, 2));
  EXPECT_EQ(attnres_block_size(4, 3), 3);  // set explicitly
  EXPECT_EQ(attnres_groups(8, 3), (std::vector<int64_t>{3, 3, 2}));
  EXPECT_THROW(attnres_groups(8, 9), InputError);
  EXPECT_THROW(attnres_groups(8, 0), InputError);
  // sources before sublayer j: the embedding and one per block begun before j
  EXPECT_EQ(attnres_sources(0, 6), 1);
  EXPECT_EQ(attnres_sources(1, 6), 2);
  EXPECT_EQ(attnres_sources(6, 6), 2);
  EXPECT_EQ(attnres_sources(7, 6), 3);
  EXPECT_EQ(attnres_sources(46, 6), 9);  // the read-out at 23 layers: embedding + 8 blocks
}

TEST(AttnRes, MixByHand) {
  // three sources of width 2: [1,0], [0,2], [3,3]
  const at::Tensor V = at::tensor({1.0, 0.0, 0.0, 2.0, 3.0, 3.0}, kF64).view({1, 1, 3, 2});
  // zero query: uniform weights, the mean of the sources
  at::Tensor h = attnres_mix(V, at::zeros({2}, kF64)).flatten();
  EXPECT_NEAR(h[0].item<double>(), 4.0 / 3.0, 1e-15);
  EXPECT_NEAR(h[1].item<double>(), 5.0 / 3.0, 1e-15);
  // w = [1,0]: scores w·RMSNorm(v) = 1/√(½ + eps), 0, 3/√(9 + eps)
  const double e = kRmsEps;
  const double s0 = 1.0 / std::sqrt(0.5 + e), s2 = 3.0 / std::sqrt(9.0 + e);
  const double a0 = std::exp(s0), a1 = 1.0, a2 = std::exp(s2), z = a0 + a1 + a2;
  h = attnres_mix(V, at::tensor({1.0, 0.0}, kF64)).flatten();
  EXPECT_NEAR(h[0].item<double>(), (a0 * 1 + a2 * 3) / z, 1e-14);
  EXPECT_NEAR(h[1].item<double>(), (a1 * 2 + a2 * 3) / z, 1e-14);
  // keys are normalised: scaling a source by 10 scales its value, its score only through eps
  const at::Tensor V10 = V.clone();
  V10.select(2, 0).mul_(10.0);
  const double b0 = std::exp(10.0 / std::sqrt(50.0 + e)), z10 = b0 + a1 + a2;
  EXPECT_NEAR(b0 / z10, a0 / z, 1e-6);
  h = attnres_mix(V10, at::tensor({1.0, 0.0}, kF64)).flatten();
  EXPECT_NEAR(h[0].item<double>(), (b0 * 10 + a2 * 3) / z10, 1e-13);
  // without the key norm the weights change (scores 10, 0, 3)
  const at::Tensor raw = attnres_mix(V10, at::tensor({1.0, 0.0}, kF64), /*normalise_keys=*/false).flatten();
  EXPECT_NEAR(raw[0].item<double>(), (std::exp(10.0) * 10 + std::exp(3.0) * 3) / (std::exp(10.0) + 1 + std::exp(3.0)), 1e-12);
  EXPECT_GT(std::abs(raw[0].item<double>() - (b0 * 10 + a2 * 3) / z10), 1e-3);
}

// The mix's products are what the FLOP counter sees: 6·d per source (Σv², w·v, weighted sum).
TEST(AttnRes, MixFlopsAreCounted) {
  c10::NoGradGuard ng;
  at::Generator g = gen_of(1);
  const at::Tensor V = at::randn({2, 5, 4, 8}, g, kF64), w = at::randn({8}, g, kF64);
  FlopCounter fc;
  attnres_mix(V, w);
  EXPECT_DOUBLE_EQ(fc.total(), 6.0 * 8 * 4 * 2 * 5);
}

// A toy depth of J sublayers F_j(h) = tanh(W_j · h/rms(h)) driven through the stream, next to the
// plain pre-norm residual h ← h + F_j(norm(h)). With zero queries every source has weight 1/N_j,
// and the sources partition x + Σ outputs, so the stream reads h_plain / N_j: after the sublayer's
// RMSNorm the same input, the same outputs, the same final state up to scale. With one source (the
// first sublayer, only the embedding) it reads x whatever the query.
struct Toy {
  int64_t J = 6, d = 8;
  at::Tensor x, W, q;  // x [2,3,d], W [J,d,d], queries [J+1,d]
};
Toy toy(uint64_t seed) {
  Toy t;
  at::Generator g = gen_of(seed);
  t.x = at::randn({2, 3, t.d}, g, kF64);
  t.W = at::randn({t.J, t.d, t.d}, g, kF64) / std::sqrt(double(t.d));
  t.q = at::zeros({t.J + 1, t.d}, kF64);
  return t;
}
at::Tensor norm0(const at::Tensor& h) { return h / h.pow(2).mean(-1, true).sqrt(); }
at::Tensor F(const Toy& t, int64_t j, const at::Tensor& h) { return at::tanh(at::matmul(norm0(h), t.W[j].t())); }

// Largest |N_j·read_j − h_plain_j| over the sublayers and the read-out, and the first read.
struct Drive {
  double worst = 0;
  at::Tensor first;
};
Drive drive(const Toy& t, const ResidualStream& s, int64_t S, Backend b) {
  TensorMap P{{"attnres_queries", t.q}};
  TensorMap st = s.begin(t.x, P, b);
  at::Tensor plain = t.x;
  Drive out;
  for (int64_t j = 0; j < t.J; ++j) {
    const Sublayer sub{j / 2, t.J / 2, j / 2, j % 2 ? Sublayer::Kind::Mlp : Sublayer::Kind::Mixer, 0, 1, b};
    const at::Tensor h = s.read(st, sub, P);
    if (j == 0) out.first = h;
    out.worst = std::max(out.worst, (double(attnres_sources(j, S)) * h - plain).abs().max().item<double>());
    s.write(st, sub, F(t, j, h), P);
    plain = plain + F(t, j, plain);
  }
  const at::Tensor fin = s.finish(st, P, b);
  out.worst = std::max(out.worst, (double(attnres_sources(t.J, S)) * fin - plain).abs().max().item<double>());
  return out;
}

TEST(AttnRes, ZeroQueriesReduceToThePlainResidual) {
  for (Backend b : {Backend::CPU, Backend::Reference}) {
    for (int64_t S : {1, 2, 3, 4, 6}) {
      Toy t = toy(5);
      EXPECT_LT(drive(t, *attnres_stream(S), S, b).worst, 1e-12) << "S=" << S << " " << backend_name(b);
      // a missing reset at the block boundaries counts the completed blocks twice
      if (b == Backend::CPU) {
        EXPECT_GT(drive(t, *attnres_stream(S, AttnResFault::NoReset), S, b).worst, 1e-3) << "S=" << S;
      }
      // a non-zero query weights the sources unevenly; the first sublayer still reads x alone
      at::Generator g = gen_of(6);
      t.q = at::randn({t.J + 1, t.d}, g, kF64);
      Drive d = drive(t, *attnres_stream(S), S, b);
      EXPECT_GT(d.worst, 1e-3) << "S=" << S << " " << backend_name(b);
      EXPECT_LT((d.first - t.x).abs().max().item<double>(), 1e-15);
    }
  }
}

// The same reduction in the whole model: attnres with zero queries against dense_full with
// nanochat's stream set to the plain residual (resid = 1, x0 = 0, backout = 0). The states differ by
// the factor 1/N that the RMSNorms remove, up to their eps (1.2e-7 against mean squares ~1).
TEST(AttnRes, ZeroQueriesGiveThePlainResidualModel) {
  const char* shape = "n_layer=3,d_model=32,head_dim=16,vocab=32,seq_len=16";
  const MethodSpec& dense = Registry::get().method("dense_full");
  at::Generator g = gen_of(13), g2 = gen_of(13);
  Model a = build_model(attnres(), attnres().config.parse(std::string(shape) + ",attnres_block=2"), g, kF64, true);
  Model n = build_model(dense, dense.config.parse(shape), g2, kF64, true);
  for (const auto& [name, t] : n.params)
    if (a.params.has(name)) n.params.set(name, a.params.at(name));
  n.params.set("resid_lambdas", at::ones({3}, kF64));
  n.params.set("x0_lambdas", at::zeros({3}, kF64));
  n.params.set("backout_lambda", at::zeros({1}, kF64));
  a.params.set("attnres_queries", at::zeros({7, 32}, kF64));
  const at::Tensor idx = at::randint(32, {2, 9}, g, at::TensorOptions().dtype(at::kLong));
  const at::Tensor plain = model_forward(n, idx, Backend::CPU);
  for (Backend b : {Backend::CPU, Backend::Reference})
    EXPECT_LT((model_forward(a, idx, b) - plain).abs().max().item<double>(), 1e-5) << backend_name(b);
  a.params.set("attnres_queries", at::randn({7, 32}, g, kF64));
  EXPECT_GT((model_forward(a, idx, Backend::CPU) - plain).abs().max().item<double>(), 1e-3);
}

TEST(AttnRes, ReferenceEqualsFastPathAndDecodeEqualsForward) {
  const Config cfg = attnres().config.parse("n_layer=3,d_model=32,head_dim=16,vocab=32,seq_len=16,attnres_block=3");
  at::Generator g = gen_of(7);
  Model m = build_model(attnres(), cfg, g, kF64, /*random_nonzero=*/true);
  EXPECT_EQ(m.stream->name(), "attnres");
  EXPECT_EQ(m.params.at("attnres_queries").sizes(), at::IntArrayRef({7, 32}));
  EXPECT_FALSE(m.params.has("resid_lambdas"));
  EXPECT_FALSE(m.params.has("backout_lambda"));
  const at::Tensor idx = at::randint(32, {2, 11}, g, at::TensorOptions().dtype(at::kLong));
  const at::Tensor fast = model_forward(m, idx, Backend::CPU), ref = model_forward(m, idx, Backend::Reference);
  EXPECT_LT((fast - ref).abs().max().item<double>(), 1e-10);
  // the queries act: other queries, other logits
  Model m2 = m;
  m2.params.set("attnres_queries", m.params.at("attnres_queries") * 0.5);
  EXPECT_GT((model_forward(m2, idx, Backend::CPU) - fast).abs().max().item<double>(), 1e-6);
  // per-token mixing over depth: prefill + decode steps reproduce the forward
  ModelCache cache;
  const at::Tensor pre = model_prefill(m, idx.slice(1, 0, 8), Backend::CPU, &cache);
  EXPECT_LT((pre - fast.slice(1, 7, 8)).abs().max().item<double>(), 1e-10);
  for (int64_t t = 8; t < 11; ++t) {
    const at::Tensor s = model_decode_step(m, idx.slice(1, t, t + 1), cache, Backend::CPU);
    EXPECT_LT((s - fast.slice(1, t, t + 1)).abs().max().item<double>(), 1e-10) << "t=" << t;
  }
}

conformance_detail::Subject subject_with(MethodSpec& spec, AttnResFault fault, const ConformanceOptions& opt) {
  spec.residual = [fault](const Config& c) {
    return attnres_stream(attnres_block_size(c.i("n_layer"), c.i("attnres_block")), fault);
  };
  return conformance_detail::model_subject(spec, opt);
}

TEST(AttnRes, ConformancePassesAndABrokenFastPathFails) {
  ConformanceOptions opt;
  opt.methods = {"attnres"};
  ConformanceSummary s;
  run_conformance(opt, s);  // logits, every parameter gradient, finite differences, decode
  EXPECT_EQ(s.failed, 0);
  EXPECT_EQ(s.errors, 0);
  EXPECT_GE(s.passed, 3 + 3 + 3);  // three cases, their finite differences and decode checks
  opt.finite_differences = false;
  for (AttnResFault fault : {AttnResFault::KeysNotNormalised, AttnResFault::NoReset}) {
    MethodSpec spec = attnres();
    ConformanceSummary b;
    const nlohmann::json rows = conformance_detail::run_subjects({subject_with(spec, fault, opt)}, opt, b);
    int cases = 0;
    for (const auto& r : rows)
      if (r["level"] == "model") {  // logits and gradients against the reference: every case fails
        EXPECT_EQ(r["status"], "fail") << int(fault) << " " << r["case"];
        ++cases;
      }
    EXPECT_EQ(cases, 3) << int(fault);
    EXPECT_EQ(b.failed, 3) << int(fault);  // (prefill + decode still agrees with the broken forward)
  }
}

TEST(AttnRes, AccountantBillsTheMixes) {
  const Config cfg = attnres().config.parse("n_layer=3,d_model=32,head_dim=16,vocab=32,seq_len=16,attnres_block=3");
  const ModelDims d = model_dims(cfg);
  const ExecPlan plan = ExecPlan::stack(3);
  const auto s = model_stream(attnres(), cfg);
  // sources before sublayers 0…5 and at the read-out: 1,2,2,2,3,3,3
  EXPECT_DOUBLE_EQ(s->fwd_flops(d, plan), 6.0 * 32 * 16);
  // the stacked sources in at least FP32 and the FP32 weights of each of the 16 source reads
  EXPECT_DOUBLE_EQ(s->act_bytes(d, plan, 2), 16 * (32.0 * 4 + 4));
  EXPECT_DOUBLE_EQ(s->act_bytes(d, plan, 8), 16 * (32.0 * 8 + 4));
  CostQuery q;
  q.T = 16;
  at::Generator g = gen_of(3);
  const Model m = build_model(attnres(), cfg, g, kF64, true);
  const ModelCost mc = account_model(attnres(), cfg, q);
  EXPECT_EQ(mc.params.total(), count_params(m).total());
  EXPECT_EQ(mc.params.scalars, count_params(m).scalars);
  // against dense_full: 7 pseudo-queries of width 32 instead of nanochat's 3 + 3 + 1 stream scalars
  const MethodSpec& dense = Registry::get().method("dense_full");
  const ModelCost base = account_model(dense, dense.config.parse("n_layer=3,d_model=32,head_dim=16,vocab=32,seq_len=16"), q);
  EXPECT_EQ(mc.params.total() - base.params.total(), 7 * 32 - 7);
  EXPECT_EQ(mc.params.matmul, base.params.matmul);
  EXPECT_DOUBLE_EQ(mc.fwd_flops - base.fwd_flops, 6.0 * 32 * 16);
  EXPECT_DOUBLE_EQ(mc.train_flops_nanochat - base.train_flops_nanochat, 3.0 * 6.0 * 32 * 16);
}

TEST(AttnRes, GroupingThatDoesNotFitIsExit2) {
  EXPECT_THROW(attnres().config.parse("n_layer=2,attnres_block=5"), InputError);
  EXPECT_THROW(attnres().config.parse("attnres_block=-1"), InputError);
  EXPECT_NO_THROW(attnres().config.parse("n_layer=2,attnres_block=4"));
  EXPECT_EQ(run_cli({"account", "--method", "attnres", "--config", "n_layer=2,attnres_block=5"}), 2);
  EXPECT_EQ(run_cli({"account", "--method", "attnres", "--config", "n_layer=2,attnres_block=-2"}), 2);
  EXPECT_EQ(run_cli({"account", "--method", "attnres", "--config", "n_layer=2,d_model=64,head_dim=32,attnres_block=3"}), 0);
}

TEST(AttnRes, QueriesStartAtZeroAndTrainInTheirOwnGroupWithoutDecay) {
  const Config cfg = attnres().config.parse("n_layer=2,d_model=32,head_dim=16,vocab=32,seq_len=16");
  at::Generator g = gen_of(5);
  Model m = build_model(attnres(), cfg, g, at::TensorOptions().dtype(at::kFloat));  // training init
  ASSERT_EQ(m.params.at("attnres_queries").abs().max().item<float>(), 0.0f);
  const OptimRule r = m.defs.at("attnres_queries").optim_rule();
  EXPECT_EQ(r.kind, OptimKind::AdamW);
  EXPECT_EQ(r.group, "attnres_queries");
  EXPECT_EQ(r.wd, 0.0);
  for (const auto& [n, t] : m.params) t.requires_grad_(true);
  const at::Tensor idx = at::randint(32, {2, 16}, g, at::TensorOptions().dtype(at::kLong));
  model_loss(m, idx, idx.roll(-1, 1), Backend::CPU).backward();
  const at::Tensor grad = m.params.at("attnres_queries").grad();
  ASSERT_TRUE(grad.defined());
  EXPECT_GT(grad.abs().max().item<float>(), 0.0f) << "zero queries still receive a gradient";
  EXPECT_EQ(grad[0].abs().max().item<float>(), 0.0f) << "the first sublayer has one source";
  TrainHyper hyper;
  hyper.schedule.steps = 2;
  hyper.schedule.warmup = 1;
  Optimizer opt(m, 2 * 16, hyper);
  EXPECT_EQ(opt.group_of("attnres_queries"), "attnres_queries");
  opt.step(m, 0);
  EXPECT_GT(m.params.at("attnres_queries").abs().max().item<float>(), 0.0f) << "the queries trained";
}

}  // namespace
}  // namespace mixbench
