#include "suites/optimizer.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "harness/errors.h"
#include "harness/registry.h"

namespace mixbench {

// ------------------------------------------------------------------ schedules
namespace {
int64_t warmdown_iters(const Schedule& s) {
  // Python's round(): half to even, which nearbyint does in the default rounding mode.
  return int64_t(std::nearbyint(s.warmdown_ratio * double(s.steps)));
}
}  // namespace

double lr_multiplier(const Schedule& s, int64_t it) {
  const int64_t wd = warmdown_iters(s);
  if (it < s.warmup) return double(it + 1) / double(s.warmup);
  if (it <= s.steps - wd) return 1.0;
  const double progress = double(s.steps - it) / double(wd);
  return progress * 1.0 + (1.0 - progress) * s.final_lr_frac;
}

double muon_momentum(const Schedule& s, int64_t it) {
  const int64_t wd = warmdown_iters(s);
  const int64_t start = s.steps - wd;
  if (it < s.momentum_warmup) {
    const double frac = double(it) / double(s.momentum_warmup);
    return (1 - frac) * 0.85 + frac * 0.97;
  }
  if (it >= start) {
    const double progress = double(it - start) / double(wd);
    return 0.97 * (1 - progress) + 0.90 * progress;
  }
  return 0.97;
}

double muon_weight_decay(const Schedule& s, int64_t it, double wd0) {
  if (s.wd_follows_lr) return it <= s.steps - warmdown_iters(s) ? wd0 : wd0 * lr_multiplier(s, it);
  return wd0 * 0.5 * (1 + std::cos(M_PI * double(it) / double(s.steps)));
}

int64_t first_schedule_difference(const Schedule& a, const Schedule& b, double wd0) {
  const int64_t n = std::min(a.steps, b.steps);
  for (int64_t it = 0; it < n; ++it)
    if (lr_multiplier(a, it) != lr_multiplier(b, it) || muon_momentum(a, it) != muon_momentum(b, it) ||
        muon_weight_decay(a, it, wd0) != muon_weight_decay(b, it, wd0))
      return it;
  return n;
}

// ------------------------------------------------------------------ optimizer pieces
namespace {
constexpr double kPolarExpress[5][3] = {
    {8.156554524902461, -22.48329292557795, 15.878769915207462},
    {4.042929935166739, -2.808917465908714, 0.5000178451051316},
    {3.8916678022926607, -2.772484153217685, 0.5060648178503393},
    {3.285753657755655, -2.3681294933425376, 0.46449024233003106},
    {2.3465413258596377, -1.7097828382687081, 0.42323551169305323},
};
}  // namespace

namespace {
// The Frobenius norm of each matrix of a [..., rows, cols] stack (keepdim), or of a single matrix.
at::Tensor frobenius(const at::Tensor& X) {
  return X.dim() == 2 ? X.norm() : at::linalg_vector_norm(X, 2, at::IntArrayRef{-2, -1}, /*keepdim=*/true);
}
at::Tensor sum_matrix(const at::Tensor& X) { return X.dim() == 2 ? X.sum() : X.sum({-2, -1}, /*keepdim=*/true); }
}  // namespace

at::Tensor polar_express(const at::Tensor& X0, int steps) {
  if (X0.dim() < 2) throw InputError("polar_express takes a matrix or a stack of matrices");
  at::Tensor X = X0 / (frobenius(X0) * 1.01 + 1e-6);
  const bool tall = X.size(-2) > X.size(-1);
  for (int i = 0; i < std::min(steps, 5); ++i) {
    const double a = kPolarExpress[i][0], b = kPolarExpress[i][1], c = kPolarExpress[i][2];
    if (tall) {
      at::Tensor A = at::matmul(X.mT(), X);
      at::Tensor B = b * A + c * at::matmul(A, A);
      X = a * X + at::matmul(X, B);
    } else {
      at::Tensor A = at::matmul(X, X.mT());
      at::Tensor B = b * A + c * at::matmul(A, A);
      X = a * X + at::matmul(B, X);
    }
  }
  return X;
}

void adamw_update(at::Tensor& p, const at::Tensor& g, at::Tensor& exp_avg, at::Tensor& exp_avg_sq, int64_t step,
                  double lr, double beta1, double beta2, double eps, double wd) {
  c10::NoGradGuard ng;
  // fp32 math at least (parameters may be stored in lower precision); fp64 stays fp64
  const auto ct = at::promote_types(p.scalar_type(), at::kFloat);
  at::Tensor g32 = g.to(ct);
  at::Tensor p32 = p.to(ct);
  p32.mul_(1 - lr * wd);
  exp_avg.lerp_(g32, 1 - beta1);
  exp_avg_sq.lerp_(g32.square(), 1 - beta2);
  const double bias1 = 1 - std::pow(beta1, double(step));
  const double bias2 = 1 - std::pow(beta2, double(step));
  at::Tensor denom = (exp_avg_sq / bias2).sqrt() + eps;
  p32.add_(exp_avg / denom, -lr / bias1);
  p.copy_(p32);
}

void muon_update(at::Tensor& p, const at::Tensor& grad, at::Tensor& buf, at::Tensor& buf2, double momentum, double lr,
                 double wd, double beta2, bool bf16) {
  c10::NoGradGuard ng;
  const int64_t rows = p.size(-2), cols = p.size(-1);
  // Nesterov momentum
  buf.lerp_(grad, 1 - momentum);
  at::Tensor g = grad.lerp(buf, momentum);
  at::Tensor X = bf16 ? g.to(at::kBFloat16) : g;
  // Row equilibration: every row to the mean row norm
  at::Tensor Xf = X.to(at::kFloat);
  at::Tensor target = frobenius(Xf) / std::sqrt(double(rows));
  at::Tensor row_norm = Xf.norm(2, {-1}, true).clamp_min(1e-6);
  X = X * (target / row_norm).to(X.scalar_type());
  X = polar_express(X, 5);
  g = X.to(p.scalar_type());
  // Frobenius norm of an exactly semi-orthogonal matrix
  const double target_norm = std::sqrt(double(std::min(rows, cols)));
  g = g * (target_norm / frobenius(g.to(at::kFloat)).clamp_min(1e-6)).to(g.scalar_type());
  // NorMuon variance reduction
  const int64_t red_dim = rows >= cols ? -1 : -2;
  const double red_size = double(g.size(red_dim));
  at::Tensor v_mean = g.to(at::kFloat).square().mean({red_dim}, true);
  at::Tensor v_norm = (sum_matrix(v_mean) * red_size).sqrt();
  buf2.lerp_(v_mean.to(buf2.scalar_type()), 1 - beta2);
  at::Tensor step_size = buf2.clamp_min(1e-10).rsqrt();
  at::Tensor v_norm_new = sum_matrix((v_mean * red_size) * step_size.to(at::kFloat).square()).sqrt();
  at::Tensor final_scale = step_size * (v_norm / v_norm_new.clamp_min(1e-10));
  g = g * final_scale.to(g.scalar_type());
  // Cautious weight decay and the update
  const double lr_eff = lr * std::sqrt(std::max(1.0, double(rows) / double(cols)));
  at::Tensor mask = (g * p >= 0).to(p.scalar_type());
  p.sub_(lr_eff * g + lr_eff * wd * p * mask);
}

// ------------------------------------------------------------------ Optimizer
Optimizer::Optimizer(const Model& m, int64_t batch_tokens, const TrainHyper& h) : h_(h) {
  const double bs = std::sqrt(double(batch_tokens) / h.batch_tokens_ref);
  const double ds = std::pow(double(m.dims.d_model) / 768.0, -0.5);
  std::map<std::string, std::pair<OptimRule, std::string>> declared;  // group -> (rule, first parameter)
  for (const auto& [name, t] : m.params) {
    const OptimRule rule = m.defs.at(name).optim_rule();
    auto [it, fresh] = declared.emplace(rule.group, std::make_pair(rule, name));
    if (!fresh && it->second.first != rule)
      throw std::logic_error(fmt::format("parameters {} and {} share optimizer group '{}' with different hyper-parameters",
                                         it->second.second, name, rule.group));
    const bool muon = rule.kind == OptimKind::Muon;
    if (muon && t.dim() != 2)
      throw std::logic_error(fmt::format("parameter {} is in a Muon group but is not a matrix", name));
    if (fresh) {
      double lr = rule.lr;
      if (rule.batch_scaled) lr = lr * bs;
      if (rule.width_scaled) lr = lr * ds;
      groups_.push_back({rule.group, muon, lr, rule.beta1, rule.beta2, rule.wd});
      group_index_[rule.group] = groups_.size() - 1;
    }
    group_of_[name] = group_index_.at(rule.group);
    auto o = t.options().requires_grad(false);
    if (muon) {
      m1_[name] = at::zeros(t.sizes(), o);
      m2_[name] = t.size(0) >= t.size(1) ? at::zeros({t.size(0), 1}, o) : at::zeros({1, t.size(1)}, o);
    } else {
      m1_[name] = at::zeros(t.sizes(), o.dtype(at::kFloat));
      m2_[name] = at::zeros(t.sizes(), o.dtype(at::kFloat));
    }
  }
}

std::string Optimizer::group_of(const std::string& p) const { return groups_.at(group_of_.at(p)).name; }
double Optimizer::base_lr(const std::string& p) const { return groups_.at(group_of_.at(p)).lr; }

std::vector<Optimizer::ParamSetting> Optimizer::settings(const Model& m) const {
  std::vector<ParamSetting> out;
  for (const auto& [name, t] : m.params) {
    const Group& g = groups_.at(group_of_.at(name));
    ParamSetting s;
    s.param = name;
    s.group = g.name;
    s.optimizer = g.muon ? "muon" : "adamw";
    s.shape = t.sizes().vec();
    s.lr = g.lr;
    s.beta1 = g.muon ? muon_momentum(h_.schedule, 0) : g.beta1;
    s.beta2 = g.beta2;
    s.weight_decay = g.muon ? h_.muon_wd : g.wd;
    out.push_back(std::move(s));
  }
  return out;
}

void Optimizer::step(Model& m, int64_t it, const std::set<std::string>* only) {
  c10::NoGradGuard ng;
  const double lrm = lr_multiplier(h_.schedule, it);
  const double mom = muon_momentum(h_.schedule, it);
  const double wd = muon_weight_decay(h_.schedule, it, h_.muon_wd);
  ++adam_step_;
  auto grad_of = [](const at::Tensor& t) {
    at::Tensor grad = t.grad();
    return grad.defined() ? grad : at::zeros_like(t);
  };
  // On a GPU the Muon matrices of one group and shape are updated as one stack (batched matmuls,
  // a few dozen launches instead of a few thousand); on the CPU one at a time.
  std::map<std::pair<size_t, std::vector<int64_t>>, std::vector<std::string>> stacks;
  for (const auto& [name, t] : m.params) {
    if (only && !only->count(name)) continue;
    const size_t gi = group_of_.at(name);
    const Group& g = groups_[gi];
    at::Tensor p = t;
    if (g.muon && t.is_cuda()) stacks[{gi, t.sizes().vec()}].push_back(name);
    else if (g.muon) muon_update(p, grad_of(t), m1_.at(name), m2_.at(name), mom, g.lr * lrm, wd, g.beta2, h_.muon_bf16);
    else adamw_update(p, grad_of(t), m1_.at(name), m2_.at(name), adam_step_, g.lr * lrm, g.beta1, g.beta2, 1e-10, g.wd);
  }
  for (const auto& [key, names] : stacks) {
    const Group& g = groups_[key.first];
    std::vector<at::Tensor> ps, gs, b1, b2;
    for (const auto& n : names) {
      ps.push_back(m.params.at(n));
      gs.push_back(grad_of(m.params.at(n)));
      b1.push_back(m1_.at(n));
      b2.push_back(m2_.at(n));
    }
    at::Tensor P = at::stack(ps), G = at::stack(gs), B1 = at::stack(b1), B2 = at::stack(b2);
    muon_update(P, G, B1, B2, mom, g.lr * lrm, wd, g.beta2, h_.muon_bf16);
    for (size_t k = 0; k < names.size(); ++k) {
      ps[k].detach().copy_(P[int64_t(k)]);
      b1[k].copy_(B1[int64_t(k)]);
      b2[k].copy_(B2[int64_t(k)]);
    }
  }
}

TensorMap Optimizer::state() const {
  TensorMap s;
  for (const auto& [n, t] : m1_) s.set("m1." + n, t);
  for (const auto& [n, t] : m2_) s.set("m2." + n, t);
  s.set("adam_step", at::full({1}, adam_step_, at::TensorOptions().dtype(at::kLong)));
  return s;
}

void Optimizer::load_state(const TensorMap& s) {
  c10::NoGradGuard ng;
  for (auto* mp : {&m1_, &m2_})
    for (auto& [n, t] : *mp) {
      const std::string key = (mp == &m1_ ? "m1." : "m2.") + n;
      if (!s.has(key)) throw InputError("checkpoint lacks optimizer state " + key);
      const at::Tensor& src = s.at(key);
      if (src.sizes() != t.sizes()) throw InputError("checkpoint optimizer state " + key + " has the wrong shape");
      t.copy_(src);
    }
  if (!s.has("adam_step")) throw InputError("checkpoint lacks adam_step");
  adam_step_ = s.at("adam_step").item<int64_t>();
}

}  // namespace mixbench
