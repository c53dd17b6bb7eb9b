// Named parts of a layer's training FLOPs per token that a method reports beside its LayerCost
// (nanochat's convention: parts of the layer's 6·params.matmul + nanochat_core_flops), e.g. DSA's
// lightning indexer ("indexer"). The accounting suite shows each part's share of its layer.
#pragma once
#include <functional>
#include <string>

#include "harness/accountant.h"
#include "harness/config.h"
#include "harness/registry.h"

namespace mixbench {

using LayerCostPart = std::function<double(const Config&, const LayerCtx&, const CostQuery&)>;

// Register at static initialisation: MIXBENCH_REGISTER_COST_PART("dsa", "indexer", fn).
bool register_layer_cost_part(const std::string& method, const std::string& part, LayerCostPart fn);
// The part registered for a method's layer, or nullptr.
const LayerCostPart* layer_cost_part(const std::string& method, const std::string& part);

}  // namespace mixbench

#define MIXBENCH_REGISTER_COST_PART(method, part, fn)                         \
  static const bool MIXBENCH_CONCAT(mixbench_cost_part_, __LINE__) = \
      ::mixbench::register_layer_cost_part(method, part, fn)
