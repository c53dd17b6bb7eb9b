// FP64 references: plain per-token loops over LibTorch FP64 tensors (autograd gives their
// gradients, which the conformance suite checks against central finite differences). Nothing
// here is shared with the optimized code in mixers/.
#pragma once
#include <ATen/core/Tensor.h>

#include <vector>

namespace mixbench::reference {

// Values computed in double (RoPE angles, decays, teachers) as a tensor of opts' dtype, rounded once
// from FP64: the references then also run in another dtype (a baseline at that precision).
at::Tensor from_doubles(const std::vector<double>& v, const at::TensorOptions& opts);

// Causal attention, GQA by head groups (query head h reads KV head h / (H/Hkv)).
// q [B,T,H,D], k [B,T,Hkv,D], v [B,T,Hkv,Dv]. window = visible keys including self (0 = all).
// logit_scale_a > 0 multiplies the logits of query t by log_a(t + a).
at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                     int64_t window, double logit_scale_a);

// nanochat's attention layer (CausalSelfAttention) on x [B,T,d] (already normed):
// projections, value-embedding gate (when ve is defined), RoPE (base, half-split, nanochat's
// sign), QK RMSNorm, ×1.2, attention, output projection.
struct AttnLayerWeights {
  at::Tensor c_q, c_k, c_v, c_proj, ve_gate;  // ve_gate undefined when the layer has no VE
  at::Tensor c_gate;                          // output gate [H·dh, d] (HypeNet), undefined = none
};
// The layer's q, k, v up to the attention call (projections, VE gate, RoPE, QK RMSNorm, ×1.2):
// q [B,T,H,dh], k/v [B,T,Hkv,dh]. Layers that replace only the attention reuse it.
struct NanochatQKV {
  at::Tensor q, k, v;
};
// rope = false: NoPE (HypeNet's attention layers). `positions` [B,T] (int64): each token's RoPE
// position (a layer run on a subset of the tokens); undefined = 0 … T−1.
NanochatQKV nanochat_qkv(const at::Tensor& x, const at::Tensor& ve, const AttnLayerWeights& w, int64_t n_head,
                         int64_t n_kv_head, int64_t head_dim, double rope_base, bool rope = true,
                         const at::Tensor& positions = at::Tensor());
// The whole layer; with w.c_gate the attention output is multiplied by sigmoid(x c_gateᵀ) before c_proj.
at::Tensor nanochat_attention_layer(const at::Tensor& x, const at::Tensor& ve, const AttnLayerWeights& w,
                                    int64_t n_head, int64_t n_kv_head, int64_t head_dim, int64_t window,
                                    double rope_base, double logit_scale_a, bool rope = true,
                                    const at::Tensor& positions = at::Tensor());

// Multi-head latent attention (DeepSeek-V2), one layer: c_Q = rms(W_DQ x)·g_Q, q = [W_UQ c_Q, RoPE(W_QR c_Q)],
// c_KV = rms(W_DKV x)·g_KV, k = [W_UK c_KV, RoPE(W_KR x) shared by the heads], v = W_UV c_KV; with
// qk_norm, q ← rms(q)·1.2 and k ← rms(k)·1.2 per head over all dh + dr dims (nanochat's QK-norm);
// causal softmax attention with scale (dh + dr)^-0.5, y = c_proj(o). dr = 0: no rotary part (w_qr,
// w_kr undefined); an undefined latent gain (q_norm, kv_norm) is 1.
struct MlaWeights {
  at::Tensor w_dq, w_uq, w_qr, w_dkv, w_uk, w_uv, w_kr, c_proj, q_norm, kv_norm;
};
at::Tensor mla_layer(const at::Tensor& x, const MlaWeights& w, int64_t n_head, int64_t head_dim, int64_t rope_dim,
                     double rope_base, bool qk_norm = false);

}  // namespace mixbench::reference
