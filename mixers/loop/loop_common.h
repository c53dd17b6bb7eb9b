// Looped (recurrent-depth) methods built on a registered base method (methods.md §4): the base's
// layer in every block, an execution plan that runs the first n_prelude blocks once, the core
// blocks n_loops times and the last n_coda blocks once (ExecPlan::loop), and a residual stream
// (nanochat's by default, its backout at the unrolled midpoint). Parameters are per block, FLOPs
// per application, one decode-cache slot per unrolled step; the base's depth-dependent choices
// (dense's SSSL windows) follow the unrolled position (LayerCtx::unrolled), value embeddings stay
// with their block. A loop method is model_level(): conformance checks it as a whole small model.
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "harness/config.h"
#include "harness/plan.h"
#include "harness/registry.h"
#include "harness/residual.h"

namespace mixbench {

struct LoopDesc {
  std::string name, base, summary, citation;
  // Defaults of the method's config fields n_loops, n_prelude, n_coda (-1: automatic, see
  // loop_split).
  int64_t n_loops = 2, n_prelude = 0, n_coda = 0;
  // The residual stream; unset = nanochat's (resid/x0 scales per unrolled step, backout at the
  // unrolled midpoint).
  std::function<std::shared_ptr<const ResidualStream>(const Config&)> residual;
  // Optional: runs on the completed spec (the base's copy with the loop fields, plan and stream),
  // e.g. to add the method's own config fields or wrap its layer functions; the conformance cases
  // (small models of 3 and 4 blocks) are made from its config afterwards unless it sets its own.
  std::function<void(MethodSpec&)> finish;
};

// n_prelude or n_coda of a loop method's config; -1 resolves to 1 when the stack has 3 blocks or
// more and to 0 below (a 1- or 2-block model loops its whole stack).
int64_t loop_split(const Config& c, const std::string& field);
// The plan of a loop method's config (n_layer blocks; n_prelude, n_coda, n_loops): InputError
// for n_loops ≤ 0 or a split that leaves no core block.
ExecPlan loop_plan(const Config& c);

// A method that runs `desc.base`'s layer under the loop plan. The base's spec is copied once every
// method is registered (MethodSpec::complete); the copy keeps the base's config and adds the loop
// fields, whose rule refuses a bad split (InputError, exit 2 through the CLI).
MethodSpec loop_method(LoopDesc desc);

}  // namespace mixbench
