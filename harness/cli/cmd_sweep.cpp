// mixbench sweep: the throughput and OOM grid (suites/sweep.h).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <iostream>

#include "harness/cli/commands.h"
#include "harness/cli/common.h"
#include "harness/report.h"
#include "harness/cli/sweep_args.h"
#include "suites/mfu.h"
#include "suites/sweep.h"

namespace mixbench {

namespace {

using Json = nlohmann::json;

int run_sweep_command(const Args& a, const std::vector<std::string>& args) {
  SweepOptions opt = sweep_options_from_args(a);
  opt.progress = !a.flag("quiet");
  SweepSummary sum;
  Json results = run_sweep(opt, sum);
  RunInfo info = run_info("sweep", args);
  info.config = sweep_config_json(opt);
  info.seeds = {{"base", opt.seed}};
  Json report = make_report(info, results);
  // the copy bandwidth the decode points' roofline shares are against (the measurement they used)
  if (opt.mode == "decode") report["copy_bandwidth"] = copy_bandwidth_json(copy_bandwidth(opt.device));
  report["summary"] = {{"ok", sum.ok}, {"oom", sum.oom}, {"skipped", sum.skipped}, {"errors", sum.errors}};
  if (auto out = a.get("out")) write_report(*out, report);
  std::cout << fmt::format("sweep {}: {} ok, {} oom, {} skipped, {} errors\n", opt.mode, sum.ok, sum.oom, sum.skipped,
                           sum.errors);
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
           {"out", OptionKind::Value, "FILE", "write the JSON report (`mixbench plot` draws it)"},
           {"quiet", OptionKind::Flag, "", "no progress line per point on stderr"}},
          run_sweep_command};
}

}  // namespace mixbench
