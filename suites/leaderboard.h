// The equal-FLOP leaderboard: every method calibrated to the preset's anchor's training FLOPs per
// token, trained at the preset, ranked by validation bits per byte against the preset's baseline.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "suites/budgets.h"

namespace mixbench {

struct Calibration {
  std::string method;
  int64_t n_layer = 0, d_model = 0;
  int64_t mlp_hidden = 0;                              // 0: nanochat's 4·d_model
  double flops = 0, anchor_flops = 0, residual = 0;  // residual = flops/anchor − 1
  bool within = false;                                 // |residual| ≤ 2%
  std::string config;                                  // overrides that realise the shape
};
// Picks n_layer/d_model from the grid (n_layer 1..2L, d_model multiples of head_dim up to 2d) and
// the MLP width (nanochat's 4·d_model, or a multiple of head_dim in [2d, 6d]) whose training
// FLOPs/token (nanochat convention) is within ±2% of the preset's anchor's (TrainPreset::anchor), nearest
// the anchor's shape: |ΔL| + |Δd|/head_dim + |mlp − 4d|/(4·head_dim); ties to the smaller residual.
Calibration calibrate(const std::string& method, const std::string& preset, const std::string& extra_config = "");

struct LeaderboardOptions {
  std::string preset = "tiny";
  std::vector<std::string> methods;
  std::string config;  // extra overrides applied to every method (after calibration)
  int64_t steps = 0, batch = 0;
  std::string budget;           // "" = the preset's (steps wins)
  std::vector<Budget> budgets;  // several: every method trained to each in one pass (run_budgets)
  int64_t micro_batch = 0;  // rows per forward/backward; 0 = the preset's for each method
  uint64_t seed = 0;
  std::string data;    // "" = the preset's
  std::string out;     // report path (JSON); the Markdown table (.md) and the HTML page (.html) go beside it
  int progress = 0;
  int64_t probe_sequences = -1;  // -1 = the preset's
  std::string device = "cpu";
};
// One result row per method and budget, ranked within its budget; with several budgets the Markdown
// has a section per budget and *per_budget receives budget_rankings() of the rows.
nlohmann::json run_leaderboard(const LeaderboardOptions& opt, std::string& markdown,
                               nlohmann::json* per_budget = nullptr);

}  // namespace mixbench
