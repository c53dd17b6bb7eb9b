// The equal-FLOP leaderboard: every method calibrated to the preset's anchor's training FLOPs per
// token, trained at the preset with one or more seeds, ranked by validation bits per byte (mean,
// 95% intervals, ranks shared where they overlap) against the preset's baseline, paired by seed.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "suites/budgets.h"

namespace mixbench {

class DataParallel;  // suites/distributed.h

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
  std::string dtype;   // compute dtype ("" = bf16 on a GPU, fp32 on the CPU)
  std::string graph = "auto";  // CUDA-graph replay of the training steps ("auto", "fwd-bwd" or "off": TrainOptions::graph)
  std::shared_ptr<DataParallel> data_parallel;  // each method trained data-parallel over these ranks (null: one process)
  int64_t seeds = 0;       // runs per method with seeds seed, seed+1, ...; 0 = the preset's
  int64_t stop_after = 0;  // stop as if interrupted after this many trained (method, seed) cells; 0 = never
  // A report of an earlier run (kind leaderboard, possibly unfinished): its finished cells are kept
  // instead of trained again. InputError naming the field when its config (leaderboard_config:
  // preset, config, steps, batch, micro-batch, data and its hash, device, probes) differs.
  nlohmann::json resume;
  // Earlier leaderboard reports of parts of this leaderboard (name, report), e.g. one process per
  // method and seed: their finished cells are kept as the resumed report's are (each checked the
  // same way; the method list and the seeds may differ). A (method, seed, budget) cell in several of
  // them (or in `resume` too) is kept from the first when their values agree; InputError naming
  // both otherwise.
  std::vector<std::pair<std::string, nlohmann::json>> from;
  // Train nothing: cells that no earlier report holds are left out (summary "missing"); a failed
  // cell of an earlier report is shown as failed.
  bool no_train = false;
  // A folder for the cells' training checkpoints ("" = none): a cell trained here saves its run to
  // <dir>/<method>.s<seed>/ every checkpoint_every steps of the preset, resumes from a checkpoint of
  // the same run found there (one interrupted by a stopped process, or one that ran out of memory),
  // and removes the folder once the cell has finished. One budget only.
  std::string cell_checkpoints;
  // Called after each finished cell with the results so far, their Markdown table and the summary.
  std::function<void(const nlohmann::json& results, const std::string& markdown, const nlohmann::json& summary)> on_cell;
};
// The training options of the cell (method m at `seed`, calibrated as `cal`) that run_leaderboard
// trains: with cell_checkpoints, its checkpoint folder and whether it resumes from it.
TrainOptions leaderboard_cell_options(const LeaderboardOptions& opt, const std::string& m, uint64_t seed, const Calibration& cal);
// The report's config for these options (preset, methods, steps, batch, micro_batch, data,
// data_hash, data_order, config, anchor, baseline, device, probes, seed, seeds); all but the method list and
// the seeds decide a cell's numbers, so a report is resumed only when those agree.
nlohmann::json leaderboard_config(const LeaderboardOptions& opt);
// InputError naming the first field of the cells' config where `report` (an earlier leaderboard
// report) differs from `config` (leaderboard_config), or when it is not a leaderboard report.
void check_leaderboard_resume(const nlohmann::json& report, const nlohmann::json& config);
// One row per method that has a finished cell (see README.md, "Training and the leaderboard"):
// the first seed's train result with the means of val_bpb (or val_bits_per_token), tokens_per_s,
// seconds and mfu over the seeds, the per-seed values, sd, 95% interval, the paired difference to
// the baseline with its interval, the shared rank, and every seed's result under "runs".
// `summary` (if given) receives {seeds, seed_values, cells, cells_done, cells_trained, complete,
// single_seed, baseline, missing: the [method, seed] cells neither trained nor kept}.
nlohmann::json run_leaderboard(const LeaderboardOptions& opt, std::string& markdown, nlohmann::json* summary = nullptr);
// The rows and the Markdown table from per-seed train results (rows of train_result_json plus
// "seed" and "calibration"), grouped by method in `methods` order.
nlohmann::json leaderboard_rows(const std::vector<std::string>& methods, const std::vector<nlohmann::json>& runs,
                                const std::string& baseline, std::string& markdown);

// The leaderboard's tables as text cells, for the Markdown table and the HTML page: the ranking
// (best first; ties marked " =" in the rank cell) and the probes' accuracies, with the lines around
// them ("N seeds per method ..." or "single seed ...", what "=" means, failed methods).
struct TextTable {
  std::vector<std::string> header;
  std::vector<bool> right;  // per column: right-aligned (numbers)
  std::vector<std::vector<std::string>> rows;
  std::vector<bool> tie;    // per row
};
struct LeaderboardTables {
  std::string note, tie_note;
  TextTable ranking, probes;  // probes: no header when no method has probes
  std::vector<std::string> errors;
};
LeaderboardTables leaderboard_tables(const nlohmann::json& results, const std::string& baseline);
std::string markdown_table(const TextTable& t);
std::string leaderboard_markdown(const nlohmann::json& results, const std::string& baseline);

}  // namespace mixbench
