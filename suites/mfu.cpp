#include "suites/mfu.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#if defined(MIXBENCH_WITH_CUDA)
#include <ATen/cuda/CUDAContext.h>
#endif

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "harness/metrics.h"
#include "harness/report.h"
#include "suites/sweep_measure.h"

namespace mixbench {

namespace {
int current_gpu() {
#if defined(MIXBENCH_WITH_CUDA)
  return at::cuda::current_device();
#else
  return 0;
#endif
}

MatmulPeak probe(const std::string& device, at::ScalarType dtype) {
  MatmulPeak p;
  p.device = device;
  p.dtype = dtype_name(dtype);
  const bool gpu = device == "cuda";
  p.n = gpu ? 8192 : 1024;
#if defined(MIXBENCH_WITH_CUDA)
  p.device_name = gpu ? at::cuda::getCurrentDeviceProperties()->name : cpu_model();
#else
  p.device_name = cpu_model();
#endif
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(0);
  const auto opts = at::TensorOptions().dtype(at::kFloat);
  const at::Device dev = gpu ? at::Device(at::kCUDA, current_gpu()) : at::Device(at::kCPU);
  at::Tensor a = at::randn({p.n, p.n}, gen, opts).to(dev, dtype);
  at::Tensor b = at::randn({p.n, p.n}, gen, opts).to(dev, dtype);
  at::Tensor c = at::empty({p.n, p.n}, a.options());
  const int warm = gpu ? 5 : 1, reps = gpu ? 20 : 3, per = gpu ? 10 : 1;  // per: matmuls per timed rep
  for (int i = 0; i < warm; ++i) at::mm_out(c, a, b);
  sweep_detail::sync_device(device);
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < per; ++i) at::mm_out(c, a, b);
    sweep_detail::sync_device(device);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 2.0 * double(p.n) * double(p.n) * double(p.n) * per / s);
  }
  p.flop_per_s = best;
  return p;
}
}  // namespace

const MatmulPeak& matmul_peak(const std::string& device, at::ScalarType dtype) {
  static std::mutex mu;
  static std::map<std::tuple<std::string, int, int>, MatmulPeak> cache;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(device, int(dtype), device == "cuda" ? current_gpu() : -1);
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, probe(device, dtype)).first;
  return it->second;
}

nlohmann::json matmul_peak_json(const MatmulPeak& p) {
  return {{"device", p.device}, {"device_name", p.device_name}, {"dtype", p.dtype}, {"n", p.n},
          {"flop_per_s", p.flop_per_s}};
}

namespace {
CopyBandwidth probe_copy(const std::string& device) {
  CopyBandwidth b;
  b.device = device;
  const bool gpu = device == "cuda";
#if defined(MIXBENCH_WITH_CUDA)
  b.device_name = gpu ? at::cuda::getCurrentDeviceProperties()->name : cpu_model();
#else
  b.device_name = cpu_model();
#endif
  b.bytes = gpu ? (int64_t(1) << 30) : (int64_t(256) << 20);
  const at::Device dev = gpu ? at::Device(at::kCUDA, current_gpu()) : at::Device(at::kCPU);
  const auto opts = at::TensorOptions().dtype(at::kByte).device(dev);
  at::Tensor src = at::ones({b.bytes}, opts);  // written once, so its pages are resident before timing
  at::Tensor dst = at::zeros({b.bytes}, opts);
  const int warm = gpu ? 3 : 1;
  b.reps = gpu ? 10 : 3;
  for (int i = 0; i < warm; ++i) dst.copy_(src);
  sweep_detail::sync_device(device);
  double best = 0;
  for (int r = 0; r < b.reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    dst.copy_(src);
    sweep_detail::sync_device(device);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > 0) best = std::max(best, 2.0 * double(b.bytes) / s);
  }
  b.bytes_per_s = best;
  return b;
}
}  // namespace

const CopyBandwidth& copy_bandwidth(const std::string& device) {
  static std::mutex mu;
  static std::map<std::pair<std::string, int>, CopyBandwidth> cache;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(device, device == "cuda" ? current_gpu() : -1);
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, probe_copy(device)).first;
  return it->second;
}

nlohmann::json copy_bandwidth_json(const CopyBandwidth& b) {
  return {{"device", b.device}, {"device_name", b.device_name}, {"bytes", b.bytes}, {"reps", b.reps},
          {"bytes_per_s", b.bytes_per_s}, {"convention", "at::copy_ between two byte tensors on the device, best "
                                                         "repetition, bytes read + bytes written"}};
}

double roofline_share(double bytes, double seconds, double bytes_per_s) {
  if (!(bytes > 0) || !(seconds > 0) || !(bytes_per_s > 0)) return 0;
  return bytes / seconds / bytes_per_s;
}

nlohmann::json roofline_json(double weight_bytes, double embedding_row_bytes, double cache_bytes, double median_s,
                             double copy_bytes_per_s) {
  const double bytes = weight_bytes + embedding_row_bytes + cache_bytes;
  return {{"bytes", bytes},
          {"bytes_formula", "weight_bytes + embedding_row_bytes + cache_bytes"},
          {"weight_bytes", weight_bytes},
          {"embedding_row_bytes", embedding_row_bytes},
          {"cache_bytes", cache_bytes},
          {"copy_bytes_per_s", copy_bytes_per_s},
          {"share", roofline_share(bytes, median_s, copy_bytes_per_s)}};
}

double mfu(double flops_per_token, double tokens_per_s, const MatmulPeak& peak) {
  if (!(flops_per_token > 0) || !(tokens_per_s > 0) || !(peak.flop_per_s > 0)) return 0;
  return flops_per_token * tokens_per_s / peak.flop_per_s;
}

}  // namespace mixbench
