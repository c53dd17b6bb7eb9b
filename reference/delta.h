// FP64 references for the delta-rule family (flash-linear-attention conventions): per-token
// recurrences in plain LibTorch ops, autograd for gradients. Nothing here is shared with mixers/.
#pragma once
#include <ATen/core/Tensor.h>

#include <string>
#include <utility>

#include "harness/tensor_map.h"

namespace mixbench::reference {

// The delta rule with an optional decay applied to the state before each update:
//   S ← Γ_t S  (Γ_t = exp(g_t) for g [B,T,H]; diag(exp g_t) for g [B,T,H,K]; identity for g undefined)
//   v'_t = β_t (v_t − Sᵀ k_t);  S ← S + k_t v'_tᵀ;  o_t = Sᵀ (scale·q_t)
// q,k [B,T,H,K], v [B,T,H,V], beta [B,T,H], h0 [B,H,K,V] or undefined. Returns (o [B,T,H,V], ht).
std::pair<at::Tensor, at::Tensor> delta_recurrent(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                  const at::Tensor& beta, const at::Tensor& g, double scale,
                                                  const at::Tensor& h0);

// Layer references (flash-linear-attention's DeltaNet / GatedDeltaNet / KDA layers with the
// choices documented in mixers/linear/*.cpp). `in` holds x [B,T,d], optional ve [B,T,H·V] and the
// layer's parameters by name. Returns y [B,T,d].
enum class DeltaKind { DeltaNet, Gdn, Kda };
struct DeltaLayerShape {
  int64_t H, K, V, conv;
  double norm_eps;
  double gate_offset = 0;  // added inside the decay gate's softplus (gdn, kda)
};
at::Tensor delta_family_layer(DeltaKind kind, const TensorMap& in, const DeltaLayerShape& s);

}  // namespace mixbench::reference
