// Markdown rendering of reports (`mixbench report FILE`).
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <sstream>

#include "reports/render.h"

namespace mixbench {

namespace {
using Json = nlohmann::json;

std::string str_or(const Json& j, const char* key, const std::string& def = "-") {
  if (!j.contains(key) || j[key].is_null()) return def;
  if (j[key].is_string()) return j[key].get<std::string>();
  return j[key].dump();
}

std::string num(double v) { return fmt::format("{:.3g}", v); }
}  // namespace

std::string render_markdown(const Json& r) {
  std::ostringstream md;
  const std::string kind = r.value("kind", std::string("?"));
  md << "# mixbench " << kind << " report\n\n";
  md << "- created: " << str_or(r, "created") << "\n";
  md << "- commit: `" << str_or(r, "git_commit") << "`\n";
  md << "- command: `" << str_or(r, "command") << "`\n";
  const Json& m = r["machine"];
  md << "- machine: " << str_or(m, "cpu") << "; GPU " << str_or(m, "gpu", "none") << "; driver "
     << str_or(m, "driver", "-") << "; CUDA " << str_or(m, "cuda_runtime", "-") << "; LibTorch "
     << str_or(m, "libtorch") << "\n";
  md << "- config hash: `" << str_or(r, "config_hash") << "`\n\n";
  if (r.contains("summary")) md << "Summary: `" << r["summary"].dump() << "`\n\n";
  const Json& results = r["results"];
  if (kind == "conformance") {
    md << "| status | method | op | level | case | device | dtype | worst tensor | rel RMS | threshold |\n";
    md << "|---|---|---|---|---|---|---|---|---|---|\n";
    for (const auto& x : results) {
      std::string worst = "-", err = "-", thr = "-";
      double ratio = -1;
      if (x.contains("checks"))
        for (const auto& c : x["checks"]) {
          double e = c["rel_rms"].is_null() ? INFINITY : c["rel_rms"].get<double>();
          double t = c["threshold"].get<double>();
          if (e / t > ratio) {
            ratio = e / t;
            worst = c["tensor"];
            err = c["rel_rms"].is_null() ? "non-finite" : num(e);
            thr = num(t);
          }
        }
      std::string status = str_or(x, "status");
      if (x.contains("message")) status += " (" + x["message"].get<std::string>().substr(0, 80) + ")";
      if (x.contains("reason")) status += " (" + x["reason"].get<std::string>() + ")";
      md << "| " << status << " | " << str_or(x, "method") << " | " << str_or(x, "op") << " | " << str_or(x, "level")
         << " | " << str_or(x, "case") << " | " << str_or(x, "device") << " | " << str_or(x, "dtype") << " | " << worst
         << " | " << err << " | " << thr << " |\n";
    }
    if (r.contains("thresholds")) {
      md << "\nThresholds (relative RMS error):\n\n| dtype | output | gradient |\n|---|---|---|\n";
      for (auto it = r["thresholds"].begin(); it != r["thresholds"].end(); ++it)
        md << "| " << it.key() << " | " << it.value()["output"].get<double>() << " | "
           << it.value()["gradient"].get<double>() << " |\n";
    }
  } else if (kind == "sweep") {
    md << "| status | method | op | level | mode | B | T | median ms | IQR ms | tokens/s | GFLOP/s | peak MiB | predicted MiB |\n";
    md << "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    auto get = [](const Json& j, const char* a, const char* b) -> const Json* {
      if (!j.contains(a) || !j[a].is_object() || !j[a].contains(b) || j[a][b].is_null()) return nullptr;
      return &j[a][b];
    };
    auto cell = [](const Json* v, double scale) { return v ? num(v->get<double>() * scale) : std::string("-"); };
    for (const auto& x : results) {
      std::string status = str_or(x, "status");
      if (x.contains("reason")) status += " (" + x["reason"].get<std::string>() + ")";
      if (x.contains("last_fit_T")) status += ", last fit T=" + str_or(x, "last_fit_T", "none");
      md << "| " << status << " | " << str_or(x, "method") << " | " << str_or(x, "op") << " | " << str_or(x, "level")
         << " | " << str_or(x, "mode") << " | " << (get(x, "shape", "B") ? get(x, "shape", "B")->dump() : "-") << " | "
         << (get(x, "shape", "T") ? get(x, "shape", "T")->dump() : "-") << " | " << cell(get(x, "timing", "median_s"), 1e3)
         << " | " << cell(get(x, "timing", "iqr_s"), 1e3) << " | "
         << (x.contains("tokens_per_s") ? num(x["tokens_per_s"].get<double>()) : "-") << " | "
         << (x.contains("flop_per_s") && x["flop_per_s"].is_number() ? num(x["flop_per_s"].get<double>() * 1e-9) : "-")
         << " | " << cell(get(x, "memory", "peak_bytes"), 1.0 / 1048576) << " | "
         << cell(get(x, "accountant", "predicted_bytes"), 1.0 / 1048576) << " |\n";
    }
  } else if (kind == "profile") {
    for (const auto& x : results) {
      const Json& t = x["totals"];
      const double total = t.value("duration_s", 0.0);
      md << "## " << str_or(x, "subject") << " " << str_or(x, "phase") << " (" << str_or(x, "subject_kind") << ", "
         << str_or(x, "level") << " level)\n\n";
      md << "- ncu filter: `" << str_or(x, "nvtx_include") << "`\n";
      md << "- " << t.value("kernels", 0) << " kernels, " << num(total * 1e6) << " µs, " << num(t.value("flops", 0.0))
         << " FLOPs, " << num(t.value("dram_bytes", 0.0)) << " DRAM bytes";
      if (x.value("launch_count_reached", false)) md << " (stopped at the launch count: partial)";
      md << "\n- accountant FLOPs: "
         << (x["accountant_flops"].is_number() ? num(x["accountant_flops"].get<double>()) : std::string("none"))
         << ", measured ÷ accountant: "
         << (x.contains("measured_over_accountant_flops") && x["measured_over_accountant_flops"].is_number()
                 ? num(x["measured_over_accountant_flops"].get<double>())
                 : std::string("-"))
         << "\n\n";
      // the kernels by time, longest first
      std::vector<const Json*> ks;
      for (const auto& k : x["kernels"]) ks.push_back(&k);
      std::stable_sort(ks.begin(), ks.end(), [](const Json* a, const Json* b) {
        return (*a)["duration_s"].get<double>() > (*b)["duration_s"].get<double>();
      });
      md << "| kernel | µs | % time | TFLOP/s | GB/s | SM % | DRAM % | occupancy % | regs | smem B |\n";
      md << "|---|---|---|---|---|---|---|---|---|---|\n";
      for (const Json* k : ks) {
        std::string name = (*k)["name"].get<std::string>();
        if (name.size() > 60) name = name.substr(0, 57) + "...";
        for (auto& c : name)
          if (c == '|') c = '/';
        const double d = (*k)["duration_s"].get<double>();
        md << "| `" << name << "` | " << num(d * 1e6) << " | " << num(total > 0 ? 100.0 * d / total : 0.0) << " | "
           << num((*k).value("achieved_flop_per_s", 0.0) * 1e-12) << " | " << num((*k).value("achieved_bytes_per_s", 0.0) * 1e-9)
           << " | " << num((*k).value("sm_throughput_pct", 0.0)) << " | " << num((*k).value("dram_throughput_pct", 0.0))
           << " | " << num((*k).value("achieved_occupancy_pct", 0.0)) << " | " << (*k).value("registers_per_thread", 0)
           << " | " << (*k).value("shared_mem_static_bytes", 0) + (*k).value("shared_mem_dynamic_bytes", 0) << " |\n";
      }
      md << "\n";
    }
  } else if (kind == "account") {
    for (const auto& x : results) {
      md << "## " << str_or(x, "method") << "\n\n| quantity | value |\n|---|---|\n";
      for (const char* k : {"train_flops_per_token_nanochat", "fwd_flops_per_token", "decode_flops_per_token",
                            "activation_bytes_per_token", "kv_cache_bytes_per_token", "state_bytes_per_sequence"})
        if (x.contains(k)) md << "| " << k << " | " << num(x[k].get<double>()) << " |\n";
      if (x.contains("params"))
        for (auto it = x["params"].begin(); it != x["params"].end(); ++it)
          md << "| params." << it.key() << " | " << it.value().dump() << " |\n";
      if (x.contains("audit"))
        for (auto it = x["audit"].begin(); it != x["audit"].end(); ++it)
          if (!it.value().is_object()) md << "| audit." << it.key() << " | " << it.value().dump() << " |\n";
      md << "\n";
    }
  } else {
    // Generic: one row per result with its scalar fields.
    std::vector<std::string> cols;
    for (const auto& x : results)
      for (auto it = x.begin(); it != x.end(); ++it)
        if (!it.value().is_object() && !it.value().is_array() &&
            std::find(cols.begin(), cols.end(), it.key()) == cols.end())
          cols.push_back(it.key());
    md << "|";
    for (const auto& c : cols) md << " " << c << " |";
    md << "\n|";
    for (size_t i = 0; i < cols.size(); ++i) md << "---|";
    md << "\n";
    for (const auto& x : results) {
      md << "|";
      for (const auto& c : cols) md << " " << (x.contains(c) ? (x[c].is_string() ? x[c].get<std::string>() : x[c].dump()) : "") << " |";
      md << "\n";
    }
  }
  return md.str();
}

}  // namespace mixbench
