// FP64 references of the deltanet, gdn and kda layers: projections as broadcast products, the
// short convolution as a loop over positions, norms and gates written out, the op as the
// per-token recurrence of reference/delta.cpp.
#include <ATen/ATen.h>

#include "reference/delta.h"

namespace mixbench::reference {

namespace {

at::Tensor project(const at::Tensor& x, const at::Tensor& w) { return (x.unsqueeze(-2) * w).sum(-1); }

// Causal depthwise conv over time, x [B,T,C], w [C,W]: y_t = Σ_{j=0}^{W−1} w[:, W−1−j] x_{t−j}; then SiLU.
at::Tensor causal_conv_silu(const at::Tensor& x, const at::Tensor& w) {
  const int64_t T = x.size(1), W = w.size(1);
  std::vector<at::Tensor> rows;
  for (int64_t t = 0; t < T; ++t) {
    at::Tensor acc = at::zeros_like(x.select(1, t));
    for (int64_t j = 0; j < W && j <= t; ++j) acc = acc + w.select(1, W - 1 - j) * x.select(1, t - j);
    rows.push_back(acc * at::sigmoid(acc));
  }
  return at::stack(rows, 1);
}

at::Tensor l2n(const at::Tensor& x) { return x / (x * x).sum(-1, true).add(1e-6).sqrt(); }

at::Tensor softplus_ref(const at::Tensor& x) { return at::relu(x) + at::log1p(at::exp(-x.abs())); }

}  // namespace

at::Tensor delta_family_layer(DeltaKind kind, const TensorMap& in, const DeltaLayerShape& s) {
  const at::Tensor& x = in.at("x");
  const int64_t B = x.size(0), T = x.size(1), H = s.H, K = s.K, V = s.V;
  at::Tensor q = causal_conv_silu(project(x, in.at("q_proj")), in.at("q_conv")).reshape({B, T, H, K});
  at::Tensor k = causal_conv_silu(project(x, in.at("k_proj")), in.at("k_conv")).reshape({B, T, H, K});
  at::Tensor v = causal_conv_silu(project(x, in.at("v_proj")), in.at("v_conv")).reshape({B, T, H, V});
  if (in.has("ve")) {
    const at::Tensor& wg = in.at("ve_gate");
    at::Tensor gate = 3.0 * at::sigmoid(project(x.slice(-1, 0, wg.size(1)), wg));  // [B,T,H]
    v = v + gate.unsqueeze(-1) * in.at("ve").reshape({B, T, H, V});
  }
  q = l2n(q);
  k = l2n(k);
  at::Tensor beta = at::sigmoid(project(x, in.at("b_proj")));  // [B,T,H]
  at::Tensor g;
  if (kind == DeltaKind::Gdn) {
    g = -at::exp(in.at("A_log")) * softplus_ref(project(x, in.at("a_proj")) + in.at("dt_bias") + s.gate_offset);
  } else if (kind == DeltaKind::Kda) {
    at::Tensor f = project(project(x, in.at("f_proj1")), in.at("f_proj2")).reshape({B, T, H, K});
    g = -at::exp(in.at("A_log")).reshape({H, 1}) * softplus_ref(f + in.at("dt_bias").reshape({H, K}) + s.gate_offset);
  }
  at::Tensor o = delta_recurrent(q, k, v, beta, g, 1.0 / std::sqrt(double(K)), at::Tensor()).first;
  o = o / ((o * o).mean(-1, true) + s.norm_eps).sqrt() * in.at("o_norm");
  if (kind == DeltaKind::Gdn) {
    at::Tensor z = project(x, in.at("g_proj")).reshape({B, T, H, V});
    o = o * z * at::sigmoid(z);
  } else if (kind == DeltaKind::Kda) {
    at::Tensor z = project(project(x, in.at("g_proj1")), in.at("g_proj2")) + in.at("g_proj2_bias");
    o = o * at::sigmoid(z).reshape({B, T, H, V});
  }
  return project(o.reshape({B, T, H * V}), in.at("o_proj"));
}

}  // namespace mixbench::reference
