#include "harness/report.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/version.h>
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <regex>
#include <thread>

#include "harness/config.h"
#include "harness/errors.h"
#include "harness/io.h"

#if defined(MIXBENCH_WITH_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace mixbench {

namespace {
std::string run_command(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[256];
  while (fgets(buf, sizeof buf, p)) out += buf;
  pclose(p);
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

std::string iso_now() {
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}
}  // namespace

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      auto c = line.find(':');
      if (c != std::string::npos) return line.substr(c + 2);
    }
  return "unknown";
}

std::string git_commit() {
  static std::string commit = [] {
    std::string c = run_command(fmt::format("git -C '{}' rev-parse HEAD 2>/dev/null", MIXBENCH_SOURCE_DIR));
    if (c.size() != 40) return std::string("unknown");
    std::string dirty = run_command(fmt::format("git -C '{}' status --porcelain --untracked-files=no 2>/dev/null", MIXBENCH_SOURCE_DIR));
    return dirty.empty() ? c : c + "-dirty";
  }();
  return commit;
}

nlohmann::json machine_info() {
  nlohmann::json m;
  m["cpu"] = cpu_model();
  m["cpu_threads"] = int64_t(std::thread::hardware_concurrency());
  m["torch_threads"] = int64_t(at::get_num_threads());
  m["libtorch"] = TORCH_VERSION;
  m["gpu"] = nullptr;
  m["driver"] = nullptr;
  m["cuda_runtime"] = nullptr;
#if defined(MIXBENCH_WITH_CUDA)
  int n = 0;
  if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0) {
    cudaDeviceProp p{};
    cudaGetDeviceProperties(&p, 0);
    m["gpu"] = p.name;
    m["gpu_count"] = n;
    m["gpu_memory_bytes"] = int64_t(p.totalGlobalMem);
    m["gpu_sm_count"] = p.multiProcessorCount;
    int drv = 0, rt = 0;
    cudaDriverGetVersion(&drv);
    cudaRuntimeGetVersion(&rt);
    m["driver"] = fmt::format("{}.{}", drv / 1000, (drv % 1000) / 10);
    m["cuda_runtime"] = fmt::format("{}.{}", rt / 1000, (rt % 1000) / 10);
    std::string smi = run_command("nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1");
    if (!smi.empty()) m["driver_version"] = smi;
  }
  m["cuda_build"] = true;
#else
  m["cuda_build"] = false;
#endif
  return m;
}

nlohmann::json make_report(const RunInfo& info, nlohmann::json results) {
  nlohmann::json r;
  r["schema_version"] = kSchemaVersion;
  r["kind"] = info.kind;
  r["created"] = iso_now();
  r["git_commit"] = git_commit();
  r["mixbench_version"] = MIXBENCH_VERSION;
  r["machine"] = machine_info();
  std::string cmd;
  for (const auto& a : info.argv) cmd += (cmd.empty() ? "" : " ") + a;
  r["command"] = cmd;
  r["config"] = info.config;
  r["config_hash"] = fnv1a_hex(info.config.dump());
  r["seeds"] = info.seeds;
  r["results"] = std::move(results);
  return r;
}

void write_report(const std::string& path, const nlohmann::json& report) {
  auto errors = validate_json(report, report_schema());
  if (!errors.empty()) {
    std::string msg = "internal error: report does not match its schema:";
    for (size_t i = 0; i < errors.size() && i < 10; ++i) msg += "\n  " + errors[i];
    throw std::logic_error(msg);
  }
  write_file_atomic(path, report.dump(2) + "\n");
}

// ------------------------------------------------------------------ schema validation
namespace {
const nlohmann::json* resolve_ref(const std::string& ref, const nlohmann::json& root) {
  if (ref.rfind("#/", 0) != 0) return nullptr;
  const nlohmann::json* cur = &root;
  size_t pos = 2;
  while (pos <= ref.size()) {
    size_t next = ref.find('/', pos);
    std::string key = ref.substr(pos, next == std::string::npos ? std::string::npos : next - pos);
    if (!cur->is_object() || !cur->contains(key)) return nullptr;
    cur = &(*cur)[key];
    if (next == std::string::npos) break;
    pos = next + 1;
  }
  return cur;
}

bool type_matches(const nlohmann::json& v, const std::string& type) {
  if (type == "object") return v.is_object();
  if (type == "array") return v.is_array();
  if (type == "string") return v.is_string();
  if (type == "integer") return v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
  if (type == "number") return v.is_number();
  if (type == "boolean") return v.is_boolean();
  if (type == "null") return v.is_null();
  return false;
}

void validate_at(const nlohmann::json& v, const nlohmann::json& s, const nlohmann::json& root,
                 const std::string& path, std::vector<std::string>& errs) {
  if (s.is_boolean()) {
    if (!s.get<bool>()) errs.push_back(path + ": not allowed");
    return;
  }
  if (!s.is_object()) return;
  if (s.contains("$ref")) {
    const nlohmann::json* target = resolve_ref(s["$ref"].get<std::string>(), root);
    if (!target) {
      errs.push_back(path + ": unresolvable $ref " + s["$ref"].dump());
      return;
    }
    validate_at(v, *target, root, path, errs);
  }
  if (s.contains("type")) {
    bool ok = false;
    if (s["type"].is_string()) ok = type_matches(v, s["type"].get<std::string>());
    else
      for (const auto& t : s["type"]) ok = ok || type_matches(v, t.get<std::string>());
    if (!ok) {
      errs.push_back(fmt::format("{}: expected type {}, got {}", path, s["type"].dump(), v.type_name()));
      return;
    }
  }
  if (s.contains("enum")) {
    bool found = false;
    for (const auto& e : s["enum"]) found = found || e == v;
    if (!found) errs.push_back(fmt::format("{}: {} not in {}", path, v.dump(), s["enum"].dump()));
  }
  if (s.contains("const") && s["const"] != v) errs.push_back(fmt::format("{}: expected {}", path, s["const"].dump()));
  if (v.is_number()) {
    if (s.contains("minimum") && v.get<double>() < s["minimum"].get<double>())
      errs.push_back(fmt::format("{}: {} below minimum {}", path, v.dump(), s["minimum"].dump()));
    if (s.contains("exclusiveMinimum") && !(v.get<double>() > s["exclusiveMinimum"].get<double>()))
      errs.push_back(fmt::format("{}: {} not above {}", path, v.dump(), s["exclusiveMinimum"].dump()));
    if (s.contains("maximum") && v.get<double>() > s["maximum"].get<double>())
      errs.push_back(fmt::format("{}: {} above maximum {}", path, v.dump(), s["maximum"].dump()));
  }
  if (v.is_string() && s.contains("minLength") && v.get<std::string>().size() < s["minLength"].get<size_t>())
    errs.push_back(path + ": string too short");
  if (v.is_string() && s.contains("pattern") && !std::regex_search(v.get<std::string>(), std::regex(s["pattern"].get<std::string>())))
    errs.push_back(fmt::format("{}: '{}' does not match {}", path, v.get<std::string>(), s["pattern"].dump()));
  if (v.is_object()) {
    if (s.contains("required"))
      for (const auto& r : s["required"])
        if (!v.contains(r.get<std::string>())) errs.push_back(fmt::format("{}: missing required '{}'", path, r.get<std::string>()));
    for (auto it = v.begin(); it != v.end(); ++it) {
      std::string sub = path + "/" + it.key();
      if (s.contains("properties") && s["properties"].contains(it.key()))
        validate_at(it.value(), s["properties"][it.key()], root, sub, errs);
      else if (s.contains("additionalProperties"))
        validate_at(it.value(), s["additionalProperties"], root, sub, errs);
    }
  }
  if (v.is_array()) {
    if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) errs.push_back(path + ": too few items");
    if (s.contains("items"))
      for (size_t i = 0; i < v.size(); ++i) validate_at(v[i], s["items"], root, fmt::format("{}/{}", path, i), errs);
  }
  for (const char* key : {"anyOf", "oneOf"}) {
    if (!s.contains(key)) continue;
    int matches = 0;
    for (const auto& alt : s[key]) {
      std::vector<std::string> sub;
      validate_at(v, alt, root, path, sub);
      matches += sub.empty();
    }
    if (std::string(key) == "anyOf" ? matches == 0 : matches != 1)
      errs.push_back(fmt::format("{}: matches {} of the {} alternatives", path, matches, key));
  }
  if (s.contains("allOf"))
    for (const auto& alt : s["allOf"]) validate_at(v, alt, root, path, errs);
}
}  // namespace

std::vector<std::string> validate_json(const nlohmann::json& doc, const nlohmann::json& schema) {
  std::vector<std::string> errs;
  validate_at(doc, schema, schema, "", errs);
  return errs;
}

}  // namespace mixbench
