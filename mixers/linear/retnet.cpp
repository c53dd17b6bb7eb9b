// Method `retnet`: RetNet's multi-scale retention on the simple_gla op (methods.md §2; seed 001).
//   fixed per-head decay γ_h = 1 − 2^(−5−h), h = 0..H−1, i.e. g_h = log γ_h constant over tokens;
//   rotary position on q and k (layers::rope, half-split, base 10000 as FLA's RotaryEmbedding);
//   query scale K^-0.5 (FLA chunk_retention's default);
//   output o = W_o( RMSNorm_head(o)·gain ⊙ silu(x W_gᵀ) ) as FLA's MultiScaleRetention
//   (FusedRMSNormGated, swish gate, learnable elementwise gain of size V shared by heads);
//   per-head RMSNorm replaces the paper's GroupNorm. No feature map, no short conv, K = V = head_dim
//   (FLA uses expand_v = 2; we keep the backbone's head geometry).
#include "mixers/linear/gla_family.h"

namespace mixbench::linear {
namespace {
MethodSpec make() {
  GlaFamilyDesc d;
  d.name = "retnet";
  d.summary = "RetNet retention: fixed per-head decay 1−2^(−5−h), RoPE, per-head RMSNorm, SiLU output gate";
  d.citation = "Sun et al. 2023 (RetNet); fla-org/flash-linear-attention fla/layers/multiscale_retention.py";
  d.op = "simple_gla";
  d.rope = true;
  d.scale = 0;  // K^-0.5
  d.decay = "retnet";
  d.out_gain = true;
  d.out_gate = "silu";
  return make_gla_family_method(d);
}
MIXBENCH_REGISTER(make());
}  // namespace
}  // namespace mixbench::linear
