#include "harness/cli/sweep_args.h"

#include <iostream>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "harness/args.h"
#include "harness/errors.h"
#include "harness/metrics.h"
#include "harness/registry.h"

namespace mixbench {

SweepOptions sweep_options_from_args(const Args& a) {
  SweepOptions o = sweep_preset(a.get_or("preset", "cpu-tiny"));
  auto mode = a.get("mode");
  if (!mode) throw UsageError("sweep needs --mode prefill|decode|train");
  if (*mode != "prefill" && *mode != "decode" && *mode != "train")
    throw UsageError(fmt::format("unknown mode '{}' (use prefill, decode or train)", *mode));
  o.mode = *mode;
  o.level = a.get_or("level", o.level);
  if (o.level != "op" && o.level != "layer" && o.level != "model")
    throw UsageError(fmt::format("unknown level '{}' (use op, layer or model)", o.level));
  if (o.mode == "decode" && o.level != "model")
    throw UsageError(fmt::format("--mode decode runs at model level (the backbone drives the caches), not --level {}", o.level));
  if (auto b = a.get("batch")) o.batches = parse_counts(*b, "batch size");
  if (auto l = a.get("lengths")) o.lengths = parse_lengths(*l);
  o.device = a.get_or("device", o.device);
  if (o.device != "cpu" && o.device != "cuda") throw UsageError(fmt::format("unknown device '{}' (use cpu or cuda)", o.device));
  o.dtype = a.get_or("dtype", o.dtype);
  parse_dtype(o.dtype);
  if (auto c = a.get("config")) o.config += (o.config.empty() ? "" : ",") + *c;
  o.reps = int(a.get_int("reps", o.reps));
  o.warmup = int(a.get_int("warmup", o.warmup));
  if (o.reps < 1 || o.warmup < 0) throw UsageError("--reps must be >= 1 and --warmup >= 0");
  if (auto m = a.get("memory-limit")) o.memory_limit = parse_bytes(*m);
  o.seed = uint64_t(a.get_int("seed", 0));
  o.graph = a.get_or("graph", o.graph);
  if (o.graph != "auto" && o.graph != "off") throw UsageError(fmt::format("unknown --graph '{}' (use auto or off)", o.graph));
  Registry& reg = Registry::get();
  auto methods = a.list("methods");
  const bool all = methods.empty() || (methods.size() == 1 && methods[0] == "all");
  if (all) {
    methods.clear();
    for (auto* m : reg.methods()) methods.push_back(m->name);
  }
  for (const auto& m : methods) reg.method(m);  // unknown names fail before any work
  o.methods = methods;
  if (o.level == "op") {
    // Op units take the keys their op declares; each key must mean something to a selected method or op.
    for (const auto& kv : split(o.config, ',')) {
      const std::string key = kv.substr(0, kv.find('='));
      bool known = false;
      for (const auto& m : methods) {
        const MethodSpec& ms = reg.method(m);
        known = known || ms.config.find(key) != nullptr;
        for (const auto& op : ms.ops) known = known || (reg.has_op(op) && reg.op(op).params.find(key) != nullptr);
      }
      if (!known) throw UsageError(fmt::format("unknown config field '{}' for the selected methods and their ops", key));
    }
  } else {
    // Every method's config must accept the overrides before anything runs. Of "all", a method
    // whose own rules refuse the preset's model (a looped method whose prelude and coda need more
    // blocks) is left out with a note; a method named on the command line is an error.
    std::vector<std::string> kept;
    std::string first_refusal;
    for (const auto& m : methods) {
      try {
        sweep_method_config(reg.method(m), o, o.lengths.front());
        kept.push_back(m);
      } catch (const InputError& e) {
        if (!all) throw;
        if (first_refusal.empty()) first_refusal = e.what();
        std::cerr << fmt::format("sweep: leaving out {}: {} (name it with a --config it accepts to sweep it)\n", m,
                                 e.what());
      }
    }
    if (kept.empty()) throw InputError(first_refusal);  // the config fits no method: the config is wrong
    o.methods = kept;
  }
  if (o.device == "cuda" && !at::hasCUDA()) throw UsageError("--device cuda but no CUDA device is available");
  return o;
}

}  // namespace mixbench
