// Method `gla`: FLA's GatedLinearAttention layer on the gla op (methods.md §2; seed 001).
//   forget gate per key channel: g = logsigmoid((x W_1ᵀ) W_2ᵀ + b) / 16, W_1 d→16 (no bias),
//   W_2 16→H·K with bias (FLA gk_proj, gate_low_rank_dim 16, gate_logit_normalizer 16, no clamp);
//   query scale K^-0.5 (FLA chunk_gla default); no feature map, no short conv, no RoPE;
//   output W_o( RMSNorm_head(o)·gain ⊙ silu(x W_gᵀ) ) (FLA FusedRMSNormGated with swish gate, gain
//   of size V shared by heads). K = V = head_dim (FLA defaults to expand_k = 0.5).
#include "mixers/linear/gla_family.h"

namespace mixbench::linear {
namespace {
MethodSpec make() {
  GlaFamilyDesc d;
  d.name = "gla";
  d.summary = "Gated Linear Attention: low-rank per-key forget gate logsigmoid/16, SiLU output gate";
  d.citation = "Yang et al. 2024 (GLA); fla-org/flash-linear-attention fla/layers/gla.py";
  d.op = "gla";
  d.scale = 0;
  d.decay = "lowrank";
  d.out_gain = true;
  d.out_gate = "silu";
  MethodSpec m = make_gla_family_method(d);
  m.foreign_names["fla"] = [](const Config&) {
    ParamAliases a;
    a.aliases = {{"q_proj.weight", "w_q"}, {"k_proj.weight", "w_k"}, {"v_proj.weight", "w_v"}, {"g_proj.weight", "w_g"},
                 {"o_proj.weight", "w_o"}, {"g_norm_swish_gate.weight", "o_norm"}};
    a.aliases.push_back({"gk_proj.0.weight", "w_gk1"});
    a.aliases.push_back({"gk_proj.1.weight", "w_gk2"});
    a.aliases.push_back({"gk_proj.1.bias", "b_gk"});
    a.deviations = {
        "value embeddings (ve.<i>, ve_gate) are mixbench's additions, as nanochat's attention: fla's layer has none",
        "the key head width is head_dim (fla's GatedLinearAttention defaults to expand_k = 0.5, expand_v = 1): build "
        "it with expand_k = 1",
        "the output RMSNorm's eps is float32's epsilon (nanochat's F.rms_norm default) where fla's norm_eps is 1e-5: "
        "build the fla layer with norm_eps = 1.1920928955078125e-07 to compare",
        "initialisation differs (nanochat's uniform projections, zero w_o); a state dict carries its own values"};
    return a;
  };
  // gpu-d12: the LibTorch chunked path for 32 rows × 2048 tokens needs more than an H200's memory;
  // micro-batches of 8 rows (gradients accumulated).
  m.presets["gpu-d12"].micro_batch = 8;
  return m;
}
MIXBENCH_REGISTER(make());
}  // namespace
}  // namespace mixbench::linear
