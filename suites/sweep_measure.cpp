#include "suites/sweep_measure.h"
#include "suites/sweep_ranges.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <sstream>

#if defined(MIXBENCH_WITH_CUDA)
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#endif

#include "harness/nvtx.h"

namespace mixbench::sweep_detail {

using Json = nlohmann::json;

namespace {

double quantile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return NAN;
  const double pos = p * double(sorted.size() - 1);
  const size_t lo = size_t(std::floor(pos)), hi = size_t(std::ceil(pos));
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - double(lo));
}

int64_t proc_status_kb(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  const std::string k = std::string(key) + ":";
  while (std::getline(f, line))
    if (line.rfind(k, 0) == 0) {
      std::istringstream ss(line.substr(k.size()));
      int64_t v = -1;
      ss >> v;
      return v;
    }
  return -1;
}

// Linux >= 4.0: writing "5" to clear_refs resets VmHWM to the current RSS.
bool reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  if (!f) return false;
  f << "5";
  f.flush();
  return bool(f);
}

}  // namespace

Json timing_json(std::vector<double> s, int warmup) {
  Json samples = s;
  std::sort(s.begin(), s.end());
  return {{"reps", int64_t(s.size())},
          {"warmup", warmup},
          {"median_s", quantile(s, 0.5)},
          {"min_s", s.front()},
          {"max_s", s.back()},
          {"iqr_s", quantile(s, 0.75) - quantile(s, 0.25)},
          {"samples_s", samples}};
}

Json stream_share_json(const Json& info, const Json& timing, const Json& control_timing) {
  Json r = info;
  const double t = timing.at("median_s").get<double>(), c = control_timing.at("median_s").get<double>();
  r["control_timing"] = control_timing;
  r["time_share"] = t > 0 ? 1.0 - c / t : NAN;
  return r;
}

bool is_oom_message(const std::string& m) {
  return m.find("out of memory") != std::string::npos || m.find("not enough memory") != std::string::npos ||
         m.find("can't allocate memory") != std::string::npos;
}

void sync_device(const std::string& device) {
#if defined(MIXBENCH_WITH_CUDA)
  if (device == "cuda") cudaDeviceSynchronize();
#endif
}

void free_device_cache(const std::string& device) {
#if defined(MIXBENCH_WITH_CUDA)
  if (device == "cuda") {
    cudaDeviceSynchronize();
    c10::cuda::CUDACachingAllocator::emptyCache();
  }
#endif
}

std::vector<double> time_reps(const std::function<void(const std::string&)>& step, const SweepOptions& opt,
                              const std::string& nv) {
  {
    NvtxRange r(sweep_phase_range(nv, "warmup"));
    for (int i = 0; i < opt.warmup; ++i) step(nv);
    sync_device(opt.device);
  }
  std::vector<double> s;
  NvtxRange r(sweep_phase_range(nv, "timed"));
  for (int i = 0; i < opt.reps; ++i) {
#if defined(MIXBENCH_WITH_CUDA)
    if (opt.device == "cuda") {
      cudaEvent_t a, b;
      cudaEventCreate(&a);
      cudaEventCreate(&b);
      cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
      cudaEventRecord(a, stream);
      step(nv);
      cudaEventRecord(b, stream);
      cudaEventSynchronize(b);
      float ms = 0;
      cudaEventElapsedTime(&ms, a, b);
      cudaEventDestroy(a);
      cudaEventDestroy(b);
      s.push_back(double(ms) * 1e-3);
      continue;
    }
#endif
    auto t0 = std::chrono::steady_clock::now();
    step(nv);
    auto t1 = std::chrono::steady_clock::now();
    s.push_back(std::chrono::duration<double>(t1 - t0).count());
  }
  return s;
}

void MemProbe::start() {
#if defined(MIXBENCH_WITH_CUDA)
  if (device == "cuda") {
    cudaDeviceSynchronize();
    int dev = 0;
    cudaGetDevice(&dev);
    c10::cuda::CUDACachingAllocator::resetPeakStats(c10::DeviceIndex(dev));
    auto st = c10::cuda::CUDACachingAllocator::getDeviceStats(c10::DeviceIndex(dev));
    base = st.allocated_bytes[size_t(c10::CachingAllocator::StatType::AGGREGATE)].current;
    reset = true;
    return;
  }
#endif
  base = proc_status_kb("VmRSS") * 1024;
  reset = reset_peak_rss();
}
Json MemProbe::finish() {
#if defined(MIXBENCH_WITH_CUDA)
  if (device == "cuda") {
    cudaDeviceSynchronize();
    int dev = 0;
    cudaGetDevice(&dev);
    auto st = c10::cuda::CUDACachingAllocator::getDeviceStats(c10::DeviceIndex(dev));
    const int64_t peak = st.allocated_bytes[size_t(c10::CachingAllocator::StatType::AGGREGATE)].peak;
    return {{"source", "cuda_allocator"}, {"peak_bytes", peak}, {"delta_bytes", std::max<int64_t>(0, peak - base)},
            {"peak_reset", true}};
  }
#endif
  const int64_t hwm = proc_status_kb("VmHWM") * 1024;
  const int64_t rss = proc_status_kb("VmRSS") * 1024;
  // Without a reset VmHWM is the process-lifetime peak; the RSS delta is then the honest number.
  const int64_t delta = reset ? hwm - base : rss - base;
  return {{"source", "vmhwm"}, {"peak_bytes", std::max<int64_t>(0, hwm)}, {"delta_bytes", std::max<int64_t>(0, delta)},
          {"peak_reset", reset}};
}

std::string fmt_bytes(double b) {
  if (b >= 1024.0 * 1024 * 1024) return fmt::format("{:.2f} GiB", b / (1024.0 * 1024 * 1024));
  if (b >= 1024.0 * 1024) return fmt::format("{:.1f} MiB", b / (1024.0 * 1024));
  return fmt::format("{:.0f} KiB", b / 1024.0);
}

}  // namespace mixbench::sweep_detail
