// mixbench sweep: the throughput and OOM grid (suites/sweep.h).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <sys/stat.h>

#include <iostream>

#include "harness/cli/commands.h"
#include "harness/cli/common.h"
#include "harness/errors.h"
#include "harness/io.h"
#include "harness/report.h"
#include "harness/cli/sweep_args.h"
#include "suites/mfu.h"
#include "suites/sweep.h"

namespace mixbench {

namespace {

using Json = nlohmann::json;

bool file_exists(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0;
}

int run_sweep_command(const Args& a, const std::vector<std::string>& args) {
  SweepOptions opt = sweep_options_from_args(a);
  opt.progress = !a.flag("quiet");
  const auto out = a.get("out");
  const Json config = sweep_config_json(opt);
  // --resume: the report at --out, when there is one, holds the finished points of an earlier run of
  // this sweep (stopped, or cut off by a time limit): they are kept and the sweep goes on after them.
  Json resumed_from = Json::array();
  if (a.flag("resume")) {
    if (!out) throw UsageError("--resume continues the report at --out: give --out FILE");
    if (file_exists(*out)) {
      Json prev;
      try {
        prev = Json::parse(read_file(*out));
      } catch (const Json::exception& e) {
        throw InputError(fmt::format("--resume: {} is not JSON ({})", *out, e.what()));
      }
      const std::string why = sweep_resume_mismatch(prev, config);
      if (!why.empty())
        throw UsageError(fmt::format("--resume: {} is not a report of this sweep: {} (another --out, or the same options)",
                                     *out, why));
      opt.previous = prev["results"];
      const Json& ps = prev.value("summary", Json::object());
      if (ps.contains("resumed_from")) resumed_from = ps["resumed_from"];
      Json from = {{"git_commit", prev.value("git_commit", "")}, {"created", prev.value("created", "")}};
      if (prev.contains("copy_bandwidth")) from["copy_bandwidth"] = prev["copy_bandwidth"];
      resumed_from.push_back(from);
    }
  }
  RunInfo info = run_info("sweep", args);
  info.config = config;
  info.seeds = {{"base", opt.seed}};
  Json head;  // the header (machine, commit, command), made once
  auto report_of = [&](const Json& results, const SweepSummary& sum, bool complete) {
    if (head.is_null()) head = make_report(info, Json::array());
    Json report = head;
    report["results"] = results;
    // the copy bandwidth the decode points' roofline shares are against (the measurement they used)
    if (opt.mode == "decode") report["copy_bandwidth"] = copy_bandwidth_json(copy_bandwidth(opt.device));
    report["summary"] = {{"ok", sum.ok},     {"oom", sum.oom},           {"skipped", sum.skipped}, {"errors", sum.errors},
                         {"kept", sum.kept}, {"complete", complete}};
    if (!resumed_from.empty()) report["summary"]["resumed_from"] = resumed_from;
    return report;
  };
  // the report in progress, rewritten (atomically) after every point: a sweep stopped part-way leaves
  // every finished point readable, and `--resume` continues from it
  SweepProgress progress;
  if (out) progress = [&](const Json& results, const SweepSummary& sum) { write_report(*out, report_of(results, sum, false)); };
  SweepSummary sum;
  Json results = run_sweep(opt, sum, progress);
  if (out) write_report(*out, report_of(results, sum, true));
  std::cout << fmt::format("sweep {}: {} ok, {} oom, {} skipped, {} errors{}\n", opt.mode, sum.ok, sum.oom, sum.skipped,
                           sum.errors, sum.kept ? fmt::format(" ({} kept from the report resumed)", sum.kept) : "");
  return sum.errors == 0 ? 0 : 1;
}

}  // namespace

Command sweep_command() {
  return {"sweep",
          "throughput and OOM grid over methods, batch sizes and lengths; oom points are results",
          "",
          "exit 1 when a point failed with an error (an OOM is a result, not an error)",
          {{"mode", OptionKind::Value, "prefill|decode|train", "what is timed (required); decode runs at model level"},
           {"methods", OptionKind::Multi, "a,b|all", "methods to sweep (default all)"},
           {"level", OptionKind::Value, "op|layer|model", "unit timed (default: the preset's, model)"},
           {"batch", OptionKind::Value, "1,2,4,8", "batch sizes (default: the preset's)"},
           {"lengths", OptionKind::Value, "1k:1m|256,512,...", "lengths: a doubling range (k = 1024) or a list"},
           {"device", OptionKind::Value, "cpu|cuda", "device (default: the preset's)"},
           {"dtype", OptionKind::Value, "bf16|fp32|fp64", "dtype (default: the preset's)"},
           {"preset", OptionKind::Value, "cpu-tiny|gpu-d12", "defaults for everything else (default cpu-tiny)"},
           {"config", OptionKind::Value, "k=v,...", "overrides applied to every method's config, after the preset's"},
           {"reps", OptionKind::Value, "N", "timed repetitions per point (default: the preset's)"},
           {"graph", OptionKind::Value, "auto|off",
            "decode on CUDA: auto captures the step in a CUDA graph over static caches where the method keeps them "
            "(each point says whether it ran captured and why not), off decodes eagerly (default auto)"},
           {"warmup", OptionKind::Value, "N", "untimed repetitions before them (default: the preset's)"},
           {"memory-limit", OptionKind::Value, "BYTES|2G", "imposed allocation limit; points beyond it are oom"},
           {"seed", OptionKind::Value, "N", "seed of the inputs and weights (default 0)"},
           {"out", OptionKind::Value, "FILE",
            "write the JSON report (`mixbench plot` draws it), rewritten after every point (summary.complete false "
            "until the sweep ends)"},
           {"resume", OptionKind::Flag, "",
            "continue the report at --out when it exists: its ok and oom points (same options) are kept, the rest run"},
           {"quiet", OptionKind::Flag, "", "no progress line per point on stderr"}},
          run_sweep_command};
}

}  // namespace mixbench
