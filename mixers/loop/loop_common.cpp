#include "mixers/loop/loop_common.h"

#include <fmt/format.h>

#include "harness/errors.h"

namespace mixbench {
namespace {

// The base's spec with its own completion run (a base registered later than the loop method, e.g.
// a hybrid, may still hold its hook).
MethodSpec completed_base(const std::string& name) {
  MethodSpec b = Registry::get().method(name);
  if (b.complete) {
    auto hook = std::move(b.complete);
    b.complete = nullptr;
    hook(b);
  }
  return b;
}

// Whole small models of 3 and 4 blocks (an automatic split puts a prelude and a coda block around
// the core), d_model 32, short windows of 4 left keys so the unrolled SSSL pattern bites at T ≤ 16
// (finite differences).
std::vector<CaseDef> loop_cases(const ConfigSpec& spec) {
  const std::string small = "d_model=32,head_dim=16,seq_len=16,vocab=32,mlp_hidden=32";
  Config base = spec.parse("n_layer=3," + small + (spec.find("short_window") ? ",short_window=4" : ""));
  return {
      {"model_n3_T9", base, 1, 9, 0},
      {"model_n4_B2_T16", base.with("n_layer", int64_t(4)), 2, 16, 0},
  };
}

void complete(MethodSpec& self, const LoopDesc& desc) {
  MethodSpec m = completed_base(desc.base);
  if (m.plan) throw std::logic_error(fmt::format("loop method {}: base {} already has a plan", desc.name, desc.base));
  m.name = self.name;
  m.family = self.family;
  m.summary = self.summary;
  m.citation = self.citation;
  m.config.i("n_loops", desc.n_loops, "applications of the core blocks", 1)
      .i("n_prelude", desc.n_prelude, "leading blocks applied once before the core; -1 = 1 from 3 blocks on, else 0", -1)
      .i("n_coda", desc.n_coda, "trailing blocks applied once after the core; -1 = 1 from 3 blocks on, else 0", -1)
      .rule([](const Config& c) { loop_plan(c); });
  m.plan = loop_plan;
  m.residual = desc.residual;
  m.cases = nullptr;
  m.complete = nullptr;
  if (desc.finish) desc.finish(m);
  if (!m.cases) {  // the small models, with the config as finish() left it
    ConfigSpec spec = m.config;
    m.cases = [spec]() { return loop_cases(spec); };
  }
  self = std::move(m);
}

}  // namespace

int64_t loop_split(const Config& c, const std::string& field) {
  const int64_t v = c.i(field);
  return v >= 0 ? v : (c.i("n_layer") >= 3 ? 1 : 0);
}

ExecPlan loop_plan(const Config& c) {
  return ExecPlan::loop(c.i("n_layer"), loop_split(c, "n_prelude"), loop_split(c, "n_coda"), c.i("n_loops"));
}

MethodSpec loop_method(LoopDesc desc) {
  MethodSpec m;
  m.name = desc.name;
  m.family = "loop";
  // Placeholders until complete() copies the base (the registry asks for every part up front).
  auto unset = [name = desc.name](auto&&...) -> TensorMap {
    throw std::logic_error("loop method " + name + " used before its completion");
  };
  m.params = [](const Config&, const LayerCtx&) { return std::vector<ParamDef>{}; };
  m.make_inputs = [unset](const Config& c, const LayerCtx& x, int64_t, int64_t, at::Generator&) { return unset(c, x); };
  m.reference = unset;
  m.forward = unset;
  m.account = [](const Config&, const LayerCtx&, const CostQuery&) { return LayerCost{}; };
  m.cases = []() { return std::vector<CaseDef>{}; };
  m.complete = [desc](MethodSpec& self) { complete(self, desc); };
  m.summary = desc.summary;  // `list` shows them; complete() keeps them
  m.citation = desc.citation;
  return m;
}

}  // namespace mixbench
