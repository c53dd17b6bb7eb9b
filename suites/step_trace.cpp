#include "suites/step_trace.h"

#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <regex>
#include <set>

namespace mixbench {

using Json = nlohmann::json;

std::string kernel_kind(const std::string& n) {
  static const std::vector<std::pair<std::string, std::regex>> kinds = {
      {"elementwise", std::regex("rope_|short_conv", std::regex::icase)},  // mixbench's fused element-wise kernels
      {"attention", std::regex("flash|fmha|attention|sdpa|softmax", std::regex::icase)},
      {"linear_attention", std::regex("chunk|delta|gla|wy_|recurrent|mixbench", std::regex::icase)},
      {"matmul", std::regex("gemm|xmma|cutlass|nvjet|cublas|sm90_|sm80_|ampere_|wgmma|splitK", std::regex::icase)},
      {"optimizer", std::regex("adam|foreach|lerp|multi_tensor", std::regex::icase)},
      {"copy", std::regex("copy|memcpy|memset|cat_|CatArray|fill|index|gather|scatter", std::regex::icase)},
      {"reduction", std::regex("reduce|norm|sum|mean|max|min|cross_entropy|nll|log_softmax", std::regex::icase)},
      {"elementwise", std::regex("elementwise|vectorized|unrolled|pointwise|activation|tanh|relu|mul|add", std::regex::icase)},
  };
  for (const auto& [kind, re] : kinds)
    if (std::regex_search(n, re)) return kind;
  return "other";
}

Json summarize_kernels(const std::vector<KernelTime>& kernels, double wall_s, int64_t steps, int top) {
  std::map<std::string, KernelTime> by_name;
  std::map<std::string, double> by_kind;
  std::map<std::string, std::pair<int64_t, double>> by_op;
  double total = 0;
  for (const auto& k : kernels) {
    auto& o = by_op[k.op.empty() ? "(unattributed)" : k.op];
    o.first += k.calls;
    o.second += k.seconds;
    KernelTime& t = by_name[k.name];
    t.name = k.name;
    t.calls += k.calls;
    t.seconds += k.seconds;
    by_kind[kernel_kind(k.name)] += k.seconds;
    total += k.seconds;
  }
  std::vector<KernelTime> sorted;
  for (auto& [n, t] : by_name) sorted.push_back(t);
  std::sort(sorted.begin(), sorted.end(), [](const KernelTime& a, const KernelTime& b) { return a.seconds > b.seconds; });
  const double w = wall_s > 0 ? wall_s : 1;
  Json kinds = Json::object();
  for (const auto& [k, s] : by_kind) kinds[k] = {{"seconds", s}, {"share_of_wall", s / w}};
  Json topj = Json::array();
  for (int i = 0; i < int(sorted.size()) && i < top; ++i)
    topj.push_back({{"name", sorted[i].name}, {"kind", kernel_kind(sorted[i].name)}, {"calls", sorted[i].calls},
                    {"seconds", sorted[i].seconds}, {"share_of_wall", sorted[i].seconds / w}});
  std::vector<std::pair<std::string, std::pair<int64_t, double>>> ops(by_op.begin(), by_op.end());
  std::sort(ops.begin(), ops.end(), [](const auto& a, const auto& b) { return a.second.second > b.second.second; });
  Json opj = Json::array();
  for (int i = 0; i < int(ops.size()) && i < top; ++i)
    opj.push_back({{"op", ops[i].first}, {"kernels", ops[i].second.first}, {"seconds", ops[i].second.second},
                   {"share_of_wall", ops[i].second.second / w}});
  int64_t calls = 0;
  for (const auto& k : kernels) calls += k.calls;
  return {{"steps", steps},          {"wall_s", wall_s}, {"kernel_s", total}, {"busy", total / w},
          {"kernels_per_step", steps > 0 ? double(calls) / double(steps) : 0.0},
          {"by_kind", kinds},        {"top", topj}, {"top_ops", opj}};
}

StepTrace::StepTrace() = default;
StepTrace::~StepTrace() {
  if (active_) torch::autograd::profiler::disableProfiler();
}

void StepTrace::start(bool cuda) {
  using torch::profiler::impl::ActivityType;
  using torch::profiler::impl::ProfilerConfig;
  using torch::profiler::impl::ProfilerState;
  cuda_ = cuda;
  std::set<ActivityType> acts{ActivityType::CPU};
  if (cuda) acts.insert(ActivityType::CUDA);
  ProfilerConfig cfg(ProfilerState::KINETO);
  torch::autograd::profiler::prepareProfiler(cfg, acts);
  torch::autograd::profiler::enableProfiler(cfg, acts);
  active_ = true;
}

Json StepTrace::stop(const std::string& path, double wall_s, int64_t steps) {
  if (!active_) return Json();
  active_ = false;
  std::unique_ptr<torch::autograd::profiler::ProfilerResult> res = torch::autograd::profiler::disableProfiler();
  std::vector<KernelTime> ks;
  std::map<uint64_t, std::string> op_of;  // CPU operator by correlation id (its kernels link to it)
  for (const auto& e : res->events())
    if (e.deviceType() != c10::DeviceType::CUDA && e.correlationId() != 0) op_of[e.correlationId()] = e.name();
  for (const auto& e : res->events()) {
    const bool gpu = e.deviceType() == c10::DeviceType::CUDA;
    if (cuda_ != gpu) continue;
    if (!cuda_ && e.name().rfind("aten::", 0) != 0) continue;
    auto it = gpu ? op_of.find(e.linkedCorrelationId()) : op_of.end();
    ks.push_back({e.name(), it == op_of.end() ? "" : it->second, 1, double(e.durationNs()) * 1e-9});
  }
  if (!path.empty()) {
    const std::filesystem::path p(path);
    if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
    const std::string tmp = path + ".tmp";
    res->save(tmp);
    std::filesystem::rename(tmp, path);
  }
  Json s = summarize_kernels(ks, wall_s, steps);
  s["device"] = cuda_ ? "cuda" : "cpu";
  s["trace"] = path.empty() ? Json() : Json(path);
  return s;
}

}  // namespace mixbench
