// Looped (recurrent-depth) methods on nanochat's SSSL `dense` backbone: `prelude` blocks once, the
// core blocks (n_layer − prelude − coda of them) applied several times, `coda` blocks once. The
// layer of every block is dense's (mixers/attention/dense.cpp), windows and value embeddings bound
// to the physical block; the method adds its loop count, its plan and its residual stream.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "harness/plan.h"
#include "harness/registry.h"

namespace mixbench {

struct LoopSplit {
  int64_t prelude = 1, core = 1, coda = 1;
  int64_t loops = 1;  // core applications in the plan
  int64_t core_begin() const { return prelude; }                // plan step of the first core step
  int64_t core_end() const { return prelude + core * loops; }   // plan step after the last one
  int64_t n_steps() const { return core_end() + coda; }
  // Sublayer / plan-step classification: whether plan step `step` opens / closes a core application.
  bool opens_loop(int64_t step) const { return step >= core_begin() && step < core_end() && (step - prelude) % core == 0; }
  bool closes_loop(int64_t step) const {
    return step >= core_begin() && step < core_end() && (step - prelude) % core == core - 1;
  }
  int64_t loop_of(int64_t step) const { return (step - prelude) / core; }  // core application index
};

// The split of a config: "prelude", "coda" and the loop count field `loops_key`.
LoopSplit act_loop_split(const Config& c, const std::string& loops_key);
// prelude blocks, the core blocks `loops` times, coda blocks (ExecPlan::from_blocks).
ExecPlan act_loop_plan(const LoopSplit& s);

// A looped method: dense's layer (copied from the registry once every method is registered), its
// config plus "prelude", "coda" and the method's own fields (`extend`, which declares the loop
// count `loops_key`), the plan of loop_split and the residual stream `stream`. Its conformance
// cases are `cases(config spec)`.
struct LoopMethodDesc {
  std::string name, summary, citation, loops_key;
  std::function<void(ConfigSpec&)> extend;
  std::function<std::shared_ptr<const ResidualStream>(const Config&)> stream;
  std::function<std::vector<CaseDef>(const ConfigSpec&)> cases;
};
MethodSpec act_loop_method(const LoopMethodDesc& desc);

}  // namespace mixbench
