// Methods whose layers select what they attend to (the sparse family: the keys or blocks each query
// reads), registered beside their MethodSpec (defined in harness/registry.cpp).
//
// Such a layer's forward and reference return each selection as an integer output (a selection
// along its last dimension, −1 = empty slot, compared as OpSpec::selection_outputs), and the
// reference also takes it as an input of the same name: given one, the reference attends where that
// selection says instead of selecting itself. Layer-level conformance (suites/conformance_checks.h,
// run_case) therefore gives the reference the optimized path's selection, so that the outputs and
// gradients are compared on the same keys (below fp64 near-tied scores rank differently), and
// checks the selection itself against the reference's own choice, tie-aware by `scores`.
#pragma once
#include <cstdint>
#include <functional>
#include <set>
#include <string>

#include "harness/registry.h"

namespace mixbench {

struct MethodSelection {
  std::set<std::string> outputs;  // the selection outputs of forward and reference
  // The FP64 reference scores of each selection's candidates, {output: [rows..., n]} (−inf = no
  // candidate, +inf = forced, e.g. the query's own block), as OpSpec::selection_scores; the inputs
  // are the layer's.
  std::function<TensorMap(const TensorMap&, const Config&, const LayerCtx&)> scores;
};
void register_method_selection(const std::string& method, MethodSelection s);
// The method's selections, nullptr when its layer selects nothing.
const MethodSelection* method_selection(const std::string& method);

// call_op calls made on this thread so far: the checked entry points validate their inputs, which
// can read values back to the host (a synchronisation a CUDA graph cannot capture); layers meant to
// be captured call unchecked entry points instead, and tests count with this that they do.
int64_t call_op_count();

}  // namespace mixbench
