// FP64 references of the gated linear-attention ops (simple_gla, gla) and of the layers built on
// them (retnet, gla, elu_norm, elu_qknorm, lightning): per-token recurrences over LibTorch FP64
// tensors, differentiable through autograd. No computation here is shared with mixers/; the
// layer's knob kinds below are (mixers/linear/gla_family.cpp parses its descriptor into them).
#pragma once
#include <ATen/core/Tensor.h>
#include <string>
#include <utility>

namespace mixbench::reference {

// The gated linear-attention layer's knobs. Each parse function maps the knob's text (the names
// in the comments) to its kind and throws InputError naming the knob and the choices otherwise.
enum class GlaDecay { Zero, Retnet, Lightning, LowRank };  // "zero" | "retnet" | "lightning" | "lowrank"
enum class GlaFeature { None, Elu1 };                      // "none" | "elu1" (φ = elu + 1)
enum class GlaOutGate { None, Silu, Sigmoid };             // "none" | "silu" | "sigmoid"
GlaDecay parse_gla_decay(const std::string& s);
GlaFeature parse_gla_feature(const std::string& s);
GlaOutGate parse_gla_out_gate(const std::string& s);

// q,k [B,T,H,K], v [B,T,H,V], g [B,T,H] log decay, h0 [B,H,K,V] or undefined.
// S_t = exp(g_t) S_{t-1} + k_t v_tᵀ, o_t = S_tᵀ (scale q_t). Returns (o [B,T,H,V], S_T).
std::pair<at::Tensor, at::Tensor> simple_gla(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                             const at::Tensor& g, double scale, const at::Tensor& h0);
// As simple_gla with g [B,T,H,K]: S_t = diag(exp g_t) S_{t-1} + k_t v_tᵀ.
std::pair<at::Tensor, at::Tensor> gla(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const at::Tensor& g, double scale, const at::Tensor& h0);

// A gated linear-attention layer on x [B,T,d] (see mixers/linear/gla_family.h for the variants):
//   q = x W_qᵀ, k = x W_kᵀ, v = x W_vᵀ (+ 3·sigmoid(x[:12] W_vegᵀ)·ve per value head)
//   qk_norm: q,k ← τ·RMSNorm(q), τ·RMSNorm(k) per head;  feature "elu1": q,k ← elu(q)+1, elu(k)+1
//   rope on q,k;  k_inv_sqrt: k ← k/√K
//   decay "retnet": g_h = log(1 − 2^(−5−h)); "lightning": g_h = −2^(−8(h+1)/H); "zero": g = 0;
//         "lowrank": g = logsigmoid((x W_1ᵀ) W_2ᵀ + b)/normalizer per key channel (op gla)
//   o ← RMSNorm_head(o) (· gain if given) (⊙ silu(x W_gᵀ) or sigmoid(x W_gᵀ));  y = o W_oᵀ
struct GlaLayerRefSpec {
  int64_t H = 1, K = 1, V = 1;
  bool qk_norm = false;
  double qk_tau = 1.0;
  GlaFeature feature = GlaFeature::None;
  bool rope = false;
  double rope_base = 10000.0;
  bool k_inv_sqrt = false;
  double scale = 1.0;
  GlaDecay decay = GlaDecay::Zero;
  double gate_normalizer = 16.0;
  GlaOutGate out_gate = GlaOutGate::None;
};
struct GlaLayerRefWeights {
  at::Tensor w_q, w_k, w_v, w_o, w_g, o_norm, ve_gate, w_gk1, w_gk2, b_gk;  // undefined when unused
};
at::Tensor gla_family_layer(const at::Tensor& x, const at::Tensor& ve, const GlaLayerRefWeights& w,
                            const GlaLayerRefSpec& s);

}  // namespace mixbench::reference
