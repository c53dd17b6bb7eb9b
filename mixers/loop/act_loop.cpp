#include "mixers/loop/act_loop.h"

#include <fmt/format.h>

#include <stdexcept>

#include "harness/errors.h"
#include "harness/residual.h"

namespace mixbench {

LoopSplit act_loop_split(const Config& c, const std::string& loops_key) {
  LoopSplit s;
  s.prelude = c.i("prelude");
  s.coda = c.i("coda");
  s.core = c.i("n_layer") - s.prelude - s.coda;
  s.loops = c.i(loops_key);
  return s;
}

ExecPlan act_loop_plan(const LoopSplit& s) {
  std::vector<int64_t> blocks;
  for (int64_t b = 0; b < s.prelude; ++b) blocks.push_back(b);
  for (int64_t k = 0; k < s.loops; ++k)
    for (int64_t b = 0; b < s.core; ++b) blocks.push_back(s.prelude + b);
  for (int64_t b = 0; b < s.coda; ++b) blocks.push_back(s.prelude + s.core + b);
  return ExecPlan::from_blocks(s.prelude + s.core + s.coda, blocks);
}

namespace {

void unset(const std::string& name) {
  throw std::logic_error("method " + name + " is used before the registry completed it");
}

// dense's layer and config, the loop fields and the rule that the split fits.
void complete(MethodSpec& m, const LoopMethodDesc& desc) {
  const MethodSpec& dense = Registry::get().method("dense");
  m.config = dense.config;
  m.config.i("prelude", 1, "blocks run once before the loop (the backout reads the last of them)", 1, 1024)
      .i("coda", 1, "blocks run once after the loop", 1, 1024);
  desc.extend(m.config);
  const std::string key = desc.loops_key;
  m.config.rule([key](const Config& c) {
    const LoopSplit s = act_loop_split(c, key);
    if (s.core < 1)
      throw InputError(fmt::format("prelude {} + coda {} leave no core block of n_layer {} (needs prelude + coda < n_layer)",
                                   s.prelude, s.coda, c.i("n_layer")));
    if (s.loops < 1) throw InputError(fmt::format("{} is {} (needs at least 1 core application)", key, s.loops));
  });
  m.ops = dense.ops;
  m.params = dense.params;
  m.make_inputs = dense.make_inputs;
  m.reference = dense.reference;
  m.forward = dense.forward;
  m.has_cuda = dense.has_cuda;
  m.account = dense.account;
  m.ve_dim = dense.ve_dim;
  m.prefill = dense.prefill;
  m.decode = dense.decode;
  m.static_decode = dense.static_decode;  // whether the model decodes with static caches is its stream's call
}

}  // namespace

MethodSpec act_loop_method(const LoopMethodDesc& desc) {
  const std::string name = desc.name;
  MethodSpec m;
  m.name = name;
  m.family = "loop";
  m.summary = desc.summary;
  m.citation = desc.citation;
  // placeholders until complete() copies dense's layer (registered in another file)
  m.params = [name](const Config&, const LayerCtx&) -> std::vector<ParamDef> { unset(name); return {}; };
  m.make_inputs = [name](const Config&, const LayerCtx&, int64_t, int64_t, at::Generator&) -> TensorMap {
    unset(name);
    return {};
  };
  m.reference = [name](const TensorMap&, const Config&, const LayerCtx&) -> TensorMap { unset(name); return {}; };
  m.forward = [name](const TensorMap&, const Config&, const LayerCtx&, Backend) -> TensorMap { unset(name); return {}; };
  m.account = [name](const Config&, const LayerCtx&, const CostQuery&) -> LayerCost { unset(name); return {}; };
  m.prefill = [name](const TensorMap&, TensorMap&, const Config&, const LayerCtx&, Backend) -> TensorMap {
    unset(name);
    return {};
  };
  m.decode = m.prefill;
  m.cases = [name, cases = desc.cases]() { return cases(Registry::get().method(name).config); };
  const std::string key = desc.loops_key;
  m.plan = [key](const Config& c) { return act_loop_plan(act_loop_split(c, key)); };
  m.residual = desc.stream;
  m.complete = [desc](MethodSpec& self) { complete(self, desc); };
  return m;
}

}  // namespace mixbench
