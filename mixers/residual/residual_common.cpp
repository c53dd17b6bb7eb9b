#include "mixers/residual/residual_common.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <stdexcept>

#include "harness/backbone.h"

namespace mixbench::residual {

namespace {
// Registration needs every function set; the real ones are dense_full's, copied in complete().
[[noreturn]] void not_completed(const std::string& name) {
  throw std::logic_error("method " + name + " used before the registry completed it");
}
template <typename Fn>
Fn unset(const std::string& name) {
  return [name](auto&&...) -> typename Fn::result_type { not_completed(name); };
}
// What the method is, whichever spec it lands on.
void describe(MethodSpec& m, const StreamMethodDesc& desc) {
  m.name = desc.name;
  m.family = "residual";
  if (desc.name != kResidualControl) m.control = kResidualControl;  // the leaderboard's second Δ
  m.summary = desc.summary;
  m.citation = desc.citation;
  m.residual = desc.stream;
  m.complete = nullptr;
}
}  // namespace

MethodSpec stream_method(StreamMethodDesc desc) {
  MethodSpec m;
  describe(m, desc);
  m.config = backbone_config();
  m.params = unset<decltype(m.params)>(desc.name);
  m.make_inputs = unset<decltype(m.make_inputs)>(desc.name);
  m.reference = unset<decltype(m.reference)>(desc.name);
  m.forward = unset<decltype(m.forward)>(desc.name);
  m.account = unset<decltype(m.account)>(desc.name);
  m.cases = []() { return std::vector<CaseDef>{}; };
  m.complete = [desc](MethodSpec& self) {
    MethodSpec s = Registry::get().method("dense_full");
    describe(s, desc);
    if (desc.add_fields) desc.add_fields(s.config);
    // Whole small models (the suite checks a stream at model level): two layers, then three so
    // that value embeddings sit on alternate layers; T ≤ 16 keeps the finite differences cheap.
    // The single-token case has two sequences: with one, random static maps make the streams
    // nearly parallel at T = 1 and the last sublayer's map gradients nearly vanish (the final
    // RMSNorm's gradient is orthogonal to its input), leaving fp32 checks on cancellation noise.
    ConfigSpec spec = s.config;
    s.cases = [spec]() {
      Config base = spec.parse("n_layer=2,d_model=32,head_dim=16,seq_len=16,vocab=32");
      return std::vector<CaseDef>{
          {"model_n2_B2_T1", base, 2, 1, 0},
          {"model_n2_B2_T9", base, 2, 9, 0},
          {"model_n3_T16", base.with("n_layer", int64_t(3)), 1, 16, 0},
      };
    };
    self = std::move(s);
  };
  return m;
}

at::Tensor reference_rms_norm(const at::Tensor& x) {
  return x / at::sqrt((x * x).sum(-1, /*keepdim=*/true) / double(x.size(-1)) + kRmsEps);
}

OptimRule residual_map_rule() { return adamw_rule("residual_maps", 0.02, 0.8, 0.95, 0.0, false, true); }

}  // namespace mixbench::residual
