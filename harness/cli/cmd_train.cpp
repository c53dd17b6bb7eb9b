// mixbench train and mixbench leaderboard: training runs (suites/train.h) and the equal-FLOP
// ranking with its Markdown table and HTML page (reports/leaderboard.h).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <iostream>

#include "harness/cli/commands.h"
#include "harness/cli/common.h"
#include "harness/errors.h"
#include "harness/io.h"
#include "harness/report.h"
#include "reports/leaderboard.h"
#include "suites/train.h"

namespace mixbench {

namespace {

using Json = nlohmann::json;

// The training text a run reads: --data, else the preset's.
template <class Options>
std::string run_data(const Options& o) {
  return o.data.empty() ? train_preset(o.preset).data : o.data;
}

// The options train and leaderboard share (TrainOptions, LeaderboardOptions).
template <class Options>
void read_run_options(const Args& a, Options& o) {
  o.preset = a.get_or("preset", "tiny");
  o.steps = a.get_int("steps", 0);
  o.batch = a.get_int("batch", 0);
  o.micro_batch = a.get_int("micro-batch", 0);
  if (o.micro_batch < 0) throw UsageError("--micro-batch must be >= 0");
  o.seed = uint64_t(a.get_int("seed", 0));
  o.data = a.get_or("data", "");
  o.budget = a.get_or("budget", "");
  if (!o.budget.empty()) parse_budget(o.budget);  // a malformed budget fails before any work
  o.out = a.get_or("out", "");
  o.config = a.get_or("config", "");
  o.device = a.get_or("device", "cpu");
  o.probe_sequences = a.get_int("probes", -1);
  o.progress = progress_mode(a.flag("quiet"));
}

int run_train_command(const Args& a, const std::vector<std::string>& args) {
  TrainOptions o;
  auto m = a.get("method");
  if (!m) throw UsageError("train needs --method NAME");
  o.method = *m;
  read_run_options(a, o);
  o.resume = a.flag("resume");
  o.eval_every = a.get_int("eval-every", 0);
  o.eval_batches = a.get_int("eval-batches", 0);
  o.checkpoint_every = a.get_int("checkpoint-every", 0);
  o.stop_after = a.get_int("stop-after", 0);
  if (o.probe_sequences < -1) throw UsageError("--probes must be >= 0");
  if (o.steps < 0 || o.batch < 0 || o.eval_every < 0 || o.eval_batches < 0 || o.checkpoint_every < 0 || o.stop_after < 0)
    throw UsageError("--steps, --batch, --eval-every, --eval-batches, --checkpoint-every and --stop-after must be >= 0");
  TrainResult r = run_train(o);
  RunInfo info = run_info("train", args);
  info.argv.insert(info.argv.begin() + 1, "train");
  info.config = {{"method", o.method}, {"preset", o.preset}, {"config", r.cfg.to_json()}, {"steps", o.steps},
                 {"batch", o.batch}, {"micro_batch", o.micro_batch}, {"data", run_data(o)}, {"resume", o.resume},
                 {"budget", r.budget.to_json()}};
  info.seeds = {{"base", o.seed}};
  Json report = make_report(info, Json::array({train_result_json(r)}));
  if (!o.out.empty()) write_report((std::filesystem::path(o.out) / "train.json").string(), report);
  std::cerr << fmt::format("train {}: {} steps, val {} {:.4f}, {:.0f} tok/s\n", r.method, r.steps_done,
                           r.byte_level ? "bpb" : "bits/token", r.val_bpb, r.tokens_per_s);
  return 0;
}

int run_leaderboard_command(const Args& a, const std::vector<std::string>& args) {
  LeaderboardOptions o;
  o.methods = a.list("methods");
  read_run_options(a, o);
  for (const auto& b : a.list("budgets")) o.budgets.push_back(parse_budget(b));
  if ((!o.budget.empty() || o.steps > 0) && !o.budgets.empty())
    throw UsageError("--budgets sets the length of every run: give it without --budget and --steps");
  if (o.steps < 0 || o.batch < 0 || o.probe_sequences < -1) throw UsageError("--steps, --batch and --probes must be >= 0");
  std::string md;
  Json per_budget;
  Json results = run_leaderboard(o, md, &per_budget);
  RunInfo info = run_info("leaderboard", args);
  info.argv.insert(info.argv.begin() + 1, "leaderboard");
  info.config = {{"preset", o.preset}, {"methods", results.size()}, {"steps", o.steps}, {"batch", o.batch},
                 {"data", run_data(o)}, {"config", o.config}, {"anchor", train_preset(o.preset).anchor}, {"device", o.device},
                 {"budget", o.budget}};
  info.seeds = {{"base", o.seed}};
  Json report = make_report(info, results);
  report["markdown"] = md;
  if (!per_budget.is_null()) {
    report["budgets"] = per_budget["budgets"];
    report["kendall_tau"] = per_budget["kendall_tau"];
  }
  if (!o.out.empty()) {
    write_report(o.out, report);
    std::filesystem::path mdp(o.out);
    mdp.replace_extension(".md");
    write_file_atomic(mdp.string(), md);
    std::filesystem::path html(o.out);
    html.replace_extension(".html");
    write_file_atomic(html.string(), leaderboard_html(results, fmt::format("mixbench leaderboard, preset {}", o.preset), md));
  }
  std::cerr << md;
  int rc = 0;
  for (const auto& r : results)
    if (r["status"] != "ok") rc = 1;
  return rc;
}

// Options train and leaderboard share.
const OptionDoc kPreset = {"preset", OptionKind::Value, "tiny|small", "model size, steps, batch and schedule (default tiny)"};
const OptionDoc kBatch = {"batch", OptionKind::Value, "B", "rows per step (default: the preset's)"};
const OptionDoc kSeed = {"seed", OptionKind::Value, "S", "seed of the weights and the data order (default 0)"};
const OptionDoc kData = {"data", OptionKind::Value, "synthetic|text|PATH",
                         "training text: the synthetic stream, the built-in real-text corpus (ci/fetch_text.sh; "
                         "$MIXBENCH_DATA_DIR or ./data/text) or files (default: the preset's)"};
const OptionDoc kBudget = {"budget", OptionKind::Value, "tpp=X|flops=Y|steps=N",
                           "training budget: tokens per anchor parameter, total FLOPs or steps (default: the "
                           "preset's; --steps wins)"};
const OptionDoc kProbes = {"probes", OptionKind::Value, "N", "held-out sequences per capability probe (default: the preset's; 0 = none)"};
const OptionDoc kQuiet = {"quiet", OptionKind::Flag, "", "no progress output"};
const OptionDoc kDevice = {"device", OptionKind::Value, "cpu|cuda", "device the training runs on (default cpu)"};

}  // namespace

Command train_command() {
  return {"train",
          "Muon/AdamW training of one method's model, with checkpoints, evaluation and capability probes",
          "",
          "progress as JSON lines when stdout is not a terminal; DIR/checkpoint.safetensors (atomic) and\n"
          "DIR/train.json; probes: MQAR, NIAH single-1/2/3, S3/S5 state tracking on held-out sequences",
          {{"method", OptionKind::Value, "NAME", "the registered method to train (required)"},
           kPreset,
           {"steps", OptionKind::Value, "N", "optimizer steps (default: from the budget)"},
           kBudget,
           kBatch,
           {"micro-batch", OptionKind::Value, "M", "rows per forward/backward, gradients accumulated (default: the preset's for the method)"},
           kSeed,
           kData,
           {"config", OptionKind::Value, "k=v,...", "overrides of the method's config"},
           {"out", OptionKind::Value, "DIR", "folder of the checkpoint and train.json"},
           {"resume", OptionKind::Flag, "", "continue from DIR/checkpoint.safetensors"},
           {"eval-every", OptionKind::Value, "N", "steps between validation evaluations (default: the preset's)"},
           {"eval-batches", OptionKind::Value, "N", "batches per validation evaluation (default: the preset's)"},
           {"checkpoint-every", OptionKind::Value, "N", "steps between checkpoints (default: the preset's)"},
           {"stop-after", OptionKind::Value, "N", "stop as if interrupted after N steps (0 = never)"},
           kDevice,
           kProbes,
           kQuiet},
          run_train_command};
}

Command leaderboard_command() {
  return {"leaderboard",
          "equal-FLOP ranking: every method trained at dense's FLOPs/token (within 2%) and ranked",
          "",
          "with --out: the Markdown table (.md) and an HTML page (.html, inline SVG) beside the report;\n"
          "exit 1 when a method's run failed",
          {kPreset,
           {"methods", OptionKind::Multi, "a,b|all", "methods to rank (default all)"},
           {"steps", OptionKind::Value, "N", "optimizer steps per method (default: from the budget)"},
           kBudget,
           {"budgets", OptionKind::Multi, "a,b",
            "train every method to each budget in one pass (branching where the shorter one's warmdown starts) "
            "and rank at each, with Kendall's tau between the rankings"},
           kBatch,
           {"micro-batch", OptionKind::Value, "M", "rows per forward/backward (default: the preset's for each method)"},
           kSeed,
           kData,
           {"config", OptionKind::Value, "k=v,...", "overrides applied to every method after calibration"},
           kDevice,
           kProbes,
           {"out", OptionKind::Value, "report.json", "write the JSON report, with .md and .html beside it"},
           kQuiet},
          run_leaderboard_command};
}

}  // namespace mixbench
