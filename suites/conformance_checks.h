// The checks of the conformance suite, shared by every subject (conformance_subject.h) and the
// golden files: a unit's forward and backward, inputs rounded to the compute dtype, one case's
// comparisons of the optimized path against the reference, the reference's gradients against
// finite differences, fault injection, and the JSON of a check, of a case's shape and of a guarded run.
#pragma once
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <utility>

#include "harness/errors.h"
#include "harness/metrics.h"
#include "harness/registry.h"
#include "suites/conformance.h"

namespace mixbench::conformance_detail {

using Json = nlohmann::json;

// A conformance unit: an op, a layer or a whole model, with its config bound.
struct Unit {
  std::string method;  // "op" for op-level units
  std::string name;    // op name or "layer"
  std::string level;   // "op" | "layer"
  std::function<TensorMap(const TensorMap&)> reference;
  std::function<TensorMap(const TensorMap&, Backend)> optimized;
  std::set<std::string> nondiff;  // inputs without gradients
  std::set<std::string> selection;  // outputs compared as selections (OpSpec::selection_outputs)
  // The reference scores of the selections' candidates (OpSpec::selection_scores); empty: none.
  std::function<TensorMap(const TensorMap&)> selection_scores;
  // The reference attends with a selection given as an input named as the selection output (the
  // sparse layers, harness/method_selection.h): run_case then gives it the optimized path's.
  bool reference_takes_selection = false;
};

at::Generator make_gen(uint64_t seed);
// The seed of case `label` of `unit`: the run's seed mixed with a hash of both names.
uint64_t case_seed(uint64_t seed, const std::string& unit, const std::string& label);
bool floating(const at::Tensor& t);
at::Device device_of(Backend b);

// Σ_outputs sum(out · dout) and the gradients of every differentiable input.
std::pair<TensorMap, TensorMap> forward_backward(const Unit& u, const TensorMap& inputs, const TensorMap& cot,
                                                 Backend backend, bool reference);
// The FP64 inputs rounded to dt, then in FP64 (as_double, for the reference) or on dev; floating
// inputs not in u.nondiff require gradients.
TensorMap prepare(const TensorMap& inputs64, const Unit& u, at::ScalarType dt, at::Device dev, bool as_double);
// Test hook: every floating tensor becomes x·(1 + s), or x + s where x is numerically zero (a
// structurally zero gradient), and every selection output loses one key per row, so each check
// it feeds must fail.
TensorMap inject_fault(const TensorMap& m, double s, const std::set<std::string>& selection = {});
// The threshold of a check of a unit at `level` ("op", "layer" or "model") in `dtype`: ops and
// layers as threshold() (metrics.h) says; a whole model (a single method's small model with its
// own plan or residual stream) at fp32 and bf16/fp16 the model thresholds below, fp64 as a layer.
double check_threshold(const std::string& dtype, TensorKind kind, const std::string& level);
// One check of the report: the comparison against threshold thr.
Json check_json(const std::string& tensor, const char* kind, const Comparison& c, double thr);

// Whole models below fp64 chain every layer's roundings with the backbone's and their gradients
// flow back through all of them, so how far a correct low-precision computation lands from the FP64
// reference depends on how well the model at the case's parameters is conditioned: a gradient that
// is a small difference of large terms (e.g. a residual-stream map whose streams are nearly
// parallel) carries the terms' rounding error, relative to its own small size. The model checks
// therefore also run the FP64 reference's own code in the compute dtype on the CPU (the baseline:
// a plain implementation at that precision, every operation rounding its result) and accept a
// tensor whose error is within the model threshold, or at most kBaselineFactor times the
// baseline's error — flash-attention's test rule (the fast path no worse than twice a plain
// implementation in the same dtype). Where some tensor fails both, the baseline runs again on
// inputs moved by one unit in the last place (random signs; kBaselineSamples runs in all) and
// each tensor's baseline error is the largest: in a model whose gradients are sensitive to
// rounding (a softmax over few sharply weighted sources, a scalar gain summed over every token)
// one plain run is one draw of an error that any rounding-sized change moves by a factor of
// several, and the optimized path is another draw. A check records `baseline_rel_rms` and the
// `criterion` it passed (or failed) by; the case records `baseline_samples`.
constexpr double kBaselineFactor = 2.0;
constexpr int kBaselineSamples = 3;
// Whether a case at `level` in `dtype` runs the baseline: whole models below fp64.
bool uses_baseline(const std::string& dtype, const std::string& level);
// A check that passes by the threshold or by the baseline (error ≤ kBaselineFactor · base.rel_rms).
Json baseline_check_json(const std::string& tensor, const char* kind, const Comparison& c, double thr,
                         const Comparison& base);

// Selections compared as sets per row (compare_selection), accepting a row whose two selections
// differ only among keys tied with the row's k-th score (k = the keys `ref` selects): both must be
// top-k selections of `scores` — k distinct candidates, none scoring below the k-th score − tol,
// none left out scoring above it + tol, tol = rel_tol · the row's largest finite |score| — since
// top-k implementations keep different tied keys (torch.topk any of them, the reference's stable
// sort the lowest indices). Either selection missing a key strictly above the boundary, holding a
// non-candidate (−inf), repeated or out-of-range key, or a different number of keys fails the row.
// scores: [rows..., n] over the candidates, rows as ref's; −inf marks a non-candidate, +inf a forced
// candidate (a block every selection must hold, e.g. the query's own block), which is never a tie:
// both selections must hold it and it is no boundary to exchange. rel_rms = fraction of failing rows,
// max_abs = the most keys a failing row misses (at least 1), tie_swaps = the keys exchanged in
// accepted rows.
struct SelectionComparison {
  Comparison cmp;
  int64_t tie_swaps = 0;
};
// row_tol (optional, [rows...] or [rows..., 1]): an absolute tolerance per row, used where it
// exceeds rel_tol's.
SelectionComparison compare_selection_ties(const at::Tensor& ref, const at::Tensor& x, const at::Tensor& scores,
                                           double rel_tol, const at::Tensor& row_tol = at::Tensor());
// Relative tolerance of a tie between scores computed in `dtype`: 1e-12 at fp64, the dtype's
// output threshold below it.
double tie_tolerance(const std::string& dtype);
// The check (kind "selection", threshold 0) of selection output `tensor`: tie-aware, with
// `tie_swaps` in the JSON, when the reference scores are given (defined), exact sets otherwise.
Json selection_check(const std::string& tensor, const at::Tensor& ref, const at::Tensor& x, const at::Tensor& scores,
                     double rel_tol, const at::Tensor& row_tol = at::Tensor());

// One case: the optimized path (at opt's dtype and backend, outputs poisoned first) against the
// FP64 reference on the same rounded inputs, outputs and gradients; opt.fault is injected here.
// A unit whose reference takes the selection (Unit::reference_takes_selection): the reference runs
// with the optimized path's selections (taken before any injected fault), so its outputs and
// gradients are compared on the same keys, while each selection output is checked, tie-aware,
// against the reference's own selection (a run without it); the row says so in
// `reference_selection` ("optimized"), and each selection check in `compared_with` ("reference's own").
// Below fp64 a layer's scores pass through a chain of rounded operations (projections, norms,
// rotations), so two correct paths may rank candidates differently by more than one operation's
// rounding: such a selection check also accepts, per row, blocks tied within kBaselineFactor times
// how far the reference's own scores move when its code runs in the compute dtype on the CPU
// (`tie_tolerance`: "baseline"). Rows and tie_swaps as selection_check.
Json run_case(const Unit& u, const TensorMap& inputs64, const ConformanceOptions& opt, uint64_t seed);
// Reference gradients against central differences along `directions` random directions per input
// tensor, FP64.
Json run_finite_differences(const Unit& u, const TensorMap& inputs64, uint64_t seed, int directions = 2);

// {B, T, inputs: {name: sizes}}.
Json shape_json(int64_t B, int64_t T, const TensorMap& in);
// Counts the row's status into the summary.
void tally(const Json& r, ConformanceSummary& s);

// base with fn()'s fields, the kernels that ran (`kernel`) and `seconds`; an exception becomes
// status error (oom for out of memory) with its message, except bad input (InputError, UsageError),
// which propagates.
template <typename Fn>
Json guarded(Json base, Fn&& fn) {
  auto t0 = std::chrono::steady_clock::now();
  take_kernel_notes();
  try {
    Json r = fn();
    std::string k = take_kernel_notes();
    if (!k.empty()) base["kernel"] = k;
    for (auto it = r.begin(); it != r.end(); ++it) base[it.key()] = it.value();
  } catch (const InputError&) {
    throw;  // bad input data (e.g. a malformed golden file) is the caller's problem: exit 2
  } catch (const UsageError&) {
    throw;
  } catch (const c10::OutOfMemoryError& e) {
    base["status"] = "oom";
    base["message"] = e.what_without_backtrace();
  } catch (const c10::Error& e) {
    base["status"] = "error";
    base["message"] = e.what_without_backtrace();
  } catch (const std::exception& e) {
    base["status"] = "error";
    base["message"] = e.what();
  }
  base["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return base;
}

}  // namespace mixbench::conformance_detail
