// Model FLOPs utilisation: the accountant's FLOPs per token × measured tokens/s ÷ the device's matmul
// rate, measured at the start of a run by a short matmul probe in the run's compute dtype (not the
// vendor's datasheet: MFU is a share of what this device actually sustains).
#pragma once
#include <ATen/core/ATen_fwd.h>
#include <c10/core/ScalarType.h>
#include <nlohmann/json.hpp>

#include <string>

namespace mixbench {

struct MatmulPeak {
  std::string device;       // "cuda" or "cpu"
  std::string device_name;  // the GPU's name, or the CPU model
  std::string dtype;        // "bf16", "fp32", ...
  int64_t n = 0;            // the probe's square matmul size
  double flop_per_s = 0;    // the best of the probe's repetitions
};

// Measures (once per process, device (the current GPU) and dtype; later calls return the first measurement) the rate of
// an n×n×n matmul: 8192 in bf16 on a GPU, 1024 in fp32 on the CPU (a few warm-up and timed reps).
const MatmulPeak& matmul_peak(const std::string& device, at::ScalarType dtype);
nlohmann::json matmul_peak_json(const MatmulPeak& p);

// flops_per_token · tokens_per_s / peak; 0 when either is missing.
double mfu(double flops_per_token, double tokens_per_s, const MatmulPeak& peak);

}  // namespace mixbench
