// Training presets: suites/presets.json (embedded at build time) declares each preset's backbone,
// budget, hyper-parameters and leaderboard lineup; the methods declare what they need at a preset
// where they are registered (MethodSpec::presets).
#pragma once
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "suites/budgets.h"
#include "harness/config.h"
#include "suites/optimizer.h"

namespace mixbench {

// Preset configuration, as declared in suites/presets.json: "tiny" (the CPU: 6 methods in about 10
// minutes on 2 cores) and "small" (one GPU: every registered method in about 5 minutes), with the
// per-method overrides the methods declare where they are registered (MethodSpec::presets).
// UsageError for unknown names.
struct TrainPreset {
  std::string name;
  std::string config;  // backbone overrides
  int64_t steps = 0;             // when the preset states no budget
  std::optional<Budget> budget;  // "budget": {"tokens_per_param": X} or {"flops": Y}
  std::string data = "synthetic";  // the training text unless --data says otherwise ("synthetic", "text", a path)
  int64_t batch, eval_every, eval_batches, checkpoint_every;
  // Batches of the final evaluation (the run's val_bpb): 0 = eval_batches (the curve's), −1 = the whole
  // validation stream in non-overlapping rows (at least one batch).
  int64_t final_eval_batches = 0;
  int64_t probe_sequences = 64;  // held-out sequences per probe kind after training
  int64_t seeds = 1;              // the leaderboard's runs per method (seeds seed, seed+1, ...)
  int cpu_threads = 0;            // intra-op threads on the CPU during the run (0 = LibTorch's default)
  int64_t log_every = 1;          // steps between loss read-backs / progress lines (each one synchronises)
  int64_t micro_batch = 0;        // rows per forward/backward for every method (0 = the whole batch)
  // The share of a run's steps that a method with exit gates (ouro) trains at the end with only
  // its gate (llround(gate_stage_frac · steps); the method's gate_stage_steps overrides it). Seed
  // 001: the last 1,024 of 46,875 updates.
  double gate_stage_frac = 1024.0 / 46875.0;
  std::map<std::string, std::string> method_config;  // per-method overrides after `config`
  std::map<std::string, int64_t> method_micro_batch;  // rows per forward/backward where memory needs it
  TrainHyper hyper;
  std::string anchor;     // the leaderboard's FLOP anchor: every method is calibrated to its FLOPs/token
  std::string baseline;   // the leaderboard's reference for the paired difference ("delta_vs_<baseline>")
  std::vector<std::string> lineup;  // the leaderboard's default methods; empty = every registered method
  // Kendall τ-b between the leaderboard's rankings at the preset's budget and at twice it, as
  // measured ("tau_2x"; NaN until measured). A preset whose rankings disagree (τ < kMinDefaultTau)
  // must not be a default ("default": true is refused).
  double tau_2x = std::nan("");
  bool is_default = false;
  std::string config_for(const std::string& method) const;
};
constexpr double kMinDefaultTau = 0.8;
TrainPreset train_preset(const std::string& name);
// One preset from its presets.json object; logic_error for a malformed one.
TrainPreset train_preset_from_json(const std::string& name, const nlohmann::ordered_json& j);
// The sparse methods' full-attention warm-up for a run of `steps` training steps: cfg with
// full_attention_warmup_steps set to llround(full_attention_warmup_frac · steps) unless given
// explicitly (≥ 0); cfg unchanged for a method without the knob. A warm-up covering every step
// would train and evaluate dense attention: UsageError unless allow_full_warmup=1.
Config resolve_full_attention_warmup(const Config& cfg, int64_t steps);
// suites/presets.json, embedded at build time: {preset: {field: value}} in declaration order.
const nlohmann::ordered_json& train_presets_table();

}  // namespace mixbench
