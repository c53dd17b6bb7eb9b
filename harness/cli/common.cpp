#include "harness/cli/common.h"

#include <fmt/format.h>
#include <unistd.h>

#include "harness/errors.h"
#include "harness/io.h"

namespace mixbench {

using Json = nlohmann::json;

RunInfo run_info(const std::string& kind, const std::vector<std::string>& args) {
  RunInfo info;
  info.kind = kind;
  info.argv = {"mixbench", kind};  // the command line as typed: the subcommand, then its options
  info.argv.insert(info.argv.end(), args.begin(), args.end());
  return info;
}

Backend parse_device(const std::string& d) {
  if (d == "cpu") return Backend::CPU;
  if (d == "cuda") return Backend::CUDA;
  throw UsageError(fmt::format("unknown device '{}' (use cpu or cuda)", d));
}

int progress_mode(bool quiet) { return quiet ? 0 : (::isatty(STDOUT_FILENO) ? 2 : 1); }

Json load_report(const std::string& path) {
  std::string text = read_file(path);
  try {
    return Json::parse(text);
  } catch (const std::exception& e) {
    throw InputError(fmt::format("'{}' is not valid JSON: {}", path, e.what()));
  }
}

Json load_valid_report(const std::string& path) {
  Json r = load_report(path);
  auto errs = validate_json(r, report_schema());
  if (!errs.empty()) throw InputError(fmt::format("'{}' is not a mixbench report: {}", path, errs[0]));
  return r;
}

}  // namespace mixbench
