// Method `kda`: Kimi Delta Attention layer (fla/layers/kda.py, Kimi Linear 2025) on the nanochat
// backbone. Per layer, x [B,T,d]:
//   q,k,v = SiLU(shortconv(x W_q|W_k|W_v)) (kernel 4, depthwise, no bias), q,k L2-normalized
//   (value embedding on VE layers added to v after its conv — fla has no VE; our choice)
//   β = sigmoid(x W_b)
//   g = −exp(A_log[h])·softplus(f(x) + dt_bias[h,k]) per key dim, f = low rank d → V → H·K
//   (fla's f_proj, no biases; A_log per head, dt_bias per (head, key dim); safe_gate off)
//   o = kda(q, k, v, g, β), scale K^-0.5, no initial state
//   o = RMSNorm(o; gain, eps 1e-5) · sigmoid(g_out(x)) per head, g_out low rank d → V → H·V with
//   a bias on the second projection (fla's g_proj + FusedRMSNormGated(activation="sigmoid")); y = o W_o
// Heads H = d_model/head_dim, K = head_dim, V = head_v_dim (default head_dim).
// Init (training): A_log ~ U(0, log 16) approximating fla's log U(1,16); dt_bias ~
// U(softplus⁻¹(1e-3), softplus⁻¹(0.1)) approximating fla's log-uniform dt; the g_out bias 0.
#include <ATen/ATen.h>

#include "harness/fused_ops.h"
#include "harness/registry.h"
#include "mixers/common/layers.h"
#include "mixers/linear/delta_layer.h"
#include "reference/delta.h"

namespace mixbench {
namespace {

using namespace linear;

std::vector<ParamDef> params(const Config& c, const LayerCtx& ctx) {
  DeltaDims d = delta_dims(c);
  const double s = std::sqrt(3.0) / std::sqrt(double(d.d)), sv = std::sqrt(3.0) / std::sqrt(double(d.V));
  std::vector<ParamDef> p = delta_common_params(d, ctx);
  p.push_back({"f_proj1", {d.V, d.d}, ParamGroup::TransformerMatrix, true, "uniform", -s, s});
  p.push_back({"f_proj2", {d.H * d.K, d.V}, ParamGroup::TransformerMatrix, true, "uniform", -sv, sv});
  p.push_back({"g_proj1", {d.V, d.d}, ParamGroup::TransformerMatrix, true, "uniform", -s, s});
  p.push_back({"g_proj2", {d.H * d.V, d.V}, ParamGroup::TransformerMatrix, true, "uniform", -sv, sv});
  p.push_back({"g_proj2_bias", {d.H * d.V}, ParamGroup::Scalar, false, "const", 0.0, 0});
  p.push_back({"A_log", {d.H}, ParamGroup::Scalar, false, "uniform", 0.0, std::log(16.0)});
  p.push_back({"dt_bias", {d.H * d.K}, ParamGroup::Scalar, false, "uniform", -6.907255, -2.252168});
  return p;
}

// cache == nullptr: plain forward; else prefill (decode = false) or one decode step.
TensorMap run(const TensorMap& in, const Config& c, Backend backend, TensorMap* cache, bool decode) {
  DeltaDims d = delta_dims(c);
  const at::Tensor& x = in.at("x");
  const int64_t B = x.size(0), T = x.size(1);
  DeltaQKV qkv = cache ? delta_qkv_cached(in, d, *cache, decode) : delta_qkv(in, d);
  at::Tensor beta = at::sigmoid(at::linear(x, in.at("b_proj")));
  at::Tensor f = at::linear(at::linear(x, in.at("f_proj1")), in.at("f_proj2")) + in.at("dt_bias") + c.f("gate_bias_offset");
  at::Tensor g = -in.at("A_log").exp().view({d.H, 1}) * at::softplus(f.view({B, T, d.H, d.K}));
  at::Tensor o;
  if (cache) {
    o = delta_core_cached("kda", qkv, beta, g, backend, *cache, decode);
  } else {
    Config op;
    op.set("scale", 0.0);
    o = call_op("kda", backend, {{"q", qkv.q}, {"k", qkv.k}, {"v", qkv.v}, {"g", g}, {"beta", beta}}, op).at("o");
  }
  // RMSNorm · sigmoid(gate) in one pass each way on a GPU (harness/fused_ops.h)
  at::Tensor gate = at::linear(at::linear(x, in.at("g_proj1")), in.at("g_proj2"), in.at("g_proj2_bias"));
  o = rms_norm_gated(o, in.at("o_norm"), d.eps, gate.view({B, T, d.H, d.V}), NormGate::Sigmoid);
  return {{"y", at::linear(o.reshape({B, T, d.H * d.V}), in.at("o_proj"))}};
}

// Parameters: matmul N = d(2HK + HV) [q,k,v] + dH [b] + dV + V·HK [f] + dV + V·HV [g_out] + HVd [o]
// (+ 12H VE gate); conv W(2HK + HV); scalars V (gain) + HV (g_out bias) + H (A_log) + HK (dt_bias).
LayerCost account(const Config& c, const LayerCtx& ctx, const CostQuery& q) {
  DeltaDims d = delta_dims(c);
  const int64_t n = d.d * (2 * d.H * d.K + d.H * d.V) + d.d * d.H + d.d * d.V + d.V * d.H * d.K + d.d * d.V +
                    d.V * d.H * d.V + d.H * d.V * d.d + layers::ve_gate_params(ctx, d.H);
  const int64_t conv = d.W * (2 * d.H * d.K + d.H * d.V);
  return delta_account(d, n, conv, d.V + d.H * d.V + d.H + d.H * d.K, d.H * d.V + d.H * d.K, DeltaGate::Key, q,
                       "kda");
}

TensorMap reference_fn(const TensorMap& in, const Config& c, const LayerCtx&) {
  DeltaDims d = delta_dims(c);
  return {{"y", reference::delta_family_layer(reference::DeltaKind::Kda, in,
                                              {d.H, d.K, d.V, d.W, d.eps, c.f("gate_bias_offset")})}};
}

MethodSpec make_spec() {
  // Cases: gate offset −5 (see add_gate_offset_knob) and norm_eps 1e-2. At fla's 1e-5 one head of
  // layer1_ve_B2_T37 has an output of small RMS, where the gated RMSNorm divides by it: reduced
  // precision rounding of that head's output is amplified, and at bf16 the q/k-side gradients land at
  // 4.6e-2–5.9e-2 relative RMS (threshold 4e-2) while every other gradient is at 1.1e-2 (fp32 and
  // fp64 pass); at 1e-2 all are within 1.2e-2. The cases test the layer's arithmetic, not that point.
  MethodSpec m = delta_method({"kda", "Kimi Delta Attention: short convs, L2-norm q/k, per-key-dim low-rank decay, delta rule, sigmoid-gated RMSNorm",
                       "Kimi Team 2025 (Kimi Linear); fla/layers/kda.py",
                       "kda", run, params, reference_fn, account, true, "gate_bias_offset=-5,norm_eps=1e-2"});
  // gpu-d12: the LibTorch chunked path's per-key-dim decays need ~17 GB per row of 2048 tokens in
  // training (138 GB at 8 rows): micro-batches of 2 rows (gradients accumulated).
  m.presets["gpu-d12"].micro_batch = 2;
  // fla.layers.KimiDeltaAttention (low-rank f_proj and g_proj of rank head_v_dim, sigmoid output gate)
  m.foreign_names["fla"] = [](const Config& c) {
    ParamAliases a = delta_fla_aliases(delta_dims(c));
    a.aliases.push_back({"f_proj.0.weight", "f_proj1"});
    a.aliases.push_back({"f_proj.1.weight", "f_proj2"});
    a.aliases.push_back({"g_proj.0.weight", "g_proj1"});
    a.aliases.push_back({"g_proj.1.weight", "g_proj2"});
    a.aliases.push_back({"g_proj.1.bias", "g_proj2_bias"});
    add_fla_decay_aliases(a);
    return a;
  };
  return m;
}

MIXBENCH_REGISTER(make_spec());

}  // namespace
}  // namespace mixbench
