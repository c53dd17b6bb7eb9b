// Method `deltanet`: DeltaNet layer (fla/layers/delta_net.py, Yang et al. 2024) on the nanochat
// backbone. Per layer, x [B,T,d]:
//   q,k,v = SiLU(shortconv(x W_q|W_k|W_v)) (kernel 4, depthwise, no bias; fla's defaults
//   use_short_conv=True, qk_activation='silu', conv activation silu), q,k L2-normalized
//   (value embedding on VE layers added to v after its conv — fla has no VE; our choice)
//   β = sigmoid(x W_b)
//   o = delta_rule(q, k, v, β), scale K^-0.5, no initial state
//   o = RMSNorm(o; gain, eps 1e-5) per head (fla's default use_gate=False), y = o W_o
// Heads H = d_model/head_dim, K = head_dim, V = head_v_dim (default head_dim; fla's expand_v = 1).
#include <ATen/ATen.h>

#include "harness/registry.h"
#include "mixers/common/layers.h"
#include "mixers/linear/delta_layer.h"
#include "reference/delta.h"

namespace mixbench {
namespace {

using namespace linear;

std::vector<ParamDef> params(const Config& c, const LayerCtx& ctx) {
  return delta_common_params(delta_dims(c), ctx);
}

// cache == nullptr: plain forward; else prefill (decode = false) or one decode step.
TensorMap run(const TensorMap& in, const Config& c, Backend backend, TensorMap* cache, bool decode) {
  DeltaDims d = delta_dims(c);
  const at::Tensor& x = in.at("x");
  const int64_t B = x.size(0), T = x.size(1);
  DeltaQKV qkv = cache ? delta_qkv_cached(in, d, *cache, decode) : delta_qkv(in, d);
  at::Tensor beta = at::sigmoid(at::linear(x, in.at("b_proj")));
  at::Tensor o;
  if (cache) {
    o = delta_core_cached("delta_rule", qkv, beta, at::Tensor(), backend, *cache, decode);
  } else {
    Config op;
    op.set("scale", 0.0);
    o = call_op("delta_rule", backend, {{"q", qkv.q}, {"k", qkv.k}, {"v", qkv.v}, {"beta", beta}}, op).at("o");
  }
  o = rms_norm_gain(o, in.at("o_norm"), d.eps);
  return {{"y", at::linear(o.reshape({B, T, d.H * d.V}), in.at("o_proj"))}};
}

// Parameters: matmul N = d(2HK + HV) [q,k,v] + dH [b] + HVd [o] (+ 12H VE gate);
// conv W(2HK + HV); scalars V (gain). FLOPs: see delta_account.
LayerCost account(const Config& c, const LayerCtx& ctx, const CostQuery& q) {
  DeltaDims d = delta_dims(c);
  const int64_t n = d.d * (2 * d.H * d.K + d.H * d.V) + d.d * d.H + d.H * d.V * d.d +
                    layers::ve_gate_params(ctx, d.H);
  const int64_t conv = d.W * (2 * d.H * d.K + d.H * d.V);
  return delta_account(d, n, conv, d.V, 0, DeltaGate::None, q, "deltanet");
}

TensorMap reference_fn(const TensorMap& in, const Config& c, const LayerCtx&) {
  DeltaDims d = delta_dims(c);
  return {{"y", reference::delta_family_layer(reference::DeltaKind::DeltaNet, in, {d.H, d.K, d.V, d.W, d.eps})}};
}

MethodSpec make_spec() {
  MethodSpec m = delta_method({"deltanet", "DeltaNet: short convs + SiLU, L2-norm q/k, sigmoid β, delta rule, per-head RMSNorm output",
                       "Schlag et al. 2021; Yang et al. 2024 (Parallelizing Linear Transformers with the Delta Rule); fla/layers/delta_net.py",
                       "delta_rule", run, params, reference_fn, account, false, ""});
  // gpu-d12: capturing the step of 32 rows × 2048 tokens in a CUDA graph runs out of memory (the
  // warm-up pass and the graph's pool together); micro-batches of 16 rows.
  m.presets["gpu-d12"].micro_batch = 16;
  // fla.layers.DeltaNet with its defaults (use_gate=False, qk_activation silu, qk_norm l2, beta sigmoid)
  m.foreign_names["fla"] = [](const Config& c) { return delta_fla_aliases(delta_dims(c)); };
  return m;
}

MIXBENCH_REGISTER(make_spec());

}  // namespace
}  // namespace mixbench
