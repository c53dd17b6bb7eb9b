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
}  // namespace

MethodSpec stream_method(StreamMethodDesc desc) {
  MethodSpec m;
  m.name = desc.name;
  m.family = "residual";
  m.summary = desc.summary;
  m.citation = desc.citation;
  m.config = backbone_config();
  const std::string name = desc.name;
  m.params = [name](const Config&, const LayerCtx&) -> std::vector<ParamDef> { not_completed(name); };
  m.make_inputs = [name](const Config&, const LayerCtx&, int64_t, int64_t, at::Generator&) -> TensorMap {
    not_completed(name);
  };
  m.reference = [name](const TensorMap&, const Config&, const LayerCtx&) -> TensorMap { not_completed(name); };
  m.forward = [name](const TensorMap&, const Config&, const LayerCtx&, Backend) -> TensorMap { not_completed(name); };
  m.cases = []() { return std::vector<CaseDef>{}; };
  m.account = [name](const Config&, const LayerCtx&, const CostQuery&) -> LayerCost { not_completed(name); };
  m.residual = desc.stream;
  m.complete = [desc](MethodSpec& self) {
    MethodSpec s = Registry::get().method("dense_full");
    s.name = desc.name;
    s.family = "residual";
    s.summary = desc.summary;
    s.citation = desc.citation;
    if (desc.add_fields) desc.add_fields(s.config);
    s.residual = desc.stream;
    s.complete = nullptr;
    // Whole small models (the suite checks a stream at model level): two layers, then three so
    // that value embeddings sit on alternate layers; T ≤ 16 keeps the finite differences cheap.
    ConfigSpec spec = s.config;
    s.cases = [spec]() {
      Config base = spec.parse("n_layer=2,d_model=32,head_dim=16,seq_len=16,vocab=32");
      return std::vector<CaseDef>{
          {"model_n2_T1", base, 1, 1, 0},
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
