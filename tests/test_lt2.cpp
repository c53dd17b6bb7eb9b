// LT2 (mixers/loop/lt2.cpp): the whole stack looped with the cross-loop residual ρ, its layouts,
// its accounting, its decode caches, and conformance failing when the fast path ignores ρ.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "harness/backbone.h"
#include "harness/cli/cli.h"
#include "harness/errors.h"
#include "harness/io.h"
#include "harness/registry.h"
#include "harness/residual.h"
#include "mixers/loop/lt2_stream.h"
#include "suites/conformance.h"
#include "suites/conformance_subject.h"
#include "suites/leaderboard.h"

namespace mixbench {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
const at::TensorOptions kF64 = at::TensorOptions().dtype(at::kDouble);
at::Generator gen_of(uint64_t s) { return at::make_generator<at::CPUGeneratorImpl>(s); }
double max_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }
const char* kTiny = "n_layer=2,d_model=32,head_dim=16,vocab=32,seq_len=32,gate_bias_offset=-5";

fs::path lt2_tmp() {
  static fs::path d = [] {
    fs::path p = fs::temp_directory_path() / fmt::format("mixbench_lt2_test_{}", ::getpid());
    fs::create_directories(p);
    return p;
  }();
  return d;
}

TEST(Lt2, RhoZeroIsTheLoopedStackAndRhoActs) {
  const MethodSpec& spec = Registry::get().method("lt2_gdn");
  const Config cfg = spec.config.parse(std::string(kTiny) + ",lt2_loops=3");
  at::Generator g = gen_of(3);
  Model m = build_model(spec, cfg, g, kF64, /*random_nonzero=*/true);
  ASSERT_EQ(m.plan.n_steps(), 6);
  ASSERT_EQ(m.params.at("lt2_rho").sizes(), at::IntArrayRef({2, 32})) << "one per-channel ρ per loop boundary";
  // The same looped plan under nanochat's plain stream: no cross-loop term.
  MethodSpec plain = spec;
  plain.residual = nullptr;
  at::Generator g2 = gen_of(3);
  Model n = build_model(plain, cfg, g2, kF64, true);
  for (const auto& [name, t] : n.params) n.params.set(name, m.params.at(name));
  EXPECT_FALSE(n.params.has("lt2_rho"));
  at::Tensor idx = at::randint(32, {2, 11}, g, at::TensorOptions().dtype(at::kLong));
  const at::Tensor without = model_forward(n, idx, Backend::CPU);
  m.params.set("lt2_rho", at::zeros({2, 32}, kF64));
  EXPECT_LT(max_diff(model_forward(m, idx, Backend::CPU), without), 1e-12);
  EXPECT_LT(max_diff(model_forward(m, idx, Backend::Reference), without), 1e-12);
  // ρ ≠ 0 changes the logits, and only the second boundary's ρ acts on the second boundary
  at::Tensor rho = at::zeros({2, 32}, kF64);
  rho[1].normal_(0.0, 0.5, g);
  m.params.set("lt2_rho", rho);
  const at::Tensor with = model_forward(m, idx, Backend::CPU);
  EXPECT_GT(max_diff(with, without), 1e-6);
  // the reference stream's own arithmetic agrees with the fast path
  EXPECT_LT(max_diff(model_forward(m, idx, Backend::Reference), with), 1e-10);
}

// h⁽τ⁾ = h̃⁽τ⁾ + ρ_τ ⊙ h⁽τ⁻¹⁾ checked on the stream alone: two blocks, two loops, sublayer outputs given.
TEST(Lt2, StreamAddsRhoTimesThePreviousLoopsState) {
  auto s = lt2_stream(2, 2);
  ModelDims d{2, 4, 1, 4, 8, 8, 16};
  ExecPlan plan = ExecPlan::from_blocks(2, {0, 1, 0, 1});
  TensorMap P;
  for (const auto& def : s->params(d, plan)) P.set(def.name, at::zeros(def.shape, kF64));
  P.set("resid_lambdas", at::ones({4}, kF64));
  at::Tensor rho = at::tensor({0.5, -1.0, 2.0, 0.25}, kF64);
  P.set("lt2_rho", rho.view({1, 4}));
  at::Generator g = gen_of(1);
  const at::Tensor x = at::randn({1, 3, 4}, g, kF64);
  for (Backend b : {Backend::CPU, Backend::Reference}) {
    TensorMap st = s->begin(x, P, b);
    at::Tensor h = x, h1;
    for (int64_t step = 0; step < 4; ++step)
      for (auto kind : {Sublayer::Kind::Mixer, Sublayer::Kind::Mlp}) {
        Sublayer sl{step, 4, step % 2, kind, step / 2, 2, b};
        EXPECT_LT(max_diff(s->read(st, sl, P), h), 1e-15);
        const at::Tensor y = at::randn({1, 3, 4}, g, kF64);
        s->write(st, sl, y, P);
        h = h + y;
        if (kind == Sublayer::Kind::Mlp && step == 1) h1 = h;                // h⁽¹⁾
        if (kind == Sublayer::Kind::Mlp && step == 3) h = h + rho * h1;      // h⁽²⁾
      }
    EXPECT_LT(max_diff(s->finish(st, P, b), h), 1e-14) << backend_name(b);
  }
  EXPECT_DOUBLE_EQ(s->fwd_flops(d, plan), 2.0 * 4);
  EXPECT_THROW(lt2_stream(2, 0), InputError);
}

TEST(Lt2, OneLoopIsTheUnloopedStack) {
  for (const char* name : {"lt2_gdn", "lt2_hybrid_full_gdn"}) {
    const MethodSpec& spec = Registry::get().method(name);
    const Config cfg = spec.config.parse(std::string(kTiny) + ",lt2_loops=1");
    at::Generator g = gen_of(5);
    Model m = build_model(spec, cfg, g, kF64, true);
    EXPECT_FALSE(m.params.has("lt2_rho"));
    // the unlooped stack of the same layer methods: gdn, or its registered full:GDN layout's
    // methods (a plain hybrid over the same layout)
    MethodSpec plain = spec;
    plain.plan = nullptr;
    plain.residual = nullptr;
    at::Generator g2 = gen_of(9);
    Model n = build_model(plain, cfg, g2, kF64, true);
    ASSERT_EQ(n.params.size(), m.params.size()) << name << ": the same parameters";
    for (const auto& [pn, t] : n.params) n.params.set(pn, m.params.at(pn));
    EXPECT_EQ(m.layer_mixers, n.layer_mixers);
    at::Tensor idx = at::randint(32, {1, 13}, g, at::TensorOptions().dtype(at::kLong));
    EXPECT_LT(max_diff(model_forward(m, idx, Backend::CPU), model_forward(n, idx, Backend::CPU)), 1e-12) << name;
    EXPECT_LT(max_diff(model_forward(m, idx, Backend::Reference), model_forward(n, idx, Backend::Reference)), 1e-12)
        << name;
  }
  // lt2_gdn at one loop is the registered gdn stack itself
  const MethodSpec& lt2 = Registry::get().method("lt2_gdn");
  const MethodSpec& gdn = Registry::get().method("gdn");
  const Config cfg = lt2.config.parse(std::string(kTiny) + ",lt2_loops=1");
  at::Generator g = gen_of(7);
  Model m = build_model(lt2, cfg, g, kF64, true);
  Model n = build_model(gdn, gdn.config.parse(kTiny), g, kF64, true);
  ASSERT_EQ(n.params.size(), m.params.size());
  for (const auto& [pn, t] : n.params) n.params.set(pn, m.params.at(pn));
  at::Tensor idx = at::randint(32, {2, 10}, g, at::TensorOptions().dtype(at::kLong));
  EXPECT_LT(max_diff(model_forward(m, idx, Backend::CPU), model_forward(n, idx, Backend::CPU)), 1e-12);
}

TEST(Lt2, HybridLayouts) {
  const MethodSpec& fg = Registry::get().method("lt2_hybrid_full_gdn");
  const Config cfg = fg.config.parse(std::string(kTiny) + ",n_layer=10,lt2_loops=2");
  const std::vector<LayerMethod> lm = layer_methods(fg, cfg);
  ASSERT_EQ(lm.size(), 10u);
  int full = 0;
  for (size_t i = 0; i < lm.size(); ++i) {
    const std::string want = i % 5 == 0 ? "dense_full" : "gdn";
    EXPECT_EQ(lm[i].method->name, want) << "block " << i;
    full += lm[i].method->name == "dense_full";
  }
  EXPECT_EQ(full, 2) << "full : GDN = 1 : 4";
  const ExecPlan p = model_plan(fg, cfg);
  ASSERT_EQ(p.n_steps(), 20);
  EXPECT_EQ(p.steps[13].block, 3);
  EXPECT_EQ(p.steps[13].iteration, 1);
  // the tiny preset's four blocks still hold a full-attention layer
  const std::vector<LayerMethod> four = layer_methods(fg, cfg.with("n_layer", int64_t(4)));
  EXPECT_EQ(four[0].method->name, "dense_full");
  EXPECT_EQ(four[3].method->name, "gdn");
  const MethodSpec& gd = Registry::get().method("lt2_hybrid_gdn_dsa");
  const std::vector<LayerMethod> gdl = layer_methods(gd, gd.config.parse(std::string(kTiny) + ",n_layer=6"));
  EXPECT_EQ(gdl[0].method->name, "gdn");
  EXPECT_EQ(gdl[1].method->name, "dsa");
  EXPECT_EQ(gdl[5].method->name, "gdn");
  // the SDPA output gate: dense_full's out_gate on the full-attention layers only
  const Config gated = cfg.with("out_gate", true);
  at::Generator g = gen_of(2);
  Model m = build_model(fg, gated, g, kF64, true);
  EXPECT_TRUE(m.params.has("layers.0.mixer.c_gate"));
  EXPECT_FALSE(m.params.has("layers.1.mixer.c_gate"));
  EXPECT_FALSE(fg.config.defaults().b("out_gate")) << "off by default";
  EXPECT_EQ(fg.config.defaults().i("lt2_loops"), 4);
  EXPECT_EQ(fg.family, "loop");
}

TEST(Lt2, AccountantCountsEveryLoop) {
  const MethodSpec& lt2 = Registry::get().method("lt2_gdn");
  const MethodSpec& gdn = Registry::get().method("gdn");
  const std::string shape = "n_layer=2,d_model=64,head_dim=32,vocab=64,seq_len=64";
  CostQuery q;
  q.T = 64;
  q.context = 64;
  const ModelCost a = account_model(lt2, lt2.config.parse(shape + ",lt2_loops=3"), q);
  const ModelCost b = account_model(gdn, gdn.config.parse(shape), q);
  // parameters per block: gdn's, plus 2 ρ vectors and 4 more resid / x0 scales
  EXPECT_EQ(a.params.matmul, b.params.matmul);
  EXPECT_EQ(a.params.total(), b.params.total() + 2 * 64 + 8);
  // FLOPs per application: the blocks (all of gdn's FLOPs but the head's) three times, plus ρ's
  const double head = 2.0 * (64 * 64 + 24);  // lm_head and the smear gate run once
  EXPECT_NEAR(a.fwd_flops, 3.0 * (b.fwd_flops - head) + head + 2.0 * 2 * 64, 1e-9 * a.fwd_flops);
  EXPECT_NEAR(a.state_bytes, 3.0 * b.state_bytes, 1e-9 * a.state_bytes) << "one recurrent state per application";
  ASSERT_EQ(a.layers.size(), 6u);
  // the built model has the accountant's parameters, and the FLOP audit agrees
  for (const auto& [name, extra] : std::vector<std::pair<std::string, std::string>>{
           {"lt2_gdn", ""}, {"lt2_hybrid_full_gdn", ""}, {"lt2_hybrid_gdn_dsa", ",dsa_topk=16,idx_heads=2,idx_dim=16,idx_rope_dim=8"}}) {
    const fs::path out = lt2_tmp() / fmt::format("{}_acct.json", name);
    ASSERT_EQ(run_cli({"account", "--method", name, "--config",
                       "n_layer=3,d_model=64,head_dim=32,vocab=64,seq_len=64,lt2_loops=2" + extra, "--audit", "--out",
                       out.string()}),
              0);
    Json r = Json::parse(read_file(out.string()));
    EXPECT_TRUE(r["results"][0]["audit"]["params_match"].get<bool>()) << name;
    EXPECT_LT(r["results"][0]["audit"]["fwd_flops_rel_diff"].get<double>(), 1e-3) << name;
  }
}

TEST(Lt2, DecodeKeepsOneCachePerApplication) {
  for (const char* name : {"lt2_gdn", "lt2_hybrid_full_gdn"}) {
    const MethodSpec& spec = Registry::get().method(name);
    const Config cfg = spec.config.parse(std::string(kTiny) + ",lt2_loops=3");
    at::Generator g = gen_of(11);
    Model m = build_model(spec, cfg, g, kF64, true);
    at::Tensor idx = at::randint(32, {2, 12}, g, at::TensorOptions().dtype(at::kLong));
    const at::Tensor full = model_forward(m, idx, Backend::CPU);
    ModelCache cache;
    const at::Tensor pre = model_prefill(m, idx.slice(1, 0, 8), Backend::CPU, &cache);
    ASSERT_EQ(cache.layers.size(), 6u) << name;
    EXPECT_LT(max_diff(pre, full.slice(1, 7, 8)), 1e-10) << name;
    for (int64_t t = 8; t < 12; ++t)
      EXPECT_LT(max_diff(model_decode_step(m, idx.slice(1, t, t + 1), cache, Backend::CPU), full.slice(1, t, t + 1)), 1e-10)
          << name << " t=" << t;
  }
}

// A stream that ignores ρ outside the reference pass: LT2's stream with ρ zeroed in the fast path.
class IgnoreRhoFast final : public ResidualStream {
 public:
  explicit IgnoreRhoFast(std::shared_ptr<const ResidualStream> s) : s_(std::move(s)) {}
  std::string name() const override { return "lt2_ignoring_rho"; }
  std::vector<ParamDef> params(const ModelDims& d, const ExecPlan& p) const override { return s_->params(d, p); }
  TensorMap begin(const at::Tensor& x, const TensorMap& P, Backend b) const override { return s_->begin(x, P, b); }
  at::Tensor read(TensorMap& st, const Sublayer& s, const TensorMap& P) const override { return s_->read(st, s, P); }
  void write(TensorMap& st, const Sublayer& s, const at::Tensor& y, const TensorMap& P) const override {
    if (s.backend == Backend::Reference) return s_->write(st, s, y, P);
    TensorMap Q = P;
    Q.set("lt2_rho", at::zeros_like(P.at("lt2_rho")));
    s_->write(st, s, y, Q);
  }
  at::Tensor finish(TensorMap& st, const TensorMap& P, Backend b) const override { return s_->finish(st, P, b); }

 private:
  std::shared_ptr<const ResidualStream> s_;
};

TEST(Lt2, ConformanceFailsWhenTheFastPathIgnoresRho) {
  using namespace conformance_detail;
  ConformanceOptions opt;
  opt.finite_differences = false;
  MethodSpec spec = Registry::get().method("lt2_gdn");
  const CaseDef c = spec.cases().at(1);
  spec.cases = [c]() { return std::vector<CaseDef>{c}; };
  ConformanceSummary ok;
  run_subjects({model_subject(spec, opt)}, opt, ok);
  EXPECT_EQ(ok.failed + ok.errors, 0);
  EXPECT_GE(ok.passed, 1);
  auto inner = spec.residual;
  spec.residual = [inner](const Config& cfg) { return std::make_shared<IgnoreRhoFast>(inner(cfg)); };
  ConformanceSummary bad;
  Json rows = run_subjects({model_subject(spec, opt)}, opt, bad);
  EXPECT_GE(bad.failed, 1) << rows.dump();
}

TEST(Lt2, BadInputExitsTwo) {
  for (const char* bad : {"lt2_loops=0", "lt2_loops=-3"})
    EXPECT_EQ(run_cli({"account", "--method", "lt2_gdn", "--config", bad}), 2) << bad;
  EXPECT_EQ(run_cli({"account", "--method", "lt2_hybrid_gdn_dsa", "--config", "lt2_loops=x"}), 2);
  EXPECT_THROW(Registry::get().method("lt2_gdn").config.parse("lt2_loops=0"), InputError);
}

// The leaderboard presets run two loops, and iso-FLOP calibration then keeps at least half the
// anchor's depth in blocks.
TEST(Lt2, CalibratesAtTheLeaderboardPresets) {
  for (const auto& [preset, min_blocks] : std::vector<std::pair<std::string, int64_t>>{{"tiny", 2}, {"small", 3}})
    for (const char* name : {"lt2_gdn", "lt2_hybrid_full_gdn", "lt2_hybrid_gdn_dsa"}) {
      const Calibration c = calibrate(name, preset);
      EXPECT_TRUE(c.within) << preset << " " << name << " residual " << c.residual << " at " << c.config;
      EXPECT_GE(c.n_layer, min_blocks) << preset << " " << name;
      EXPECT_EQ(Registry::get().method(name).presets.at(preset).config.substr(0, 11), "lt2_loops=2") << name;
    }
}

}  // namespace
}  // namespace mixbench
