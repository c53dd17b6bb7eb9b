// The accounting suite: a method's parameters, FLOPs per token (nanochat's training convention and
// the executed forward), decode FLOPs, activation, cache and state bytes, per layer and in total;
// optionally audited by building the model, counting its parameters and counting the FLOPs its
// forward pass executes.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>

#include "harness/accountant.h"
#include "harness/backbone.h"
#include "harness/config.h"
#include "harness/registry.h"

namespace mixbench {

struct AccountOptions {
  std::string method;              // registered method name (UsageError when unknown)
  std::string config;              // "k=v,..." overrides of the method's config (seq_len among them)
  std::optional<int64_t> context;  // decode context length; default: the config's seq_len
  int64_t dtype_bytes = 2;         // element size of activations, caches and states
  bool audit = false;              // build the model and count what it holds and executes
  int64_t audit_batch = 1;         // rows of the audit's forward pass
};

struct AccountResult {
  const MethodSpec* method = nullptr;
  Config config;
  ModelDims dims{};
  CostQuery query;
  ModelCost cost;
  // The report's result row: status, method, config, shape, params, FLOPs, bytes, layers and,
  // with an audit, `audit` (params_built, params_match, fwd_flops_counted_per_token, ...; for a plan
  // with auxiliary routes also the count of a forward pass that runs them against
  // fwd_flops + aux_route_fwd_flops, aux_route_fwd_flops_rel_diff). Where a
  // layer has an indexer (DSA; harness/cost_parts.h), its row adds indexer_train_flops and
  // indexer_share (of layer_train_flops), and the result `indexer_share`, the largest over the layers.
  nlohmann::json row;
  // False when an audit ran and the built parameters differ from the accountant's or the counted
  // forward FLOPs (with the auxiliary routes, either count) differ by more than 2%; true without an audit.
  bool audit_passed() const;
};

AccountResult run_account(const AccountOptions& opt);

// A mixer layer's training FLOPs per token in nanochat's convention: 6·matmul params + its core (the
// block's MLP excluded). An indexer's share (harness/cost_parts.h, part "indexer") is of this.
double layer_train_flops(const LayerCost& lc);

// A ParamCount as the report writes it (the parts, total and matmul).
nlohmann::json param_json(const ParamCount& p);

}  // namespace mixbench
