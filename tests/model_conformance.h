// Model-level conformance of one method on one intra-op thread (thousands of tiny FP64 ops), for
// the tests of methods checked as whole models: fp64 adds finite differences of the reference
// (one direction per tensor); `fault` injects a fault, which skips them.
#pragma once
#include <ATen/Parallel.h>

#include <string>

#include "harness/registry.h"
#include "suites/conformance.h"
#include "suites/conformance_subject.h"

namespace mixbench::test_support {

inline ConformanceSummary model_conformance(const MethodSpec& method, const std::string& dtype, const std::string& fault) {
  ConformanceOptions opt;
  opt.dtype = dtype;
  opt.fault = fault;
  opt.finite_differences = dtype == "fp64" && fault.empty();
  opt.fd_directions = 1;
  ConformanceSummary s;
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  conformance_detail::run_subjects({conformance_detail::model_subject(method, opt)}, opt, s);
  at::set_num_threads(threads);
  return s;
}

}  // namespace mixbench::test_support
