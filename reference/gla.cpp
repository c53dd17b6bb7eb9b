// FP64 per-token references for simple_gla / gla and the layers built on them.
#include "reference/gla.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>
#include <utility>
#include <vector>

#include "harness/errors.h"
#include "reference/reference.h"

namespace mixbench::reference {

namespace {
template <typename E>
E parse_kind(const char* knob, const std::string& s, const std::vector<std::pair<const char*, E>>& kinds) {
  std::string names;
  for (const auto& [name, kind] : kinds) {
    if (s == name) return kind;
    names += names.empty() ? name : std::string(", ") + name;
  }
  throw InputError(fmt::format("{} '{}' is not one of {}", knob, s, names));
}
}  // namespace

GlaDecay parse_gla_decay(const std::string& s) {
  return parse_kind<GlaDecay>("decay", s, {{"zero", GlaDecay::Zero}, {"retnet", GlaDecay::Retnet},
                                           {"lightning", GlaDecay::Lightning}, {"lowrank", GlaDecay::LowRank}});
}

GlaFeature parse_gla_feature(const std::string& s) {
  return parse_kind<GlaFeature>("feature map", s, {{"none", GlaFeature::None}, {"elu1", GlaFeature::Elu1}});
}

GlaOutGate parse_gla_out_gate(const std::string& s) {
  return parse_kind<GlaOutGate>("output gate", s,
                                {{"none", GlaOutGate::None}, {"silu", GlaOutGate::Silu}, {"sigmoid", GlaOutGate::Sigmoid}});
}

namespace {
// shared recurrence: decay [B,H] or [B,H,K] already exponentiated per token
std::pair<at::Tensor, at::Tensor> recur(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                        const at::Tensor& g, double scale, const at::Tensor& h0, bool per_key) {
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), K = q.size(3), V = v.size(3);
  at::Tensor S = h0.defined() ? h0 : at::zeros({B, H, K, V}, v.options());
  std::vector<at::Tensor> os;
  os.reserve(size_t(T));
  for (int64_t t = 0; t < T; ++t) {
    at::Tensor a = g.select(1, t).exp();                           // [B,H] or [B,H,K]
    a = per_key ? a.unsqueeze(-1) : a.unsqueeze(-1).unsqueeze(-1);
    at::Tensor kt = k.select(1, t), vt = v.select(1, t), qt = q.select(1, t) * scale;
    S = a * S + kt.unsqueeze(-1) * vt.unsqueeze(-2);               // [B,H,K,V]
    os.push_back((qt.unsqueeze(-1) * S).sum(-2));                  // [B,H,V]
  }
  return {at::stack(os, 1), S};
}

at::Tensor project(const at::Tensor& x, const at::Tensor& w) { return (x.unsqueeze(-2) * w).sum(-1); }

at::Tensor rms(const at::Tensor& x) {
  const double eps = 1.1920928955078125e-07;  // float32 epsilon, as nanochat's F.rms_norm(eps=None)
  return x / (x.pow(2).mean(-1, true) + eps).sqrt();
}

// half-split rotation y1 = x1 cos + x2 sin, y2 = −x1 sin + x2 cos, angle t·base^(−2i/D), per token
at::Tensor rope(const at::Tensor& x, double base) {
  const int64_t T = x.size(1), D = x.size(3), half = D / 2;
  std::vector<at::Tensor> rows;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> c(static_cast<size_t>(half)), s(static_cast<size_t>(half));
    for (int64_t i = 0; i < half; ++i) {
      const double ang = double(t) * std::pow(base, -double(2 * i) / double(D));
      c[size_t(i)] = std::cos(ang);
      s[size_t(i)] = std::sin(ang);
    }
    at::Tensor cs = from_doubles(c, x.options().requires_grad(false));
    at::Tensor sn = from_doubles(s, x.options().requires_grad(false));
    at::Tensor xt = x.select(1, t);
    at::Tensor x1 = xt.slice(-1, 0, half), x2 = xt.slice(-1, half);
    rows.push_back(at::cat({x1 * cs + x2 * sn, -x1 * sn + x2 * cs}, -1));
  }
  return at::stack(rows, 1);
}
}  // namespace

std::pair<at::Tensor, at::Tensor> simple_gla(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                             const at::Tensor& g, double scale, const at::Tensor& h0) {
  return recur(q, k, v, g, scale, h0, false);
}

std::pair<at::Tensor, at::Tensor> gla(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const at::Tensor& g, double scale, const at::Tensor& h0) {
  return recur(q, k, v, g, scale, h0, true);
}

at::Tensor gla_family_layer(const at::Tensor& x, const at::Tensor& ve, const GlaLayerRefWeights& w,
                            const GlaLayerRefSpec& s) {
  const int64_t B = x.size(0), T = x.size(1), H = s.H, K = s.K, V = s.V;
  at::Tensor q = project(x, w.w_q).view({B, T, H, K});
  at::Tensor k = project(x, w.w_k).view({B, T, H, K});
  at::Tensor v = project(x, w.w_v).view({B, T, H, V});
  if (ve.defined() && w.ve_gate.defined()) {
    at::Tensor gate = 3.0 * at::sigmoid(project(x.slice(-1, 0, w.ve_gate.size(1)), w.ve_gate));  // [B,T,H]
    v = v + gate.unsqueeze(-1) * ve.view({B, T, H, V});
  }
  if (s.qk_norm) {
    q = rms(q) * s.qk_tau;
    k = rms(k) * s.qk_tau;
  }
  if (s.feature == GlaFeature::Elu1) {
    q = at::elu(q) + 1.0;
    k = at::elu(k) + 1.0;
  }
  if (s.rope) {
    q = rope(q, s.rope_base);
    k = rope(k, s.rope_base);
  }
  if (s.k_inv_sqrt) k = k / std::sqrt(double(K));
  at::Tensor o;
  auto opts = x.options().requires_grad(false);
  if (s.decay == GlaDecay::LowRank) {
    at::Tensor gk = project(project(x, w.w_gk1), w.w_gk2) + w.b_gk;
    at::Tensor g = at::log_sigmoid(gk).view({B, T, H, K}) / s.gate_normalizer;
    o = gla(q, k, v, g, s.scale, at::Tensor()).first;
  } else {
    std::vector<double> gh(size_t(H), 0.0);
    for (int64_t h = 0; h < H; ++h) {
      if (s.decay == GlaDecay::Retnet) gh[size_t(h)] = std::log(1.0 - std::pow(2.0, -5.0 - double(h)));
      else if (s.decay == GlaDecay::Lightning) gh[size_t(h)] = -std::pow(2.0, -8.0 * double(h + 1) / double(H));
    }
    at::Tensor g = from_doubles(gh, opts).view({1, 1, H}).expand({B, T, H});
    o = simple_gla(q, k, v, g, s.scale, at::Tensor()).first;
  }
  o = rms(o);
  if (w.o_norm.defined()) o = o * w.o_norm;
  if (s.out_gate == GlaOutGate::Silu) o = o * at::silu(project(x, w.w_g)).view({B, T, H, V});
  else if (s.out_gate == GlaOutGate::Sigmoid) o = o * at::sigmoid(project(x, w.w_g)).view({B, T, H, V});
  return project(o.reshape({B, T, H * V}), w.w_o);
}

}  // namespace mixbench::reference
