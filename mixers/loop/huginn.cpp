// huginn: prelude → core applied r times → coda, on nanochat's SSSL dense layer (the stream):
//   e = prelude output;  s₀ ~ TruncNormal(0, σ²), σ = √(2/(5d)), ±3σ (per global row, huginn::initial_state)
//   application k: s ← core(A[s; e])   (A: Linear(2d → d), no bias: "huginn_adapter")
//   coda reads norm(s_r)
// Every block is sandwich-normed: x = n₂(x + Attn(n₁x)), x = n₄(x + MLP(n₃x)) (n₁, n₃ the
// backbone's pre-norms; the stream applies n₂, n₄ after nanochat's resid/x0 mix and residual add).
// The plan holds max_loops core applications. In training (LayerCtx::step ≥ 0 with gradients on)
// r is sampled per step (huginn::sample_depth) and the first max(r − grad_loops, 0) applications
// run without gradient; elsewhere r = round(mean_loops) (huginn::eval_depth) with full gradients.
// Applications beyond r are skipped (ResidualStream::runs). The backout keeps the prelude's output.
#include "mixers/loop/huginn.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "harness/backbone.h"
#include "harness/errors.h"
#include "harness/residual.h"
#include "mixers/common/layers.h"
#include "mixers/loop/act_loop.h"
#include "mixers/loop/loop_ref.h"

namespace mixbench {
namespace huginn {
namespace {

uint64_t mix(uint64_t a, uint64_t b) {  // splitmix64 of a combined with b
  uint64_t z = a + 0x9E3779B97F4A7C15ULL * (b + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}
constexpr uint64_t kDepthDomain = 0x6465707468ULL;  // "depth"
constexpr uint64_t kStateDomain = 0x7374617465ULL;  // "state"

}  // namespace

int64_t sample_depth(uint64_t seed, int64_t step, double mean_loops, int64_t max_loops) {
  std::mt19937_64 rng(mix(mix(seed, kDepthDomain), uint64_t(step)));
  std::normal_distribution<double> tau(std::log(mean_loops) - kDepthSigma * kDepthSigma / 2.0, kDepthSigma);
  std::poisson_distribution<int64_t> poisson(std::exp(tau(rng)));
  return std::min<int64_t>(poisson(rng) + 1, max_loops);
}

double run_probability(int64_t k, double mean_loops) {
  if (k <= 0) return 1.0;
  // trapezoid over τ ∈ μ ± 10σ of the normal density times P(Poisson(e^τ) < k)
  const double mu = std::log(mean_loops) - kDepthSigma * kDepthSigma / 2.0;
  const int64_t n = 8000;
  const double lo = mu - 10.0 * kDepthSigma, h = 20.0 * kDepthSigma / double(n);
  double below = 0;
  for (int64_t i = 0; i <= n; ++i) {
    const double tau = lo + h * double(i), lambda = std::exp(tau);
    double term = std::exp(-lambda), cdf = 0;  // Σ_{j<k} e^{−λ} λ^j / j!
    for (int64_t j = 0; j < k; ++j) {
      cdf += term;
      term *= lambda / double(j + 1);
    }
    const double z = (tau - mu) / kDepthSigma;
    const double density = std::exp(-0.5 * z * z) / (kDepthSigma * std::sqrt(2.0 * std::acos(-1.0)));
    below += (i == 0 || i == n ? 0.5 : 1.0) * h * density * cdf;
  }
  return 1.0 - below;
}

int64_t eval_depth(double mean_loops, int64_t max_loops) {
  return std::clamp<int64_t>(int64_t(std::llround(mean_loops)), 1, max_loops);
}

at::Tensor initial_state(uint64_t seed, int64_t row0, int64_t B, int64_t pos, int64_t T, int64_t d,
                         const at::TensorOptions& opts) {
  const double sigma = std::sqrt(2.0 / (5.0 * double(d)));
  // inverse CDF: u uniform in [2Φ(−3) − 1, 2Φ(3) − 1], x = √2·σ·erfinv(u)
  const double hi = std::erf(3.0 / std::sqrt(2.0));
  std::vector<at::Tensor> rows;
  for (int64_t b = 0; b < B; ++b) {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(mix(mix(seed, kStateDomain), uint64_t(row0 + b)));
    at::Tensor u = at::empty({(pos + T) * d}, at::TensorOptions().dtype(at::kDouble)).uniform_(-hi, hi, gen);
    at::Tensor x = (at::erfinv(u) * (std::sqrt(2.0) * sigma)).clamp(-3.0 * sigma, 3.0 * sigma);
    rows.push_back(x.slice(0, pos * d).view({T, d}));
  }
  return at::stack(rows).to(opts);
}

}  // namespace huginn

namespace {

// The FP64 reference of the stream's own arithmetic, position by position.
namespace ref {

// A[s; e] per position.
at::Tensor adapt(const at::Tensor& A, const at::Tensor& s, const at::Tensor& e) {
  const int64_t B = s.size(0), T = s.size(1);
  std::vector<at::Tensor> rows;
  for (int64_t i = 0; i < B; ++i)
    for (int64_t t = 0; t < T; ++t) rows.push_back(at::mv(A, at::cat({s[i][t], e[i][t]})));
  return at::stack(rows).view(s.sizes());
}

}  // namespace ref

class HuginnStream final : public ResidualStream {
 public:
  HuginnStream(const LoopSplit& s, double mean_loops, int64_t grad_loops)
      : split_(s), mean_(mean_loops), grad_loops_(grad_loops), inner_(nanochat_stream(s.prelude - 1)) {}
  std::string name() const override { return "huginn"; }
  // No static decode (ResidualStream::static_decode stays false): the initial state s₀ of a decoded
  // token is drawn on the host, from the row's CPU generator advanced to the token's position
  // (huginn::initial_state), which a captured step cannot replay at another position; on the device
  // it would take a table of s₀ for every row and position up to the capacity ([B, capacity, d]).
  // The depth outside training (eval_depth) is fixed and would not stand in the way.

  std::vector<ParamDef> params(const ModelDims& d, const ExecPlan& plan) const override {
    std::vector<ParamDef> p = inner_->params(d, plan);
    const double s = std::sqrt(3.0) / std::sqrt(double(2 * d.d_model));
    // applied once per core application: billed by the stream (fwd_flops), not as a backbone matmul
    p.push_back({"huginn_adapter", {d.d_model, 2 * d.d_model}, ParamGroup::TransformerMatrix, false, "uniform", -s, s,
                 muon_rule()});
    return p;
  }

  TensorMap begin(const at::Tensor& x, const TensorMap& P, Backend backend) const override {
    return inner_->begin(x, P, backend);
  }

  bool runs(const Sublayer& s, const TensorMap& st) const override {
    decide_depth(const_cast<TensorMap&>(st), s);  // the backbone passes the pass's own (mutable) state
    return !in_core(s.step) || split_.loop_of(s.step) < depth(st);
  }

  bool truncated(const Sublayer& s, const TensorMap& st) const override {
    if (!in_core(s.step) || !st.has("huginn_train") || st.at("huginn_train").item<int64_t>() == 0) return false;
    return split_.loop_of(s.step) < std::max<int64_t>(depth(st) - grad_loops_, 0);
  }

  at::Tensor read(TensorMap& st, const Sublayer& s, const TensorMap& P) const override {
    decide_depth(st, s);
    if (s.kind == Sublayer::Kind::Mixer && split_.opens_loop(s.step)) {
      const at::Tensor x = st.at("x");
      const at::Tensor prev = split_.loop_of(s.step) == 0
                                  ? huginn::initial_state(s.seed, s.row0, x.size(0), s.pos, x.size(1), x.size(2), x.options())
                                  : x;
      const at::Tensor& A = P.at("huginn_adapter");
      st.set("x", s.backend == Backend::Reference ? ref::adapt(A, prev, st.at("huginn_e"))
                                                  : at::linear(at::cat({prev, st.at("huginn_e")}, -1), A));
    }
    return inner_->read(st, s, P);
  }

  void write(TensorMap& st, const Sublayer& s, const at::Tensor& y, const TensorMap& P) const override {
    inner_->write(st, s, y, P);
    auto norm = [&](const at::Tensor& x) { return s.backend == Backend::Reference ? loop_ref::rms_norm(x) : layers::rms_norm(x); };
    st.set("x", norm(st.at("x")));  // sandwich: n₂ after the mixer, n₄ after the MLP
    if (s.kind != Sublayer::Kind::Mlp) return;
    if (s.step == split_.prelude - 1) {  // e, and the backout state: the prelude's output
      st.set("huginn_e", st.at("x"));
      st.set("backout", st.at("x"));
    }
    if (split_.closes_loop(s.step) && split_.loop_of(s.step) == depth(st) - 1) st.set("x", norm(st.at("x")));  // norm(s_r)
  }

  at::Tensor finish(TensorMap& st, const TensorMap& P, Backend backend) const override {
    return inner_->finish(st, P, backend);
  }

  // Training passes run core application k with probability P(r > k): the accountant bills each
  // core step by it (calibration sees the expected depth).
  double step_share(const ExecPlan&, int64_t step) const override {
    return in_core(step) ? huginn::run_probability(split_.loop_of(step), mean_) : 1.0;
  }
  // the adapter (2·2d·d) per core application, by its share
  double fwd_flops(const ModelDims& d, const ExecPlan&) const override {
    double apps = 0;
    for (int64_t k = 0; k < split_.loops; ++k) apps += huginn::run_probability(k, mean_);
    return apps * 4.0 * double(d.d_model) * double(d.d_model);
  }
  // per plan step the two sandwich norms' inputs; per core application the adapter's input [s; e]
  double act_bytes(const ModelDims& d, const ExecPlan& plan, int64_t dtype_bytes) const override {
    return (double(plan.n_steps()) * 2.0 + double(split_.loops) * 2.0) * double(d.d_model) * double(dtype_bytes);
  }

 private:
  bool in_core(int64_t step) const { return step >= split_.core_begin() && step < split_.core_end(); }
  // The depth of this pass, decided at its first sublayer, before any step runs without gradient.
  void decide_depth(TensorMap& st, const Sublayer& s) const {
    if (s.step != 0 || s.kind != Sublayer::Kind::Mixer || st.has("huginn_r")) return;
    const bool training = s.train_step >= 0 && at::GradMode::is_enabled();
    const int64_t r = training ? huginn::sample_depth(s.seed, s.train_step, mean_, split_.loops)
                               : huginn::eval_depth(mean_, split_.loops);
    st.set("huginn_r", at::scalar_tensor(r, at::TensorOptions().dtype(at::kLong)));
    st.set("huginn_train", at::scalar_tensor(int64_t(training), at::TensorOptions().dtype(at::kLong)));
  }

  int64_t depth(const TensorMap& st) const {
    if (!st.has("huginn_r")) throw std::logic_error("huginn: the depth is read before the pass's first sublayer");
    return st.at("huginn_r").item<int64_t>();
  }

  LoopSplit split_;
  double mean_;
  int64_t grad_loops_;
  std::shared_ptr<const ResidualStream> inner_;
};

std::vector<CaseDef> cases(const ConfigSpec& spec) {
  // prelude, one core block looped (r = 3 of 4 applications outside training), coda; d 32
  const Config base = spec.parse(
      "n_layer=3,d_model=32,head_dim=16,seq_len=32,vocab=32,mlp_hidden=32,short_window=4,max_loops=4,mean_loops=3");
  return {
      // first (the golden's and the audit's config): r̄ 16 runs all four applications in training
      // too, so the accountant's expected depth is the depth a forward pass executes
      {"B2_T9_deep", base.with("mean_loops", 16.0), 2, 9},
      {"B2_T9", base, 2, 9},
      {"T12_all_loops", base.with("mean_loops", 4.0), 1, 12},
      {"T8_core2", base.with("n_layer", int64_t(4)).with("mean_loops", 2.0), 1, 8},
  };
}

MIXBENCH_REGISTER(act_loop_method({
    "huginn",
    "recurrent depth: core applied a sampled r ≤ max_loops times on A[s; e], truncated backprop, sandwich norm",
    "arXiv 2502.05171; seal-rg/recurrent-pretraining raven_modeling_minimal.py",
    "max_loops",
    [](ConfigSpec& c) {
      c.i("max_loops", 4, "core applications in the plan (the sampled depth is cut there)", 1, 64)
          .f("mean_loops", 2.5, "mean depth r̄ of the sampler; evaluation runs round(r̄) applications", 0.5, 64)
          .i("grad_loops", 2, "last applications trained with gradient (the earlier ones without)", 1, 64);
    },
    [](const Config& c) -> std::shared_ptr<const ResidualStream> {
      return std::make_shared<HuginnStream>(act_loop_split(c, "max_loops"), c.f("mean_loops"), c.i("grad_loops"));
    },
    cases,
}));

}  // namespace
}  // namespace mixbench
