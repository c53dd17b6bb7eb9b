// mixbench list: registered methods and ops, and which parts exist.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <iostream>

#include "harness/cli/commands.h"
#include "harness/foreign_names.h"
#include "harness/io.h"
#include "harness/registry.h"

namespace mixbench {

namespace {

using Json = nlohmann::json;

// `list --names SCHEME`: every method's parameter names in that scheme (harness/foreign_names.h),
// at the method's default config (layer level; with nanochat also the whole model of dense).
int list_names(const std::string& scheme, const Args& a) {
  check_scheme(scheme);
  Registry& reg = Registry::get();
  std::vector<const MethodSpec*> ms;
  if (auto which = a.get("methods"))
    for (const auto& n : split(*which, ',')) ms.push_back(&reg.method(n));
  else
    for (const MethodSpec* m : reg.methods())
      if (m->foreign_names.count(scheme)) ms.push_back(m);
  for (const MethodSpec* m : ms) {
    const Config cfg = m->config.defaults();
    const int64_t L = cfg.i("n_layer");
    if (scheme == "nanochat") {
      const std::string text = describe_aliases(model_aliases(*m, cfg, scheme));
      std::cout << fmt::format("{} (model, nanochat GPT.state_dict() <- mixbench, n_layer {}):\n{}", m->name, L, text);
    } else {
      // the last layer has a value embedding; a layer before it has none
      const LayerCtx ctx{L > 1 ? L - 2 : 0, L};
      const std::string text = describe_aliases(layer_aliases(*m, cfg, ctx, scheme));
      std::cout << fmt::format("{} (layer, {} <- mixbench):\n{}", m->name, scheme, text);
    }
  }
  return 0;
}

int run_list(const Args& a, const std::vector<std::string>&) {
  Registry& reg = Registry::get();
  if (auto scheme = a.get("names")) return list_names(*scheme, a);
  Json j = {{"methods", Json::array()}, {"ops", Json::array()}};
  for (const MethodSpec* m : reg.methods()) {
    bool cuda_ops = true;
    for (const auto& o : m->ops) cuda_ops = cuda_ops && reg.has_op(o) && bool(reg.op(o).cuda);
    j["methods"].push_back({{"name", m->name}, {"family", m->family}, {"summary", m->summary},
                            {"citation", m->citation}, {"ops", m->ops}, {"reference", bool(m->reference)},
                            {"cpu", bool(m->forward)}, {"cuda", m->has_cuda && cuda_ops},
                            {"accountant", bool(m->account)}});
    if (m->is_hybrid()) {  // the layout at the method's default depth
      Json lay = Json::array();
      for (const auto& ch : m->layout(m->config.defaults())) lay.push_back(ch.method);
      j["methods"].back()["layer_mixers"] = lay;
    }
  }
  for (const OpSpec* o : reg.ops())
    j["ops"].push_back({{"name", o->name}, {"family", o->family}, {"summary", o->summary}, {"citation", o->citation},
                        {"reference", bool(o->reference)}, {"cpu", bool(o->cpu)}, {"cuda", bool(o->cuda)},
                        {"inputs", [&] { Json x = Json::array(); for (auto& d : o->inputs) x.push_back(d.name); return x; }()},
                        {"outputs", o->outputs}});
  const bool all = a.flag("all");
  if (all) {
    j["unlisted"] = Json::array();
    for (const UnlistedMethod& u : unlisted_methods())
      j["unlisted"].push_back({{"name", u.name}, {"family", u.family}, {"reason", u.reason}});
  }
  if (a.flag("json")) {
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  auto yn = [](bool b) { return b ? "yes" : "-"; };
  std::cout << fmt::format("{:<16} {:<12} {:<5} {:<5} {:<5} {:<5}  {}\n", "method", "family", "ref", "cpu", "cuda", "acct", "summary");
  for (const auto& m : j["methods"])
    std::cout << fmt::format("{:<16} {:<12} {:<5} {:<5} {:<5} {:<5}  {}\n", m["name"].get<std::string>(),
                             m["family"].get<std::string>(), yn(m["reference"]), yn(m["cpu"]), yn(m["cuda"]),
                             yn(m["accountant"]), m["summary"].get<std::string>());
  if (all)
    for (const auto& u : j["unlisted"])
      std::cout << fmt::format("{:<16} {:<12} {:<5} {:<5} {:<5} {:<5}  not registered: {}\n", u["name"].get<std::string>(),
                               u["family"].get<std::string>(), "-", "-", "-", "-", u["reason"].get<std::string>());
  std::cout << "\n" << fmt::format("{:<22} {:<12} {:<5} {:<5} {:<5}  {}\n", "op", "family", "ref", "cpu", "cuda", "summary");
  for (const auto& o : j["ops"])
    std::cout << fmt::format("{:<22} {:<12} {:<5} {:<5} {:<5}  {}\n", o["name"].get<std::string>(),
                             o["family"].get<std::string>(), yn(o["reference"]), yn(o["cpu"]), yn(o["cuda"]),
                             o["summary"].get<std::string>());
  return 0;
}

}  // namespace

Command list_command() {
  return {"list", "registered methods and ops, and which parts exist (reference, CPU, CUDA, accountant)", "", "",
          {{"json", OptionKind::Flag, "", "print the table as JSON (methods with their ops and layer mixers, ops with their tensors)"},
           {"all", OptionKind::Flag, "", "also list catalogued methods kept out of the registry, with the reason (JSON: \"unlisted\")"},
           {"names", OptionKind::Value, "nanochat|fla", "print the parameter names another implementation uses (theirs <- ours, layouts, deviations)"},
           {"methods", OptionKind::Value, "a,b", "with --names: only these methods"}},
          run_list};
}

}  // namespace mixbench
