// Method `lightning`: HypeNet's Lightning Attention mixer (seed 000 §2.5, Eqs. 18-19):
//   q = RMSNorm(x W_q), k = RMSNorm(x W_k) per head (parameter-free), then RoPE on both
//   (layers::rope, base 10000: the seed gives no base), k ← k/√dh; op scale 1 (the 1/√dh sits on k);
//   fixed decay γ_h = exp(−2^(−8h/H)), h = 1..H (g_h = −2^(−8h/H)), no per-layer rescaling;
//   y = W_o( RMSNorm_head(o) ⊙ sigmoid(x W_zᵀ) ) with a parameter-free output RMSNorm (the seed's
//   Norm has no stated gain); no short conv, no feature map.
#include "mixers/linear/gla_family.h"

namespace mixbench::linear {
namespace {
MethodSpec make() {
  GlaFamilyDesc d;
  d.name = "lightning";
  d.summary = "HypeNet Lightning: QK-norm, RoPE, k/√dh, fixed decay exp(−2^(−8h/H)), RMSNorm·sigmoid gate";
  d.citation = "HypeNet/HALO arXiv:2601.22156 (seed 000 §2.5, App. A Eqs. 18-19); Qin et al. 2024 (Lightning Attention)";
  d.op = "simple_gla";
  d.qk_norm = true;
  d.qk_tau = 1.0;
  d.rope = true;
  d.k_inv_sqrt = true;
  d.scale = 1.0;
  d.decay = "lightning";
  d.out_gain = false;
  d.out_gate = "sigmoid";
  return make_gla_family_method(d);
}
MIXBENCH_REGISTER(make());
}  // namespace
}  // namespace mixbench::linear
