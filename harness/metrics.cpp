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
//
// Layer level in bf16/fp16: a layer rounds its activations to the 8-bit mantissa 4 to 8 times in
// sequence (each rounding ≈ 2^-9 relative, ~2.3e-3 RMS), so its RMS error is expected near
// √n·2.3e-3 ≈ 5e-3 to 7e-3 for outputs and about twice that for gradients. Measured on the 13
// layer methods (CPU and H200, after moving norms, RoPE and recurrent states to fp32): outputs up
// to 9.7e-3, gradients up to 2.9e-2 (gdn's grad_dt_bias). The layer column is therefore 1.5e-2
// and 4e-2; op-level thresholds are unchanged, and fp64/fp32 layer checks stay as strict as ops,
// so a wrong formula is caught there, while bf16 layer checks catch precision-handling defects
// (a bf16 recurrent state, for example, shows errors of 3e-2 to 1e-1 at op level).
double threshold(const std::string& dtype, TensorKind kind, bool layer) {
  if (dtype == "fp64") return 1e-10;
  if (dtype == "fp32") return 1e-5;
  if (dtype == "tf32") return 1e-3;
  if ((dtype == "bf16" || dtype == "fp16") && layer) return kind == TensorKind::Output ? 1.5e-2 : 4e-2;
  if (dtype == "bf16" || dtype == "fp16") return kind == TensorKind::Output ? 5e-3 : 1e-2;
  throw UsageError(fmt::format("no threshold for dtype '{}'", dtype));
}

nlohmann::json threshold_table() {
  nlohmann::json t = nlohmann::json::object();
  for (const char* d : {"fp64", "fp32", "tf32", "bf16", "fp16"})
    t[d] = {{"output", threshold(d, TensorKind::Output)}, {"gradient", threshold(d, TensorKind::Gradient)},
            {"layer_output", threshold(d, TensorKind::Output, true)},
            {"layer_gradient", threshold(d, TensorKind::Gradient, true)}};
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
