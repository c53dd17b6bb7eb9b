// mor (Mixture-of-Recursions, expert choice): capacities and their rounding, the tie rule of the
// selection, the capacity-1 identity with a plain looped stack whose core updates are router
// weighted, the auxiliary router loss, the accountant and bad input.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <memory>

#include "harness/backbone.h"
#include "harness/cli/cli.h"
#include "harness/errors.h"
#include "harness/registry.h"
#include "harness/residual.h"
#include "mixers/common/layers.h"
#include "mixers/loop/act_loop.h"
#include "mixers/loop/mor.h"
#include "suites/account.h"
#include "suites/conformance.h"
#include "suites/leaderboard.h"

namespace mixbench {
namespace {

const at::TensorOptions kF64 = at::TensorOptions().dtype(at::kDouble);
at::Generator gen_of(uint64_t s) { return at::make_generator<at::CPUGeneratorImpl>(s); }
double max_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

// prelude, one core block, coda at d 32; three recursions by default
const std::string kCfg = "n_layer=3,d_model=32,head_dim=16,seq_len=16,vocab=32,mlp_hidden=32";

const MethodSpec& mor_spec() { return Registry::get().method("mor"); }
Model mor_model(const MethodSpec& m, const std::string& extra, uint64_t seed) {
  at::Generator g = gen_of(seed);
  return build_model(m, m.config.parse(kCfg + (extra.empty() ? "" : "," + extra)), g, kF64, /*random_nonzero=*/true);
}
at::Tensor tokens(int64_t B, int64_t T, uint64_t seed) {
  at::Generator g = gen_of(seed);
  return at::randint(32, {B, T}, g, at::TensorOptions().dtype(at::kLong));
}

TEST(MorRouting, CapacitiesAndRounding) {
  EXPECT_EQ(mor::capacities(mor_spec().config.parse(kCfg)), (std::vector<double>{1.0, 2.0 / 3.0, 1.0 / 3.0}));
  EXPECT_EQ(mor::capacities(mor_spec().config.parse(kCfg + ",n_loops=2")), (std::vector<double>{1.0, 0.5}));
  EXPECT_EQ(mor::capacities(mor_spec().config.parse(kCfg + ",capacity=0.5:0.5:0.1")), (std::vector<double>{0.5, 0.5, 0.1}));
  // max(1, int(c·T)) as the original rounds
  EXPECT_EQ(mor::tokens_at(2.0 / 3.0, 16), 10);
  EXPECT_EQ(mor::tokens_at(1.0 / 3.0, 9), 3);
  EXPECT_EQ(mor::tokens_at(0.3, 16), 4);
  EXPECT_EQ(mor::tokens_at(0.1, 7), 1);
  EXPECT_EQ(mor::tokens_at(1.0, 5), 5);
}

// The k largest logits, in position order; equal logits go to the earlier position.
TEST(MorRouting, SelectionTieRule) {
  const at::Tensor z = at::tensor({1.0, 3.0, 3.0, 2.0, 3.0, -1.0, 0.0, 0.0, 0.0, 0.0}, kF64).view({2, 5});
  const at::Tensor top = mor::select_top(z, 2);
  EXPECT_EQ(top[0][0].item<int64_t>(), 1);
  EXPECT_EQ(top[0][1].item<int64_t>(), 2);
  EXPECT_EQ(top[1][0].item<int64_t>(), 1);
  EXPECT_EQ(top[1][1].item<int64_t>(), 2);
  const at::Tensor top3 = mor::select_top(z, 3);
  EXPECT_EQ(top3[0][2].item<int64_t>(), 4);
  EXPECT_EQ(top3[1][0].item<int64_t>(), 1) << "row 2: the first three of four equal logits";
  EXPECT_EQ(top3[1][2].item<int64_t>(), 3);
}

// A layer run on a subset of the tokens rotates each at its own position ("positions"): rope_at at
// p, p+1, … is rope from offset p; dense_full's fast path and its reference agree at scattered
// positions, and differ from the same tokens taken at 0 … k−1.
TEST(MorRouting, LayerOnATokenSubsetRotatesAtTheTokensPositions) {
  at::Generator g = gen_of(21);
  const at::TensorOptions i64 = at::TensorOptions().dtype(at::kLong);
  const at::Tensor q = at::randn({2, 5, 2, 8}, g, kF64);
  EXPECT_TRUE(layers::rope_at(q, 100000.0, at::arange(3, 8, i64).expand({2, 5})).equal(layers::rope(q, 100000.0, 3)));
  const MethodSpec& m = Registry::get().method("dense_full");
  const Config c = m.config.parse("n_layer=2,d_model=32,head_dim=16,seq_len=16,vocab=32");
  const LayerCtx ctx{1, 2};  // the last layer: with a value embedding
  TensorMap in = m.make_inputs(c, ctx, 2, 6, g);
  for (const auto& d : m.params(c, ctx)) in.set(d.name, random_param(d, g, kF64));
  TensorMap plain = in;
  in.set("positions", at::tensor({0, 2, 3, 7, 9, 12, 1, 4, 5, 6, 10, 15}, i64).view({2, 6}));
  const at::Tensor fast = m.forward(in, c, ctx, Backend::CPU).at("y");
  EXPECT_LT(max_diff(fast, m.reference(in, c, ctx).at("y")), 1e-12);
  EXPECT_GT(max_diff(fast, m.forward(plain, c, ctx, Backend::CPU).at("y")), 1e-6);
  in.set("positions", at::arange(6, i64).expand({2, 6}));
  EXPECT_LT(max_diff(m.forward(in, c, ctx, Backend::CPU).at("y"), m.forward(plain, c, ctx, Backend::CPU).at("y")), 1e-14);
  EXPECT_LT(max_diff(m.reference(in, c, ctx).at("y"), m.reference(plain, c, ctx).at("y")), 1e-14);
}

// A copy of mor whose core layer records the token count and positions of every call.
struct Recorded {
  std::vector<int64_t> sizes;
  std::vector<at::Tensor> positions;
};
MethodSpec recording(std::shared_ptr<Recorded> rec) {
  MethodSpec m = mor_spec();
  auto fwd = m.forward;
  auto ref = m.reference;
  m.forward = [fwd, rec](const TensorMap& in, const Config& c, const LayerCtx& ctx, Backend b) {
    rec->sizes.push_back(in.at("x").size(1));
    rec->positions.push_back(in.get_or("positions", at::Tensor()));
    return fwd(in, c, ctx, b);
  };
  m.reference = [ref, rec](const TensorMap& in, const Config& c, const LayerCtx& ctx) {
    rec->sizes.push_back(in.at("x").size(1));
    rec->positions.push_back(in.get_or("positions", at::Tensor()));
    return ref(in, c, ctx);
  };
  return m;
}

TEST(MorRouting, TokensPerRecursionAreNestedAndRounded) {
  auto rec = std::make_shared<Recorded>();
  const MethodSpec m = recording(rec);
  for (const auto& [extra, want] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
           {"", {16, 16, 10, 5, 16}}, {"capacity=0.5:0.3:0.1", {16, 8, 4, 1, 16}}})
    for (Backend b : {Backend::CPU, Backend::Reference}) {
      Model model = mor_model(m, extra, 3);
      rec->sizes.clear();
      rec->positions.clear();
      model_forward(model, tokens(2, 16, 4), b);
      EXPECT_EQ(rec->sizes, want) << extra << " " << backend_name(b);
      ASSERT_EQ(rec->positions.size(), 5u);
      EXPECT_FALSE(rec->positions[0].defined()) << "the prelude runs on every token";
      EXPECT_FALSE(rec->positions[4].defined()) << "the coda runs on every token";
      for (size_t r = 1; r <= 3; ++r) {
        const at::Tensor p = rec->positions[r];
        ASSERT_TRUE(p.defined());
        EXPECT_TRUE((p.slice(1, 1) > p.slice(1, 0, -1)).all().item<bool>()) << "selected in position order";
        if (r > 1) {  // nested: every token of recursion r was processed by recursion r − 1
          for (int64_t i = 0; i < p.size(0); ++i)
            EXPECT_TRUE(at::isin(p[i], rec->positions[r - 1][i]).all().item<bool>()) << r;
        }
      }
    }
}

// All router logits equal (θ = 0): every recursion keeps its first k candidates, on both paths.
TEST(MorRouting, TiesBreakTheSameWayOnBothPaths) {
  auto rec = std::make_shared<Recorded>();
  const MethodSpec m = recording(rec);
  Model model = mor_model(m, "capacity=0.75:0.5:0.25", 7);
  model.params.set("mor_router", at::zeros_like(model.params.at("mor_router")));
  const at::Tensor idx = tokens(2, 16, 8);
  const at::Tensor cpu = model_forward(model, idx, Backend::CPU);
  for (size_t r = 1; r <= 3; ++r)
    EXPECT_TRUE(rec->positions[r].equal(at::arange(rec->sizes[r], rec->positions[r].options()).expand({2, rec->sizes[r]})))
        << r;
  EXPECT_LT(max_diff(model_forward(model, idx, Backend::Reference), cpu), 1e-10);
}

// The capacity-1 identity: with every capacity 1 each recursion selects every token, so mor is the
// looped stack (prelude, core N_r times, coda) whose core applications update
// H ← H + α·σ(θ_rᵀH)·f(H) (f the core's output state), and its auxiliary loss is
// coeff · Σ_r mean(log(1 + e^{−z_r})) (every target 1).
class GatedLoopStream final : public ResidualStream {
 public:
  // `mor`: mor's stream, whose parameters (nanochat's scales and the routers) this one reads
  GatedLoopStream(LoopSplit s, std::shared_ptr<const ResidualStream> mor)
      : split_(s), inner_(nanochat_stream(0)), mor_(std::move(mor)) {}
  std::string name() const override { return "gated_loop"; }
  std::vector<ParamDef> params(const ModelDims& d, const ExecPlan& plan) const override { return mor_->params(d, plan); }
  TensorMap begin(const at::Tensor& x, const TensorMap& P, Backend b) const override { return inner_->begin(x, P, b); }
  at::Tensor read(TensorMap& st, const Sublayer& s, const TensorMap& P) const override {
    if (s.kind == Sublayer::Kind::Mixer && split_.opens_loop(s.step)) {
      const int64_t r = split_.loop_of(s.step);
      const at::Tensor z = at::matmul(st.at("x"), P.at("mor_router")[r]);
      st.set("g", mor::kAlpha * at::sigmoid(z));
      st.set("h", st.at("x"));
      st.set(fmt::format("z{}", r), z);
    }
    return inner_->read(st, s, P);
  }
  void write(TensorMap& st, const Sublayer& s, const at::Tensor& y, const TensorMap& P) const override {
    inner_->write(st, s, y, P);
    if (s.kind == Sublayer::Kind::Mlp && split_.closes_loop(s.step))
      st.set("x", st.at("h") + st.at("g").unsqueeze(-1) * st.at("x"));
  }
  at::Tensor finish(TensorMap& st, const TensorMap& P, Backend b) const override {
    at::Tensor aux = at::log1p(at::exp(-st.at("z0"))).mean();
    for (int64_t r = 1; r < split_.loops; ++r) aux = aux + at::log1p(at::exp(-st.at(fmt::format("z{}", r)))).mean();
    st.set("aux_loss", mor::kAuxCoeff * aux);
    return inner_->finish(st, P, b);
  }

 private:
  LoopSplit split_;
  std::shared_ptr<const ResidualStream> inner_, mor_;
};

TEST(Mor, CapacityOneIsTheRouterWeightedLoopedStack) {
  const MethodSpec& mor = mor_spec();
  MethodSpec plain = mor;
  LoopSplit s;
  s.prelude = 1, s.core = 1, s.coda = 1, s.loops = 3;
  plain.residual = [s, &mor](const Config& c) { return std::make_shared<GatedLoopStream>(s, model_stream(mor, c)); };
  const at::Tensor idx = tokens(2, 12, 5);
  Model a = mor_model(mor, "capacity=1:1:1", 9);
  Model b = mor_model(plain, "capacity=1:1:1", 1);
  for (const auto& [n, t] : a.params) b.params.set(n, t);
  for (Backend be : {Backend::CPU, Backend::Reference}) {
    ModelAux aa, ab;
    const at::Tensor ya = model_forward(a, idx, be, &aa), yb = model_forward(b, idx, be, &ab);
    EXPECT_LT(max_diff(ya, yb), 1e-12) << backend_name(be);
    EXPECT_NEAR(aa.aux_loss.item<double>(), ab.aux_loss.item<double>(), 1e-15) << backend_name(be);
    EXPECT_GT(aa.aux_loss.item<double>(), 0.0);
  }
  // a capacity below 1 leaves tokens out: no longer the plain stack
  Model c = mor_model(mor, "capacity=1:1:0.5", 9);
  for (const auto& [n, t] : a.params) c.params.set(n, t);
  EXPECT_GT(max_diff(model_forward(c, idx, Backend::CPU), model_forward(b, idx, Backend::CPU)), 1e-6);
}

// The auxiliary BCE trains the router: its gradient reaches θ and perturbing θ changes it.
TEST(Mor, AuxiliaryRouterLossDependsOnTheRouter) {
  Model m = mor_model(mor_spec(), "", 13);
  const at::Tensor idx = tokens(2, 16, 14);
  at::Tensor theta = m.params.at("mor_router").detach().clone().requires_grad_(true);
  m.params.set("mor_router", theta);
  ModelAux aux;
  model_forward(m, idx, Backend::CPU, &aux);
  ASSERT_TRUE(aux.aux_loss.defined());
  const double a0 = aux.aux_loss.item<double>();
  EXPECT_GT(a0, 0.0);
  aux.aux_loss.backward();
  ASSERT_TRUE(theta.grad().defined());
  for (int64_t r = 0; r < 3; ++r) EXPECT_GT(theta.grad()[r].abs().max().item<double>(), 0.0) << "recursion " << r;
  m.params.set("mor_router", (theta.detach() * 1.5).requires_grad_(false));
  ModelAux aux2;
  model_forward(m, idx, Backend::CPU, &aux2);
  EXPECT_GT(std::abs(aux2.aux_loss.item<double>() - a0), 1e-8);
  // the reference computes the same loss
  ModelAux aux3;
  model_forward(m, idx, Backend::Reference, &aux3);
  EXPECT_NEAR(aux3.aux_loss.item<double>(), aux2.aux_loss.item<double>(), 1e-14);
  // and the gates weigh the recursions' updates: a router scaled up changes the logits
  m.params.set("mor_router", theta.detach());
  const at::Tensor y0 = model_forward(m, idx, Backend::CPU);
  m.params.set("mor_router", theta.detach() * 1.5);
  EXPECT_GT(max_diff(model_forward(m, idx, Backend::CPU), y0), 1e-8);
}

TEST(Mor, ConformanceAtModelLevel) {
  const int threads = at::get_num_threads();
  at::set_num_threads(1);  // thousands of tiny FP64 ops (finite differences): one intra-op thread
  for (const char* dtype : {"fp64", "fp32"}) {
    ConformanceOptions opt;
    opt.methods = {"mor"};
    opt.dtype = dtype;
    opt.finite_differences = std::string(dtype) == "fp64";
    opt.fd_directions = 1;
    ConformanceSummary s;
    const nlohmann::json r = run_conformance(opt, s);
    EXPECT_EQ(s.failed, 0) << dtype;
    EXPECT_EQ(s.errors, 0) << dtype;
    int model = 0;
    for (const auto& x : r) {
      EXPECT_EQ(x["status"], "pass") << x.dump();
      if (x["level"] == "model") ++model;
    }
    EXPECT_EQ(model, 2) << dtype;
  }
  at::set_num_threads(threads);
}

// The shared block is billed per recursion at k_r of T tokens, attending among them; the routers
// at the candidates; the audit agrees with what runs.
TEST(Mor, AccountantBillsEachRecursionAtItsCapacity) {
  const MethodSpec& m = mor_spec();
  const Config c = m.config.parse("n_layer=3,d_model=32,head_dim=16,seq_len=32,vocab=32,mlp_hidden=32,capacity=1:0.5:0.25");
  CostQuery q;
  q.T = 32;
  q.context = 32;
  const ModelCost mc = account_model(m, c, q);
  ASSERT_EQ(mc.layers.size(), 5u);
  const MethodSpec& full = Registry::get().method("dense_full");
  const Config fc = full.config.parse("n_layer=3,d_model=32,head_dim=16,seq_len=32,vocab=32,mlp_hidden=32");
  for (int64_t r = 0; r < 3; ++r) {
    CostQuery qk = q;
    qk.T = 32 >> r;
    const LayerCost want = full.account(fc, LayerCtx{1, 3, -1, r, 3, 1 + r, 5}, qk);
    EXPECT_DOUBLE_EQ(mc.layers[size_t(1 + r)].fwd_flops, want.fwd_flops) << r;
  }
  // fwd = 2·N_once + Σ_r (k_r/T)·(core FLOPs at k_r) + routers 2d·(32 + 32 + 16)/32 per token
  const double mlp = 2.0 * 2.0 * 32 * 32;
  const double outer = mc.layers[0].fwd_flops + mc.layers[4].fwd_flops + 2 * mlp;
  double core = 0;
  for (int64_t r = 0; r < 3; ++r) core += (1.0 / double(1 << r)) * (mc.layers[size_t(1 + r)].fwd_flops + mlp);
  const double head = 2.0 * 32 * 32 + 2.0 * 24;  // lm_head and the smear gate
  EXPECT_NEAR(mc.fwd_flops, outer + core + head + 2.0 * 32 * (32.0 + 32.0 + 16.0) / 32.0, 1e-9 * mc.fwd_flops);
  AccountOptions opt;
  opt.method = "mor";
  opt.config = "n_layer=4,d_model=64,head_dim=32,vocab=64,seq_len=48";
  opt.audit = true;
  const AccountResult a = run_account(opt);
  EXPECT_TRUE(a.row["audit"]["params_match"].get<bool>());
  EXPECT_LT(a.row["audit"]["fwd_flops_rel_diff"].get<double>(), 0.02);
  EXPECT_TRUE(a.audit_passed());
}

TEST(Mor, CalibratesAtEveryPreset) {
  for (const char* preset : {"tiny", "small", "gpu-d12"}) {
    const Calibration c = calibrate("mor", preset);
    EXPECT_TRUE(c.within) << preset << " residual " << c.residual << " at " << c.config;
  }
}

// Each bad config exits 2 with a message naming the problem.
TEST(Mor, BadInputExitsTwo) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {kCfg + ",capacity=1.5:0.5:0.25", "outside (0, 1]"},
      {kCfg + ",capacity=0:0:0", "outside (0, 1]"},
      {kCfg + ",capacity=1:-0.5:-1", "outside (0, 1]"},
      {kCfg + ",capacity=1:0.5", "2 capacities for n_loops 3"},
      {kCfg + ",capacity=0.5:1:0.25", "must not increase"},
      {kCfg + ",capacity=1:x:0.5", "not a number"},
      {kCfg + ",n_loops=0", "n_loops"},
      {kCfg + ",n_loops=-1", "n_loops"},
      {kCfg + ",n_prelude=0", "first and last blocks unique"},
      {"n_layer=2,d_model=32,head_dim=16", "first and last blocks unique"},
  };
  for (const auto& [cfg, says] : bad) {
    testing::internal::CaptureStdout();
    testing::internal::CaptureStderr();
    const int rc = run_cli({"account", "--method", "mor", "--config", cfg});
    testing::internal::GetCapturedStdout();
    const std::string err = testing::internal::GetCapturedStderr();
    EXPECT_EQ(rc, 2) << cfg;
    EXPECT_NE(err.find(says), std::string::npos) << cfg << ": " << err;
  }
}

// No decode: the top-k over the sequence is not causal; `list` says so and decoding is refused.
TEST(Mor, RegisteredWithoutDecode) {
  const MethodSpec& m = mor_spec();
  EXPECT_FALSE(m.has_decode());
  EXPECT_NE(m.summary.find("no decode"), std::string::npos);
  Model model = mor_model(m, "", 1);
  ModelCache cache;
  EXPECT_THROW(model_prefill(model, tokens(1, 8, 2), Backend::CPU, &cache), UsageError);
}

}  // namespace
}  // namespace mixbench
