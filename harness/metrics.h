// Conformance metric and the per-dtype threshold table (one place, also written into reports).
#pragma once
#include <ATen/core/Tensor.h>
#include <nlohmann/json_fwd.hpp>
#include <string>

namespace mixbench {

struct Comparison {
  double rel_rms = 0;   // RMS(ref - x) / (RMS(ref) + 1e-8)
  double max_abs = 0;   // max |ref - x|
  bool finite = true;   // x has no NaN/Inf
  bool shape_ok = true;
  bool absolute = false;  // reference was numerically zero: rel_rms holds the absolute RMS error
};

// RMS below which a reference tensor counts as numerically zero (see compare()).
constexpr double kZeroReference = 1e-12;

// Compares x to ref in FP64. Shape mismatch or a non-finite x is reported, not thrown.
Comparison compare(const at::Tensor& ref, const at::Tensor& x);

// Selections (integer tensors [..., k], −1 = empty slot) compared as multisets per row of the last
// dimension: rel_rms = fraction of rows whose selections differ, max_abs = the most slots that
// differ in one row (after sorting both rows). Shape mismatch is reported, not thrown.
Comparison compare_selection(const at::Tensor& ref, const at::Tensor& x);

enum class TensorKind { Output, Gradient };

// Threshold on rel_rms for the optimized path's compute dtype ("fp64", "fp32", "tf32", "bf16", "fp16").
// `layer` selects the layer-level column: identical to the op level except for bf16/fp16, where a
// whole layer chains several roundings to 8 bits of mantissa (projections, gates, short conv,
// norms, the op, the output projection) — see the table in metrics.cpp for the evidence.
double threshold(const std::string& dtype, TensorKind kind, bool layer = false);
nlohmann::json threshold_table();

// dtype names <-> ScalarType
at::ScalarType parse_dtype(const std::string& name);  // UsageError on unknown names
std::string dtype_name(at::ScalarType t);

}  // namespace mixbench
