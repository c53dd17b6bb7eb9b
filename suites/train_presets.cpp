#include "suites/train_presets.h"

#include <fmt/format.h>

#include <cmath>
#include <stdexcept>

#include "harness/errors.h"
#include "harness/registry.h"

namespace mixbench {

std::string TrainPreset::config_for(const std::string& method) const {
  auto it = method_config.find(method);
  return it == method_config.end() ? config : config + "," + it->second;
}

TrainPreset train_preset(const std::string& name) {
  const nlohmann::ordered_json& table = train_presets_table();
  if (!table.contains(name)) {
    std::string known;
    for (const auto& [k, v] : table.items()) known += (known.empty() ? "" : ", ") + k;
    throw UsageError(fmt::format("unknown preset '{}' (known: {})", name, known));
  }
  return train_preset_from_json(name, table.at(name));
}

TrainPreset train_preset_from_json(const std::string& name, const nlohmann::ordered_json& j) {
  TrainPreset p;
  p.name = name;
  p.config = j.at("config").get<std::string>();
  if (j.contains("budget")) p.budget = budget_from_json(j.at("budget"), name);
  if (j.contains("steps")) p.steps = j.at("steps").get<int64_t>();
  if (!p.budget && p.steps <= 0) throw std::logic_error("preset " + name + ": neither a budget nor steps");
  p.data = j.value("data", std::string("synthetic"));
  p.hyper.schedule.wd_follows_lr = j.value("muon_wd_schedule", std::string("cosine")) == "warmdown";
  if (j.contains("muon_wd_schedule") && j.at("muon_wd_schedule") != "warmdown" && j.at("muon_wd_schedule") != "cosine")
    throw std::logic_error("preset " + name + ": muon_wd_schedule is \"cosine\" or \"warmdown\"");
  if (j.contains("tau_2x") && j.at("tau_2x").is_number()) p.tau_2x = j.at("tau_2x").get<double>();
  p.is_default = j.value("default", false);
  if (p.is_default && p.tau_2x < kMinDefaultTau)
    throw std::logic_error(fmt::format("preset {}: its rankings at its budget and twice it agree with tau {:.3f} < {}: "
                                       "it cannot be a default",
                                       name, p.tau_2x, kMinDefaultTau));
  p.batch = j.at("batch").get<int64_t>();
  p.eval_every = j.at("eval_every").get<int64_t>();
  p.eval_batches = j.at("eval_batches").get<int64_t>();
  p.final_eval_batches = j.value("final_eval_batches", int64_t(0));
  if (p.final_eval_batches < -1)
    throw std::logic_error(fmt::format("preset {}: final_eval_batches must be -1, 0 or a batch count", name));
  p.checkpoint_every = j.at("checkpoint_every").get<int64_t>();
  p.probe_sequences = j.at("probe_sequences").get<int64_t>();
  p.log_every = j.value("log_every", int64_t(1));
  p.gate_stage_frac = j.value("gate_stage_frac", p.gate_stage_frac);
  if (!(p.gate_stage_frac >= 0.0 && p.gate_stage_frac < 1.0))
    throw std::logic_error("preset " + name + ": gate_stage_frac must be in [0, 1)");
  p.micro_batch = j.value("micro_batch", int64_t(0));
  p.seeds = j.at("seeds").get<int64_t>();
  if (p.seeds < 1) throw std::logic_error("preset " + name + ": seeds must be >= 1");
  p.cpu_threads = j.at("cpu_threads").get<int>();
  p.hyper.batch_tokens_ref = j.at("batch_tokens_ref").get<double>();
  p.hyper.muon_wd = j.at("muon_wd").get<double>();
  p.hyper.muon_bf16 = j.at("muon_bf16").get<bool>();
  p.anchor = j.at("anchor").get<std::string>();
  p.baseline = j.at("baseline").get<std::string>();
  if (j.at("lineup").is_array()) p.lineup = j.at("lineup").get<std::vector<std::string>>();
  else if (j.at("lineup") != "all") throw std::logic_error("preset " + name + ": lineup is a list of methods or \"all\"");
  // What each method needs at this preset, as it declares it where it is registered.
  for (const auto* m : Registry::get().methods()) {
    auto it = m->presets.find(name);
    if (it == m->presets.end()) continue;
    if (!it->second.config.empty()) p.method_config[m->name] = it->second.config;
    if (it->second.micro_batch > 0) p.method_micro_batch[m->name] = it->second.micro_batch;
  }
  return p;
}

Config resolve_full_attention_warmup(const Config& cfg, int64_t steps) {
  if (!cfg.has("full_attention_warmup_steps")) return cfg;
  int64_t n = cfg.i("full_attention_warmup_steps");
  if (n < 0) n = std::llround(cfg.f("full_attention_warmup_frac") * double(steps));
  if (n >= steps && !cfg.b("allow_full_warmup"))
    throw UsageError(fmt::format(
        "the full-attention warm-up of {} steps covers all {} training steps, so the run would train and evaluate "
        "dense attention; lower full_attention_warmup_frac or full_attention_warmup_steps, or set allow_full_warmup=1",
        n, steps));
  return cfg.with("full_attention_warmup_steps", n);
}

}  // namespace mixbench
