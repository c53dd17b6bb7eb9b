// Training budgets: a preset states how much a method trains as tokens per parameter of its anchor
// or as total training FLOPs, and the steps follow from the anchor, so that every method calibrated
// to the anchor trains on the same tokens (iso-FLOP). One method trained to several budgets in one
// pass branches off the longest run where the shorter budget's warmdown starts.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace mixbench {

struct TrainPreset;
struct TrainOptions;
struct TrainResult;

struct Budget {
  enum class Kind { Steps, TokensPerParam, Flops };
  Kind kind = Kind::Steps;
  double value = 0;
  std::string str() const;  // "steps=N", "tpp=X" or "flops=Y": what parse_budget reads
};
// "tpp=X" (tokens per parameter), "flops=Y" (total training FLOPs) or "steps=N"; UsageError otherwise.
Budget parse_budget(const std::string& text);
// A preset's "budget" object: {"tokens_per_param": X} or {"flops": Y}; logic_error otherwise.
Budget budget_from_json(const nlohmann::ordered_json& j, const std::string& preset);

// The steps a budget gives at a preset: tokens = X · (the anchor's block matrices + head, nanochat's
// horizon parameters) or Y / (the anchor's training FLOPs per token), steps = max(1, round(tokens /
// (batch · seq_len))), the anchor at the preset's config with the overrides of `extra_config` it
// takes (another method's own knobs are left out).
struct BudgetPlan {
  Budget budget;
  std::string anchor;
  int64_t anchor_params = 0;          // block matrices + head
  double anchor_flops_per_token = 0;  // nanochat convention
  double target_tokens = 0;           // what the budget asks for
  int64_t steps = 0;
  int64_t tokens = 0;                 // steps · batch · seq_len: what the run trains on
  nlohmann::json to_json() const;
};
BudgetPlan plan_budget(const Budget& b, const TrainPreset& p, int64_t batch, const std::string& extra_config);
// The length of a run: TrainOptions::steps when > 0 (a steps= budget), else TrainOptions::budget, else
// the preset's budget, else the preset's steps; the anchor at TrainOptions::anchor_config (default:
// its config).
BudgetPlan run_length(const TrainOptions& o, const TrainPreset& p);

// Trains `base` (its budget, steps and stop_after ignored) to each budget and returns one result per
// budget, in the order given. The runs share their common beginning: the longest budget's run is
// snapshotted before the first step at which a shorter budget's schedule departs from it (its
// warmdown with Schedule::wd_follows_lr; step 1 with the cosine weight decay), the shorter run
// continues from the snapshot to its end, and the longest run resumes from the snapshot. Each
// result is bitwise the standalone run's.
std::vector<TrainResult> run_budgets(const TrainOptions& base, const std::vector<Budget>& budgets);

// The leaderboard's per-budget summary of its result rows (each with "budget", "method", "status"
// and, when ok, "val_bpb" or "val_bits_per_token"): [{budget, steps, tokens, ranking: [methods best first]}] in budget order,
// and for every two budgets the Kendall τ-b of the methods ranked at both (suites/rank_agreement.h).
nlohmann::json budget_rankings(const nlohmann::json& rows);

}  // namespace mixbench
