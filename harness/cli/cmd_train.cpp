// mixbench train and mixbench leaderboard: training runs (suites/train.h) and the equal-FLOP
// ranking with its Markdown table and HTML page (reports/leaderboard.h).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <iostream>
#include <optional>

#include "harness/cli/commands.h"
#include "harness/cli/common.h"
#include "harness/errors.h"
#include "harness/io.h"
#include "harness/report.h"
#include "reports/leaderboard.h"
#include "suites/distributed.h"
#include "suites/train.h"
#include "suites/train_data.h"

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
  o.batch = a.get_int("batch", 0);  // 0: the preset's
  if (a.get("batch") && o.batch < 1) throw UsageError("--batch must be >= 1 (leave it out for the preset's)");
  o.micro_batch = a.get_int("micro-batch", 0);
  if (o.micro_batch < 0) throw UsageError("--micro-batch must be >= 0");
  o.seed = uint64_t(a.get_int("seed", 0));
  o.data = a.get_or("data", "");
  o.budget = a.get_or("budget", "");
  if (!o.budget.empty()) parse_budget(o.budget);  // a malformed budget fails before any work
  o.out = a.get_or("out", "");
  o.config = a.get_or("config", "");
  o.device = a.get_or("device", "cpu");
  o.dtype = a.get_or("dtype", "");
  o.graph = a.get_or("graph", "auto");
  if (o.graph != "auto" && o.graph != "fwd-bwd" && o.graph != "off")
    throw UsageError(fmt::format("--graph {}: takes auto, fwd-bwd or off", o.graph));
  o.probe_sequences = a.get_int("probes", -1);
  o.progress = progress_mode(a.flag("quiet"));
}

// Several ranks. With --nproc N this process starts the N local ranks of the same command (without
// --nproc) and returns their exit code; otherwise, under torchrun's variables, it joins as one rank
// (data_parallel stays null for one process). Only rank 0 writes reports and prints the summary.
std::optional<int> spawn_ranks(const Args& a, const std::string& command, const std::vector<std::string>& args) {
  if (!a.get("nproc")) return std::nullopt;
  const int64_t n = a.get_int("nproc", 0);
  if (n < 1 || n > 4096) throw UsageError("--nproc must be in [1, 4096]");
  std::vector<std::string> rank_args = {command};
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--nproc") ++i;  // and its value
    else if (args[i].rfind("--nproc=", 0) != 0) rank_args.push_back(args[i]);
  }
  return spawn_local_ranks(int(n), a.get_or("device", "cpu"), rank_args);
}

std::shared_ptr<DataParallel> join_ranks(const Args& a, const std::string& device) {
  const int64_t t = a.get_int("dist-timeout", 300);
  if (t < 1) throw UsageError("--dist-timeout must be >= 1 (seconds)");
  return DataParallel::connect(dist_env_from_environment(), device, std::chrono::seconds(t));
}

// Runs one rank's work: its failure is recorded in the store for the other ranks' messages, and a
// peer's failure is reported as an error (exit 3).
template <class Body>
int as_rank(const std::shared_ptr<DataParallel>& dp, Body body) {
  try {
    return body();
  } catch (const PeerFailure& e) {
    std::cerr << "mixbench: error: " << e.what() << "\n";
    return 3;
  } catch (const std::exception& e) {
    if (dp) dp->report_failure(e.what());
    throw;
  }
}

int train_rank(const TrainOptions& o, const std::vector<std::string>& args);
int leaderboard_rank(LeaderboardOptions o, const std::vector<std::string>& args);

int run_train_command(const Args& a, const std::vector<std::string>& args) {
  TrainOptions o;
  auto m = a.get("method");
  if (!m) throw UsageError("train needs --method NAME");
  o.method = *m;
  read_run_options(a, o);
  o.resume = a.flag("resume");
  o.init_from = a.get_or("init-from", "");
  o.init_level = a.get_or("init-level", "model");
  if (o.init_level != "model" && o.init_level != "layer") throw UsageError("--init-level takes model or layer");
  if ((a.get("init-level") || a.get("init-layers")) && o.init_from.empty())
    throw UsageError("--init-level and --init-layers go with --init-from FILE");
  if (auto ls = a.get("init-layers")) {
    if (o.init_level != "layer") throw UsageError("--init-layers goes with --init-level layer");
    if (*ls != "all")
      for (const auto& x : split(*ls, ',')) {
        try {
          o.init_layers.push_back(std::stoll(x));
        } catch (const std::logic_error&) {
          throw UsageError(fmt::format("--init-layers takes layer indices or all, not '{}'", x));
        }
      }
  }
  o.eval_every = a.get_int("eval-every", 0);
  o.eval_batches = a.get_int("eval-batches", 0);
  if (const auto f = a.get("final-eval-batches")) {
    if (*f == "all") o.final_eval_batches = -1;
    else if (*f == "curve") o.final_eval_batches = 0;
    else {
      int64_t n = 0;
      try {
        size_t used = 0;
        n = std::stoll(*f, &used);
        if (used != f->size()) n = 0;
      } catch (const std::logic_error&) {
      }
      if (n < 1) throw UsageError(fmt::format("--final-eval-batches takes all, curve or a positive count, not '{}'", *f));
      o.final_eval_batches = n;
    }
  }
  o.checkpoint_every = a.get_int("checkpoint-every", 0);
  o.stop_after = a.get_int("stop-after", 0);
  o.log_every = a.get_int("log-every", 0);
  o.trace = a.get_or("trace", "");
  o.trace_steps = a.get_int("trace-steps", 2);
  if (o.trace_steps < 1) throw UsageError("--trace-steps must be >= 1");
  if (o.probe_sequences < -1) throw UsageError("--probes must be >= 0");
  if (o.steps < 0 || o.batch < 0 || o.eval_every < 0 || o.eval_batches < 0 || o.checkpoint_every < 0 || o.stop_after < 0 ||
      o.log_every < 0)
    throw UsageError("--steps, --batch, --eval-every, --eval-batches, --checkpoint-every, --stop-after and --log-every "
                     "must be >= 0");
  if (a.flag("dry-run")) {
    // every parameter's optimizer group and hyper-parameters; nothing trains
    const Json s = optimizer_settings(o);
    if (a.flag("json")) {
      std::cout << s.dump(1) << "\n";
      return 0;
    }
    std::cout << fmt::format("{} at preset {}: {} steps, {} tokens per step\n", s["method"].get<std::string>(),
                             s["preset"].get<std::string>(), s["steps"].get<int64_t>(), s["batch_tokens"].get<int64_t>());
    // Muon rows: eps "-", and how each matrix is updated: "H×rows×cols @ lr" (lr with the shape factor)
    std::cout << fmt::format("{:<36} {:<16} {:<15} {:<6} {:>10} {:>7} {:>7} {:>7} {:>7}  {}\n", "parameter", "shape",
                             "group", "optim", "lr", "beta1", "beta2", "eps", "wd", "muon matrices");
    auto dims = [](const Json& v) {
      std::string out;
      for (const auto& x : v) out += (out.empty() ? "" : "x") + std::to_string(x.get<int64_t>());
      return out;
    };
    for (const auto& r : s["params"]) {
      const bool muon = r["optimizer"] == "muon";
      std::cout << fmt::format(
          "{:<36} {:<16} {:<15} {:<6} {:>10.4g} {:>7.3g} {:>7.3g} {:>7} {:>7.3g}  {}\n", r["param"].get<std::string>(),
          dims(r["shape"]), r["group"].get<std::string>(), r["optimizer"].get<std::string>(), r["lr"].get<double>(),
          r["beta1"].get<double>(), r["beta2"].get<double>(),
          muon ? std::string("-") : fmt::format("{:.3g}", r["eps"].get<double>()), r["weight_decay"].get<double>(),
          muon ? fmt::format("{}x{} @ {:.4g}", r["matrices"].get<int64_t>(), dims(r["matrix"]), r["matrix_lr"].get<double>())
               : std::string());
    }
    return 0;
  }
  if (auto rc = spawn_ranks(a, "train", args)) return *rc;
  o.data_parallel = join_ranks(a, o.device);
  return as_rank(o.data_parallel, [&] { return train_rank(o, args); });
}

int train_rank(const TrainOptions& o, const std::vector<std::string>& args) {
  TrainResult r = run_train(o);
  if (o.data_parallel && o.data_parallel->rank() != 0) return 0;
  RunInfo info = run_info("train", args);
  info.config = {{"method", o.method}, {"preset", o.preset}, {"config", r.cfg.to_json()}, {"steps", o.steps},
                 {"batch", o.batch}, {"micro_batch", o.micro_batch}, {"data", run_data(o)}, {"data_order", data_order(run_data(o))}, {"resume", o.resume}, {"init_from", o.init_from},
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
  o.seeds = a.get_int("seeds", 0);
  o.stop_after = a.get_int("stop-after", 0);
  if (a.get("seeds") && o.seeds < 1) throw UsageError("--seeds must be >= 1");
  if (o.stop_after < 0) throw UsageError("--stop-after must be >= 0");
  o.no_train = a.flag("no-train");
  if (auto d = a.get("cell-checkpoints")) o.cell_checkpoints = *d;
  // --from: earlier reports of parts of this leaderboard; read (and checked) in leaderboard_rank
  for (const auto& f : a.list("from")) o.from.emplace_back(f, Json());
  if (auto rc = spawn_ranks(a, "leaderboard", args)) return *rc;
  o.data_parallel = join_ranks(a, o.device);
  return as_rank(o.data_parallel, [&] { return leaderboard_rank(o, args); });
}

// Every rank trains the same cells (an earlier report's finished cells are read on each); rank 0
// writes the report after each cell and at the end.
int leaderboard_rank(LeaderboardOptions o, const std::vector<std::string>& args) {
  const bool rank0 = !o.data_parallel || o.data_parallel->rank() == 0;
  RunInfo info = run_info("leaderboard", args);
  info.config = leaderboard_config(o);
  info.seeds = {{"base", o.seed}};
  const std::string title = fmt::format("mixbench leaderboard, preset {}", o.preset);
  Json merged_from = Json::array();  // the --from reports
  auto report_of = [&](const Json& results, const std::string& md, const Json& summary) {
    Json report = make_report(info, results);
    report["markdown"] = md;
    report["summary"] = summary;
    if (!merged_from.empty()) report["merged_from"] = merged_from;
    if (summary.contains("budgets")) {  // --budgets: each budget's ranking and Kendall's tau between them
      report["budgets"] = summary["budgets"];
      report["kendall_tau"] = summary["kendall_tau"];
    }
    return report;
  };
  if (!o.out.empty() && std::filesystem::exists(o.out)) {  // a report of an earlier run: keep its finished cells
    try {
      o.resume = Json::parse(read_file(o.out));
    } catch (const Json::parse_error& e) {
      throw InputError(fmt::format("'{}' exists and is not a JSON report ({}); remove it or use another --out", o.out, e.what()));
    }
    try {
      check_leaderboard_resume(o.resume, info.config);
    } catch (const InputError& e) {
      throw InputError(fmt::format("'{}': {}; remove it or use another --out", o.out, e.what()));
    }
  }
  for (auto& [path, report] : o.from) {  // earlier reports of parts of this leaderboard
    if (!std::filesystem::is_regular_file(path)) throw InputError(fmt::format("--from '{}': no such file", path));
    try {
      report = Json::parse(read_file(path));
    } catch (const Json::parse_error& e) {
      throw InputError(fmt::format("--from '{}': not a JSON report ({})", path, e.what()));
    }
    try {
      check_leaderboard_resume(report, info.config);
    } catch (const InputError& e) {
      throw InputError(fmt::format("--from '{}': {}", path, e.what()));
    }
    merged_from.push_back(path);
  }
  if (!o.out.empty() && rank0)
    o.on_cell = [&](const Json& results, const std::string& md, const Json& summary) {
      write_report(o.out, report_of(results, md, summary));
    };
  std::string md;
  Json summary;
  Json results = run_leaderboard(o, md, &summary);
  if (!rank0) return 0;
  if (!o.out.empty()) {
    write_report(o.out, report_of(results, md, summary));
    std::filesystem::path mdp(o.out);
    mdp.replace_extension(".md");
    write_file_atomic(mdp.string(), md);
    std::filesystem::path html(o.out);
    html.replace_extension(".html");
    write_file_atomic(html.string(), leaderboard_html(results, title, summary));
  }
  std::cerr << md;
  if (o.no_train && !summary.value("missing", Json::array()).empty())
    std::cerr << fmt::format("{} of {} cells missing (in no earlier report; --no-train trains none)\n",
                             summary["missing"].size(), summary["cells"].get<int64_t>());
  else if (!summary.value("complete", false))
    std::cerr << fmt::format("stopped after {} of {} cells; the same command continues it\n", summary["cells_done"].get<int64_t>(),
                             summary["cells"].get<int64_t>());
  int rc = 0;
  for (const auto& r : results)
    if (r["status"] != "ok") rc = 1;
  return rc;
}

// Options train and leaderboard share.
const OptionDoc kPreset = {"preset", OptionKind::Value, "tiny|small|gpu-d12", "model size, steps, batch and schedule (default tiny)"};
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
const OptionDoc kGraph = {"graph", OptionKind::Value, "auto|fwd-bwd|off",
                          "CUDA graphs on a GPU: auto captures the whole step (forward, backward, optimizer) where "
                          "it can, fwd-bwd only forward + backward (default auto)"};
const OptionDoc kDtype = {"dtype", OptionKind::Value, "bf16|fp32",
                          "compute dtype; weights and optimizer state stay fp32 (default bf16 on cuda, fp32 on cpu)"};
const OptionDoc kNproc = {"nproc", OptionKind::Value, "N", "data-parallel over N local ranks, one per GPU (or CPU process), started here"};
const OptionDoc kDistTimeout = {"dist-timeout", OptionKind::Value, "SECONDS", "limit on every collective and rendezvous over several ranks (default 300)"};

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
           {"init-from", OptionKind::Value, "FILE", "start from these parameters: a model state dict (nanochat's names, converted by ci/nanochat_to_safetensors.py, or mixbench's)"},
           {"init-level", OptionKind::Value, "model|layer", "with --init-from: layer = one layer's state dict (fla's or nanochat's names) loaded into every block"},
           {"init-layers", OptionKind::Value, "I,J|all", "with --init-level layer: the blocks it is loaded into (default all)"},
           {"dry-run", OptionKind::Flag, "", "print every parameter with its optimizer group, lr, betas, eps and weight decay; train nothing"},
           {"json", OptionKind::Flag, "", "with --dry-run: the table as JSON"},
           {"eval-every", OptionKind::Value, "N", "steps between validation evaluations (default: the preset's)"},
           {"eval-batches", OptionKind::Value, "N", "batches per validation evaluation (default: the preset's)"},
           {"final-eval-batches", OptionKind::Value, "all|curve|N",
            "batches of the final evaluation, the run's val_bpb: all = the whole validation stream, curve = as the "
            "curve's (default: the preset's: all on the GPU presets, curve on tiny)"},
           {"checkpoint-every", OptionKind::Value, "N", "steps between checkpoints (default: the preset's)"},
           {"stop-after", OptionKind::Value, "N", "stop as if interrupted after N steps (0 = never)"},
           {"log-every", OptionKind::Value, "N", "steps between loss read-backs and progress lines (default: the preset's)"},
           {"trace", OptionKind::Value, "FILE.json", "Kineto trace (Chrome/Perfetto) of steps after the first; kernel time by kind in train.json"},
           {"trace-steps", OptionKind::Value, "N", "steps the trace covers (default 2)"},
           kGraph,
           kDevice,
           kDtype,
           kProbes,
           kQuiet,
           kNproc,
           kDistTimeout},
          run_train_command};
}

Command leaderboard_command() {
  return {"leaderboard",
          "equal-FLOP ranking: every method trained at dense's FLOPs/token (within 2%) and ranked",
          "",
          "with --out: the Markdown table (.md) and an HTML page (.html, inline SVG) beside the report;\n"
          "a report already at --out with other preset/config/steps/batch/data is refused (exit 2);\n"
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
           {"seeds", OptionKind::Value, "N", "runs per method, seeds S..S+N-1, paired across methods (default: the preset's)"},
           kData,
           {"config", OptionKind::Value, "k=v,...", "overrides applied to every method after calibration"},
           kDevice,
           kDtype,
           kGraph,
           kProbes,
           {"out", OptionKind::Value, "report.json",
            "write the JSON report (after every finished method/seed cell; a rerun keeps the cells it holds), "
            "with .md and .html beside it"},
           {"from", OptionKind::Multi, "a.json,b.json",
            "earlier reports of parts of this leaderboard (e.g. one per method and seed, run in parallel): their "
            "finished cells are kept as a resumed --out report's are; each must have this run's preset, config, "
            "steps, batch, micro-batch, data, device, probes and budgets (exit 2 naming the file and the field), while methods "
            "and seeds may differ. A cell in several files (or in --out too) is kept from the first; exit 2 when "
            "their val_bpb/val_bits_per_token differ. The report lists them under merged_from"},
           {"no-train", OptionKind::Flag, "",
            "train nothing: combine the cells of --out and --from; the others are listed as missing "
            "(summary.missing, the .md)"},
           {"stop-after", OptionKind::Value, "N", "stop as if interrupted after N trained cells (0 = never)"},
           {"cell-checkpoints", OptionKind::Value, "DIR",
            "each trained cell checkpoints its run into DIR/<method>.s<seed>/ (the preset's checkpoint_every) and "
            "resumes from a checkpoint of the same run there, so a cell stopped part-way (a killed process, out of "
            "memory) continues where it was; the folder is removed once the cell is done. One budget only"},
           kQuiet,
           kNproc,
           kDistTimeout},
          run_leaderboard_command};
}

}  // namespace mixbench
