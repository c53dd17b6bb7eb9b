// Parameter names of other implementations (harness/param_alias.h) applied to whole state dicts:
// the names a model or a layer's parameters have in a naming scheme, and the conversion of tensors
// between mixbench's names and layouts and the scheme's. Schemes:
//   "nanochat"  nanochat's GPT.state_dict() (karpathy/nanochat 92d63d4 nanochat/gpt.py): the
//               backbone's names plus the attention layers' (dense, dense_full, mqa, gqa); model
//               and layer level
//   "fla"       flash-linear-attention's layer the method follows (gdn: GatedDeltaNet, deltanet:
//               DeltaNet, gla: GatedLinearAttention, retnet: MultiScaleRetention, kda:
//               KimiDeltaAttention); layer level only
// docs/foreign-names.md lists every mapping and deviation; `mixbench list --names SCHEME` prints them.
#pragma once
#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <vector>

#include "harness/param_alias.h"
#include "harness/registry.h"
#include "harness/tensor_map.h"

namespace mixbench {

// The schemes mixbench knows ("nanochat", "fla").
const std::vector<std::string>& foreign_schemes();
// UsageError unless `scheme` is one of them.
void check_scheme(const std::string& scheme);

// A layer's aliases at (cfg, ctx): the method's scheme entries that name a parameter the layer has
// there (a value-embedding gate only on value-embedding layers). UsageError naming the method when
// it has no such scheme.
ParamAliases layer_aliases(const MethodSpec& m, const Config& cfg, const LayerCtx& ctx, const std::string& scheme);
// A whole model's aliases ("nanochat" only: the backbone's names and every layer's, prefixed
// transformer.h.<i>.attn.). UsageError for a method or scheme that has none.
ParamAliases model_aliases(const MethodSpec& m, const Config& cfg, const std::string& scheme);

// Our tensors (parameter name -> tensor) under their names and layouts. UsageError naming a
// parameter that has no name in the scheme.
TensorMap to_foreign(const TensorMap& ours, const ParamAliases& aliases, const std::string& scheme);
// The alias of our parameter `ours` (nullptr: none).
const ParamAlias* alias_of_ours(const ParamAliases& aliases, const std::string& ours);

// Their tensors read back as ours: every expected parameter (name -> shape) must be present under
// its name in the scheme (or ours when scheme is empty) with the shape the config implies (padded
// rows dropped). InputError "<where>: ..." naming the tensor for an unknown name, a missing
// parameter or a contradicting shape. Tensors keep their dtype.
TensorMap from_foreign(const TensorMap& theirs, const ParamAliases& aliases,
                       const std::vector<std::pair<std::string, std::vector<int64_t>>>& expected,
                       const std::string& scheme, const std::string& where, bool require_all = true);

// One line per alias ("theirs <- ours [layout] note") and one per deviation, for `mixbench list --names`.
std::string describe_aliases(const ParamAliases& a);

}  // namespace mixbench
