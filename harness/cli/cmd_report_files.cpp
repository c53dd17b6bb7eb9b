// mixbench report, plot and validate: commands reading report files.
#include <iostream>

#include "harness/cli/commands.h"
#include "harness/cli/common.h"
#include "harness/errors.h"
#include "harness/io.h"
#include "harness/report.h"
#include "reports/plot.h"
#include "reports/render.h"

namespace mixbench {

namespace {

using Json = nlohmann::json;

int run_report_command(const Args& a, const std::vector<std::string>&) {
  if (a.positional().size() != 1) throw UsageError("report takes one FILE");
  std::cout << render_markdown(load_valid_report(a.positional()[0]));
  return 0;
}

int run_plot_command(const Args& a, const std::vector<std::string>&) {
  if (a.positional().size() != 1 || !a.get("out")) throw UsageError("plot takes FILE --out page.html");
  Json r = load_valid_report(a.positional()[0]);
  write_file_atomic(*a.get("out"), render_sweep_html(r));
  std::cout << "wrote " << *a.get("out") << "\n";
  return 0;
}

int run_validate_command(const Args& a, const std::vector<std::string>&) {
  if (a.positional().empty()) throw UsageError("validate takes FILE...");
  int rc = 0;
  for (const auto& p : a.positional()) {
    auto errs = validate_json(load_report(p), report_schema());
    if (errs.empty()) std::cout << p << ": valid\n";
    else {
      rc = 1;
      std::cout << p << ": " << errs.size() << " problem(s)\n";
      for (const auto& e : errs) std::cout << "  " << e << "\n";
    }
  }
  return rc;
}

}  // namespace

Command plot_command() {
  return {"plot", "offline HTML page (inline SVG, no scripts) of a sweep report: throughput against length, OOM marked",
          "FILE", "", {{"out", OptionKind::Value, "page.html", "the page to write (required)"}}, run_plot_command};
}

Command report_command() {
  return {"report", "Markdown summary of a report", "FILE", "", {}, run_report_command};
}

Command validate_command() {
  return {"validate", "check reports against reports/report.schema.json", "FILE...",
          "exit 1 when a file is not a valid report (its problems are listed)", {}, run_validate_command};
}

}  // namespace mixbench
