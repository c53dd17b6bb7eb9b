// Helpers shared by the residual-stream methods (methods.md §5): each is dense_full's model (full
// causal MHA, value embeddings, smear, ReLU² MLP) with its own ResidualStream in place of
// nanochat's resid/x0 lambdas and backout.
#pragma once
#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>

#include "harness/config.h"
#include "harness/registry.h"
#include "harness/residual.h"

namespace mixbench::residual {

// The family's control: every other residual-stream method is also compared with it.
inline constexpr const char* kResidualControl = "residual_standard";

// A residual-stream method: dense_full's spec (its layer, decode path, accountant and presets)
// with the stream `stream(cfg)`, the config fields `add_fields` declares on top of dense_full's,
// and small whole-model conformance cases (n_layer 2–3, d_model 32, T ≤ 16). The copy is made once
// every method is registered (MethodSpec::complete), so registration order does not matter.
struct StreamMethodDesc {
  std::string name, summary, citation;
  std::function<void(ConfigSpec&)> add_fields;  // may be empty
  std::function<std::shared_ptr<const ResidualStream>(const Config&)> stream;
};
MethodSpec stream_method(StreamMethodDesc desc);

// Parameter-free RMSNorm over the last dimension with the backbone's eps, written out in the
// reference's plain arithmetic (x / √(mean(x²) + eps)); the fast paths use layers::rms_norm.
at::Tensor reference_rms_norm(const at::Tensor& x);

// The optimizer rule of every stream-owned map parameter (static coefficients, dynamic
// projections, gate scales): their own AdamW group "residual_maps", no weight decay, at the Muon
// base lr scaled with the batch like nanochat's other AdamW groups.
OptimRule residual_map_rule();

}  // namespace mixbench::residual
