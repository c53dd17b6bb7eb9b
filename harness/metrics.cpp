#include "harness/metrics.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include <fmt/format.h>

#include "harness/errors.h"

namespace mixbench {

Comparison compare(const at::Tensor& ref_in, const at::Tensor& x_in) {
  Comparison c;
  if (ref_in.sizes() != x_in.sizes()) {
    c.shape_ok = false;
    c.rel_rms = c.max_abs = std::numeric_limits<double>::infinity();
    return c;
  }
  at::Tensor ref = ref_in.detach().to(at::kCPU, at::kDouble);
  at::Tensor x = x_in.detach().to(at::kCPU, at::kDouble);
  c.finite = x.numel() == 0 || at::isfinite(x).all().item<bool>();
  if (!c.finite) {
    c.rel_rms = c.max_abs = std::numeric_limits<double>::infinity();
    return c;
  }
  if (x.numel() == 0) return c;
  at::Tensor diff = ref - x;
  double rms_diff = diff.pow(2).mean().sqrt().item<double>();
  double rms_ref = ref.pow(2).mean().sqrt().item<double>();
  // A reference that is identically zero up to rounding (a structurally zero gradient such as dq at
  // T = 1, where every softmax has one entry) has no scale to be relative to: the error is then
  // the absolute RMS difference, held to the same threshold.
  c.absolute = rms_ref < kZeroReference;
  c.rel_rms = c.absolute ? rms_diff : rms_diff / (rms_ref + 1e-8);
  c.max_abs = diff.abs().max().item<double>();
  return c;
}

Comparison compare_selection(const at::Tensor& ref_in, const at::Tensor& x_in) {
  Comparison c;
  if (ref_in.sizes() != x_in.sizes() || ref_in.dim() == 0) {
    c.shape_ok = false;
    c.rel_rms = c.max_abs = std::numeric_limits<double>::infinity();
    return c;
  }
  if (ref_in.numel() == 0) return c;
  const int64_t k = ref_in.size(-1);
  at::Tensor ref = std::get<0>(ref_in.detach().to(at::kCPU, at::kLong).reshape({-1, k}).sort(-1));
  at::Tensor x = std::get<0>(x_in.detach().to(at::kCPU, at::kLong).reshape({-1, k}).sort(-1));
  at::Tensor differ = (ref != x).sum(-1);  // [rows]
  c.rel_rms = (differ > 0).to(at::kDouble).mean().item<double>();
  c.max_abs = double(differ.max().item<int64_t>());
  return c;
}

// Thresholds on the relative RMS error. Outputs and gradients of an optimized path computed in
// the given dtype, against the FP64 reference on the same (dtype-rounded) inputs.
double threshold(const std::string& dtype, TensorKind kind) {
  if (dtype == "fp64") return 1e-10;
  if (dtype == "fp32") return 1e-5;
  if (dtype == "tf32") return 1e-3;
  if (dtype == "bf16" || dtype == "fp16") return kind == TensorKind::Output ? 5e-3 : 1e-2;
  throw UsageError(fmt::format("no threshold for dtype '{}'", dtype));
}

nlohmann::json threshold_table() {
  nlohmann::json t = nlohmann::json::object();
  for (const char* d : {"fp64", "fp32", "tf32", "bf16", "fp16"})
    t[d] = {{"output", threshold(d, TensorKind::Output)}, {"gradient", threshold(d, TensorKind::Gradient)}};
  return t;
}

at::ScalarType parse_dtype(const std::string& name) {
  if (name == "fp64" || name == "float64") return at::kDouble;
  if (name == "fp32" || name == "float32") return at::kFloat;
  if (name == "bf16" || name == "bfloat16") return at::kBFloat16;
  if (name == "fp16" || name == "float16") return at::kHalf;
  throw UsageError(fmt::format("unknown dtype '{}' (use fp64, fp32, bf16 or fp16)", name));
}

std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kDouble: return "fp64";
    case at::kFloat: return "fp32";
    case at::kBFloat16: return "bf16";
    case at::kHalf: return "fp16";
    case at::kLong: return "int64";
    case at::kInt: return "int32";
    default: return std::string(c10::toString(t));
  }
}

}  // namespace mixbench
