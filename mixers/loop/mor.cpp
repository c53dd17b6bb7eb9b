// mor: Mixture-of-Recursions with expert-choice routing (arXiv 2507.10524; raymin0223/mixture_of_recursions,
// model/mor_model/expert_choice_router.py `MoRLlamaDecoderLayer`). Middle-cycle sharing: the first
// block once, the middle n_layer − 2 blocks (the recursion block) applied N_r = n_loops times, the
// last block once, on nanochat's layer with full causal attention in every layer (dense_full: the
// original's Llama has no windows). Values from the original's
// conf/pretrain/250720_pretrain_smollm-360m_rec3_middle_cycle_random_lr3e-3_mor_expert_linear_alpha_0.1_sigmoid_aux_loss_0.001.yaml
// and util/config.py: N_r = 3, capacities (N_r − r)/N_r = 1, 2/3, 1/3, linear router without bias
// (N(0, 0.02)), sigmoid, α = 0.1, temp 1, auxiliary BCE loss with coefficient 0.001.
// At recursion r (one router θ_r per recursion), among the n tokens the previous recursion
// processed (all T at r = 0):
//   z = θ_rᵀ H_t                                   (router logit of each candidate)
//   S = the k_r = max(1, ⌊c_r·T⌋) largest z         (expert choice; mor::select_top's tie rule)
//   H_S ← H_S + α·σ(z_S) · f(H_S)                   (f: the recursion block on the selected tokens
//                                                    alone, causal among them at their own positions;
//                                                    f's output is the block's hidden state, its own
//                                                    residual included, as the original's decoder layer)
//   aux += coeff · Σ BCEWithLogits(z, [t ∈ S]) / (B·n)
// Unselected tokens keep H; the next recursion chooses among S. The backout keeps the first
// block's output (nanochat_stream(prelude − 1)); resid/x0 scales per plan step act on the
// selected tokens inside a recursion. The shared block is billed per recursion at k_r/T of the
// tokens (its attention among k_r tokens), the routers at n/T tokens each.
// No decode: the selection is a top-k over the whole sequence (non-causal). The original trains
// the router with the BCE so that σ(z) ≥ 0.5 predicts the selection, but its released code does
// not decode with a threshold (its generation path runs one token, which top-k always selects);
// a threshold rule would not reproduce the forward pass, which the harness's decode invariant asks.
#include "mixers/loop/mor.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "harness/backbone.h"
#include "harness/errors.h"
#include "harness/residual.h"
#include "mixers/loop/act_loop.h"
#include "mixers/loop/loop_common.h"

namespace mixbench {
namespace mor {

std::vector<double> capacities(const Config& c) {
  const int64_t n = c.i("n_loops");
  const std::string& text = c.s("capacity");
  std::vector<double> cap;
  if (text.empty()) {
    for (int64_t r = 0; r < n; ++r) cap.push_back(double(n - r) / double(n));
    return cap;
  }
  size_t start = 0;
  while (true) {
    const size_t end = text.find(':', start);
    const std::string item = text.substr(start, end == std::string::npos ? std::string::npos : end - start);
    size_t used = 0;
    double v = 0;
    try {
      v = std::stod(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size())
      throw InputError(fmt::format("capacity '{}': '{}' is not a number (capacities c_0:c_1:… in (0, 1])", text, item));
    if (!(v > 0.0 && v <= 1.0)) throw InputError(fmt::format("capacity '{}': {} is outside (0, 1]", text, v));
    if (!cap.empty() && v > cap.back())
      throw InputError(fmt::format("capacity '{}': capacities must not increase from one recursion to the next", text));
    cap.push_back(v);
    if (end == std::string::npos) break;
    start = end + 1;
  }
  if (int64_t(cap.size()) != n)
    throw InputError(fmt::format("capacity '{}' lists {} capacities for n_loops {} recursions", text, cap.size(), n));
  return cap;
}

int64_t tokens_at(double capacity, int64_t T) { return std::max<int64_t>(1, int64_t(std::floor(capacity * double(T)))); }

at::Tensor select_top(const at::Tensor& z, int64_t k) {
  // a stable descending sort keeps equal logits in position order
  const at::Tensor order = std::get<1>(at::sort(z, /*stable=*/true, /*dim=*/1, /*descending=*/true));
  return std::get<0>(at::sort(order.slice(1, 0, k), 1));
}

}  // namespace mor

namespace {

// The rows idx [B,k] of x [B,T,C].
at::Tensor gather_rows(const at::Tensor& x, const at::Tensor& idx) {
  return at::gather(x, 1, idx.unsqueeze(-1).expand({idx.size(0), idx.size(1), x.size(2)}));
}

// The FP64 reference of the stream's own arithmetic: explicit loops over rows and tokens.
namespace ref {

at::Tensor gather_rows(const at::Tensor& x, const at::Tensor& idx) {
  std::vector<at::Tensor> rows;
  for (int64_t b = 0; b < idx.size(0); ++b)
    for (int64_t j = 0; j < idx.size(1); ++j) rows.push_back(x[b][idx[b][j].item<int64_t>()]);
  return at::stack(rows).view({idx.size(0), idx.size(1), x.size(2)});
}

// Per row: the k candidates of largest logit (earlier position first among equal logits), in
// position order, as positions into the row of candidates.
std::vector<std::vector<int64_t>> select_top(const at::Tensor& z, int64_t k) {
  std::vector<std::vector<int64_t>> out;
  for (int64_t b = 0; b < z.size(0); ++b) {
    std::vector<std::pair<double, int64_t>> s;
    for (int64_t j = 0; j < z.size(1); ++j) s.push_back({z[b][j].item<double>(), j});
    std::sort(s.begin(), s.end(), [](const auto& a, const auto& c) {
      return a.first > c.first || (a.first == c.first && a.second < c.second);
    });
    std::vector<int64_t> top;
    for (int64_t j = 0; j < k; ++j) top.push_back(s[size_t(j)].second);
    std::sort(top.begin(), top.end());
    out.push_back(top);
  }
  return out;
}

// log(1 + e^{−|z|}) + max(z, 0) − z·y: the BCE of logit z toward y, summed.
at::Tensor bce_sum(const at::Tensor& z, const std::vector<std::vector<int64_t>>& top) {
  at::Tensor sum = at::zeros({}, z.options());
  for (int64_t b = 0; b < z.size(0); ++b)
    for (int64_t j = 0; j < z.size(1); ++j) {
      const at::Tensor zj = z[b][j];
      const bool in = std::binary_search(top[size_t(b)].begin(), top[size_t(b)].end(), j);
      sum = sum + at::log1p(at::exp(-zj.abs())) + at::clamp_min(zj, 0.0) - (in ? zj : at::zeros_like(zj));
    }
  return sum;
}

}  // namespace ref

class MorStream final : public ResidualStream {
 public:
  MorStream(const LoopSplit& split, std::vector<double> cap, double alpha, double coeff, int64_t seq_len)
      : split_(split), cap_(std::move(cap)), alpha_(alpha), coeff_(coeff), seq_len_(seq_len),
        inner_(nanochat_stream(split.prelude - 1)) {}
  std::string name() const override { return "mor"; }

  std::vector<ParamDef> params(const ModelDims& d, const ExecPlan& plan) const override {
    std::vector<ParamDef> p = inner_->params(d, plan);
    p.push_back({"mor_router", {split_.loops, d.d_model}, ParamGroup::Scalar, false, "normal", 0.0, mor::kRouterInitStd,
                 adamw_rule("mor_router", 0.004, 0.8, 0.95, 0.0, false, true)});
    return p;
  }

  TensorMap begin(const at::Tensor& x, const TensorMap& P, Backend backend) const override {
    TensorMap st = inner_->begin(x, P, backend);
    st.set("aux_loss", at::zeros({}, x.options()));
    return st;
  }

  at::Tensor read(TensorMap& st, const Sublayer& s, const TensorMap& P) const override {
    if (s.kind == Sublayer::Kind::Mixer && split_.opens_loop(s.step)) route(st, s, P);
    return inner_->read(st, s, P);
  }

  void write(TensorMap& st, const Sublayer& s, const at::Tensor& y, const TensorMap& P) const override {
    inner_->write(st, s, y, P);
    if (s.kind != Sublayer::Kind::Mlp || !split_.closes_loop(s.step)) return;
    // H_S ← H_S + g·f(H_S); the others keep H
    const at::Tensor f = st.at("x"), full = st.at("mor_full"), sel = st.at("mor_sel"), g = st.at("mor_gate");
    at::Tensor out;
    if (s.backend == Backend::Reference) {
      std::vector<at::Tensor> rows;
      for (int64_t b = 0; b < full.size(0); ++b)
        for (int64_t t = 0; t < full.size(1); ++t) {
          at::Tensor row = full[b][t];
          for (int64_t j = 0; j < sel.size(1); ++j)
            if (sel[b][j].item<int64_t>() == t) row = row + g[b][j] * f[b][j];
          rows.push_back(row);
        }
      out = at::stack(rows).view(full.sizes());
    } else {
      out = at::scatter_add(full, 1, sel.unsqueeze(-1).expand(f.sizes()), g.unsqueeze(-1) * f);
    }
    st.set("x", out);
    st.set("x0", st.at("mor_x0"));
  }

  void mixer_inputs(const TensorMap& st, const Sublayer& s, TensorMap& in) const override {
    if (!inside(s.step)) return;
    const at::Tensor sel = st.at("mor_sel");
    in.set("positions", sel + s.pos);
    if (in.has("ve")) in.set("ve", s.backend == Backend::Reference ? ref::gather_rows(in.at("ve"), sel) : gather_rows(in.at("ve"), sel));
  }

  at::Tensor finish(TensorMap& st, const TensorMap& P, Backend backend) const override {
    return inner_->finish(st, P, backend);
  }

  // a recursion's steps run on k_r of the T tokens
  double step_share(const ExecPlan&, int64_t step) const override {
    return inside(step) ? double(mor::tokens_at(cap_[size_t(split_.loop_of(step))], seq_len_)) / double(seq_len_) : 1.0;
  }
  // the router logits θ_rᵀH of every candidate: n_r/T of the tokens at recursion r
  double fwd_flops(const ModelDims& d, const ExecPlan&) const override {
    double n = 0;
    for (size_t r = 0; r < cap_.size(); ++r) n += double(candidates(r));
    return 2.0 * double(d.d_model) * n / double(seq_len_);
  }
  // per recursion: the gathered state and embedding of the selected tokens, the logits and gates
  double act_bytes(const ModelDims& d, const ExecPlan&, int64_t dtype_bytes) const override {
    double n = 0;
    for (size_t r = 0; r < cap_.size(); ++r)
      n += (2.0 * double(d.d_model) + 1.0) * double(mor::tokens_at(cap_[r], seq_len_)) + double(candidates(r));
    return n * double(dtype_bytes) / double(seq_len_);
  }

 private:
  bool inside(int64_t step) const { return step >= split_.core_begin() && step < split_.core_end(); }
  // candidates of recursion r at T = seq_len: all tokens first, then the previous selection
  int64_t candidates(size_t r) const { return r == 0 ? seq_len_ : mor::tokens_at(cap_[r - 1], seq_len_); }

  // Opens recursion r: routes among the candidates, keeps the full state, and leaves the selected
  // tokens' state (and embedding, for the x0 mix) as the stream's state.
  void route(TensorMap& st, const Sublayer& s, const TensorMap& P) const {
    const int64_t r = split_.loop_of(s.step);
    const at::Tensor full = st.at("x"), x0 = st.at("x0");
    const int64_t B = full.size(0), T = full.size(1);
    const int64_t k = mor::tokens_at(cap_[size_t(r)], T);
    const at::Tensor cand = r == 0 ? at::arange(T, full.options().dtype(at::kLong)).expand({B, T}) : st.at("mor_sel");
    const int64_t n = cand.size(1);
    const at::Tensor theta = P.at("mor_router")[r];
    at::Tensor sel, g, bce, x, x00;
    if (s.backend == Backend::Reference) {
      const at::Tensor xc = ref::gather_rows(full, cand);
      std::vector<at::Tensor> zs;
      for (int64_t b = 0; b < B; ++b)
        for (int64_t j = 0; j < n; ++j) zs.push_back(at::dot(theta, xc[b][j]));
      const at::Tensor z = at::stack(zs).view({B, n});
      const auto top = ref::select_top(z, k);
      std::vector<int64_t> idx;
      std::vector<at::Tensor> gs;
      for (int64_t b = 0; b < B; ++b)
        for (int64_t j : top[size_t(b)]) {
          idx.push_back(cand[b][j].item<int64_t>());
          gs.push_back(alpha_ / (1.0 + at::exp(-z[b][j])));
        }
      sel = at::tensor(idx, at::TensorOptions().dtype(at::kLong)).view({B, k}).to(full.device());
      g = at::stack(gs).view({B, k});
      bce = ref::bce_sum(z, top);
      x = ref::gather_rows(full, sel);
      x00 = ref::gather_rows(x0, sel);
    } else {
      const at::Tensor z = at::matmul(gather_rows(full, cand), theta);  // [B,n]
      const at::Tensor top = mor::select_top(z.detach(), k);
      sel = at::gather(cand, 1, top);
      const at::Tensor zs = at::gather(z, 1, top);
      g = alpha_ * at::sigmoid(zs);
      const at::Tensor target = at::zeros_like(z).scatter(1, top, 1.0);
      bce = at::binary_cross_entropy_with_logits(z, target, {}, {}, at::Reduction::Sum);
      x = gather_rows(full, sel);
      x00 = gather_rows(x0, sel);
    }
    st.set("aux_loss", st.at("aux_loss") + coeff_ * bce / double(B * n));
    st.set("mor_full", full);
    st.set("mor_x0", x0);
    st.set("mor_sel", sel);
    st.set("mor_gate", g);
    st.set("x", x);
    st.set("x0", x00);
  }

  LoopSplit split_;
  std::vector<double> cap_;
  double alpha_, coeff_;
  int64_t seq_len_;
  std::shared_ptr<const ResidualStream> inner_;
};

LoopSplit mor_split(const Config& c) {
  LoopSplit s;
  s.prelude = loop_split(c, "n_prelude");
  s.coda = loop_split(c, "n_coda");
  s.core = c.i("n_layer") - s.prelude - s.coda;
  s.loops = c.i("n_loops");
  return s;
}

std::shared_ptr<const ResidualStream> mor_stream(const Config& c) {
  return std::make_shared<MorStream>(mor_split(c), mor::capacities(c), c.f("router_alpha"), c.f("router_aux_coeff"),
                                     c.i("seq_len"));
}

// mor's own fields, no decode, and the shared block's attention billed among the k_r tokens a
// recursion processes (the accountant weighs the step by k_r/T, its step share).
void finish(MethodSpec& m) {
  m.config.s("capacity", "", "capacities c_0:c_1:… of the recursions, each in (0, 1], non-increasing; a recursion "
                             "processes max(1, ⌊c_r·T⌋) tokens; empty = (N_r − r)/N_r")
      .f("router_alpha", mor::kAlpha, "α of the router gate α·σ(θ_rᵀH)", 0.0)
      .f("router_aux_coeff", mor::kAuxCoeff, "weight of the auxiliary router BCE loss", 0.0)
      .rule([](const Config& c) {
        mor::capacities(c);
        const LoopSplit s = mor_split(c);
        if (s.prelude < 1 || s.coda < 1)
          throw InputError(fmt::format("mor keeps its first and last blocks unique around the core: n_prelude {} and "
                                       "n_coda {} must be at least 1 (n_layer ≥ 3)",
                                       s.prelude, s.coda));
      });
  m.prefill = nullptr;
  m.decode = nullptr;
  auto base = m.account;
  m.account = [base](const Config& c, const LayerCtx& ctx, const CostQuery& q) {
    const LoopSplit s = mor_split(c);
    if (ctx.unrolled < s.core_begin() || ctx.unrolled >= s.core_end()) return base(c, ctx, q);
    const int64_t r = s.loop_of(ctx.unrolled);
    CostQuery qk = q;
    qk.T = mor::tokens_at(mor::capacities(c)[size_t(r)], c.i("seq_len"));
    LayerCost lc = base(c, ctx, qk);
    lc.formula = fmt::format("recursion {}: {} of T = {} tokens, attending among themselves; {}", r, qk.T,
                             c.i("seq_len"), lc.formula);
    return lc;
  };
}

MIXBENCH_REGISTER(loop_method({"mor",
                               "dense_full",
                               "Mixture-of-Recursions: first/last block unique, middle blocks recursed N_r times on the "
                               "tokens an expert-choice sigmoid router keeps; no decode (top-k over the sequence)",
                               "arXiv 2507.10524; raymin0223/mixture_of_recursions (expert_choice_router.py)",
                               3,
                               -1,
                               -1,
                               mor_stream,
                               finish}));

}  // namespace
}  // namespace mixbench
