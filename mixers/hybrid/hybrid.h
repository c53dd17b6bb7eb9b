// Building a hybrid method from a per-layer layout (mixers/hybrid/hybrid.cpp describes the rules:
// the union config, per-layer dispatch, decode hooks and model-level cases).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "harness/config.h"
#include "harness/registry.h"

namespace mixbench {

using LayoutFn = std::function<std::vector<LayerChoice>(const Config&)>;

struct HybridDesc {
  std::string name, summary, citation;
  LayoutFn layout;
  ConfigSpec own;             // the hybrid's own knobs (added to the union)
  std::string case_config;    // extra fields of the conformance cases (small blocks etc.)
  int64_t case_min_T = 1;     // the shortest conformance case
};

// The hybrid's MethodSpec (family "hybrid"); its config, ops, decode hooks, cases and summary are
// completed once every method is registered (MethodSpec::complete).
MethodSpec make_hybrid(HybridDesc desc);

}  // namespace mixbench
