// Helpers shared by the command handlers.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "harness/registry.h"
#include "harness/report.h"

namespace mixbench {

// The report header's run description: kind and the command line "mixbench ARGS...".
RunInfo run_info(const std::string& kind, const std::vector<std::string>& args);
// "cpu" or "cuda"; UsageError otherwise.
Backend parse_device(const std::string& d);
// Progress output of train and leaderboard: 0 none (--quiet), 1 JSON lines, 2 human lines (a terminal).
int progress_mode(bool quiet);
// A JSON file; InputError when it cannot be read or parsed.
nlohmann::json load_report(const std::string& path);
// load_report, then InputError unless it matches reports/report.schema.json.
nlohmann::json load_valid_report(const std::string& path);

}  // namespace mixbench
