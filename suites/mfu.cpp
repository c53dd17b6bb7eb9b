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

double mfu(double flops_per_token, double tokens_per_s, const MatmulPeak& peak) {
  if (!(flops_per_token > 0) || !(tokens_per_s > 0) || !(peak.flop_per_s > 0)) return 0;
  return flops_per_token * tokens_per_s / peak.flop_per_s;
}

}  // namespace mixbench
