// The JSON report every command writes (see reports/report.schema.json): a header describing the
// run (kind, time, commit, machine, command line, config and its hash, seeds) and `results`.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace mixbench {

constexpr int kSchemaVersion = 1;

struct RunInfo {
  std::string kind;                 // conformance, sweep, train, leaderboard, bench, account
  std::vector<std::string> argv;    // exact command line
  nlohmann::json config = nlohmann::json::object();
  nlohmann::json seeds = nlohmann::json::object();
};

nlohmann::json machine_info();
std::string cpu_model();  // /proc/cpuinfo's model name ("unknown" elsewhere)
std::string git_commit();
nlohmann::json make_report(const RunInfo& info, nlohmann::json results);
// Validates against the schema, then writes atomically. Throws on a schema violation (a bug).
void write_report(const std::string& path, const nlohmann::json& report);

// JSON Schema (draft-07 subset: type, required, properties, additionalProperties, items, enum,
// const, minimum, maximum, minItems, anyOf, oneOf, $ref to local definitions). Returns the list
// of violations, empty when valid.
std::vector<std::string> validate_json(const nlohmann::json& doc, const nlohmann::json& schema);
const nlohmann::json& report_schema();  // reports/report.schema.json, embedded at build time

}  // namespace mixbench
