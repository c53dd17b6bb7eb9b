// The residual-stream family (mixers/residual): residual_standard, hc and mhc. hc at its init is
// residual_standard exactly; mhc's residual map is doubly stochastic; the reference arithmetic and
// the fast path agree; bad configs exit 2; a broken fast path fails conformance; fp32 model-level
// conformance runs; the accountant bills the streams; the leaderboard pairs the family with its control.
#include <gtest/gtest.h>

#include <algorithm>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include "harness/backbone.h"
#include "harness/cli/cli.h"
#include "harness/errors.h"
#include "harness/flop_counter.h"
#include "harness/registry.h"
#include "harness/residual.h"
#include "mixers/residual/streams.h"
#include "suites/conformance.h"
#include "suites/conformance_subject.h"
#include "suites/leaderboard.h"

namespace mixbench {
namespace {

using Json = nlohmann::json;
const at::TensorOptions kF64 = at::TensorOptions().dtype(at::kDouble);
at::Generator gen_of(uint64_t s) { return at::make_generator<at::CPUGeneratorImpl>(s); }
const char* kSmall = "n_layer=3,d_model=32,head_dim=16,vocab=32,seq_len=16";

// A model of `method` with random backbone weights and the stream's own parameters at their
// training init (or random too).
Model model_of(const std::string& method, uint64_t seed, bool stream_at_init, const std::string& extra = "") {
  const MethodSpec& m = Registry::get().method(method);
  const Config cfg = m.config.parse(std::string(kSmall) + (extra.empty() ? "" : "," + extra));
  at::Generator g = gen_of(seed);
  Model model = build_model(m, cfg, g, kF64, /*random_nonzero=*/true);
  if (stream_at_init)
    for (const ParamDef& def : model.stream->params(model.dims, model.plan)) {
      at::Tensor t = model.params.at(def.name);
      init_param(t, def, g);
    }
  return model;
}

at::Tensor tokens(uint64_t seed, int64_t B = 2, int64_t T = 11) {
  at::Generator g = gen_of(seed);
  return at::randint(32, {B, T}, g, at::TensorOptions().dtype(at::kLong));
}

double max_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

TEST(ResidualStreams, RegisteredOnDenseFullsBackbone) {
  for (const char* name : {"residual_standard", "hc", "mhc"}) {
    const MethodSpec& m = Registry::get().method(name);
    EXPECT_EQ(m.family, "residual") << name;
    EXPECT_TRUE(m.model_level()) << name;
    EXPECT_TRUE(m.has_decode()) << name;
    Model model = model_of(name, 1, true);
    EXPECT_FALSE(model.params.has("resid_lambdas")) << name;
    EXPECT_FALSE(model.params.has("backout_lambda")) << name;
    EXPECT_TRUE(model.params.has("ve.2")) << name << ": value embeddings kept";
    EXPECT_TRUE(model.params.has("smear_gate")) << name;
  }
  EXPECT_EQ(Registry::get().method("hc").config.defaults().i("streams"), 4);
  EXPECT_EQ(Registry::get().method("mhc").config.defaults().i("sinkhorn_iters"), 20);
  // the map parameters train in their own AdamW group without weight decay
  Model hc = model_of("hc", 1, true);
  for (const auto& [name, def] : hc.defs)
    if (name.rfind("hc.", 0) == 0) {
      EXPECT_EQ(def.optim_rule().kind, OptimKind::AdamW) << name;
      EXPECT_EQ(def.optim_rule().group, "residual_maps") << name;
      EXPECT_EQ(def.optim_rule().wd, 0.0) << name;
    }
}

// residual_standard is nanochat's stream with resid = 1, x0 = 0 and no backout.
TEST(ResidualStreams, StandardIsThePlainPreNormResidual) {
  Model s = model_of("residual_standard", 3, true);
  MethodSpec dense = Registry::get().method("dense_full");
  at::Generator g = gen_of(3);
  Model n = build_model(dense, s.cfg, g, kF64, true);
  for (const auto& [name, t] : s.params) n.params.set(name, t);
  n.params.set("resid_lambdas", at::ones({3}, kF64));
  n.params.set("x0_lambdas", at::zeros({3}, kF64));
  n.params.set("backout_lambda", at::zeros({1}, kF64));
  const at::Tensor idx = tokens(4);
  EXPECT_LT(max_diff(model_forward(s, idx, Backend::CPU), model_forward(n, idx, Backend::CPU)), 1e-12);
  n.params.set("x0_lambdas", at::full({3}, 0.1, kF64));
  EXPECT_GT(max_diff(model_forward(s, idx, Backend::CPU), model_forward(n, idx, Backend::CPU)), 1e-6);
}

TEST(ResidualStreams, HcAtInitEqualsResidualStandard) {
  Model hc = model_of("hc", 5, /*stream_at_init=*/true);
  Model st = model_of("residual_standard", 5, true);
  std::vector<std::string> names;
  for (const auto& [name, t] : st.params) names.push_back(name);
  for (const auto& name : names) st.params.set(name, hc.params.at(name));  // the same backbone
  const at::Tensor idx = tokens(6);
  const at::Tensor want = model_forward(st, idx, Backend::CPU);
  EXPECT_LT(max_diff(model_forward(hc, idx, Backend::CPU), want), 1e-12);
  EXPECT_LT(max_diff(model_forward(hc, idx, Backend::Reference), want), 1e-12);
  // the equality rests on the init: B₀ ≠ 1 on one stream, A_r0 ≠ I, or a non-zero dynamic
  // projection each change the logits
  auto perturbed = [&](const std::string& name, const std::function<void(at::Tensor&)>& edit) {
    Model m = hc;
    at::Tensor t = hc.params.at(name).clone();
    edit(t);
    m.params.set(name, t);
    return max_diff(model_forward(m, idx, Backend::CPU), want);
  };
  EXPECT_GT(perturbed("hc.static", [](at::Tensor& t) { t[1][2][0].add_(-0.5); }), 1e-6);  // B₀ of stream 2
  EXPECT_GT(perturbed("hc.static", [](at::Tensor& t) { t[0][1][3].add_(-0.1); }), 1e-6);  // A_r0[1,1] = 0.9
  EXPECT_GT(perturbed("hc.dynamic.0", [](at::Tensor& t) { t.fill_(0.3); }), 1e-6);
}

TEST(ResidualStreams, ReferenceEqualsFastPathAtFp64) {
  const at::Tensor idx = tokens(8);
  for (const char* name : {"residual_standard", "hc", "mhc"}) {
    Model m = model_of(name, 9, /*stream_at_init=*/false);  // random, non-trivial maps
    const at::Tensor fast = model_forward(m, idx, Backend::CPU), ref = model_forward(m, idx, Backend::Reference);
    EXPECT_LT(max_diff(fast, ref), 1e-10) << name;
    EXPECT_GT(fast.abs().max().item<double>(), 1e-3) << name;
  }
  // mhc with another stream count and iteration count
  Model m = model_of("mhc", 10, false, "streams=3,sinkhorn_iters=5");
  EXPECT_LT(max_diff(model_forward(m, idx, Backend::CPU), model_forward(m, idx, Backend::Reference)), 1e-10);
}

TEST(ResidualStreams, PrefillAndDecodeEqualTheForward) {
  for (const char* name : {"hc", "mhc"}) {
    Model m = model_of(name, 12, false);
    const at::Tensor idx = tokens(13, 2, 10);
    c10::NoGradGuard ng;
    const at::Tensor full = model_forward(m, idx, Backend::CPU);
    ModelCache cache;
    const at::Tensor pre = model_prefill(m, idx.slice(1, 0, 7), Backend::CPU, &cache);
    EXPECT_LT(max_diff(pre, full.slice(1, 6, 7)), 1e-10) << name;
    for (int64_t t = 7; t < 10; ++t)
      EXPECT_LT(max_diff(model_decode_step(m, idx.slice(1, t, t + 1), cache, Backend::CPU), full.slice(1, t, t + 1)), 1e-10)
          << name << " t=" << t;
  }
}

void expect_doubly_stochastic(const at::Tensor& M, double tol, const std::string& what) {
  const at::Tensor d = M.to(at::kDouble);
  EXPECT_LT((d.sum(-1) - 1).abs().max().item<double>(), tol) << what << ": rows";
  EXPECT_LT((d.sum(-2) - 1).abs().max().item<double>(), tol) << what << ": columns";
  EXPECT_GE(d.min().item<double>(), 0.0) << what;
}

TEST(ResidualStreams, SinkhornIsDoublyStochastic) {
  at::Generator g = gen_of(14);
  // 20 iterations converge to 1e-9 for moderate logits; larger ones need more (columns are only
  // approximately normalised after the final row step)
  const at::Tensor moderate = 0.5 * at::randn({3, 5, 4, 4}, g, kF64), logits = 1.5 * at::randn({3, 5, 4, 4}, g, kF64);
  expect_doubly_stochastic(residual::sinkhorn(moderate, 20), 1e-9, "fp64, 20 iterations");
  expect_doubly_stochastic(residual::sinkhorn(moderate.to(at::kFloat), 20), 1e-3, "fp32, 20 iterations");
  expect_doubly_stochastic(residual::sinkhorn_reference(moderate, 20), 1e-9, "reference, 20 iterations");
  expect_doubly_stochastic(residual::sinkhorn(logits, 60), 1e-9, "fp64, 60 iterations");
  expect_doubly_stochastic(residual::sinkhorn(logits.to(at::kFloat), 20), 1e-3, "fp32, 20 iterations");
  EXPECT_EQ(residual::sinkhorn(logits.to(at::kBFloat16), 20).scalar_type(), at::kFloat) << "coefficients in FP32";
  EXPECT_LT(max_diff(residual::sinkhorn(logits, 7), residual::sinkhorn_reference(logits, 7)), 1e-13);
  // one iteration of a non-trivial matrix: rows sum to 1 (normalised last), columns do not yet
  const at::Tensor one = residual::sinkhorn(logits, 1);
  EXPECT_LT((one.sum(-1) - 1).abs().max().item<double>(), 1e-12);
  EXPECT_GT((one.sum(-2) - 1).abs().max().item<double>(), 1e-2);
  EXPECT_THROW(residual::sinkhorn(logits, 0), InputError);
}

// The residual map the model's fast path builds from random parameters.
TEST(ResidualStreams, MhcResidualMapInTheModelIsDoublyStochastic) {
  Model m = model_of("mhc", 15, false, "sinkhorn_iters=60");
  at::Generator g = gen_of(16);
  const at::Tensor x = at::randn({2, 5, 32}, g, kF64);
  for (Backend b : {Backend::CPU, Backend::Reference}) {
    TensorMap st = m.stream->begin(x, m.params, b);
    const Sublayer s{1, m.plan.n_steps(), 1, Sublayer::Kind::Mlp, 0, 1, b};
    m.stream->read(st, s, m.params);
    if (b == Backend::CPU) {
      expect_doubly_stochastic(st.at("mix"), 1e-9, "model H_res");
    } else {
      at::Tensor rows = at::zeros({2, 5, 4}, kF64), cols = at::zeros({2, 5, 4}, kF64);
      for (int64_t i = 0; i < 4; ++i)
        for (int64_t j = 0; j < 4; ++j) {
          rows.select(-1, i).add_(st.at(fmt::format("mix.{}.{}", i, j)));
          cols.select(-1, j).add_(st.at(fmt::format("mix.{}.{}", i, j)));
        }
      EXPECT_LT((rows - 1).abs().max().item<double>(), 1e-9);
      EXPECT_LT((cols - 1).abs().max().item<double>(), 1e-9);
    }
  }
}

TEST(ResidualStreams, BadConfigsExitTwo) {
  EXPECT_EQ(run_cli({"account", "--method", "hc", "--config", "streams=0"}), 2);
  EXPECT_EQ(run_cli({"account", "--method", "hc", "--config", "streams=-3"}), 2);
  EXPECT_EQ(run_cli({"account", "--method", "mhc", "--config", "streams=0"}), 2);
  EXPECT_EQ(run_cli({"account", "--method", "mhc", "--config", "sinkhorn_iters=0"}), 2);
  EXPECT_EQ(run_cli({"account", "--method", "mhc", "--config", "sinkhorn_iters=20"}), 0);
  EXPECT_THROW(residual::hc_stream(0), InputError);
  EXPECT_THROW(residual::mhc_stream(4, 0), InputError);
}

// The stream's arithmetic in the accountant: parameters exact, forward FLOPs within 2% of what
// LibTorch executes plus the documented element-wise part, n-stream activations.
TEST(ResidualStreams, AccountantBillsTheStreams) {
  const MethodSpec& dense = Registry::get().method("residual_standard");
  CostQuery q{16, 16, 2};
  const ModelCost base = account_model(dense, dense.config.parse(kSmall), q);
  for (const char* name : {"hc", "mhc"}) {
    const MethodSpec& m = Registry::get().method(name);
    const Config cfg = m.config.parse(kSmall);
    const ModelCost mc = account_model(m, cfg, q);
    Model model = model_of(name, 17, false);
    EXPECT_EQ(count_params(model).total(), mc.params.total()) << name;
    EXPECT_EQ(count_params(model).matmul, mc.params.matmul) << name;
    EXPECT_GT(mc.fwd_flops, base.fwd_flops) << name;
    EXPECT_GT(mc.uncounted_flops, 0.0) << name;
    EXPECT_GT(mc.act_bytes, base.act_bytes + 6 * 4 * 32 * 2) << name << ": n streams per sublayer";
    const at::Tensor idx = tokens(18, 2, 16);
    c10::NoGradGuard ng;
    FlopCounter fc;
    model_forward(model, idx, Backend::CPU);
    const double counted = fc.total() / 32.0 + mc.uncounted_flops;
    EXPECT_NEAR(counted / mc.fwd_flops, 1.0, 0.02) << name;
    // more Sinkhorn iterations, more FLOPs
    if (std::string(name) == "mhc") {
      EXPECT_GT(account_model(m, cfg.with("sinkhorn_iters", int64_t(40)), q).fwd_flops, mc.fwd_flops);
    }
  }
}

// A stream whose fast path alters its stream mix after computing it (the reference path is left
// alone): A_r instead of A_rᵀ in hc, H_resᵀ in mhc, as a wrong index order would give.
class Tampered final : public ResidualStream {
 public:
  explicit Tampered(std::shared_ptr<const ResidualStream> inner) : inner_(std::move(inner)) {}
  std::string name() const override { return inner_->name(); }
  std::vector<ParamDef> params(const ModelDims& d, const ExecPlan& p) const override { return inner_->params(d, p); }
  TensorMap begin(const at::Tensor& x, const TensorMap& P, Backend b) const override { return inner_->begin(x, P, b); }
  at::Tensor read(TensorMap& st, const Sublayer& s, const TensorMap& P) const override {
    at::Tensor h = inner_->read(st, s, P);
    if (s.backend != Backend::Reference) st.set("mix", st.at("mix").transpose(-1, -2));
    return h;
  }
  void write(TensorMap& st, const Sublayer& s, const at::Tensor& y, const TensorMap& P) const override {
    inner_->write(st, s, y, P);
  }
  at::Tensor finish(TensorMap& st, const TensorMap& P, Backend b) const override { return inner_->finish(st, P, b); }

 private:
  std::shared_ptr<const ResidualStream> inner_;
};

// Model-level conformance of m at dtype, without finite differences; `only`: that case alone.
Json conformance_of(const MethodSpec& m, const std::string& dtype, ConformanceSummary& sum, const std::string& only = "") {
  ConformanceOptions opt;
  opt.methods = {m.name};
  opt.dtype = dtype;
  opt.finite_differences = false;
  conformance_detail::Subject s = conformance_detail::model_subject(m, opt);
  if (!only.empty())
    s.cases.erase(std::remove_if(s.cases.begin(), s.cases.end(), [&](const CaseDef& c) { return c.label != only; }),
                  s.cases.end());
  return conformance_detail::run_subjects({s}, opt, sum);
}

TEST(ResidualStreams, ABrokenFastPathFailsConformance) {
  for (const char* name : {"hc", "mhc"}) {
    MethodSpec broken = Registry::get().method(name);
    auto make = broken.residual;
    broken.residual = [make](const Config& c) { return std::make_shared<Tampered>(make(c)); };
    ConformanceSummary sum;
    const Json rows = conformance_of(broken, "fp64", sum, "model_n2_B2_T9");
    ASSERT_GE(rows.size(), 1u) << name;
    EXPECT_EQ(rows[0]["level"], "model") << name;
    EXPECT_EQ(rows[0]["status"], "fail") << name;  // the case (its decode invariant compares the fast path with itself)
    EXPECT_EQ(sum.failed, 1) << name;
  }
}

// fp32 against the model thresholds: every case runs (none skipped) and passes, the decode
// invariant included (fp64 with finite differences: `mixbench conformance` and the Mutation test).
TEST(ResidualStreams, ModelConformanceAtFp32) {
  for (const char* name : {"residual_standard", "hc", "mhc"}) {
    for (const char* dtype : {"fp32"}) {
      ConformanceSummary sum;
      const Json rows = conformance_of(Registry::get().method(name), dtype, sum);
      EXPECT_EQ(sum.failed, 0) << name << " " << dtype;
      EXPECT_EQ(sum.errors, 0) << name << " " << dtype;
      EXPECT_EQ(sum.skipped, 0) << name << " " << dtype;
      int model = 0, fd = 0, decode = 0;
      for (const auto& r : rows) {
        model += r["level"] == "model";
        fd += r["level"] == "fd";
        decode += r["level"] == "invariant";
        EXPECT_EQ(r["status"], "pass") << r.dump().substr(0, 2000);
      }
      EXPECT_EQ(model, 3) << name << " " << dtype;
      EXPECT_EQ(decode, 2) << name << " " << dtype;
      EXPECT_EQ(fd, 0) << name;
    }
  }
}

// The leaderboard's iso-FLOP calibration finds a shape within ±2% of the anchor for every stream
// (mhc's maps cost a few percent more than dense_full: a narrower MLP or another shape pays for them).
TEST(ResidualStreams, CalibrateWithinTwoPercent) {
  for (const char* preset : {"tiny", "small", "gpu-d12"})
    for (const char* name : {"residual_standard", "hc", "mhc"}) {
      const Calibration c = calibrate(name, preset);
      EXPECT_TRUE(c.within) << name << " at " << preset << ": " << c.residual;
      EXPECT_LE(std::abs(c.residual), 0.02) << name << " at " << preset;
    }
}

Json run_row(const std::string& method, uint64_t seed, double bpb) {
  return {{"status", "ok"}, {"method", method}, {"seed", seed}, {"val_bpb", bpb}, {"tokens_per_s", 1.0},
          {"seconds", 1.0}, {"steps", 2}, {"tokens", 128}, {"train_flops_per_token_nanochat", 1.0}};
}

TEST(ResidualStreams, LeaderboardPairsTheFamilyWithItsControl) {
  std::vector<Json> runs;
  const std::vector<std::pair<std::string, std::vector<double>>> vals = {
      {"dense_full", {2.0, 2.1}}, {"residual_standard", {2.2, 2.4}}, {"hc", {2.1, 2.2}}, {"mqa", {2.5, 2.5}}};
  for (const auto& [m, v] : vals)
    for (size_t s = 0; s < v.size(); ++s) runs.push_back(run_row(m, s, v[s]));
  std::string md;
  const Json rows = leaderboard_rows({"dense_full", "residual_standard", "hc", "mqa"}, runs, "dense_full", md);
  ASSERT_EQ(rows.size(), 4u);
  const Json& hc = rows[2];
  EXPECT_EQ(hc["method"], "hc");
  EXPECT_NEAR(hc["delta_vs_dense_full"].get<double>(), 0.1, 1e-12);
  EXPECT_EQ(hc["residual_control"], "residual_standard");
  EXPECT_NEAR(hc["residual_delta"].get<double>(), -0.15, 1e-12);
  EXPECT_TRUE(hc["residual_delta_ci95"].is_array());
  EXPECT_FALSE(rows[1].contains("residual_delta")) << "the control itself";
  EXPECT_FALSE(rows[3].contains("residual_delta")) << "not a residual-stream method";
  EXPECT_NE(md.find("Δ vs residual_standard"), std::string::npos) << md;
  EXPECT_NE(md.find("-0.1500"), std::string::npos) << md;
  // without the control in the lineup: no second difference
  std::vector<Json> no_control;
  for (const auto& r : runs)
    if (r["method"] != "residual_standard") no_control.push_back(r);
  const Json rows2 = leaderboard_rows({"dense_full", "hc", "mqa"}, no_control, "dense_full", md);
  EXPECT_FALSE(rows2[1].contains("residual_delta"));
  EXPECT_EQ(md.find("Δ vs residual_standard"), std::string::npos);
}

}  // namespace
}  // namespace mixbench
