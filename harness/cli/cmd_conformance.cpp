// mixbench conformance: optimized paths against the FP64 references.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <iostream>
#include <map>
#include <set>

#include "harness/cli/commands.h"
#include "harness/cli/common.h"
#include "harness/errors.h"
#include "harness/metrics.h"
#include "harness/registry.h"
#include "harness/report.h"
#include "suites/conformance.h"

namespace mixbench {

namespace {

using Json = nlohmann::json;

void print_conformance_table(const Json& results) {
  struct Row {
    int pass = 0, fail = 0, other = 0;
    double worst = 0;
  };
  std::map<std::string, Row> rows;
  for (const auto& r : results) {
    std::string key = fmt::format("{:<14} {:<18} {:<7} {:<5} {:<5}", r.value("method", Json()).is_null() ? "-" : r["method"].get<std::string>(),
                                  !r.value("op", Json()).is_null() ? r["op"].get<std::string>()
                                  : r.contains("layer_mixers") ? "model" : "layer",
                                  r.value("level", std::string("?")), r.value("device", std::string("?")),
                                  r.value("dtype", std::string("?")));
    Row& row = rows[key];
    std::string st = r["status"];
    if (st == "pass") ++row.pass;
    else if (st == "fail") ++row.fail;
    else ++row.other;
    if (r.contains("checks"))
      for (const auto& c : r["checks"])
        if (!c["rel_rms"].is_null()) {
          // threshold 0 (selection checks): any error is infinitely over it
          const double e = c["rel_rms"].get<double>(), t = c["threshold"].get<double>();
          row.worst = std::max(row.worst, t > 0 ? e / t : (e > 0 ? INFINITY : 0.0));
        }
  }
  std::cout << fmt::format("{:<14} {:<18} {:<7} {:<5} {:<5} {:>5} {:>5} {:>6} {:>12}\n", "method", "op", "level", "dev",
                           "dtype", "pass", "fail", "other", "worst/thr");
  for (const auto& [k, r] : rows)
    std::cout << fmt::format("{} {:>5} {:>5} {:>6} {:>12.3g}\n", k, r.pass, r.fail, r.other, r.worst);
}

int run_conformance_command(const Args& a, const std::vector<std::string>& args) {
  Registry& reg = Registry::get();
  ConformanceOptions opt;
  opt.backend = parse_device(a.get_or("device", "cpu"));
  opt.dtype = a.get_or("dtype", "fp64");
  parse_dtype(opt.dtype);
  opt.seed = uint64_t(a.get_int("seed", 1234));
  opt.finite_differences = !a.flag("no-fd");
  opt.fd_directions = int(a.get_int("fd-directions", 2));
  if (opt.fd_directions < 1) throw UsageError("--fd-directions takes a positive count of directions");
  opt.goldens = a.list("golden");
  opt.fault = a.get_or("inject-fault", "");
  if (!opt.fault.empty() && opt.fault != "output" && opt.fault != "gradient")
    throw UsageError("--inject-fault takes 'output' or 'gradient'");
  auto methods = a.list("methods");
  auto ops = a.list("ops");
  const bool none_given = methods.empty() && ops.empty() && opt.goldens.empty();
  if ((methods.size() == 1 && methods[0] == "all") || none_given) {
    methods.clear();
    for (auto* m : reg.methods()) methods.push_back(m->name);
  }
  if ((ops.size() == 1 && ops[0] == "all") || none_given) {
    ops.clear();
    for (auto* o : reg.ops()) ops.push_back(o->name);
  }
  for (const auto& m : methods) reg.method(m);  // unknown names fail before any work
  for (const auto& o : ops) reg.op(o);
  if (ops.empty()) {  // the ops the selected methods call
    std::set<std::string> used;
    for (const auto& m : methods)
      for (const auto& o : reg.method(m).ops) used.insert(o);
    ops.assign(used.begin(), used.end());
  }
  opt.methods = methods;
  opt.ops = ops;
  ConformanceSummary sum;
  Json results = run_conformance(opt, sum);
  RunInfo info = run_info("conformance", args);
  info.config = {{"methods", methods}, {"ops", ops}, {"device", a.get_or("device", "cpu")}, {"dtype", opt.dtype},
                 {"goldens", opt.goldens}, {"finite_differences", opt.finite_differences},
                 {"fd_directions", opt.fd_directions}, {"fault", opt.fault}};
  info.seeds = {{"base", opt.seed}};
  Json report = make_report(info, results);
  report["thresholds"] = threshold_table();
  report["summary"] = {{"passed", sum.passed}, {"failed", sum.failed}, {"skipped", sum.skipped}, {"errors", sum.errors}};
  if (auto out = a.get("out")) write_report(*out, report);
  if (!a.flag("quiet")) print_conformance_table(results);
  std::cout << fmt::format("conformance: {} passed, {} failed, {} skipped, {} errors\n", sum.passed, sum.failed,
                           sum.skipped, sum.errors);
  return (sum.failed == 0 && sum.errors == 0) ? 0 : 1;
}

}  // namespace

Command conformance_command() {
  return {"conformance",
          "optimized paths against FP64 references (outputs, gradients, finite differences, golden files)",
          "",
          "exit 0 when every case passes, 1 when a case failed",
          {{"methods", OptionKind::Multi, "a,b|all", "methods checked at layer and model level (all when no --ops or --golden is given)"},
           {"ops", OptionKind::Multi, "x,y|all", "ops checked at op level (default: the ops the selected methods call)"},
           {"golden", OptionKind::Multi, "FILE...", "golden files to check (written by `mixbench golden` or other implementations)"},
           {"device", OptionKind::Value, "cpu|cuda", "device of the optimized paths (default cpu)"},
           {"dtype", OptionKind::Value, "fp64|fp32|bf16", "dtype of the optimized paths (default fp64)"},
           {"seed", OptionKind::Value, "N", "base seed of the generated cases (default 1234)"},
           {"no-fd", OptionKind::Flag, "", "skip the finite-difference check of the reference gradients"},
           {"fd-directions", OptionKind::Value, "N", "random directions per input tensor in the finite-difference check (default 2)"},
           {"out", OptionKind::Value, "report.json", "write the JSON report"},
           {"quiet", OptionKind::Flag, "", "print the one-line summary only, not the per-unit table"},
           {"inject-fault", OptionKind::Value, "output|gradient",
            "test hook: perturb the optimized path's first output or gradient so that its checks must fail"}},
          run_conformance_command};
}

}  // namespace mixbench
