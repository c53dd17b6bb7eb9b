// Method `gdn`: Gated DeltaNet layer (fla/layers/gated_deltanet.py, Yang et al. 2025) on the
// nanochat backbone. Per layer, x [B,T,d]:
//   q,k,v = SiLU(shortconv(x W_q|W_k|W_v)) (kernel 4, depthwise, no bias), q,k L2-normalized
//   (value embedding on VE layers added to v after its conv — fla has no VE; our choice)
//   β = sigmoid(x W_b)   (allow_neg_eigval = false)
//   g = −exp(A_log)·softplus(x W_a + dt_bias), one per head
//   o = gated_delta_rule(q, k, v, g, β), scale K^-0.5, no initial state
//   o = RMSNorm(o; gain, eps 1e-5) · silu(x W_g) per head (fla's FusedRMSNormGated, swish), y = o W_o
// Heads H = d_model/head_dim, K = head_dim, V = head_v_dim (default = head_dim; fla's default
// expand_v = 2 is not used: the method table says K = V = 128).
// Init (training): A_log ~ log U(1,16) is approximated by U(0, log 16) (fla draws A ~ U(0,16)),
// dt_bias by U(softplus⁻¹(1e-3), softplus⁻¹(0.1)) instead of fla's log-uniform dt; o_proj zero
// (nanochat's c_proj); other projections nanochat's uniform ±√3/√d.
#include <ATen/ATen.h>

#include "harness/decode_ops.h"
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
  const double s = std::sqrt(3.0) / std::sqrt(double(d.d));
  std::vector<ParamDef> p = delta_common_params(d, ctx);
  p.push_back({"a_proj", {d.H, d.d}, ParamGroup::TransformerMatrix, true, "uniform", -s, s});
  p.push_back({"g_proj", {d.H * d.V, d.d}, ParamGroup::TransformerMatrix, true, "uniform", -s, s});
  p.push_back({"A_log", {d.H}, ParamGroup::Scalar, false, "uniform", 0.0, std::log(16.0)});
  p.push_back({"dt_bias", {d.H}, ParamGroup::Scalar, false, "uniform", -6.907255, -2.252168});
  return p;
}

// cache == nullptr: plain forward; else prefill (decode = false) or one decode step.
TensorMap run(const TensorMap& in, const Config& c, Backend backend, TensorMap* cache, bool decode) {
  DeltaDims d = delta_dims(c);
  const at::Tensor& x = in.at("x");
  const int64_t B = x.size(0), T = x.size(1);
  // A static cache: β's, the decay's and the output gate's projections join q|k|v's in one GEMM
  // (one per decode step), and the decay's constants are prepared once at prefill (a decode step
  // takes this path when the prefill prepared it)
  const bool joint = cache && cache_is_static(*cache) && (!decode || cache->has(kStaticInput));
  // its decode step: one GEMM, the conv step and one op for the rest (gdn_static_step), then o_proj
  if (joint && decode) {
    const at::Tensor o = gdn_static_step(in, d, *cache, in.at("o_norm"), d.eps, backend).reshape({B, T, d.H * d.V});
    // o_proj for the step's few rows as one GEMV launch where no gradient is taken
    return {{"y", at::GradMode::is_enabled() ? at::linear(o, in.at("o_proj")) : linear_rows(o, in.at("o_proj"))}};
  }
  DeltaQKV qkv = !cache ? delta_qkv(in, d)
                 : joint ? delta_qkv_cached(in, d, *cache, decode, {"b_proj", "a_proj", "g_proj"})
                         : delta_qkv_cached(in, d, *cache, decode);
  at::Tensor b_lin, a_lin, gate;
  if (joint) {
    b_lin = qkv.extra.narrow(-1, 0, d.H);
    a_lin = qkv.extra.narrow(-1, d.H, d.H);
    gate = qkv.extra.narrow(-1, 2 * d.H, d.H * d.V).view({B, T, d.H, d.V});
    if (!decode) {  // fp32 for half-precision models: the fused step forms the gates in fp32
      const auto gt = layers::is_half(x) ? at::kFloat : x.scalar_type();
      cache_store(*cache, "w.neg_a", -in.at("A_log").to(gt).exp());
      cache_store(*cache, "w.dt_bias", in.at("dt_bias").to(gt) + c.f("gate_bias_offset"));
    }
  } else if (x.is_cuda()) {  // β's and the decay's projections (H columns each) in one GEMM: one dx in its backward
    const std::vector<at::Tensor> ba = at::linear(x, at::cat({in.at("b_proj"), in.at("a_proj")}, 0)).split(d.H, -1);
    b_lin = ba[0];
    a_lin = ba[1];
  } else {
    b_lin = at::linear(x, in.at("b_proj"));
    a_lin = at::linear(x, in.at("a_proj"));
  }
  at::Tensor o;
  if (joint && decode) {
    o = gated_delta_static_step(qkv, b_lin, a_lin, cache->at("w.neg_a"), cache->at("w.dt_bias"), backend, *cache);
  } else {
    at::Tensor beta = at::sigmoid(b_lin);
    at::Tensor g = -in.at("A_log").exp() * at::softplus(a_lin + in.at("dt_bias") + c.f("gate_bias_offset"));
    if (cache) {
      o = delta_core_cached("gated_delta_rule", qkv, beta, g, backend, *cache, decode);
    } else {
      Config op;
      op.set("scale", 0.0);
      o = call_op("gated_delta_rule", backend, {{"q", qkv.q}, {"k", qkv.k}, {"v", qkv.v}, {"g", g}, {"beta", beta}}, op)
              .at("o");
    }
  }
  // RMSNorm · silu(gate) in one pass each way on a GPU (harness/fused_ops.h)
  if (!gate.defined()) gate = at::linear(x, in.at("g_proj")).view({B, T, d.H, d.V});
  o = rms_norm_gated(o, in.at("o_norm"), d.eps, gate, NormGate::Silu);
  return {{"y", at::linear(o.reshape({B, T, d.H * d.V}), in.at("o_proj"))}};
}

// Parameters: matmul N = d(2HK + HV) [q,k,v] + dH [b] + dH [a] + dHV [g] + HVd [o] (+ 12H VE gate);
// conv W(2HK + HV); scalars V (gain) + 2H (A_log, dt_bias). FLOPs: see delta_account.
LayerCost account(const Config& c, const LayerCtx& ctx, const CostQuery& q) {
  DeltaDims d = delta_dims(c);
  const int64_t n = d.d * (2 * d.H * d.K + d.H * d.V) + 2 * d.d * d.H + 2 * d.d * d.H * d.V +
                    layers::ve_gate_params(ctx, d.H);
  const int64_t conv = d.W * (2 * d.H * d.K + d.H * d.V);
  return delta_account(d, n, conv, d.V + 2 * d.H, d.H * d.V + d.H, DeltaGate::Head, q, "gdn");
}

TensorMap reference_fn(const TensorMap& in, const Config& c, const LayerCtx&) {
  DeltaDims d = delta_dims(c);
  return {{"y", reference::delta_family_layer(reference::DeltaKind::Gdn, in,
                                              {d.H, d.K, d.V, d.W, d.eps, c.f("gate_bias_offset")})}};
}

MethodSpec make_spec() {
  MethodSpec m = delta_method({"gdn", "Gated DeltaNet: short convs, L2-norm q/k, per-head decay, delta rule, gated RMSNorm output",
                       "Yang, Kautz, Hatamizadeh 2025 (Gated Delta Networks); fla/layers/gated_deltanet.py",
                       "gated_delta_rule", run, params, reference_fn, account, true, "gate_bias_offset=-5"});
  // fla.layers.GatedDeltaNet (use_gate=True, swish output gate, allow_neg_eigval=False, num_v_heads = num_heads)
  m.foreign_names["fla"] = [](const Config& c) {
    ParamAliases a = delta_fla_aliases(delta_dims(c));
    for (const char* n : {"a_proj", "g_proj"}) a.aliases.push_back({std::string(n) + ".weight", n});
    add_fla_decay_aliases(a);
    return a;
  };
  return m;
}

MIXBENCH_REGISTER(make_spec());

}  // namespace
}  // namespace mixbench
