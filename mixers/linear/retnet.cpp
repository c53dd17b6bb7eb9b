// Method `retnet`: RetNet's multi-scale retention on the simple_gla op (methods.md §2; seed 001).
//   fixed per-head decay γ_h = 1 − 2^(−5−h), h = 0..H−1, i.e. g_h = log γ_h constant over tokens;
//   rotary position on q and k (layers::rope, half-split, base 10000 as FLA's RotaryEmbedding);
//   query scale K^-0.5 (FLA chunk_retention's default);
//   output o = W_o( RMSNorm_head(o)·gain ⊙ silu(x W_gᵀ) ) as FLA's MultiScaleRetention
//   (FusedRMSNormGated, swish gate, learnable elementwise gain of size V shared by heads);
//   per-head RMSNorm replaces the paper's GroupNorm. No feature map, no short conv, K = V = head_dim
//   (FLA uses expand_v = 2; we keep the backbone's head geometry).
#include "harness/backbone.h"
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
  MethodSpec m = make_gla_family_method(d);
  m.foreign_names["fla"] = [](const Config& c) {
    ParamAliases a;
    a.aliases = {{"q_proj.weight", "w_q"}, {"k_proj.weight", "w_k"}, {"v_proj.weight", "w_v"}, {"g_proj.weight", "w_g"},
                 {"o_proj.weight", "w_o"}, {"g_norm_swish_gate.weight", "o_norm"}};
    // fla's rotary rotates by +θ, mixbench's (nanochat's layout) by −θ: q/k rows' second halves flip sign
    for (auto& x : a.aliases)
      if (x.ours == "w_q" || x.ours == "w_k") {
        x.negate_second_half_rows = model_dims(c).head_dim;
        x.note = "fla's rotary turns by +θ, mixbench's by −θ: the second half of each head's rows is negated";
      }
    a.deviations = {
        "value embeddings (ve.<i>, ve_gate) are mixbench's additions, as nanochat's attention: fla's layer has none",
        "the value head width is head_dim (fla's MultiScaleRetention defaults to expand_v = 2): build it with "
        "expand_v = 1; its rotary embedding rotates by +θ (x1·cos − x2·sin) where mixbench's RoPE follows nanochat's "
        "−θ layout (x1·cos + x2·sin): the same attention up to negating the second half of each q and k head, so "
        "the mapping negates those rows of q_proj/k_proj both ways",
        "the output RMSNorm's eps is float32's epsilon (nanochat's F.rms_norm default) where fla's norm_eps is 1e-5: "
        "build the fla layer with norm_eps = 1.1920928955078125e-07 to compare",
        "initialisation differs (nanochat's uniform projections, zero w_o); a state dict carries its own values"};
    return a;
  };
  return m;
}
MIXBENCH_REGISTER(make());
}  // namespace
}  // namespace mixbench::linear
