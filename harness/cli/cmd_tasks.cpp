// mixbench tasks: the synthetic task suite (suites/tasks.h) and its Markdown and HTML pages
// (reports/tasks.h).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <iostream>

#include "harness/cli/commands.h"
#include "harness/cli/common.h"
#include "harness/errors.h"
#include "harness/io.h"
#include "harness/report.h"
#include "reports/tasks.h"
#include "suites/sweep.h"
#include "suites/tasks.h"

namespace mixbench {

namespace {

using Json = nlohmann::json;

// A multi-valued option of positive counts (suites/sweep.h's rules).
std::vector<int64_t> counts(const Args& a, const std::string& name, const char* what) {
  std::vector<int64_t> v;
  for (const auto& item : a.list(name))
    for (int64_t x : parse_counts(item, what)) v.push_back(x);
  return v;
}

int run_tasks_command(const Args& a, const std::vector<std::string>& args) {
  TasksOptions o;
  o.preset = a.get_or("preset", "cpu-tiny");
  o.methods = a.list("methods");
  o.tasks = a.list("tasks");
  o.seeds = a.get_int("seeds", 0);
  o.steps = a.get_int("steps", 0);
  o.seed = uint64_t(a.get_int("seed", 0));
  if (auto lr = a.get("lr")) {
    size_t used = 0;
    try {
      o.lr = std::stod(*lr, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != lr->size() || !(o.lr > 0)) throw UsageError(fmt::format("--lr takes a positive number, not '{}'", *lr));
  }
  o.device = a.get_or("device", "cpu");
  o.graph = a.get_or("graph", "auto");
  if (o.graph != "auto" && o.graph != "off") throw UsageError(fmt::format("--graph {}: takes auto or off", o.graph));
  o.mqar_lengths = counts(a, "lengths", "MQAR length");
  o.mqar_pairs = counts(a, "pairs", "MQAR pair count");
  o.mqar_widths = counts(a, "widths", "MQAR width");
  o.mqar_vocab = a.get_int("vocab", 0);
  if (o.mqar_vocab < 0) throw UsageError(fmt::format("--vocab takes a positive integer, not {}", o.mqar_vocab));
  o.test_scales = counts(a, "test-scales", "held-out length multiple");
  o.config = a.get_or("config", "");
  o.progress = progress_mode(a.flag("quiet"));
  if (o.seeds < 0 || o.steps < 0) throw UsageError("--seeds and --steps must be >= 0");
  parse_device(o.device);
  Json results = run_tasks(o);
  const std::string md = tasks_markdown(results);
  RunInfo info = run_info("tasks", args);
  const TasksPreset P = tasks_preset(o.preset);
  info.config = {{"preset", o.preset},
                 {"methods", tasks_methods(P, o.methods)},
                 {"tasks", o.tasks.empty() ? P.tasks : o.tasks},
                 {"seeds", o.seeds > 0 ? o.seeds : P.seeds},
                 {"steps", o.steps > 0 ? o.steps : P.steps},
                 {"batch", P.batch},
                 {"optimizer", fmt::format("AdamW lr {} betas (0.9, 0.999) wd {} on matrices", o.lr > 0 ? o.lr : P.lr, P.weight_decay)},
                 {"mqar_vocab", o.mqar_vocab > 0 ? o.mqar_vocab : P.mqar_vocab},
                 {"n_layer", P.n_layer},
                 {"eval_instances", P.eval_instances},
                 {"test_scales", o.test_scales},
                 {"model_config", o.config},
                 {"device", o.device},
                 {"graph", o.graph}};
  info.seeds = {{"base", o.seed}};
  Json report = make_report(info, results);
  report["markdown"] = md;
  int64_t ok = 0, skipped = 0, errors = 0;
  for (const auto& r : results) {
    const std::string st = r["status"].get<std::string>();
    ok += st == "ok";
    skipped += st == "skipped";
    errors += st == "error";
  }
  report["summary"] = {{"ok", ok}, {"skipped", skipped}, {"errors", errors}};
  if (auto out = a.get("out")) {
    write_report(*out, report);
    std::filesystem::path p(*out);
    write_file_atomic(p.replace_extension(".md").string(), md);
    write_file_atomic(p.replace_extension(".html").string(),
                      tasks_html(results, fmt::format("mixbench tasks, preset {}", o.preset)));
  }
  std::cerr << md << fmt::format("\ntasks: {} ok, {} skipped, {} errors\n", ok, skipped, errors);
  return errors == 0 ? 0 : 1;
}

}  // namespace

Command tasks_command() {
  return {"tasks",
          "synthetic task suite (Zoology's MQAR, MAD's recall/copy/compression/memorization, S3/S5/parity)",
          "",
          "each method's 2-layer model trained on each setting with AdamW and a loss on the answer tokens only,\n"
          "scored on held-out instances (state tracking at L, 2L and 4L); with --out: the Markdown tables (.md)\n"
          "and an HTML page (.html) beside the report; a method that refuses a setting gets a \"skipped\" row;\n"
          "exit 1 when a run failed",
          {{"preset", OptionKind::Value, "cpu-tiny|gpu", "cpu-tiny: CI grid, 3 methods, 1 seed; gpu: full grid, every method, 3 seeds (default cpu-tiny)"},
           {"methods", OptionKind::Multi, "a,b|all", "methods to train (default: the preset's lineup)"},
           {"tasks", OptionKind::Multi, "t1,t2", "tasks: mqar, in_context_recall, noisy_recall, fuzzy_recall, selective_copy, compression, memorization, s3, s5, parity"},
           {"seeds", OptionKind::Value, "N", "seeds per setting (default: the preset's)"},
           {"seed", OptionKind::Value, "S", "first seed (default 0)"},
           {"steps", OptionKind::Value, "N", "AdamW steps per setting (default: the preset's)"},
           {"lr", OptionKind::Value, "X", "AdamW peak learning rate (default: the preset's)"},
           {"lengths", OptionKind::Multi, "L1,L2", "MQAR sequence lengths (even; default: the preset's)"},
           {"pairs", OptionKind::Multi, "N1,N2", "MQAR key-value pairs (4 x pairs <= length; default: the preset's)"},
           {"widths", OptionKind::Multi, "D1,D2", "MQAR model widths (default: the preset's)"},
           {"vocab", OptionKind::Value, "V", "MQAR token ids: keys from [1, V/2), values from [V/2, V) (default: the preset's)"},
           {"test-scales", OptionKind::Multi, "1,2,4,8", "held-out lengths as multiples of each setting's training length (length extrapolation; default: L, and L, 2L, 4L for state tracking)"},
           {"config", OptionKind::Value, "k=v,...", "config overrides of every method's model (e.g. rope=false)"},
           {"device", OptionKind::Value, "cpu|cuda", "device the training runs on (default cpu)"},
           {"graph", OptionKind::Value, "auto|off",
            "CUDA graphs on a GPU: auto captures each run's whole training step (forward, loss, backward, AdamW) "
            "where it can and replays it; off runs every step eagerly (default auto)"},
           {"out", OptionKind::Value, "report.json", "write the JSON report, with .md and .html beside it"},
           {"quiet", OptionKind::Flag, "", "no progress output"}},
          run_tasks_command};
}

}  // namespace mixbench
