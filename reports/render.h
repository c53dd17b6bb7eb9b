// Markdown summary of a report (the `mixbench report FILE` command): the header, then a table
// per kind (conformance, sweep, account; one row of scalar fields per result for the others).
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace mixbench {

std::string render_markdown(const nlohmann::json& report);

}  // namespace mixbench
