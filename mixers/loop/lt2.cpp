// LT2, linear-time looped transformers (methods.md §4 `lt2_*`, seed 004). The whole stack of
// n_layer blocks is looped lt2_loops times (seed 004 §2.1 Eq. 2, seed line 89: h⁽⁰⁾ = Emb(x),
// h⁽τ⁾ = (F_N ∘ … ∘ F_1)(h⁽τ⁻¹⁾), τ = 1 … T), each application with its own decode-cache slot;
// the default T = 4 is the seed's (§3.1, line 112: "T = 4 for every looped variant"). Between loops
// the cross-loop residual h⁽τ⁾ = h̃⁽τ⁾ + ρ_τ ⊙ h⁽τ⁻¹⁾ with zero-initialised per-channel ρ (line 93;
// mixers/loop/lt2_stream.h).
//
// Layouts of the n_layer blocks (1-based i), the hybrids at the seed's 1:4 mix (line 112: "1:4 for
// both (Full:Linear) and (GDN:DSA)"), the minority layer first in every group of five (uniform
// interleaving, §3.3), so any stack has at least one of it:
//   lt2_gdn              GDN at every block
//   lt2_hybrid_full_gdn  full attention (dense_full) iff i % 5 == 1, else GDN
//   lt2_hybrid_gdn_dsa   GDN iff i % 5 == 1, else DSA (the seed's GDN:DSA = 1:4, read literally)
// The SDPA output gate (§3.4, an ablation there, so off by default) is dense_full's `out_gate`:
// with out_gate=true the full-attention layers of lt2_hybrid_full_gdn multiply their attention
// output by sigmoid(x W_gate) (DSA has no output-gate option).
//
// Each method is a hybrid (mixers/hybrid/hybrid.h) over its layout with an execution plan
// (harness/plan.h) and the LT2 stream: its layers' references, CPU and CUDA paths and decode hooks
// are the layer methods' own; parameters are per block and FLOPs per application.
#include <fmt/format.h>

#include "harness/backbone.h"
#include "harness/plan.h"
#include "harness/registry.h"
#include "mixers/hybrid/hybrid.h"
#include "mixers/loop/lt2_stream.h"

namespace mixbench {
namespace {

// Blocks 0 … n_layer−1 in order, lt2_loops times.
ExecPlan lt2_plan(const Config& c) {
  const int64_t L = c.i("n_layer"), loops = c.i("lt2_loops");
  std::vector<int64_t> blocks;
  for (int64_t t = 0; t < loops; ++t)
    for (int64_t i = 0; i < L; ++i) blocks.push_back(i);
  return ExecPlan::from_blocks(L, blocks);
}

// `minority` at i % 5 == 1 (1-based), `majority` elsewhere; one method throughout when they agree.
LayoutFn one_in_five(std::string minority, std::string majority) {
  return [minority, majority](const Config& c) {
    const int64_t N = c.i("n_layer");
    std::vector<LayerChoice> out;
    for (int64_t i = 1; i <= N; ++i) out.push_back({i % 5 == 1 ? minority : majority, ""});
    return out;
  };
}

MethodSpec lt2_method(std::string name, std::string summary, LayoutFn layout, std::string case_config,
                      int64_t case_blocks) {
  HybridDesc d;
  d.name = name;
  d.summary = summary;
  d.citation = "Deng et al. 2026, LT2: Linear-Time Looped Transformers (arXiv 2605.20670), §2.1, §3.1; methods.md §4";
  d.layout = std::move(layout);
  d.own.i("lt2_loops", 4, "times the whole stack of n_layer blocks runs (LT2's T)", 1, 64);
  MethodSpec m = make_hybrid(d);
  m.family = "loop";
  m.plan = lt2_plan;
  m.residual = [](const Config& c) { return lt2_stream(c.i("n_layer"), c.i("lt2_loops")); };
  // The leaderboard presets run two loops: at four, iso-FLOP calibration to the anchor leaves
  // fewer blocks than half the anchor's layers (1 at tiny, 2 at small).
  for (const char* preset : {"tiny", "small"}) m.presets[preset].config = "lt2_loops=2";
  // Tiny model-level cases: two loops of a few blocks, d_model 32, with finite differences on
  // every parameter (T ≤ 24); three loops at T = 26 without them (a model's finite differences
  // cost most of the suite's time).
  auto complete = m.complete;
  m.complete = [complete, case_config, case_blocks](MethodSpec& self) {
    complete(self);
    const ConfigSpec spec = self.config;
    self.cases = [spec, case_config, case_blocks]() {
      const Config base = spec.parse(fmt::format("n_layer={},d_model=32,head_dim=16,seq_len=32,vocab=32,lt2_loops=2,{}",
                                                 case_blocks, case_config));
      return std::vector<CaseDef>{
          {fmt::format("model_n{}_loops2_T1", case_blocks), base, 1, 1, 0},
          {fmt::format("model_n{}_loops2_T9", case_blocks), base, 1, 9, 0},
          {fmt::format("model_n{}_loops3_T26", case_blocks), base.with("lt2_loops", int64_t(3)), 1, 26, 0},
      };
    };
    self.summary = fmt::format("LT2, the whole stack looped lt2_loops times (default 4) with cross-loop ρ: {}", self.summary);
  };
  return m;
}

MIXBENCH_REGISTER(lt2_method("lt2_gdn", "GDN at every block", one_in_five("gdn", "gdn"), "gate_bias_offset=-5", 2));
MIXBENCH_REGISTER(lt2_method("lt2_hybrid_full_gdn", "full attention : GDN = 1 : 4 (full at blocks 1, 6, ...)",
                             one_in_five("dense_full", "gdn"), "gate_bias_offset=-5", 3));
MIXBENCH_REGISTER(lt2_method("lt2_hybrid_gdn_dsa", "GDN : DSA = 1 : 4 (GDN at blocks 1, 6, ...)",
                             one_in_five("gdn", "dsa"),
                             "gate_bias_offset=-5,dsa_topk=5,idx_heads=2,idx_dim=8,idx_rope_dim=4", 3));

}  // namespace
}  // namespace mixbench
