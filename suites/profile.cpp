#include "suites/profile.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <sstream>

#include "harness/backbone.h"
#include "harness/errors.h"
#include "harness/io.h"
#include "harness/registry.h"
#include "harness/report.h"
#include <algorithm>
#include "suites/sweep.h"
#include "suites/sweep_ranges.h"

namespace mixbench {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

// The method whose sweep runs an op: the first registered method that calls it.
const MethodSpec& method_for_op(const std::string& op) {
  Registry& reg = Registry::get();
  reg.op(op);  // unknown op → UsageError with suggestions
  for (const MethodSpec* m : reg.methods())
    for (const auto& o : m->ops)
      if (o == op && !m->is_hybrid()) return *m;
  throw UsageError(fmt::format("op '{}' is called by no registered method, so no sweep point runs it", op));
}

// Splits one CSV line with quoted fields ("" inside quotes is a quote).
std::vector<std::string> csv_fields(const std::string& line) {
  std::vector<std::string> out;
  std::string cur;
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        cur += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        cur += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      out.push_back(cur);
      cur.clear();
    } else if (c != '\r') {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

double parse_number(const std::string& s) {
  std::string t;
  for (char c : s)
    if (c != ',') t += c;
  if (t.empty() || t == "n/a") return 0;
  try {
    size_t used = 0;
    double v = std::stod(t, &used);
    return used == t.size() ? v : NAN;
  } catch (const std::exception&) {
    return NAN;
  }
}

// Scale of a unit to seconds or bytes; 1 for units it does not know (%, inst, counts).
double unit_scale(const std::string& u) {
  static const std::map<std::string, double> k = {
      {"ns", 1e-9},         {"nsecond", 1e-9},   {"us", 1e-6},           {"usecond", 1e-6},
      {"ms", 1e-3},         {"msecond", 1e-3},   {"s", 1.0},             {"second", 1.0},
      {"byte", 1.0},        {"Kbyte", 1e3},      {"Mbyte", 1e6},         {"Gbyte", 1e9},
      {"Tbyte", 1e12},      {"KB", 1e3},         {"MB", 1e6},            {"GB", 1e9}};
  auto it = k.find(u.substr(0, u.find('/')));  // "Kbyte/block" scales as "Kbyte"
  return it == k.end() ? 1.0 : it->second;
}

const std::vector<std::string>& flop_metrics_x2() {  // fused multiply-adds: two FLOPs each
  static const std::vector<std::string> v = {"sm__sass_thread_inst_executed_op_ffma_pred_on.sum",
                                             "sm__sass_thread_inst_executed_op_dfma_pred_on.sum"};
  return v;
}
const std::vector<std::string>& flop_metrics_x1() {
  static const std::vector<std::string> v = {"sm__sass_thread_inst_executed_op_fadd_pred_on.sum",
                                             "sm__sass_thread_inst_executed_op_fmul_pred_on.sum",
                                             "sm__sass_thread_inst_executed_op_dadd_pred_on.sum",
                                             "sm__sass_thread_inst_executed_op_dmul_pred_on.sum"};
  return v;
}
// Tensor-core math ops (an FMA counts two: a 2048³ bf16 GEMM reads 2·2048³ on the H200).
const std::vector<std::string>& tensor_metrics() {
  static const std::vector<std::string> v = {"sm__ops_path_tensor_src_bf16_dst_fp32.sum", "sm__ops_path_tensor_src_fp16.sum",
                                             "sm__ops_path_tensor_src_tf32_dst_fp32.sum", "sm__ops_path_tensor_src_fp64.sum"};
  return v;
}
const std::vector<std::string>& other_metrics() {
  static const std::vector<std::string> v = {
      "gpu__time_duration.sum",
      "dram__bytes_read.sum",
      "dram__bytes_write.sum",
      "sm__throughput.avg.pct_of_peak_sustained_elapsed",
      "dram__throughput.avg.pct_of_peak_sustained_elapsed",
      "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
      "sm__warps_active.avg.pct_of_peak_sustained_active",
      "launch__registers_per_thread",
      "launch__shared_mem_per_block_static",
      "launch__shared_mem_per_block_dynamic",
      "launch__block_size",
      "launch__grid_size"};
  return v;
}

// An executable by name: as given when it holds a '/', else on PATH, else in /usr/local/cuda/bin.
std::string find_executable(const std::string& name) {
  auto runnable = [](const fs::path& p) { return ::access(p.c_str(), X_OK) == 0 && fs::is_regular_file(p); };
  if (name.find('/') != std::string::npos) return runnable(name) ? name : "";
  if (const char* path = std::getenv("PATH")) {
    std::stringstream ss(path);
    std::string dir;
    while (std::getline(ss, dir, ':'))
      if (!dir.empty() && runnable(fs::path(dir) / name)) return (fs::path(dir) / name).string();
  }
  const fs::path cuda = fs::path("/usr/local/cuda/bin") / name;
  return runnable(cuda) ? cuda.string() : "";
}

// Runs argv with stdout to `out_path` ("" = inherited); returns the exit status.
int run_process(const std::vector<std::string>& argv, const std::string& out_path) {
  pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    if (!out_path.empty()) {
      if (!std::freopen(out_path.c_str(), "w", stdout)) ::_exit(127);
    }
    std::vector<char*> a;
    for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    ::execv(a[0], a.data());
    ::_exit(127);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

const std::vector<std::string>& profile_phases() {
  static const std::vector<std::string> p = {"forward", "backward", "decode", "train"};
  return p;
}

ProfilePlan profile_plan(const ProfileOptions& opt) {
  if (opt.method.empty() == opt.op.empty()) throw UsageError("profile needs exactly one of --method NAME and --op NAME");
  const auto& phases = profile_phases();
  if (std::find(phases.begin(), phases.end(), opt.phase) == phases.end()) {
    auto near = closest_names(opt.phase, phases);
    throw UsageError(fmt::format("unknown phase '{}' (use forward, backward, decode or train{})", opt.phase,
                                 near.empty() ? "" : "; did you mean " + near[0] + "?"));
  }
  if (opt.batch < 1 || opt.seq_len < 1) throw UsageError("--batch and --seq-len must be positive");
  if (opt.launch_count < 1) throw UsageError("--launch-count must be positive");
  ProfilePlan p;
  std::string sweep_method, subject;
  if (!opt.op.empty()) {
    if (opt.phase == "decode" || opt.phase == "train")
      throw UsageError(fmt::format("an op has phases forward and backward, not {}", opt.phase));
    sweep_method = method_for_op(opt.op).name;
    const OpSpec& spec = Registry::get().op(opt.op);
    if (opt.phase == "backward" &&
        std::none_of(spec.inputs.begin(), spec.inputs.end(), [](const TensorDef& d) { return d.differentiable; }))
      throw UsageError(fmt::format("op '{}' has no backward (none of its inputs is differentiable)", opt.op));
    subject = opt.op;
    p.level = "op";
  } else {
    const MethodSpec& m = Registry::get().method(opt.method);
    sweep_method = m.name;
    subject = m.name;
    if (opt.phase == "decode" || opt.phase == "train" || m.is_hybrid()) p.level = "model";
    else p.level = "layer";
    if (opt.phase == "decode") {
      Config cfg = m.config.defaults();
      bool decodes = true;
      for (const auto& l : layer_methods(m, cfg)) decodes = decodes && l.method->has_decode();
      if (!decodes) throw UsageError(fmt::format("method {} registers no decode path", m.name));
    }
  }
  p.mode = opt.phase == "forward" ? "prefill" : opt.phase == "decode" ? "decode" : "train";
  p.point_range = sweep_point_range(subject, p.mode, opt.batch, opt.seq_len);
  const std::string inner = opt.phase == "train" ? "timed" : opt.phase == "forward" ? "forward" : opt.phase;
  p.range_path = {sweep_phase_range(p.point_range, "timed")};
  if (inner != "timed") p.range_path.push_back(sweep_phase_range(p.point_range, inner));
  p.nvtx_include = "mixbench@";
  for (const auto& r : p.range_path) p.nvtx_include += r + "/";
  p.sweep_args = {"sweep",     "--mode",   p.mode,     "--level",   p.level,
                  "--methods", sweep_method, "--lengths", std::to_string(opt.seq_len), "--batch",
                  std::to_string(opt.batch), "--device", opt.device, "--dtype", opt.dtype,
                  "--preset",  opt.preset, "--reps", "1", "--warmup", "1", "--quiet"};
  if (!opt.config.empty()) {
    p.sweep_args.push_back("--config");
    p.sweep_args.push_back(opt.config);
  }
  return p;
}

bool nvtx_stack_matches(const std::vector<std::string>& stack, const std::vector<std::string>& path) {
  if (path.empty() || stack.size() < path.size()) return false;
  for (size_t s = 0; s + path.size() <= stack.size(); ++s) {
    bool ok = true;
    for (size_t k = 0; k < path.size() && ok; ++k) ok = stack[s + k] == path[k];
    if (ok) return true;
  }
  return false;
}

std::string profile_metrics() {
  std::string m;
  for (const auto* v : {&other_metrics(), &flop_metrics_x2(), &flop_metrics_x1(), &tensor_metrics()})
    for (const auto& s : *v) m += (m.empty() ? "" : ",") + s;
  return m;
}

std::vector<KernelProfile> parse_ncu_raw_csv(const std::string& text) {
  std::vector<std::vector<std::string>> rows;
  std::stringstream ss(text);
  std::string line;
  while (std::getline(ss, line)) {
    if (line.empty() || line.rfind("==", 0) == 0) continue;  // ncu's own messages
    auto f = csv_fields(line);
    if (f.size() > 3) rows.push_back(std::move(f));
  }
  if (rows.empty()) throw InputError("ncu produced no CSV rows (was any kernel profiled?)");
  const auto& head = rows[0];
  std::map<std::string, size_t> col;
  for (size_t i = 0; i < head.size(); ++i) col[head[i]] = i;
  auto need = [&](const std::string& n) {
    auto it = col.find(n);
    if (it == col.end()) throw InputError(fmt::format("ncu CSV lacks the column '{}'", n));
    return it->second;
  };
  const size_t c_name = need("Kernel Name");
  size_t c_nvtx = SIZE_MAX;
  for (const auto& [n, i] : col)
    if (n.rfind("thread Domain:Push/Pop_Range", 0) == 0) c_nvtx = i;
  for (const auto& m : other_metrics()) need(m);
  // the units row follows the header (its "ID" cell is empty)
  std::vector<std::string> units(head.size());
  size_t first = 1;
  if (rows.size() > 1 && rows[1][need("ID")].empty()) {
    units = rows[1];
    units.resize(head.size());
    first = 2;
  }
  auto value = [&](const std::vector<std::string>& r, const std::string& metric) -> double {
    auto it = col.find(metric);
    if (it == col.end() || it->second >= r.size()) return 0;  // optional metrics may be absent
    const double v = parse_number(r[it->second]);
    if (std::isnan(v)) throw InputError(fmt::format("ncu CSV: '{}' is not a number in column {}", r[it->second], metric));
    return v * unit_scale(units[it->second]);
  };
  std::vector<KernelProfile> out;
  for (size_t i = first; i < rows.size(); ++i) {
    const auto& r = rows[i];
    if (r.size() < head.size()) throw InputError(fmt::format("ncu CSV row {} has {} fields, the header {}", i, r.size(), head.size()));
    KernelProfile k;
    k.name = r[c_name];
    if (c_nvtx != SIZE_MAX) k.nvtx = r[c_nvtx];
    k.duration_s = value(r, "gpu__time_duration.sum");
    for (const auto& m : flop_metrics_x2()) k.flops += 2.0 * value(r, m);
    for (const auto& m : flop_metrics_x1()) k.flops += value(r, m);
    for (const auto& m : tensor_metrics()) k.tensor_flops += value(r, m);
    k.flops += k.tensor_flops;
    k.dram_bytes = value(r, "dram__bytes_read.sum") + value(r, "dram__bytes_write.sum");
    k.sm_pct = value(r, "sm__throughput.avg.pct_of_peak_sustained_elapsed");
    k.dram_pct = value(r, "dram__throughput.avg.pct_of_peak_sustained_elapsed");
    k.memory_pct = value(r, "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed");
    k.achieved_occupancy_pct = value(r, "sm__warps_active.avg.pct_of_peak_sustained_active");
    k.registers_per_thread = std::llround(value(r, "launch__registers_per_thread"));
    k.shared_mem_static = std::llround(value(r, "launch__shared_mem_per_block_static"));
    k.shared_mem_dynamic = std::llround(value(r, "launch__shared_mem_per_block_dynamic"));
    k.block_size = std::llround(value(r, "launch__block_size"));
    k.grid_size = std::llround(value(r, "launch__grid_size"));
    out.push_back(std::move(k));
  }
  return out;
}

double profile_accountant_flops(const ProfileOptions& opt) {
  if (!opt.op.empty()) return NAN;  // ops have no accountant
  const MethodSpec& m = Registry::get().method(opt.method);
  SweepOptions so = sweep_preset(opt.preset);
  so.dtype = opt.dtype;
  if (!opt.config.empty()) so.config += (so.config.empty() ? "" : ",") + opt.config;
  const Config cfg = m.config.parse(so.config).with("seq_len", opt.seq_len);  // as the sweep builds it
  CostQuery q;
  q.T = opt.seq_len;
  q.context = opt.seq_len;
  const ModelCost mc = account_model(m, cfg, q);
  const double tokens = double(opt.batch * opt.seq_len);
  if (opt.phase == "decode") return mc.decode_flops * double(opt.batch);
  if (opt.phase == "train") return 3.0 * (mc.fwd_flops + mc.aux_route_fwd_flops) * tokens;
  // layer level: layer 0's mixer and the backbone's share of one layer are not split by the
  // accountant, so the layer's own forward FLOPs are used (the MLP is not part of a layer unit)
  const LayerCost& l0 = mc.layers.front();
  const double fwd = l0.fwd_flops * tokens;
  return opt.phase == "backward" ? 2.0 * fwd : fwd;
}

Json profile_report(const ProfileOptions& opt, const ProfilePlan& plan, const std::vector<KernelProfile>& kernels,
                    double accountant_flops) {
  Json ks = Json::array();
  double t = 0, flops = 0, bytes = 0;
  for (const auto& k : kernels) {
    ks.push_back({{"name", k.name},
                  {"nvtx", k.nvtx},
                  {"duration_s", k.duration_s},
                  {"flops", k.flops},
                  {"tensor_flops", k.tensor_flops},
                  {"dram_bytes", k.dram_bytes},
                  {"achieved_flop_per_s", k.duration_s > 0 ? k.flops / k.duration_s : 0.0},
                  {"achieved_bytes_per_s", k.duration_s > 0 ? k.dram_bytes / k.duration_s : 0.0},
                  {"sm_throughput_pct", k.sm_pct},
                  {"dram_throughput_pct", k.dram_pct},
                  {"memory_throughput_pct", k.memory_pct},
                  {"achieved_occupancy_pct", k.achieved_occupancy_pct},
                  {"registers_per_thread", k.registers_per_thread},
                  {"shared_mem_static_bytes", k.shared_mem_static},
                  {"shared_mem_dynamic_bytes", k.shared_mem_dynamic},
                  {"block_size", k.block_size},
                  {"grid_size", k.grid_size}});
    t += k.duration_s;
    flops += k.flops;
    bytes += k.dram_bytes;
  }
  Json acc = nullptr, ratio = nullptr;
  if (std::isfinite(accountant_flops) && accountant_flops > 0 && int64_t(kernels.size()) < opt.launch_count) {
    acc = accountant_flops;
    ratio = flops / accountant_flops;
  }
  return {{"subject", opt.op.empty() ? opt.method : opt.op},
          {"subject_kind", opt.op.empty() ? "method" : "op"},
          {"phase", opt.phase},
          {"shape", {{"B", opt.batch}, {"T", opt.seq_len}}},
          {"dtype", opt.dtype},
          {"level", plan.level},
          {"sweep_mode", plan.mode},
          {"nvtx_include", plan.nvtx_include},
          {"kernels", ks},
          {"totals", {{"kernels", kernels.size()}, {"duration_s", t}, {"flops", flops}, {"dram_bytes", bytes}}},
          // ncu stopped at --launch-count: the totals (and the ratio) cover only the first kernels
          {"launch_count_reached", int64_t(kernels.size()) >= opt.launch_count},
          {"accountant_flops", acc},
          {"measured_over_accountant_flops", ratio}};
}

int run_profile(const ProfileOptions& opt, const std::string& self, const std::vector<std::string>& command) {
  ProfilePlan plan = profile_plan(opt);  // bad input fails before looking for tools
  const std::string ncu = find_executable(opt.ncu);
  if (ncu.empty())
    throw UsageError(fmt::format("'{}' (Nsight Compute) was not found on PATH or in /usr/local/cuda/bin; install it or pass --ncu PATH",
                                 opt.ncu));
  std::string nsys;
  if (opt.timeline) {
    nsys = find_executable("nsys");
    if (nsys.empty()) throw UsageError("--timeline needs nsys (Nsight Systems), which was not found on PATH or in /usr/local/cuda/bin");
  }
  const std::string out = opt.out.empty() ? "profile.json" : opt.out;
  const fs::path base = fs::path(out).replace_extension("");
  const std::string rep = base.string() + ".ncu-rep";
  const std::string sweep_json = base.string() + ".sweep.json.tmp";
  std::vector<std::string> work = {self};
  for (const auto& a : plan.sweep_args) work.push_back(a);
  work.push_back("--out");
  work.push_back(sweep_json);
  std::vector<std::string> argv = {ncu, "--nvtx", "--nvtx-push-pop-scope", "process", "--nvtx-include", plan.nvtx_include,
                                   "--launch-count", std::to_string(opt.launch_count), "--metrics", profile_metrics(),
                                   "-f", "-o", base.string()};
  argv.insert(argv.end(), work.begin(), work.end());
  std::cerr << "profile: " << fmt::format("{}", fmt::join(argv, " ")) << "\n";
  int rc = run_process(argv, "");
  std::error_code ec;
  fs::remove(sweep_json, ec);
  if (rc != 0) {
    // ncu passes on the profiled program's exit status: a failed sweep point is a failed run
    std::string work_line = "mixbench";
    for (const auto& a : plan.sweep_args) work_line += " " + a;
    std::cerr << fmt::format("profile: ncu or the profiled work exited with {}; run the work alone to see its error:\n  {}\n",
                             rc, work_line);
    return 1;
  }
  if (!fs::exists(rep)) {
    std::cerr << fmt::format("profile: ncu wrote no report {}: no kernel ran inside {}\n", rep, plan.nvtx_include);
    return 1;
  }
  const std::string csv = base.string() + ".csv.tmp";
  rc = run_process({ncu, "--import", rep, "--csv", "--page", "raw"}, csv);
  if (rc != 0) throw std::runtime_error(fmt::format("ncu --import {} exited with {}", rep, rc));
  const std::vector<KernelProfile> kernels = parse_ncu_raw_csv(read_file(csv));
  fs::remove(csv, ec);
  if (opt.timeline) {
    std::vector<std::string> ns = {nsys, "profile", "--trace=cuda,nvtx", "-f", "true", "-o", base.string()};
    ns.insert(ns.end(), work.begin(), work.end());
    rc = run_process(ns, "");
    fs::remove(sweep_json, ec);
    if (rc != 0) throw std::runtime_error(fmt::format("nsys exited with {}", rc));
  }
  Json result = profile_report(opt, plan, kernels, profile_accountant_flops(opt));
  result["status"] = kernels.empty() ? "fail" : "pass";
  result["ncu_report"] = fs::path(rep).filename().string();
  result["ncu_command"] = fmt::format("{}", fmt::join(argv, " "));
  RunInfo info;
  info.kind = "profile";
  info.argv = command;
  info.config = {{"ncu", ncu}, {"launch_count", opt.launch_count}, {"preset", opt.preset}, {"device", opt.device}};
  Json report = make_report(info, Json::array({result}));
  write_report(out, report);
  std::cout << fmt::format("{} kernels of {} {} profiled → {} ({})\n", kernels.size(), result["subject"].get<std::string>(),
                           opt.phase, out, rep);
  return kernels.empty() ? 1 : 0;
}

}  // namespace mixbench
