// What the conformance driver (run_subjects, conformance.cpp) runs: subjects. A subject is one thing
// checked case by case, an op, a method's layer or a hybrid's whole model, and supplies for each of
// its cases the unit (reference and optimized callables, non-differentiable inputs, selection
// outputs), the FP64 inputs, the report's base fields, a skip reason where the case cannot run
// here, and the checks that follow the case (finite differences, invariants such as decode against
// forward). The driver runs every subject the same way: the case with fault injection, then the
// follow-ups, each guarded, and tallies every row.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "harness/backbone.h"
#include "harness/registry.h"
#include "suites/conformance.h"
#include "suites/conformance_checks.h"

namespace mixbench::conformance_detail {

// A check after a case, run only without fault injection.
struct FollowUp {
  enum Kind { FiniteDifferences, Invariant };
  Kind kind = FiniteDifferences;
  // Invariant: its row's case label is the case's plus case_suffix; run gives {status, checks} and
  // may add `shape` keys (merged into the case's shape) and a `message`.
  std::string case_suffix;
  std::function<Json()> run;
};

struct SubjectCase {
  Json base;                  // the fields every row of the case starts from (method, op, level, case, ...)
  std::string skip_reason;    // non-empty: one row with status skipped and this reason, nothing run
  Unit unit;
  TensorMap inputs;           // FP64
  uint64_t seed = 0;
  std::string nvtx;           // the NVTX range around the case and its follow-ups
  std::vector<FollowUp> follow_ups;  // in report order
};

struct Subject {
  std::vector<CaseDef> cases;
  std::function<SubjectCase(const CaseDef&)> make;
};

// An op at op level: its registered cases, outputs and gradients, its invariants (chunked ==
// recurrent, ...), finite differences for T ≤ 40; skipped on CUDA without a CUDA path.
Subject op_subject(const OpSpec& spec, const ConformanceOptions& opt);
// A method's layer: its cases with random parameters, finite differences for T ≤ 40, prefill +
// decode against forward where it decodes; skipped on CUDA without a CUDA path.
Subject layer_subject(const MethodSpec& m, const ConformanceOptions& opt);
// A whole small model: a hybrid's (it has no layer of its own) at fp64 only (other dtypes:
// skipped, its layer methods are checked at layer level), a single method with its own plan or
// residual stream at every dtype (the model thresholds, check_threshold); finite differences for
// T ≤ 24, the model's prefill + decode against forward.
Subject model_subject(const MethodSpec& m, const ConformanceOptions& opt);
// The subjects opt selects, in report order: opt.ops, then opt.methods (a hybrid as a model
// subject; at a dtype other than fp64 its layer methods are appended as layer subjects).
std::vector<Subject> conformance_subjects(const ConformanceOptions& opt);

// The driver: every case of every subject, its follow-ups, tallied; returns the report's rows.
nlohmann::json run_subjects(const std::vector<Subject>& subjects, const ConformanceOptions& opt,
                            ConformanceSummary& summary);

// The units of the three subjects (an op's unit also checks golden files).
Unit op_unit(const OpSpec& spec, const Config& cfg);
Unit layer_unit(const MethodSpec& m, const Config& cfg, const LayerCtx& ctx);
Unit model_unit(const MethodSpec& m, const Model& proto);

}  // namespace mixbench::conformance_detail
