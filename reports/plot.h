// Offline HTML page (inline SVG, no scripts) for a sweep report: throughput (tokens/s) against
// length, log-log, one line per method and batch size, the OOM frontier marked with an x.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace mixbench {

// InputError when the report is not a sweep.
std::string render_sweep_html(const nlohmann::json& report);

}  // namespace mixbench
