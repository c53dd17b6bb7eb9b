// ouro: prelude once, then n_loops times the core blocks and the coda blocks, on nanochat's SSSL
// dense layer; every loop is read out (the stream):
//   h ← prelude(embedding)                                  (the backout keeps the prelude's last layer)
//   loop t = 1 … K:  h ← norm(core(h))                      (h⁽ᵗ⁾ = norm(F(h⁽ᵗ⁻¹⁾)), norm without weight)
//                    o_t = coda(h) − backout                 (the coda runs on a branch; the next loop reads h)
//                    logits_t = head(norm(o_t)),  λ_t = σ(wᵀ norm(o_t) + b)
//   p(t) = λ_t·Π_{j<t}(1 − λ_j), p(K) = Π_{j<K}(1 − λ_j)     (ouro::exit_distribution)
// Training (stage 1): Σ_t p(t)·CE_t − 0.1·H(p) per token; the run's last gate_stage_steps (a
// share of the run, the preset's gate_stage_frac) train only the gate (w, b) on the detached
// next-loop improvement (ouro::stage2_loss), the other parameters frozen. Evaluation and decoding
// run every loop and take, per token, the logits of the first loop whose cumulative exit
// probability reaches 0.5. Every loop's coda, head and gate are computed and billed. One cache
// slot per unrolled step.
#include "mixers/loop/ouro.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <cmath>
#include <vector>

#include "harness/backbone.h"
#include "harness/errors.h"
#include "harness/residual.h"
#include "mixers/common/layers.h"
#include "mixers/loop/act_loop.h"
#include "mixers/loop/loop_ref.h"

namespace mixbench {
namespace ouro {

at::Tensor exit_distribution(const at::Tensor& gates) {
  const int64_t K = gates.size(-1);
  std::vector<at::Tensor> p;
  at::Tensor survive = at::ones_like(gates.select(-1, 0));
  for (int64_t k = 0; k + 1 < K; ++k) {
    const at::Tensor lam = gates.select(-1, k);
    p.push_back(lam * survive);
    survive = survive * (1.0 - lam);
  }
  p.push_back(survive);
  return at::stack(p, -1);
}

at::Tensor exit_choice(const at::Tensor& probs, double threshold) {
  const int64_t K = probs.size(-1);
  at::Tensor reached = probs.cumsum(-1) >= threshold;
  reached.select(-1, K - 1).fill_(true);  // the last exit takes every position still running
  // reached is monotone along K: the first exit reached is K − (exits reached)
  return (reached.to(at::kLong).sum(-1) - K).neg();
}

Stage1 stage1_loss(const at::Tensor& ce, const at::Tensor& probs, const at::Tensor& valid) {
  const at::Tensor v = valid.to(ce.scalar_type());
  const at::Tensor n = v.sum().clamp_min(1.0);
  const at::Tensor p = probs.permute({2, 0, 1}).to(ce.scalar_type());  // [K,B,T]
  const at::Tensor H = -(p * at::log(p.clamp_min(1e-30))).sum(0);
  return {((p * ce).sum(0) * v).sum() / n, -kEntropyBeta * (H * v).sum() / n};
}

at::Tensor stage2_loss(const at::Tensor& ce, const at::Tensor& gates, const at::Tensor& valid) {
  const int64_t K = ce.size(0);
  if (K < 2) return gates.sum() * 0.0;
  const at::Tensor c = ce.detach();
  const at::Tensor gain = (c.slice(0, 0, K - 1) - c.slice(0, 1, K)).clamp_min(0.0);  // [K−1,B,T]
  const at::Tensor cont = at::sigmoid(kTargetSlope * (gain - kTargetMargin));
  // at least fp32 (bf16 gates of a bf16 compute model)
  const at::Tensor lam = gates.slice(-1, 0, K - 1).permute({2, 0, 1}).to(at::promote_types(gates.scalar_type(), at::kFloat));
  const at::Tensor bce = at::binary_cross_entropy(lam, (1.0 - cont).to(lam.scalar_type()), {}, at::Reduction::None);
  const at::Tensor v = valid.to(lam.scalar_type());
  return (bce * v).sum() / (v.sum().clamp_min(1.0) * double(K - 1));
}

at::Tensor ref_exit_distribution(const at::Tensor& gates) {
  const int64_t B = gates.size(0), T = gates.size(1), K = gates.size(2);
  std::vector<at::Tensor> out;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      at::Tensor survive = at::ones({}, gates.options());
      for (int64_t k = 0; k < K; ++k) {
        if (k == K - 1) {
          out.push_back(survive);
          break;
        }
        out.push_back(gates[b][t][k] * survive);
        survive = survive * (1.0 - gates[b][t][k]);
      }
    }
  return at::stack(out).view({B, T, K});
}

at::Tensor ref_exit_choice(const at::Tensor& probs, double threshold) {
  const int64_t B = probs.size(0), T = probs.size(1), K = probs.size(2);
  at::Tensor out = at::empty({B, T}, at::TensorOptions().dtype(at::kLong));
  auto o = out.accessor<int64_t, 2>();
  const at::Tensor p = probs.detach().to(at::kDouble).cpu();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      int64_t chosen = K - 1;
      double cum = 0;
      for (int64_t k = 0; k < K - 1; ++k) {
        cum += p[b][t][k].item<double>();
        if (cum >= threshold) {
          chosen = k;
          break;
        }
      }
      o[b][t] = chosen;
    }
  return out.to(probs.device());
}

Stage1 ref_stage1_loss(const at::Tensor& ce, const at::Tensor& probs, const at::Tensor& valid) {
  const int64_t K = ce.size(0), B = ce.size(1), T = ce.size(2);
  at::Tensor lm = at::zeros({}, ce.options()), H = at::zeros({}, ce.options());
  int64_t n = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      if (!valid[b][t].item<bool>()) continue;
      ++n;
      for (int64_t k = 0; k < K; ++k) {
        const at::Tensor p = probs[b][t][k].to(ce.scalar_type());
        lm = lm + p * ce[k][b][t];
        H = H - p * at::log(at::clamp_min(p, 1e-30));
      }
    }
  const double count = double(std::max<int64_t>(n, 1));
  return {lm / count, -kEntropyBeta * H / count};
}

at::Tensor ref_stage2_loss(const at::Tensor& ce, const at::Tensor& gates, const at::Tensor& valid) {
  const int64_t K = ce.size(0), B = ce.size(1), T = ce.size(2);
  if (K < 2) return gates.sum() * 0.0;
  at::Tensor sum = at::zeros({}, gates.options());
  int64_t n = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      if (!valid[b][t].item<bool>()) continue;
      ++n;
      for (int64_t k = 0; k + 1 < K; ++k) {
        // the target from the detached cross-entropies: the next loop's improvement
        const double gain = std::max(0.0, ce[k][b][t].item<double>() - ce[k + 1][b][t].item<double>());
        const double cont = 1.0 / (1.0 + std::exp(-kTargetSlope * (gain - kTargetMargin)));
        const at::Tensor lam = gates[b][t][k];
        // log clamped at −100, as torch's binary cross-entropy
        sum = sum - (cont * at::clamp_min(at::log(1.0 - lam), -100.0) + (1.0 - cont) * at::clamp_min(at::log(lam), -100.0));
      }
    }
  return sum / (double(std::max<int64_t>(n, 1)) * double(K - 1));
}

ExecPlan plan(const Layout& l) {
  std::vector<int64_t> blocks;
  for (int64_t b = 0; b < l.prelude; ++b) blocks.push_back(b);
  for (int64_t k = 0; k < l.loops; ++k)
    for (int64_t b = 0; b < l.per_loop(); ++b) blocks.push_back(l.prelude + b);
  return ExecPlan::from_blocks(l.prelude + l.per_loop(), blocks);
}

}  // namespace ouro

namespace {

ouro::Layout layout_of(const Config& c) {
  const LoopSplit s = act_loop_split(c, "n_loops");
  return {s.prelude, s.core, s.coda, s.loops};
}

class OuroStream final : public ResidualStream {
 public:
  explicit OuroStream(const ouro::Layout& l) : l_(l), inner_(nanochat_stream(l.prelude - 1)) {}
  std::string name() const override { return "ouro"; }
  // Every loop runs at every position and the exit each token takes is chosen on the device
  // (exit_choice, a gather of the exits' logits): a decode step reads nothing from the host.
  bool static_decode() const override { return true; }

  std::vector<ParamDef> params(const ModelDims& d, const ExecPlan& plan) const override {
    std::vector<ParamDef> p = inner_->params(d, plan);
    // the exit gate Linear(d → 1) with its bias (HF's init: normal(0, 0.02), bias 0); billed by
    // the stream (fwd_flops), once per loop
    const OptimRule rule = adamw_rule("ouro_gate", 0.004, 0.8, 0.95, 0.0, false, true);
    p.push_back({"ouro_gate_w", {d.d_model}, ParamGroup::Scalar, false, "normal", 0.0, 0.02, rule});
    p.push_back({"ouro_gate_b", {1}, ParamGroup::Scalar, false, "const", 0.0, 0, rule});
    return p;
  }

  TensorMap begin(const at::Tensor& x, const TensorMap& P, Backend backend) const override {
    return inner_->begin(x, P, backend);
  }
  at::Tensor read(TensorMap& st, const Sublayer& s, const TensorMap& P) const override { return inner_->read(st, s, P); }

  void write(TensorMap& st, const Sublayer& s, const at::Tensor& y, const TensorMap& P) const override {
    inner_->write(st, s, y, P);
    if (s.kind != Sublayer::Kind::Mlp) return;
    if (l_.closes_core(s.step)) {  // h⁽ᵗ⁾ = norm(core(h⁽ᵗ⁻¹⁾)): the coda's input and the next loop's
      st.set("x", norm(st.at("x"), s.backend));
      st.set("ouro_h", st.at("x"));
    }
    if (l_.closes_coda(s.step)) {
      const int64_t k = l_.loop_of(s.step);
      st.set(fmt::format("ouro_exit.{}", k), inner_->finish(st, P, s.backend));
      if (k + 1 < l_.loops) st.set("x", st.at("ouro_h"));
    }
  }

  at::Tensor finish(TensorMap& st, const TensorMap&, Backend) const override {
    return st.at(fmt::format("ouro_exit.{}", l_.loops - 1));
  }

  Exits exits(TensorMap& st, const TensorMap& P, Backend backend) const override {
    Exits e;
    const at::Tensor& w = P.at("ouro_gate_w");
    const at::Tensor& b = P.at("ouro_gate_b");
    std::vector<at::Tensor> gates;
    for (int64_t k = 0; k < l_.loops; ++k) {
      const at::Tensor h = st.at(fmt::format("ouro_exit.{}", k));
      e.hidden.push_back(h);
      gates.push_back(backend == Backend::Reference ? ref_gate(h, w, b) : at::sigmoid(at::matmul(layers::rms_norm(h), w) + b));
    }
    e.gates = at::stack(gates, -1);
    const bool ref = backend == Backend::Reference;
    e.probs = ref ? ouro::ref_exit_distribution(e.gates) : ouro::exit_distribution(e.gates);
    e.choice = ref ? ouro::ref_exit_choice(e.probs) : ouro::exit_choice(e.probs);
    return e;
  }

  ExitLoss exit_loss(const Exits& e, const at::Tensor& ce, const at::Tensor& valid, bool gate_only,
                     Backend backend) const override {
    const bool ref = backend == Backend::Reference;
    if (gate_only) {  // stage 2: the gate alone; the expected cross-entropy is logged
      at::Tensor lm;
      {
        c10::NoGradGuard ng;
        lm = (ref ? ouro::ref_stage1_loss(ce, e.probs, valid) : ouro::stage1_loss(ce, e.probs, valid)).lm;
      }
      const at::Tensor g = ref ? ouro::ref_stage2_loss(ce, e.gates, valid) : ouro::stage2_loss(ce, e.gates, valid);
      return {g, lm, g};
    }
    const ouro::Stage1 s = ref ? ouro::ref_stage1_loss(ce, e.probs, valid) : ouro::stage1_loss(ce, e.probs, valid);
    return {s.lm + s.aux, s.lm, s.aux};
  }

  std::vector<std::string> gate_params() const override { return {"ouro_gate_w", "ouro_gate_b"}; }

  // per token: the K − 1 heads beyond the backbone's one (2·V·d each) and K gates (2d each); the
  // norms and softcaps are element-wise (uncounted, as nanochat's final norm)
  double fwd_flops(const ModelDims& d, const ExecPlan&) const override {
    return double(l_.loops - 1) * 2.0 * double(d.vocab) * double(d.d_model) + double(l_.loops) * 2.0 * double(d.d_model);
  }
  // per exit beyond the last: its hidden state and normed state, its fp32 logits; per exit its
  // gate's input, λ and p
  double act_bytes(const ModelDims& d, const ExecPlan&, int64_t dtype_bytes) const override {
    return double(l_.loops - 1) * (2.0 * double(d.d_model) * double(dtype_bytes) + 4.0 * double(d.vocab)) +
           double(l_.loops) * (double(d.d_model) + 2.0) * double(dtype_bytes);
  }

 private:
  static at::Tensor norm(const at::Tensor& x, Backend backend) {
    return backend == Backend::Reference ? loop_ref::rms_norm(x) : layers::rms_norm(x);
  }
  // σ(wᵀ norm(h) + b) position by position
  static at::Tensor ref_gate(const at::Tensor& h, const at::Tensor& w, const at::Tensor& b) {
    const at::Tensor hn = loop_ref::rms_norm(h);
    const int64_t B = h.size(0), T = h.size(1);
    std::vector<at::Tensor> out;
    for (int64_t i = 0; i < B; ++i)
      for (int64_t t = 0; t < T; ++t) out.push_back(1.0 / (1.0 + at::exp(-(at::dot(w, hn[i][t]) + b[0]))));
    return at::stack(out).view({B, T});
  }

  ouro::Layout l_;
  std::shared_ptr<const ResidualStream> inner_;
};

std::vector<CaseDef> cases(const ConfigSpec& spec) {
  // prelude, one core block, coda; three loops (seven unrolled steps); d 32, windows of 4 keys
  const Config base =
      spec.parse("n_layer=3,d_model=32,head_dim=16,seq_len=32,vocab=32,mlp_hidden=32,short_window=4,n_loops=3");
  return {
      {"B2_T9", base, 2, 9},
      {"T12_core2", base.with("n_layer", int64_t(4)), 1, 12},
      {"T7_loops1", base.with("n_loops", int64_t(1)), 1, 7},
  };
}

MethodSpec ouro_method() {
  MethodSpec m = act_loop_method({
      "ouro",
      "looped LM: every loop runs coda + head, exit gates with survival, Σ p(t)·CE_t − 0.1·H(p), gate-only final "
      "stage, eval exits at cumulative p ≥ 0.5",
      "arXiv 2510.25741; ByteDance/Ouro modeling_ouro.py",
      "n_loops",
      [](ConfigSpec& c) {
        c.i("n_loops", 4, "loops of the core (every loop runs the coda and the head)", 1, 64)
            .i("gate_stage_steps", -1,
               "training steps at the end of a run that train only the exit gate; -1 = the preset's gate_stage_frac "
               "of the run",
               -1);
      },
      [](const Config& c) -> std::shared_ptr<const ResidualStream> { return std::make_shared<OuroStream>(layout_of(c)); },
      cases,
  });
  m.plan = [](const Config& c) { return ouro::plan(layout_of(c)); };
  // at the CPU preset's width four loops leave no shape within ±2% of the anchor's FLOPs; two do
  m.presets["tiny"].config = "n_loops=2";
  return m;
}

MIXBENCH_REGISTER(ouro_method());

}  // namespace
}  // namespace mixbench
