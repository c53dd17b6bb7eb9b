// ut_act: prelude once, the core blocks applied up to max_steps times with adaptive computation
// time, coda once, on nanochat's SSSL dense layer. Around each core application (the stream):
//   s ← s + token coordinates + depth coordinate k        (UT timing signals)
//   p = σ(wᵀs + b)  per position                          (b init 1.0)
//   h, R, N, u ← act_step(p)                              (method-details.md; remainder spent at k = max_steps − 1)
//   y = core(s)      (nanochat's resid/x0 mix per plan step inside the core)
//   s_acc ← u·y + (1 − u)·s_acc;  s ← y
// after the last application the coda reads s_acc. Halted positions keep being computed with weight
// 0 (their s_acc is frozen; later steps' keys still see them), so every candidate step is computed
// and billed. The ponder cost τ·mean(N + R) is left as the stream's "aux_loss". The backout keeps
// the prelude's last layer (nanochat_stream(prelude − 1) inside this stream).
#include "mixers/loop/act.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>

#include "harness/backbone.h"
#include "harness/errors.h"
#include "harness/residual.h"
#include "mixers/common/layers.h"
#include "mixers/loop/act_loop.h"

namespace mixbench {
namespace act {

at::Tensor timing_signal(int64_t start, int64_t length, int64_t channels, const at::TensorOptions& opts) {
  const int64_t n = channels / 2;
  const double inc = std::log(1.0e4) / double(std::max<int64_t>(n - 1, 1));
  at::Tensor inv = at::exp(at::arange(n, opts.dtype(at::kDouble)) * -inc);
  at::Tensor t = at::arange(start, start + length, opts.dtype(at::kDouble)).unsqueeze(1) * inv.unsqueeze(0);
  at::Tensor sig = at::cat({at::sin(t), at::cos(t)}, 1);
  if (channels % 2) sig = at::constant_pad_nd(sig, {0, 1});
  return sig.to(opts);
}

at::Tensor timing_signal_at(const at::Tensor& pos, int64_t channels, at::ScalarType dtype) {
  const int64_t n = channels / 2;
  const double inc = std::log(1.0e4) / double(std::max<int64_t>(n - 1, 1));
  const auto o64 = pos.options().dtype(at::kDouble);
  at::Tensor inv = at::exp(at::arange(n, o64) * -inc);
  at::Tensor t = pos.to(at::kDouble).view({1, 1}) * inv.unsqueeze(0);
  at::Tensor sig = at::cat({at::sin(t), at::cos(t)}, 1);
  if (channels % 2) sig = at::constant_pad_nd(sig, {0, 1});
  return sig.to(dtype);
}

at::Tensor act_step(Halting& st, const at::Tensor& p, bool last) {
  const at::Tensor running = (st.h < 1.0).to(p.scalar_type());
  const at::Tensor q = st.h + p * running;
  at::Tensor halted = (q > 1.0 - kEps).to(p.scalar_type()) * running;
  at::Tensor still = (q <= 1.0 - kEps).to(p.scalar_type()) * running;
  if (last) {
    halted = halted + still;
    still = at::zeros_like(still);
  }
  at::Tensor h = st.h + p * still;
  st.R = st.R + halted * (1.0 - h);
  // h + R is 1 up to rounding; exactly 1 so that a halted position never runs again
  st.h = at::where(halted > 0, at::ones_like(h), h + halted * st.R);
  st.N = st.N + still + halted;
  return p * still + halted * st.R;
}

at::Tensor ponder_cost(const Halting& st) { return kPonderCost * (st.N + st.R).mean(); }

}  // namespace act

namespace {

// The FP64 reference of the stream's own arithmetic: explicit loops over positions and channels.
namespace ref {

double timing(int64_t pos, int64_t c, int64_t channels) {
  const int64_t n = channels / 2;
  if (c >= 2 * n) return 0.0;
  const double inc = std::log(1.0e4) / double(std::max<int64_t>(n - 1, 1));
  const int64_t j = c < n ? c : c - n;
  const double a = double(pos) * std::exp(-inc * double(j));
  return c < n ? std::sin(a) : std::cos(a);
}

// s + token coordinates (positions pos0 …) + depth coordinate `step` of max_steps.
at::Tensor add_coordinates(const at::Tensor& s, int64_t pos0, int64_t step) {
  const int64_t T = s.size(1), d = s.size(2);
  at::Tensor sig = at::zeros({T, d}, at::TensorOptions().dtype(at::kDouble));
  auto a = sig.accessor<double, 2>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < d; ++c) a[t][c] = timing(pos0 + t, c, d) + timing(step, c, d);
  return s + sig.to(s.options());
}

// One ACT step, position by position. h, R, N [B,T] are rebuilt from per-position scalars.
at::Tensor act_step(act::Halting& st, const at::Tensor& s, const at::Tensor& w, const at::Tensor& b, bool last) {
  const int64_t B = s.size(0), T = s.size(1);
  std::vector<at::Tensor> hs, Rs, Ns, us;
  for (int64_t i = 0; i < B; ++i)
    for (int64_t t = 0; t < T; ++t) {
      const at::Tensor p = 1.0 / (1.0 + at::exp(-(at::dot(w, s[i][t]) + b[0])));
      at::Tensor h = st.h[i][t], R = st.R[i][t], N = st.N[i][t];
      double still = h.item<double>() < 1.0 ? 1.0 : 0.0;
      const double q = h.item<double>() + p.item<double>() * still;
      double halted = q > 1.0 - act::kEps ? still : 0.0;
      still = q <= 1.0 - act::kEps ? still : 0.0;
      if (last && still > 0) {
        halted = 1.0;
        still = 0.0;
      }
      if (still > 0) h = h + p;
      if (halted > 0) {
        R = R + (1.0 - h);
        h = at::ones_like(h);
      }
      N = N + (still + halted);
      hs.push_back(h);
      Rs.push_back(R);
      Ns.push_back(N);
      us.push_back(still > 0 ? p : halted > 0 ? R : at::zeros_like(p));
    }
  st.h = at::stack(hs).view({B, T});
  st.R = at::stack(Rs).view({B, T});
  st.N = at::stack(Ns).view({B, T});
  return at::stack(us).view({B, T});
}

// s_acc ← u·y + (1 − u)·s_acc, position by position.
at::Tensor accumulate(const at::Tensor& acc, const at::Tensor& y, const at::Tensor& u) {
  const int64_t B = y.size(0), T = y.size(1);
  std::vector<at::Tensor> rows;
  for (int64_t i = 0; i < B; ++i)
    for (int64_t t = 0; t < T; ++t) rows.push_back(u[i][t] * y[i][t] + (1.0 - u[i][t]) * acc[i][t]);
  return at::stack(rows).view(y.sizes());
}

}  // namespace ref

class UtActStream final : public ResidualStream {
 public:
  explicit UtActStream(const LoopSplit& s) : split_(s), inner_(nanochat_stream(s.prelude - 1)) {}
  std::string name() const override { return "ut_act"; }
  // Every candidate step runs at every position and the halting is masks on the device (act_step);
  // the token coordinates of a static decode step come from the device position ("pos_dev").
  bool static_decode() const override { return true; }

  std::vector<ParamDef> params(const ModelDims& d, const ExecPlan& plan) const override {
    std::vector<ParamDef> p = inner_->params(d, plan);
    const double s = std::sqrt(3.0) / std::sqrt(double(d.d_model));
    const OptimRule rule = adamw_rule("act_halting", 0.004, 0.8, 0.95, 0.0, false, true);
    p.push_back({"act_halt_w", {d.d_model}, ParamGroup::Scalar, false, "uniform", -s, s, rule});
    p.push_back({"act_halt_b", {1}, ParamGroup::Scalar, false, "const", act::kHaltBiasInit, 0, rule});
    return p;
  }

  TensorMap begin(const at::Tensor& x, const TensorMap& P, Backend backend) const override {
    TensorMap st = inner_->begin(x, P, backend);
    const at::Tensor z = at::zeros({x.size(0), x.size(1)}, x.options());
    st.set("act_h", z);
    st.set("act_R", z);
    st.set("act_N", z);
    st.set("act_acc", at::zeros_like(x));
    return st;
  }

  at::Tensor read(TensorMap& st, const Sublayer& s, const TensorMap& P) const override {
    if (s.kind == Sublayer::Kind::Mixer && split_.opens_loop(s.step)) {
      const int64_t k = split_.loop_of(s.step);
      const bool last = k == split_.loops - 1;
      const at::Tensor x = st.at("x");
      act::Halting h{st.at("act_h"), st.at("act_R"), st.at("act_N")};
      at::Tensor xs, u;
      if (s.backend == Backend::Reference) {
        xs = ref::add_coordinates(x, s.pos, k);
        u = ref::act_step(h, xs, P.at("act_halt_w"), P.at("act_halt_b"), last);
      } else if (st.has("pos_dev")) {
        // a decode step over static caches: the token coordinates of the device position
        const int64_t d = x.size(2);
        const at::Tensor sig = act::timing_signal_at(st.at("pos_dev"), d, at::kDouble) +
                               act::timing_signal(k, 1, d, x.options().dtype(at::kDouble));
        xs = x + sig.to(x.scalar_type());
        const at::Tensor p = at::sigmoid(at::matmul(xs, P.at("act_halt_w")) + P.at("act_halt_b"));
        u = act::act_step(h, p, last);
      } else {
        const int64_t T = x.size(1), d = x.size(2);
        // token coordinates of positions pos … pos + T − 1 plus depth coordinate k: a constant per key
        const at::Tensor sig = layers::device_constant(fmt::format("ut_act_timing/{}/{}/{}/{}", s.pos, T, d, k),
                                                       x.options(), [&] {
                                                         const at::TensorOptions f64 = at::TensorOptions().dtype(at::kDouble);
                                                         return act::timing_signal(s.pos, T, d, f64) +
                                                                act::timing_signal(k, 1, d, f64);
                                                       });
        xs = x + sig;
        const at::Tensor p = at::sigmoid(at::matmul(xs, P.at("act_halt_w")) + P.at("act_halt_b"));
        u = act::act_step(h, p, last);
      }
      st.set("x", xs);
      st.set("act_h", h.h);
      st.set("act_R", h.R);
      st.set("act_N", h.N);
      st.set("act_u", u);
    }
    return inner_->read(st, s, P);
  }

  void write(TensorMap& st, const Sublayer& s, const at::Tensor& y, const TensorMap& P) const override {
    inner_->write(st, s, y, P);
    if (s.kind != Sublayer::Kind::Mlp || !split_.closes_loop(s.step)) return;
    const at::Tensor out = st.at("x");
    const at::Tensor u = st.at("act_u");
    at::Tensor acc = s.backend == Backend::Reference ? ref::accumulate(st.at("act_acc"), out, u)
                                                     : u.unsqueeze(-1) * out + (1.0 - u.unsqueeze(-1)) * st.at("act_acc");
    st.set("act_acc", acc);
    if (split_.loop_of(s.step) == split_.loops - 1) st.set("x", acc);  // the coda reads the weighted state
  }

  at::Tensor finish(TensorMap& st, const TensorMap& P, Backend backend) const override {
    act::Halting h{st.at("act_h"), st.at("act_R"), st.at("act_N")};
    st.set("aux_loss", backend == Backend::Reference ? ref_ponder(h) : act::ponder_cost(h));
    return inner_->finish(st, P, backend);
  }

  // per token per candidate step: the halting gate wᵀs (2d); the timing additions and the mixes
  // are element-wise (uncounted, as nanochat's scalar mixes)
  double fwd_flops(const ModelDims& d, const ExecPlan&) const override {
    return double(split_.loops) * 2.0 * double(d.d_model);
  }
  // per candidate step: the state with its coordinates and the accumulated state, plus h, R, N, u
  double act_bytes(const ModelDims& d, const ExecPlan&, int64_t dtype_bytes) const override {
    return double(split_.loops) * (2.0 * double(d.d_model) + 4.0) * double(dtype_bytes);
  }

 private:
  static at::Tensor ref_ponder(const act::Halting& h) {
    at::Tensor sum = at::zeros({}, h.N.options());
    const int64_t B = h.N.size(0), T = h.N.size(1);
    for (int64_t i = 0; i < B; ++i)
      for (int64_t t = 0; t < T; ++t) sum = sum + h.N[i][t] + h.R[i][t];
    return act::kPonderCost * sum / double(B * T);
  }

  LoopSplit split_;
  std::shared_ptr<const ResidualStream> inner_;
};

std::vector<CaseDef> cases(const ConfigSpec& spec) {
  // 3 blocks (prelude, core, coda) at d 32; the core up to 3 times; windows of 4 keys bite
  const Config base =
      spec.parse("n_layer=3,d_model=32,head_dim=16,seq_len=32,vocab=32,mlp_hidden=32,short_window=4,max_steps=3");
  return {
      {"B2_T9", base, 2, 9},
      {"T12_core2", base.with("n_layer", int64_t(4)), 1, 12},
      {"T7_steps1", base.with("max_steps", int64_t(1)), 1, 7},
  };
}

MIXBENCH_REGISTER(act_loop_method({
    "ut_act",
    "Universal Transformer ACT: core looped up to max_steps with per-token halting and ponder cost",
    "arXiv 1807.03819; tensor2tensor universal_transformer_util (universal_transformer_act)",
    "max_steps",
    [](ConfigSpec& c) { c.i("max_steps", 4, "most core applications (ACT candidates; every one is computed)", 1, 64); },
    [](const Config& c) -> std::shared_ptr<const ResidualStream> {
      return std::make_shared<UtActStream>(act_loop_split(c, "max_steps"));
    },
    cases,
}));

}  // namespace
}  // namespace mixbench
