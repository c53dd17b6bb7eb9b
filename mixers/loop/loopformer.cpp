// loopformer_fixed2: LoopFormer, elastic-depth looped transformer with shortcut modulation
// (Jeddi, Ciccone, Taati, arXiv 2602.11451; armenjeddi/loopformer 706c125: models/loopformer.py,
// train.py, utils.py), at its fixed schedule of two loops, on dense_full's layer (full causal
// attention, as the original's GPT) and nanochat's backbone and stream (resid/x0 scales per
// unrolled step, backout at the unrolled midpoint).
//
// What the original does, and where it enters here:
//  * The whole stack of n_layer blocks is looped (its SharedBlock; no prelude or coda: n_prelude =
//    n_coda = 0 by default). A schedule is a list of step sizes Δt summing to 1; loop k runs at
//    internal time t_k = Σ_{j<k} Δt_j. The full schedule of L loops is [1/L] × L, so here loop k of
//    n_loops (default 2) runs at t = k/n_loops, Δt = 1/n_loops (t = 0, ½; Δt = ½).
//  * Conditioning c = te(t) + dte(Δt), the same vector for every block of a loop and every token
//    of a row: two TimestepEmbedders, each [cos(t·f_i), sin(t·f_i)] (f_i = 10000^(−i/128),
//    i < 128, cos first; 256 features) → Linear(256, d) → SiLU → Linear(d, d); weights N(0, 0.02),
//    biases 0 (its _init_weights).
//  * Every looped block has its own adaLN map SiLU(c) → Linear(d, 4d) with bias, chunked into
//    (gate_msa, gate_mlp, scale_msa, scale_mlp), weight and bias zero-initialised (adaLN-Zero; no
//    shift term). Both sublayers are modulated: x ← x + gate_msa·attn(norm₁(x)·(1 + scale_msa)),
//    x ← x + gate_mlp·mlp(norm₂(x)·(1 + scale_mlp)), the norms RMSNorms without weight — here the
//    stream scales each sublayer's input after the backbone's RMSNorm (ResidualStream::modulate)
//    and gates its output before nanochat's residual add. Blocks outside the loop (n_prelude,
//    n_coda > 0, which the original does not have) run unmodulated.
//  * Zero gates make every looped block contribute nothing at initialisation: the model computes
//    the embedding through nanochat's stream alone. nanochat zero-initialises the output
//    projections; with zero gates as well neither would ever receive a gradient, so the looped
//    blocks' output projections (attention and MLP c_proj) take the original's
//    N(0, 0.02/√(2·n_layer)) (adjust_init); the other block matrices keep nanochat's init.
//  * Training (train.py, model_type loopformer): each step runs the full schedule (x1, loss1) and a
//    shorter one sampled by sample_short_trajectory(L) (x2, loss2): L' ~ U{1, …, L−1} steps whose
//    sizes are multiples of 1/L summing to 1. loss = loss1 + 0.1·loss2 + 0.1·mse(x1.detach(), x2),
//    x the hidden state after the final norm (before lm_head), the MSE averaged over B·T·d. At two
//    loops the only shorter schedule is one loop of Δt = 1 at t = 0 (L' = randint(1, 1), its last
//    step filling the rest): it is the plan's auxiliary route 1 (harness/plan.h), deterministic.
//    With n_loops = 1 there is no shorter schedule and no consistency term; with n_loops > 2 this
//    implementation keeps the one-loop schedule rather than sampling one (its choice).
//  * The second forward shares every parameter with the first. Its steps take nanochat's scales of
//    the full route's matching steps (prelude, the first loop, coda) and its own backout at its
//    unrolled midpoint (nanochat's stream over its own depth) — the original has no such scales.
//  * Evaluation and decoding run the full schedule only (estimate_loss); the short route runs in
//    a pass that collects the auxiliary losses (the training loss, conformance, goldens). The
//    logged training loss is loss1; the auxiliary loss is 0.1·loss2 + 0.1·mse.
//  * Optimiser: the original trains everything with AdamW (lr 6e-4, betas 0.9/0.95, weight decay
//    0.2 on matrices in its config, none on biases, at ~2^19 tokens a step). The conditioning
//    parameters keep that recipe here (groups loopformer_cond, loopformer_cond_bias, eps 1e-8 as
//    torch's default; lr ×√(B/B_ref)); the blocks train as every nanochat block.
// Accountant: the conditioning is computed once per row (as the original computes c per batch
// row), so its matrix products cost per row / T per token (per row per decode step); the scale and
// gate products 2d per sublayer per token; the short route bills its blocks, conditioning and head
// (2·V·d) to training. The consistency MSE's element-wise arithmetic is not billed, as the final
// norm is not.
#include "mixers/loop/loopformer.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>
#include <memory>
#include <vector>

#include "harness/backbone.h"
#include "harness/errors.h"
#include "harness/residual.h"
#include "mixers/common/layers.h"
#include "mixers/loop/loop_common.h"
#include "mixers/loop/loop_ref.h"

namespace mixbench {
namespace loopformer {

ExecPlan plan(const Layout& l) {
  const int64_t blocks = l.prelude + l.core + l.coda;
  ExecPlan p = ExecPlan::loop(blocks, l.prelude, l.coda, l.loops);
  if (l.has_short()) {
    std::vector<int64_t> once;
    for (int64_t b = 0; b < blocks; ++b) once.push_back(b);
    p.add_route(once);
  }
  return p;
}

Layout layout_of(const Config& c) {
  Layout l;
  l.prelude = loop_split(c, "n_prelude");
  l.coda = loop_split(c, "n_coda");
  l.core = c.i("n_layer") - l.prelude - l.coda;
  l.loops = c.i("n_loops");
  return l;
}

std::vector<ParamDef> params(const Layout& l, int64_t d) {
  const OptimRule w = adamw_rule("loopformer_cond", 6e-4, 0.9, 0.95, 0.2, false, true, 1e-8);
  const OptimRule b = adamw_rule("loopformer_cond_bias", 6e-4, 0.9, 0.95, 0.0, false, true, 1e-8);
  auto matrix = [&](std::string name, std::vector<int64_t> shape, std::string init, double sd, int64_t fan_in) {
    ParamDef p{std::move(name), std::move(shape), ParamGroup::Scalar, false, std::move(init), 0.0, sd, w};
    p.fan_in = fan_in;
    return p;
  };
  auto bias = [&](std::string name, std::vector<int64_t> shape) {
    return ParamDef{std::move(name), std::move(shape), ParamGroup::Scalar, false, "const", 0.0, 0, b};
  };
  std::vector<ParamDef> p;
  for (const char* e : {"t", "dt"}) {
    p.push_back(matrix(fmt::format("loopformer_{}_w1", e), {d, kFreqDim}, "normal", 0.02, kFreqDim));
    p.push_back(bias(fmt::format("loopformer_{}_b1", e), {d}));
    p.push_back(matrix(fmt::format("loopformer_{}_w2", e), {d, d}, "normal", 0.02, d));
    p.push_back(bias(fmt::format("loopformer_{}_b2", e), {d}));
  }
  p.push_back(matrix("loopformer_ada_w", {l.core, 4 * d, d}, "const", 0.0, d));  // adaLN-Zero
  p.push_back(bias("loopformer_ada_b", {l.core, 4 * d}));
  return p;
}

at::Tensor frequency_embedding(double t, int64_t rows, const at::TensorOptions& opts) {
  const int64_t half = kFreqDim / 2;
  // at least fp32 (the original forms it in fp32 and casts to the weights' dtype)
  const at::ScalarType ct = at::promote_types(opts.dtype().toScalarType(), at::kFloat);
  const at::Tensor args = at::exp(at::arange(half, opts.dtype(ct)) * (-std::log(kMaxPeriod) / double(half))) * t;
  return at::cat({at::cos(args), at::sin(args)}).to(opts.dtype()).unsqueeze(0).expand({rows, kFreqDim});
}

at::Tensor ref_frequency_embedding(double t, int64_t rows, const at::TensorOptions& opts) {
  const int64_t half = kFreqDim / 2;
  std::vector<double> v(static_cast<size_t>(kFreqDim));
  for (int64_t i = 0; i < half; ++i) {
    const double f = std::exp(-std::log(kMaxPeriod) * double(i) / double(half));
    v[size_t(i)] = std::cos(t * f);
    v[size_t(half + i)] = std::sin(t * f);
  }
  const at::Tensor e = at::tensor(v, at::TensorOptions().dtype(at::kDouble)).to(opts);
  std::vector<at::Tensor> out(size_t(rows), e);
  return at::stack(out);
}

namespace {
const char* const kEmbedders[] = {"t", "dt"};

at::Tensor embed(const TensorMap& P, const char* e, const at::Tensor& f) {
  const at::Tensor h = at::silu(at::linear(f, P.at(fmt::format("loopformer_{}_w1", e)), P.at(fmt::format("loopformer_{}_b1", e))));
  return at::linear(h, P.at(fmt::format("loopformer_{}_w2", e)), P.at(fmt::format("loopformer_{}_b2", e)));
}

// x [rows, in] · Wᵀ + b, one output channel of one row at a time
at::Tensor ref_linear(const at::Tensor& x, const at::Tensor& W, const at::Tensor& b) {
  std::vector<at::Tensor> rows;
  for (int64_t r = 0; r < x.size(0); ++r) {
    std::vector<at::Tensor> outs;
    for (int64_t o = 0; o < W.size(0); ++o) outs.push_back(at::dot(W[o], x[r]) + b[o]);
    rows.push_back(at::stack(outs));
  }
  return at::stack(rows);
}
at::Tensor ref_silu(const at::Tensor& x) { return x / (1.0 + at::exp(-x)); }

at::Tensor ref_embed(const TensorMap& P, const char* e, const at::Tensor& f) {
  const at::Tensor h =
      ref_silu(ref_linear(f, P.at(fmt::format("loopformer_{}_w1", e)), P.at(fmt::format("loopformer_{}_b1", e))));
  return ref_linear(h, P.at(fmt::format("loopformer_{}_w2", e)), P.at(fmt::format("loopformer_{}_b2", e)));
}
}  // namespace

at::Tensor condition(const TensorMap& P, double t, double dt, int64_t rows, const at::TensorOptions& opts) {
  return embed(P, kEmbedders[0], frequency_embedding(t, rows, opts)) +
         embed(P, kEmbedders[1], frequency_embedding(dt, rows, opts));
}

at::Tensor ref_condition(const TensorMap& P, double t, double dt, int64_t rows, const at::TensorOptions& opts) {
  return ref_embed(P, kEmbedders[0], ref_frequency_embedding(t, rows, opts)) +
         ref_embed(P, kEmbedders[1], ref_frequency_embedding(dt, rows, opts));
}

at::Tensor modulation(const TensorMap& P, int64_t j, const at::Tensor& c) {
  return at::linear(at::silu(c), P.at("loopformer_ada_w")[j], P.at("loopformer_ada_b")[j]);
}

at::Tensor ref_modulation(const TensorMap& P, int64_t j, const at::Tensor& c) {
  return ref_linear(ref_silu(c), P.at("loopformer_ada_w")[j], P.at("loopformer_ada_b")[j]);
}

at::Tensor consistency_loss(const at::Tensor& h_long, const at::Tensor& h_short) {
  const at::ScalarType ct = at::promote_types(h_short.scalar_type(), at::kFloat);  // fp32 at least
  const at::Tensor target = layers::rms_norm(h_long).detach().to(ct);
  return kConsistencyWeight * (layers::rms_norm(h_short).to(ct) - target).pow(2).mean();
}

at::Tensor ref_consistency_loss(const at::Tensor& h_long, const at::Tensor& h_short) {
  // the full route's read-out is the target: no gradient reaches it (train.py's x1.detach())
  const at::Tensor a = loop_ref::rms_norm(h_long.detach()), b = loop_ref::rms_norm(h_short);
  at::Tensor sum = at::zeros({}, b.options());
  for (int64_t i = 0; i < b.size(0); ++i)
    for (int64_t t = 0; t < b.size(1); ++t) {
      const at::Tensor diff = b[i][t] - a[i][t];
      sum = sum + at::dot(diff, diff);
    }
  return kConsistencyWeight * sum / double(b.numel());
}

}  // namespace loopformer

namespace {

using loopformer::Layout;

class LoopFormerStream final : public ResidualStream {
 public:
  explicit LoopFormerStream(const Layout& l)
      : l_(l), main_(ExecPlan::loop(l.prelude + l.core + l.coda, l.prelude, l.coda, l.loops)), inner_(nanochat_stream()) {}
  std::string name() const override { return "loopformer"; }
  // Decoding runs the full route only (the short one is an auxiliary route); its conditioning is a
  // function of the loop index alone, so a decode step is the same work at every position.
  bool static_decode() const override { return true; }

  std::vector<ParamDef> params(const ModelDims& d, const ExecPlan&) const override {
    std::vector<ParamDef> p = inner_->params(d, main_);  // resid/x0 scales per step of the full route
    for (auto& q : loopformer::params(l_, d.d_model)) p.push_back(std::move(q));
    return p;
  }

  TensorMap begin(const at::Tensor& x, const TensorMap& P, Backend b) const override {
    TensorMap st = inner_->begin(x, P, b);
    st.set("lf_embed", x);  // the short route starts from the same embedding
    return st;
  }

  at::Tensor read(TensorMap& st, const Sublayer& s, const TensorMap& P) const override {
    if (s.route == 0) return inner_->read(st, s, P);
    if (!st.has("lf_long")) start_short(st, P, s.backend);
    return inner_->read(st, s, short_params(st, P));
  }

  at::Tensor modulate(TensorMap& st, const Sublayer& s, const at::Tensor& normed, const TensorMap& P) const override {
    if (!l_.is_core(s.block)) return normed;
    const int64_t d = normed.size(-1);
    const at::Tensor scale = mod_of(st, s, P, normed.size(0)).narrow(-1, (s.kind == Sublayer::Kind::Mixer ? 2 : 3) * d, d);
    if (s.backend != Backend::Reference) return normed * (1.0 + scale).unsqueeze(1);
    // reference: row by row, channel by channel
    std::vector<at::Tensor> rows;
    for (int64_t b = 0; b < normed.size(0); ++b) {
      std::vector<at::Tensor> ch;
      for (int64_t c = 0; c < d; ++c) ch.push_back(normed[b].select(-1, c) * (scale[b][c] + 1.0));
      rows.push_back(at::stack(ch, -1));
    }
    return at::stack(rows);
  }

  void write(TensorMap& st, const Sublayer& s, const at::Tensor& y, const TensorMap& P) const override {
    at::Tensor out = y;
    if (l_.is_core(s.block)) {
      const int64_t d = y.size(-1);
      const at::Tensor gate = mod_of(st, s, P, y.size(0)).narrow(-1, (s.kind == Sublayer::Kind::Mixer ? 0 : 1) * d, d);
      if (s.backend != Backend::Reference) {
        out = gate.unsqueeze(1) * y;
      } else {
        std::vector<at::Tensor> rows;
        for (int64_t b = 0; b < y.size(0); ++b) {
          std::vector<at::Tensor> ch;
          for (int64_t c = 0; c < d; ++c) ch.push_back(gate[b][c] * y[b].select(-1, c));
          rows.push_back(at::stack(ch, -1));
        }
        out = at::stack(rows);
      }
    }
    if (s.route == 0) inner_->write(st, s, out, P);
    else inner_->write(st, s, out, short_params(st, P));
  }

  at::Tensor finish(TensorMap& st, const TensorMap& P, Backend b) const override {
    if (!st.has("lf_long")) return inner_->finish(st, P, b);
    // the short route ran: its read-out, and the consistency term towards the full route's
    const at::Tensor h_short = inner_->finish(st, short_params(st, P), b);
    const at::Tensor h_long = st.at("lf_long");  // a copy: st.set below may reallocate the map
    st.set("lf_short", h_short);
    st.set("aux_loss", b == Backend::Reference ? loopformer::ref_consistency_loss(h_long, h_short)
                                               : loopformer::consistency_loss(h_long, h_short));
    return h_long;
  }

  // With the short route: two exits, the full route's (every token takes it) and the short one's,
  // whose cross-entropy enters the training loss with weight 0.1.
  Exits exits(TensorMap& st, const TensorMap&, Backend) const override {
    if (!st.has("lf_short")) return {};
    Exits e;
    const at::Tensor h = st.at("lf_long");
    e.hidden = {h, st.at("lf_short")};
    const auto o = h.options();
    const int64_t B = h.size(0), T = h.size(1);
    e.probs = at::stack({at::ones({B, T}, o), at::zeros({B, T}, o)}, -1);
    e.gates = e.probs;
    e.choice = at::zeros({B, T}, o.dtype(at::kLong));
    return e;
  }

  ExitLoss exit_loss(const Exits&, const at::Tensor& ce, const at::Tensor& valid, bool, Backend b) const override {
    at::Tensor lm, short_ce;
    if (b != Backend::Reference) {
      const at::Tensor v = valid.to(ce.scalar_type());
      const at::Tensor n = v.sum().clamp_min(1.0);
      lm = (ce[0] * v).sum() / n;
      short_ce = (ce[1] * v).sum() / n;
    } else {
      lm = at::zeros({}, ce.options());
      short_ce = at::zeros({}, ce.options());
      int64_t n = 0;
      for (int64_t i = 0; i < ce.size(1); ++i)
        for (int64_t t = 0; t < ce.size(2); ++t) {
          if (!valid[i][t].item<bool>()) continue;
          ++n;
          lm = lm + ce[0][i][t];
          short_ce = short_ce + ce[1][i][t];
        }
      lm = lm / double(std::max<int64_t>(n, 1));
      short_ce = short_ce / double(std::max<int64_t>(n, 1));
    }
    const at::Tensor aux = loopformer::kShortCeWeight * short_ce;
    return {lm + aux, lm, aux};
  }

  // The looped blocks' output projections: N(0, 0.02/√(2·n_layer)) instead of nanochat's zeros,
  // which with adaLN-Zero gates would leave both without a gradient.
  void adjust_init(std::vector<ParamDef>& defs, const ModelDims& d, const ExecPlan&) const override {
    const double sd = loopformer::kProjInitStd / std::sqrt(2.0 * double(d.n_layer));
    for (int64_t b = l_.prelude; b < l_.prelude + l_.core; ++b)
      for (ParamDef& p : defs)
        if (p.name == fmt::format("layers.{}.mixer.c_proj", b) || p.name == fmt::format("layers.{}.mlp.c_proj", b)) {
          p.init = "normal";
          p.init_a = 0.0;
          p.init_b = sd;
        }
  }

  double fwd_flops(const ModelDims& d, const ExecPlan&) const override { return route_flops(d, l_.loops); }
  double uncounted_flops(const ModelDims& d, const ExecPlan&) const override { return products(d, l_.loops); }
  // the short route's conditioning, modulation and gates, and its exit's head
  double aux_fwd_flops(const ModelDims& d, const ExecPlan&) const override {
    return l_.has_short() ? route_flops(d, 1) + 2.0 * double(d.vocab) * double(d.d_model) : 0.0;
  }
  double aux_uncounted_flops(const ModelDims& d, const ExecPlan&) const override {
    return l_.has_short() ? products(d, 1) : 0.0;
  }
  // per core application the scaled inputs and the ungated outputs of both sublayers (4d); the
  // short route adds its applications, its exit's hidden and normed state (2d) and fp32 logits
  double act_bytes(const ModelDims& d, const ExecPlan&, int64_t dtype_bytes) const override {
    const double D = double(d.d_model), e = double(dtype_bytes);
    const double apps = double(l_.core) * double(l_.loops + (l_.has_short() ? 1 : 0));
    return apps * 4.0 * D * e + (l_.has_short() ? 2.0 * D * e + 4.0 * double(d.vocab) : 0.0);
  }

 private:
  // Per token of a route of `loops` loops: per row, every loop's conditioning (two embedders,
  // 2·(256·d + d²) each) and every core block's adaLN map (2·d·4d), over the row's d.seq_len
  // tokens; per token the scale and gate products.
  double route_flops(const ModelDims& d, int64_t loops) const {
    const double D = double(d.d_model);
    const double per_row = double(loops) * (4.0 * (double(loopformer::kFreqDim) * D + D * D) + double(l_.core) * 8.0 * D * D);
    return per_row / double(d.seq_len) + products(d, loops);
  }
  // (1 + scale)·x and gate·y: 2d per sublayer, two sublayers per core application
  double products(const ModelDims& d, int64_t loops) const { return double(loops * l_.core) * 4.0 * double(d.d_model); }

  // The modulation [rows, 4d] of sublayer s's block in its route's loop, computed once per pass.
  at::Tensor mod_of(TensorMap& st, const Sublayer& s, const TensorMap& P, int64_t rows) const {
    const int64_t loop = s.route == 0 ? l_.loop_of(s.step) : 0, j = s.block - l_.prelude;
    const std::string key = fmt::format("lf_mod.{}.{}.{}", s.route, loop, j);
    if (st.has(key)) return st.at(key);
    const std::string ckey = fmt::format("lf_c.{}.{}", s.route, loop);
    const bool ref = s.backend == Backend::Reference;
    if (!st.has(ckey)) {
      const double t = l_.t_of(s.route, loop), dt = l_.dt_of(s.route);
      const at::TensorOptions o = P.at("loopformer_t_w1").options();
      st.set(ckey, ref ? loopformer::ref_condition(P, t, dt, rows, o) : loopformer::condition(P, t, dt, rows, o));
    }
    const at::Tensor m = ref ? loopformer::ref_modulation(P, j, st.at(ckey)) : loopformer::modulation(P, j, st.at(ckey));
    st.set(key, m);
    return m;
  }

  // Before the short route's first sublayer: keep the full route's read-out, restart from the
  // embedding, and take the full route's scales at the matching steps (prelude, the first loop,
  // coda).
  void start_short(TensorMap& st, const TensorMap& P, Backend b) const {
    st.set("lf_long", inner_->finish(st, P, b));
    st.set("x", st.at("lf_embed"));
    st.erase("backout");
    const int64_t head = l_.prelude + l_.core, tail = l_.prelude + l_.core * l_.loops;
    for (const char* name : {"resid_lambdas", "x0_lambdas"}) {
      const at::Tensor& v = P.at(name);
      st.set(fmt::format("lf_short.{}", name), at::cat({v.slice(0, 0, head), v.slice(0, tail, tail + l_.coda)}));
    }
  }
  static TensorMap short_params(const TensorMap& st, const TensorMap& P) {
    return TensorMap{{"resid_lambdas", st.at("lf_short.resid_lambdas")},
                     {"x0_lambdas", st.at("lf_short.x0_lambdas")},
                     {"backout_lambda", P.at("backout_lambda")}};
  }

  Layout l_;
  ExecPlan main_;
  std::shared_ptr<const ResidualStream> inner_;
};

std::vector<CaseDef> cases(const ConfigSpec& spec) {
  // d 32; two loops of two blocks (and the short route), a prelude block before a core of two,
  // three loops at T = 1, one loop of three blocks (no shorter schedule, no auxiliary route; at two
  // steps nanochat's backout would fall on the last step, where the final norm cancels its scale)
  const Config base = spec.parse("n_layer=2,d_model=32,head_dim=16,seq_len=32,vocab=32,mlp_hidden=32");
  return {
      {"model_n2_T9", base, 1, 9},
      {"model_n3_prelude1_B2_T12", base.with("n_layer", int64_t(3)).with("n_prelude", int64_t(1)), 2, 12},
      {"model_n2_loops3_T1", base.with("n_loops", int64_t(3)), 1, 1},
      {"model_n3_loops1_T7", base.with("n_layer", int64_t(3)).with("n_loops", int64_t(1)), 1, 7},
  };
}

MethodSpec make_spec() {
  LoopDesc d;
  d.name = "loopformer_fixed2";
  d.base = "dense_full";
  d.summary =
      "LoopFormer: the stack looped n_loops = 2 times, each loop conditioned on (t, Δt) by adaLN-Zero scales and "
      "gates of both sublayers; training adds the one-loop schedule (Δt = 1): 0.1·CE + 0.1·MSE to the detached "
      "full-route read-out";
  d.citation = "Jeddi et al. 2026, arXiv 2602.11451; armenjeddi/loopformer models/loopformer.py, train.py";
  d.n_loops = 2;
  d.n_prelude = 0;
  d.n_coda = 0;
  d.residual = [](const Config& c) -> std::shared_ptr<const ResidualStream> {
    return std::make_shared<LoopFormerStream>(loopformer::layout_of(c));
  };
  d.finish = [](MethodSpec& m) {
    m.plan = [](const Config& c) { return loopformer::plan(loopformer::layout_of(c)); };
    const ConfigSpec spec = m.config;
    m.cases = [spec]() { return cases(spec); };
  };
  return loop_method(d);
}

MIXBENCH_REGISTER(make_spec());

}  // namespace
}  // namespace mixbench
