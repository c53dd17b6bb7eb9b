// The conformance suite: every registered op and method, optimized path against the FP64
// reference, forward outputs and gradients of every differentiable input; reference gradients
// against central finite differences; golden files from other implementations.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "harness/registry.h"

namespace mixbench {

struct ConformanceOptions {
  std::vector<std::string> methods;  // layer-level units to run (names)
  std::vector<std::string> ops;      // op-level units to run
  Backend backend = Backend::CPU;
  std::string dtype = "fp64";
  std::vector<std::string> goldens;
  uint64_t seed = 1234;
  bool finite_differences = true;
  int fd_directions = 2;  // random directions per input tensor in the finite-difference check
  // Test hook proving every check can fail: multiply the optimized path's first output
  // ("output") or first gradient ("gradient") by (1 + fault_scale) before comparing.
  std::string fault;
  double fault_scale = 1e-3;
};

struct ConformanceSummary {
  int passed = 0, failed = 0, skipped = 0, errors = 0;
};

// Runs everything the options select; returns the `results` array of the report.
nlohmann::json run_conformance(const ConformanceOptions& opt, ConformanceSummary& summary);

// One golden file: checks the FP64 reference and the optimized path against its tensors.
nlohmann::json run_golden(const std::string& path, const ConformanceOptions& opt);

}  // namespace mixbench
