// The leaderboard page, one offline HTML file (inline SVG, no scripts) built from the leaderboard's
// result rows (suites/leaderboard.h, run_leaderboard) and its summary: the ranking and probe
// tables as HTML tables, the training loss against cumulative training FLOPs per method, and val
// bpb against training FLOPs/token and against measured tokens/s as scatter plots with the 95%
// intervals as error bars, the Pareto front (lower bpb, higher tokens/s) marked, and labels placed
// so that none overlaps another label or a point (reports/plot.h, place_labels).
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace mixbench {

// `summary`: run_leaderboard's ({baseline, ...}); the baseline defaults to the row whose
// delta_vs_<name> is there.
std::string leaderboard_html(const nlohmann::json& results, const std::string& title, const nlohmann::json& summary);

}  // namespace mixbench
