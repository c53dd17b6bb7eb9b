// Layers built on the simple_gla / gla ops. One generic layer, configured per method by a
// descriptor; each method's file (retnet.cpp, gla.cpp, elu_norm.cpp, elu_qknorm.cpp, lightning.cpp)
// fills the descriptor, documents its choices and registers the MethodSpec.
//
// Shape choices shared by all five (not fixed by methods.md): H = n_head = d/head_dim heads with
// K = V = head_dim (FLA's layers default to expand_k/expand_v ≠ 1; we keep the backbone's head
// geometry so every method has the same q/k/v widths), no bias on any projection, one KV head per
// query head. RMSNorm eps is float32's epsilon everywhere (nanochat's F.rms_norm default; FLA uses
// 1e-5/1e-6). Value embeddings as nanochat: v += 3·sigmoid(W_veg x[..., :12])·ve, one gate per head.
#pragma once
#include <string>

#include "harness/registry.h"

namespace mixbench::linear {

// The text knobs (decay, feature, out_gate) are parsed once, by make_gla_family_method, into
// reference::GlaDecay / GlaFeature / GlaOutGate (reference/gla.h); another name is an InputError.
struct GlaFamilyDesc {
  std::string name, summary, citation;
  std::string op = "simple_gla";   // "simple_gla" | "gla"
  bool qk_norm = false;            // parameter-free RMSNorm on q,k per head, times qk_tau
  double qk_tau = 1.0;
  bool qk_norm_fp32 = false;       // compute that norm in at least FP32 (inputs below FP32 are upcast)
  std::string feature = "none";    // "none" | "elu1" (φ = elu + 1)
  bool rope = false;               // layers::rope on q,k (after qk_norm / feature map)
  bool k_inv_sqrt = false;         // k ← k/√K (lightning)
  double scale = 0;                // op scale on q; 0 = K^-0.5
  std::string decay = "zero";      // "retnet" | "lightning" | "zero" | "lowrank"
  bool out_gain = false;           // learnable gain [V] on the per-head output RMSNorm
  std::string out_gate = "none";   // "none" | "silu" | "sigmoid": gate = act(x W_gᵀ) per channel
};

MethodSpec make_gla_family_method(const GlaFamilyDesc& d);

}  // namespace mixbench::linear
