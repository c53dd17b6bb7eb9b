// The leaderboard page: loss against cumulative training FLOPs per method and validation bpb
// against training FLOPs per token, as inline SVG (no scripts) in one offline HTML file, built
// from the leaderboard's result rows (suites/train.h, run_leaderboard), with its Markdown table.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace mixbench {

std::string leaderboard_html(const nlohmann::json& results, const std::string& title, const std::string& markdown);

}  // namespace mixbench
