#include "suites/optimizer.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <iterator>
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

namespace {
// The step-dependent operations, with a host value exactly as the host path has always computed
// them, or with a 0-dim tensor that gives the same bits: LibTorch's lerp, mul and addcmul take a
// tensor weight through the same arithmetic as a host one (an fp32 host value is rounded to the
// tensor's dtype as the buffer's fp32 copy is; addcmul with value 1 is the same fused multiply-add
// as add with alpha); a CUDA division by a host value multiplies by its reciprocal (AdamScalars).
void lerp_(at::Tensor& a, const at::Tensor& b, const StepScalar& w) {
  if (w.t.defined())
    a.lerp_(b, w.t);
  else
    a.lerp_(b, w.v);
}
at::Tensor lerp(const at::Tensor& a, const at::Tensor& b, const StepScalar& w) {
  return w.t.defined() ? a.lerp(b, w.t) : a.lerp(b, w.v);
}
at::Tensor times(const StepScalar& s, const at::Tensor& a) { return s.t.defined() ? a * s.t : s.v * a; }
}  // namespace

void adamw_update(at::Tensor& p, const at::Tensor& g, at::Tensor& exp_avg, at::Tensor& exp_avg_sq, int64_t step,
                  double lr, double beta1, double beta2, double eps, double wd) {
  AdamScalars s;
  s.decay.v = 1 - lr * wd;
  const double bias1 = 1 - std::pow(beta1, double(step));
  s.bias2.v = 1 - std::pow(beta2, double(step));
  s.step_factor.v = -lr / bias1;
  adamw_update(p, g, exp_avg, exp_avg_sq, s, beta1, beta2, eps);
}

void adamw_update(at::Tensor& p, const at::Tensor& g, at::Tensor& exp_avg, at::Tensor& exp_avg_sq, const AdamScalars& s,
                  double beta1, double beta2, double eps) {
  c10::NoGradGuard ng;
  // fp32 math at least (parameters may be stored in lower precision); fp64 stays fp64
  const auto ct = at::promote_types(p.scalar_type(), at::kFloat);
  at::Tensor g32 = g.to(ct);
  at::Tensor p32 = p.to(ct);
  if (s.decay.t.defined())
    p32.mul_(s.decay.t);
  else
    p32.mul_(s.decay.v);
  exp_avg.lerp_(g32, 1 - beta1);
  exp_avg_sq.lerp_(g32.square(), 1 - beta2);
  const at::Tensor v_hat = !s.bias2.t.defined()  ? exp_avg_sq / s.bias2.v
                           : s.bias2_reciprocal ? exp_avg_sq * s.bias2.t
                                                : exp_avg_sq / s.bias2.t;
  at::Tensor denom = v_hat.sqrt() + eps;
  if (s.step_factor.t.defined())
    p32.addcmul_(exp_avg / denom, s.step_factor.t);
  else
    p32.add_(exp_avg / denom, s.step_factor.v);
  p.copy_(p32);
}

void muon_update(at::Tensor& p, const at::Tensor& grad, at::Tensor& buf, at::Tensor& buf2, double momentum, double lr,
                 double wd, double beta2, bool bf16) {
  const int64_t rows = p.size(-2), cols = p.size(-1);
  MuonScalars s;
  s.one_minus_momentum.v = 1 - momentum;
  s.momentum.v = momentum;
  s.lr_eff.v = lr * std::sqrt(std::max(1.0, double(rows) / double(cols)));
  s.lr_eff_wd.v = s.lr_eff.v * wd;
  muon_update(p, grad, buf, buf2, s, beta2, bf16);
}

void muon_update(at::Tensor& p, const at::Tensor& grad, at::Tensor& buf, at::Tensor& buf2, const MuonScalars& s,
                 double beta2, bool bf16) {
  c10::NoGradGuard ng;
  const int64_t rows = p.size(-2), cols = p.size(-1);
  // Nesterov momentum
  lerp_(buf, grad, s.one_minus_momentum);
  at::Tensor g = lerp(grad, buf, s.momentum);
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
  // Cautious weight decay and the update: p −= lr_eff·g + (lr_eff·wd)·p·mask
  at::Tensor mask = (g * p >= 0).to(p.scalar_type());
  p.sub_(times(s.lr_eff, g) + times(s.lr_eff_wd, p) * mask);
}

// ------------------------------------------------------------------ parameter rules
namespace {
// Linear maps whose ParamDef says `matmul` false because they act once per block of keys/values,
// not per token (the accountant counts their FLOPs apart): NSA's compression maps φ and Seer's key gate.
const char* const kBlockLinearMaps[] = {"nsa_cmp_k", "nsa_cmp_v", "seer_wk"};
// flash-linear-attention's `_no_weight_decay` parameters (fla/layers/gated_deltanet.py, kda.py, mamba2.py)
const char* const kDecayParams[] = {"A_log", "dt_bias", "D"};

bool starts_with(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }
bool ends_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}
bool listed(const std::string& leaf, const char* const* begin, const char* const* end) {
  return std::any_of(begin, end, [&](const char* n) { return leaf == n; });
}

MixerVector mixer_vector_kind(const std::string& leaf) {
  if (listed(leaf, std::begin(kDecayParams), std::end(kDecayParams))) return MixerVector::Decay;
  if (ends_with(leaf, "_bias") || ends_with(leaf, "_b") || starts_with(leaf, "b_")) return MixerVector::Bias;
  if (leaf.find("norm") != std::string::npos) return MixerVector::Norm;
  if (ends_with(leaf, "_conv")) return MixerVector::ConvTaps;
  return MixerVector::Other;
}

// A Muon parameter as a [N, rows, cols] stack of its matrices (a view of its storage), or itself when 2-D.
at::Tensor as_matrices(const at::Tensor& t) { return t.dim() == 2 ? t : t.view({-1, t.size(-2), t.size(-1)}); }
}  // namespace

OptimRule resolve_optim_rule(const ParamDef& def) {
  if (def.optim.kind != OptimKind::Auto) return def.optim;
  const size_t dot = def.name.rfind('.');
  const std::string leaf = dot == std::string::npos ? def.name : def.name.substr(dot + 1);
  const bool block_map = listed(leaf, std::begin(kBlockLinearMaps), std::end(kBlockLinearMaps));
  if (def.shape.size() >= 2 && (def.matmul || block_map)) return muon_rule();
  return mixer_vector_rule(mixer_vector_kind(leaf));
}

// ------------------------------------------------------------------ Optimizer
Optimizer::Optimizer(const Model& m, int64_t batch_tokens, const TrainHyper& h) : h_(h) {
  const double bs = std::sqrt(double(batch_tokens) / h.batch_tokens_ref);
  const double ds = std::pow(double(m.dims.d_model) / 768.0, -0.5);
  std::map<std::string, std::pair<OptimRule, std::string>> declared;  // group -> (rule, first parameter)
  for (const auto& [name, t] : m.params) {
    const OptimRule rule = resolve_optim_rule(m.defs.at(name));
    auto [it, fresh] = declared.emplace(rule.group, std::make_pair(rule, name));
    if (!fresh && it->second.first != rule)
      throw std::logic_error(fmt::format("parameters {} and {} share optimizer group '{}' with different hyper-parameters",
                                         it->second.second, name, rule.group));
    const bool muon = rule.kind == OptimKind::Muon;
    if (muon && t.dim() < 2)
      throw std::logic_error(fmt::format("parameter {} is in a Muon group but is not a matrix or a stack of matrices", name));
    if (fresh) {
      double lr = rule.lr;
      if (rule.batch_scaled) lr = lr * bs;
      if (rule.width_scaled) lr = lr * ds;
      groups_.push_back({rule.group, muon, lr, rule.beta1, rule.beta2, rule.wd, rule.eps});
      group_index_[rule.group] = groups_.size() - 1;
    }
    group_of_[name] = group_index_.at(rule.group);
    auto o = t.options().requires_grad(false);
    if (muon) {
      muon_slot_.emplace(std::make_pair(group_of_[name], std::make_pair(t.size(-2), t.size(-1))), 0);
    } else {
      adam_slot_.emplace(group_of_[name], 0);
    }
    if (muon) {
      // NorMuon's factored second moment: one column (rows ≥ cols) or one row per matrix
      std::vector<int64_t> second = t.sizes().vec();
      second[second.size() - (t.size(-2) >= t.size(-1) ? 1 : 2)] = 1;
      m1_[name] = at::zeros(t.sizes(), o);
      m2_[name] = at::zeros(second, o);
    } else {
      // fp32 moments at least, as adamw_update computes (an fp64 model keeps fp64)
      const auto st = at::promote_types(t.scalar_type(), at::kFloat);
      m1_[name] = at::zeros(t.sizes(), o.dtype(st));
      m2_[name] = at::zeros(t.sizes(), o.dtype(st));
    }
  }
  // the device scalars' slots (muon_slot_, adam_slot_ and host_values agree on this layout)
  n_scalars_ = 2;
  for (auto& [key, slot] : muon_slot_) {
    slot = n_scalars_;
    n_scalars_ += 2;
  }
  for (auto& [gi, slot] : adam_slot_) {
    slot = n_scalars_;
    n_scalars_ += 4;
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
    if (g.muon) {
      const int64_t rows = t.size(-2), cols = t.size(-1);
      s.matrix = {rows, cols};
      s.matrices = t.numel() / (rows * cols);
      s.matrix_lr = g.lr * std::sqrt(std::max(1.0, double(rows) / double(cols)));
    } else {
      s.eps = g.eps;
    }
    out.push_back(std::move(s));
  }
  return out;
}

void Optimizer::step(Model& m, int64_t it, const std::set<std::string>* only) {
  if (device_scalars()) {
    write_scalars(it);
    apply(m, only);
    return;
  }
  c10::NoGradGuard ng;
  const double lrm = lr_multiplier(h_.schedule, it);
  const double mom = muon_momentum(h_.schedule, it);
  const double wd = muon_weight_decay(h_.schedule, it, h_.muon_wd);
  ++adam_step_;
  const auto muon = [&](size_t gi, int64_t, int64_t, at::Tensor& p, const at::Tensor& grad, at::Tensor& b1, at::Tensor& b2) {
    const Group& g = groups_[gi];
    muon_update(p, grad, b1, b2, mom, g.lr * lrm, wd, g.beta2, h_.muon_bf16);
  };
  const auto adam = [&](size_t gi, at::Tensor& p, const at::Tensor& grad, at::Tensor& m1, at::Tensor& m2) {
    const Group& g = groups_[gi];
    adamw_update(p, grad, m1, m2, adam_step_, g.lr * lrm, g.beta1, g.beta2, g.eps, g.wd);
  };
  update(m, only, muon, adam);
}

void Optimizer::apply(Model& m, const std::set<std::string>* only) {
  if (!device_scalars()) throw std::logic_error("Optimizer::apply needs use_device_scalars()");
  c10::NoGradGuard ng;
  const auto muon = [&](size_t gi, int64_t rows, int64_t cols, at::Tensor& p, const at::Tensor& grad, at::Tensor& b1,
                        at::Tensor& b2) {
    muon_update(p, grad, b1, b2, muon_scalars(gi, rows, cols, p.scalar_type()), groups_[gi].beta2, h_.muon_bf16);
  };
  const auto adam = [&](size_t gi, at::Tensor& p, const at::Tensor& grad, at::Tensor& m1, at::Tensor& m2) {
    const Group& g = groups_[gi];
    adamw_update(p, grad, m1, m2, adam_scalars(gi, m1.scalar_type()), g.beta1, g.beta2, g.eps);
  };
  update(m, only, muon, adam);
}

template <class MuonFn, class AdamFn>
void Optimizer::update(Model& m, const std::set<std::string>* only, const MuonFn& muon, const AdamFn& adam) {
  auto grad_of = [](const at::Tensor& t) {
    at::Tensor grad = t.grad();
    return grad.defined() ? grad : at::zeros_like(t);
  };
  // On a GPU the Muon matrices of one group and matrix shape (whole parameters and the heads of
  // per-head stacks alike) are updated as one stack (batched matmuls, a few dozen launches instead
  // of a few thousand); on the CPU one parameter at a time, a per-head stack as one batch (unless
  // muon_batch_on_cpu).
  std::map<std::pair<size_t, std::vector<int64_t>>, std::vector<std::string>> stacks;
  for (const auto& [name, t] : m.params) {
    if (only && !only->count(name)) continue;
    const size_t gi = group_of_.at(name);
    const Group& g = groups_[gi];
    if (g.muon && (t.is_cuda() || h_.muon_batch_on_cpu)) {
      stacks[{gi, {t.size(-2), t.size(-1)}}].push_back(name);
    } else if (g.muon) {
      at::Tensor p = as_matrices(t), b1 = as_matrices(m1_.at(name)), b2 = as_matrices(m2_.at(name));
      muon(gi, t.size(-2), t.size(-1), p, as_matrices(grad_of(t)), b1, b2);
    } else {
      at::Tensor p = t;
      adam(gi, p, grad_of(t), m1_.at(name), m2_.at(name));
    }
  }
  for (const auto& [key, names] : stacks) {
    const int64_t rows = key.second[0], cols = key.second[1];
    std::vector<at::Tensor> ps, gs, b1, b2;
    for (const auto& n : names) {
      const at::Tensor& t = m.params.at(n);
      ps.push_back(t.detach().reshape({-1, rows, cols}));
      gs.push_back(grad_of(t).reshape({-1, rows, cols}));
      b1.push_back(m1_.at(n).reshape({-1, rows, cols}));
      b2.push_back(m2_.at(n).reshape({ps.back().size(0), m2_.at(n).size(-2), m2_.at(n).size(-1)}));
    }
    at::Tensor P = at::cat(ps), G = at::cat(gs), B1 = at::cat(b1), B2 = at::cat(b2);
    muon(key.first, rows, cols, P, G, B1, B2);
    int64_t k0 = 0;
    for (size_t k = 0; k < names.size(); ++k) {
      const int64_t n = ps[k].size(0);
      m.params.at(names[k]).detach().view_as(ps[k]).copy_(P.narrow(0, k0, n));
      m1_.at(names[k]).view_as(b1[k]).copy_(B1.narrow(0, k0, n));
      m2_.at(names[k]).view_as(b2[k]).copy_(B2.narrow(0, k0, n));
      k0 += n;
    }
  }
}

// ------------------------------------------------------------------ device scalars
std::vector<double> Optimizer::host_values(int64_t it, bool single) const {
  // every value as the host path derives it (step(), muon_update, adamw_update), in double
  const double lrm = lr_multiplier(h_.schedule, it);
  const double mom = muon_momentum(h_.schedule, it);
  const double wd = muon_weight_decay(h_.schedule, it, h_.muon_wd);
  std::vector<double> v(size_t(n_scalars_), 0.0);
  v[0] = 1 - mom;
  v[1] = mom;
  for (const auto& [key, slot] : muon_slot_) {
    const double lr = groups_[key.first].lr * lrm;
    const int64_t rows = key.second.first, cols = key.second.second;
    const double lr_eff = lr * std::sqrt(std::max(1.0, double(rows) / double(cols)));
    v[size_t(slot)] = lr_eff;
    v[size_t(slot) + 1] = lr_eff * wd;
  }
  for (const auto& [gi, slot] : adam_slot_) {
    const Group& g = groups_[gi];
    const std::array<double, 4> a = adamw_step_values(g.lr * lrm, g.wd, g.beta1, g.beta2, adam_step_, single);
    std::copy(a.begin(), a.end(), v.begin() + slot);
  }
  return v;
}

void Optimizer::use_device_scalars() {
  if (m1_.empty()) throw std::logic_error("device scalars for an optimizer without parameters");
  const at::Device dev = m1_.begin()->second.device();
  for (const auto& [n, t] : m1_)
    if (t.device() != dev) throw std::logic_error("device scalars: the parameters are on more than one device");
  scalars_ = ScalarBuffer(n_scalars_, dev);
}

void Optimizer::write_scalars(int64_t it) {
  if (!device_scalars()) throw std::logic_error("Optimizer::write_scalars needs use_device_scalars()");
  ++adam_step_;
  scalars_.write(host_values(it, false), host_values(it, true));
}

MuonScalars Optimizer::muon_scalars(size_t group, int64_t rows, int64_t cols, at::ScalarType dtype) const {
  if (dtype != at::kFloat && dtype != at::kDouble)
    throw std::logic_error("device scalars: Muon parameters must be fp32 or fp64");
  const int64_t slot = muon_slot_.at({group, {rows, cols}});
  return {scalars_.at(0, dtype), scalars_.at(1, dtype), scalars_.at(slot, dtype), scalars_.at(slot + 1, dtype)};
}

AdamScalars Optimizer::adam_scalars(size_t group, at::ScalarType dtype) const {
  if (dtype != at::kFloat && dtype != at::kDouble)
    throw std::logic_error("device scalars: AdamW state must be fp32 or fp64");
  return scalars_.adam(adam_slot_.at(group), dtype);
}

// ------------------------------------------------------------------ scalar buffers
std::array<double, 4> adamw_step_values(double lr, double wd, double beta1, double beta2, int64_t t, bool single) {
  const double bias1 = 1 - std::pow(beta1, double(t));
  const double bias2 = 1 - std::pow(beta2, double(t));
  // LibTorch's CUDA division by a host value: x · (1 / v), the reciprocal in the operands' opmath type
  return {1 - lr * wd, bias2, single ? double(1.0f / float(bias2)) : 1.0 / bias2, -lr / bias1};
}

ScalarBuffer::ScalarBuffer(int64_t n, at::Device dev)
    : f64_(at::zeros({n}, at::TensorOptions().dtype(at::kDouble).device(dev))),
      f32_(at::zeros({n}, at::TensorOptions().dtype(at::kFloat).device(dev))) {}

void ScalarBuffer::write(const std::vector<double>& v64, const std::vector<double>& v32) {
  if (!defined()) throw std::logic_error("ScalarBuffer::write on an empty buffer");
  const int64_t n = f64_.size(0);
  if (int64_t(v64.size()) != n || int64_t(v32.size()) != n)
    throw std::logic_error("ScalarBuffer::write: the values do not fill the buffer");
  const bool cuda = f64_.is_cuda();
  // A fresh host tensor every step: pinned memory from LibTorch's caching host allocator, which does
  // not hand a block out again before the asynchronous copies that read it have run.
  const auto host = at::TensorOptions().pinned_memory(cuda);
  at::Tensor h64 = at::empty({n}, host.dtype(at::kDouble));
  at::Tensor h32 = at::empty({n}, host.dtype(at::kFloat));
  double* p64 = h64.data_ptr<double>();
  float* p32 = h32.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) {
    p64[i] = v64[size_t(i)];
    p32[i] = float(v32[size_t(i)]);
  }
  f64_.copy_(h64, /*non_blocking=*/cuda);
  f32_.copy_(h32, /*non_blocking=*/cuda);
}

StepScalar ScalarBuffer::at(int64_t i, at::ScalarType dtype) const {
  if (dtype != at::kFloat && dtype != at::kDouble) throw std::logic_error("ScalarBuffer: operands must be fp32 or fp64");
  return {0.0, (dtype == at::kDouble ? f64_ : f32_).select(0, i)};
}

AdamScalars ScalarBuffer::adam(int64_t i, at::ScalarType dtype) const {
  AdamScalars s;
  s.decay = at(i, dtype);
  s.bias2_reciprocal = is_cuda();
  s.bias2 = at(i + (s.bias2_reciprocal ? 2 : 1), dtype);
  s.step_factor = at(i + 3, dtype);
  return s;
}

// ------------------------------------------------------------------ plain AdamW
PlainAdamW::PlainAdamW(const Model& m, double beta1, double beta2, double eps, double weight_decay)
    : beta1_(beta1), beta2_(beta2), eps_(eps), wd_(weight_decay) {
  for (const auto& [n, p] : m.params) {
    const auto st = at::promote_types(p.scalar_type(), at::kFloat);
    moments_[n] = {at::zeros_like(p, st), at::zeros_like(p, st)};
  }
}

void PlainAdamW::step(Model& m, int64_t it, double lr) {
  if (device_scalars()) {
    write_scalars(it, lr);
    apply(m);
    return;
  }
  for (const auto& [n, t] : m.params) {
    at::Tensor p = t;
    if (!p.grad().defined()) continue;
    auto& [m1, m2] = moments_.at(n);
    adamw_update(p, p.grad(), m1, m2, it + 1, lr, beta1_, beta2_, eps_, p.dim() >= 2 ? wd_ : 0.0);
  }
}

void PlainAdamW::use_device_scalars() {
  if (moments_.empty()) throw std::logic_error("device scalars for an optimizer without parameters");
  const at::Device dev = moments_.begin()->second.first.device();
  for (const auto& [n, mv] : moments_)
    if (mv.first.device() != dev) throw std::logic_error("device scalars: the parameters are on more than one device");
  scalars_ = ScalarBuffer(8, dev);
}

void PlainAdamW::write_scalars(int64_t it, double lr) {
  if (!device_scalars()) throw std::logic_error("PlainAdamW::write_scalars needs use_device_scalars()");
  std::vector<double> v64, v32;
  for (double wd : {wd_, 0.0}) {
    const std::array<double, 4> a = adamw_step_values(lr, wd, beta1_, beta2_, it + 1, false);
    const std::array<double, 4> b = adamw_step_values(lr, wd, beta1_, beta2_, it + 1, true);
    v64.insert(v64.end(), a.begin(), a.end());
    v32.insert(v32.end(), b.begin(), b.end());
  }
  scalars_.write(v64, v32);
}

void PlainAdamW::apply(Model& m) {
  if (!device_scalars()) throw std::logic_error("PlainAdamW::apply needs use_device_scalars()");
  c10::NoGradGuard ng;
  for (const auto& [n, t] : m.params) {
    at::Tensor p = t;
    if (!p.grad().defined()) continue;
    auto& [m1, m2] = moments_.at(n);
    adamw_update(p, p.grad(), m1, m2, scalars_.adam(p.dim() >= 2 ? 0 : 4, m1.scalar_type()), beta1_, beta2_, eps_);
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
