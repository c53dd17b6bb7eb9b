// The task suite's report pages (suites/tasks.h): a Markdown summary (one table per task, mean
// held-out accuracy over seeds per method x setting) and an offline HTML page in the style of
// Zoology's figures: small-multiple SVG line plots (MQAR accuracy against key-value pairs and
// against model width, state tracking against the held-out length) and a heat table of every
// method x setting.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace mixbench {

// Mean accuracy over the seeds whose run is "ok" for each (method, setting label); cells without
// one show the first row's status. Rows as run_tasks returns them.
std::string tasks_markdown(const nlohmann::json& results);
// A self-contained page (inline SVG, no scripts) with `title` as its heading.
std::string tasks_html(const nlohmann::json& results, const std::string& title);

}  // namespace mixbench
