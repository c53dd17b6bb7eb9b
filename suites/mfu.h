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

// The memory roofline of a decode step: the bandwidth of a device-to-device tensor copy, measured like
// the matmul peak (once per process and device, best of several repetitions), counting the bytes read
// plus the bytes written.
struct CopyBandwidth {
  std::string device;       // "cuda" or "cpu"
  std::string device_name;  // the GPU's name, or the CPU model
  int64_t bytes = 0;        // the copied tensor's size (1 GiB on a GPU, 256 MiB on the CPU)
  int reps = 0;             // timed repetitions, the best counts
  double bytes_per_s = 0;   // 2·bytes / the best repetition's seconds
};

// Measures (once per process and device (the current GPU); later calls return the first
// measurement) the bandwidth of at::copy_ between two byte tensors on the device.
const CopyBandwidth& copy_bandwidth(const std::string& device);
nlohmann::json copy_bandwidth_json(const CopyBandwidth& b);

// The share of the bandwidth roofline a step achieves: bytes / seconds / bytes_per_s; 0 when any
// is missing or not positive.
double roofline_share(double bytes, double seconds, double bytes_per_s);
// A decode point's `roofline` block: bytes (weight_bytes + embedding_row_bytes + cache_bytes), its
// parts, copy_bytes_per_s and share = bytes / median_s / copy_bytes_per_s.
nlohmann::json roofline_json(double weight_bytes, double embedding_row_bytes, double cache_bytes, double median_s,
                             double copy_bytes_per_s);

}  // namespace mixbench
