#include "suites/conformance.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <ATen/core/Generator.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/autograd.h>
#include <fmt/format.h>

#include <chrono>
#include <set>

#include "harness/alloc.h"
#include "harness/backbone.h"
#include "harness/errors.h"
#include "harness/metrics.h"
#include "harness/nvtx.h"
#include "harness/safetensors.h"
#include "suites/conformance_subject.h"
#include "suites/golden.h"
#include "suites/unit_golden.h"

namespace mixbench {

using namespace conformance_detail;

Json conformance_detail::run_subjects(const std::vector<Subject>& subjects, const ConformanceOptions& opt,
                                      ConformanceSummary& summary) {
  Json results = Json::array();
  auto record = [&](const Json& r) {
    tally(r, summary);
    results.push_back(r);
  };
  for (const Subject& s : subjects)
    for (const CaseDef& c : s.cases) {
      SubjectCase k = s.make(c);
      if (!k.skip_reason.empty()) {
        k.base["status"] = "skipped";
        k.base["reason"] = k.skip_reason;
        record(k.base);
        continue;
      }
      NvtxRange r(k.nvtx);
      record(guarded(k.base, [&] { return run_case(k.unit, k.inputs, opt, k.seed); }));
      if (!opt.fault.empty()) continue;  // an injected fault shows in the case's own checks
      for (const FollowUp& f : k.follow_ups) {
        if (f.kind == FollowUp::FiniteDifferences) {
          if (!opt.finite_differences) continue;
          // Reference gradients against central differences, on the case's own FP64 inputs.
          Json fb = k.base;
          fb["level"] = "fd";
          fb["device"] = "cpu";
          fb["dtype"] = "fp64";
          fb["backend"] = "reference";
          record(guarded(fb, [&] { return run_finite_differences(k.unit, k.inputs, k.seed, opt.fd_directions); }));
          continue;
        }
        Json ib = k.base;
        ib["level"] = "invariant";
        ib["case"] = c.label + f.case_suffix;
        Json ir = guarded(ib, f.run);
        if (ir.contains("shape")) {  // the invariant's shape keys (decode steps, ...) join the case's
          Json sh = k.base["shape"];
          for (auto it = ir["shape"].begin(); it != ir["shape"].end(); ++it) sh[it.key()] = it.value();
          ir["shape"] = sh;
        }
        record(ir);
      }
    }
  return results;
}

Json run_conformance(const ConformanceOptions& opt, ConformanceSummary& summary) {
  if (opt.backend == Backend::CUDA && !at::hasCUDA())
    throw UsageError("--device cuda: no CUDA device is available in this process");
  parse_dtype(opt.dtype);
  Json results = run_subjects(conformance_subjects(opt), opt, summary);

  // ---- golden files
  for (const auto& g : opt.goldens) {
    // a layer or model golden names its level (suites/unit_golden.h); an op golden names its op
    Json gr = is_unit_golden(read_safetensors(g)) ? run_unit_golden(g, opt) : run_golden(g, opt);
    for (const auto& r : gr) {
      tally(r, summary);
      results.push_back(r);
    }
  }
  return results;
}

Json run_golden(const std::string& path, const ConformanceOptions& opt) {
  const GoldenFile golden = read_golden(path);  // InputError on a malformed file
  const SafetensorsFile& f = golden.file;
  auto fail = [&](const std::string& why) { return golden_file_error(path, why); };
  const OpSpec& spec = *golden.op;
  const Config& cfg = golden.config;
  const TensorMap& in = golden.inputs;
  Unit u = op_unit(spec, cfg);
  // expected tensors
  const TensorMap& cot = golden.cotangents;
  const std::string& golden_dtype = golden.dtype;

  Json results = Json::array();
  for (int pass = 0; pass < 2; ++pass) {
    const bool reference = pass == 0;
    if (!reference && opt.backend == Backend::CUDA && !spec.cuda) continue;
    const std::string dtype = reference ? "fp64" : opt.dtype;
    Json base = {{"method", nullptr}, {"op", spec.name}, {"level", "golden"}, {"case", path},
                 {"device", reference ? "cpu" : (opt.backend == Backend::CUDA ? "cuda" : "cpu")},
                 {"dtype", dtype}, {"backend", reference ? "reference" : backend_name(opt.backend)},
                 {"config", cfg.to_json()}, {"shape", shape_json(in.at(spec.inputs[0].name).size(0),
                                                                 in.at(spec.inputs[0].name).dim() > 1 ? in.at(spec.inputs[0].name).size(1) : 1, in)}};
    results.push_back(guarded(base, [&]() -> Json {
      const at::ScalarType dt = parse_dtype(dtype);
      const at::Device dev = reference ? at::Device(at::kCPU) : device_of(opt.backend);
      TensorMap x = prepare(in, u, reference ? at::kDouble : dt, dev, false);
      TensorMap c2;
      for (const auto& [n, t] : cot) c2.set(n, t.to(dt).to(dev));
      TensorMap outs, grads;
      {
        PoisonScope poison(!reference);
        std::tie(outs, grads) = forward_backward(u, x, c2, reference ? Backend::Reference : opt.backend, reference);
      }
      if (!reference && opt.fault == "output") outs = inject_fault(outs, opt.fault_scale, u.selection);
      if (!reference && opt.fault == "gradient") grads = inject_fault(grads, opt.fault_scale);
      const double thr_out = std::max(threshold(dtype, TensorKind::Output), threshold(golden_dtype, TensorKind::Output));
      const double thr_grad = std::max(threshold(dtype, TensorKind::Gradient), threshold(golden_dtype, TensorKind::Gradient));
      Json checks = Json::array();
      bool ok = true;
      int compared = 0;
      for (const auto& o : spec.outputs) {
        // the expected output is stored as `<o>` or `expected_<o>` (e.g. expected_indices)
        const std::string key = f.tensors.has(o) ? o : "expected_" + o;
        if (!f.tensors.has(key)) continue;
        const at::Tensor& want = f.tensors.at(key);
        if (!outs.has(o)) throw std::runtime_error("path did not return " + o);
        if (want.sizes() != outs.at(o).sizes())
          throw fail(fmt::format("tensor '{}' has shape {} but the op produces {}", key, c10::str(want.sizes()),
                                 c10::str(outs.at(o).sizes())));
        Json c;
        if (u.selection.count(o)) {
          // A selection is exact only for identical scores: below fp64 the inputs are rounded first,
          // which can reorder near-tied keys. The file's selection is checked by the fp64 reference
          // pass; a reduced-precision path is checked against the reference run on the same rounded
          // inputs (as in the generated cases). Either way keys tied with the k-th reference score
          // may be exchanged (compare_selection_ties): another implementation's top-k may keep
          // other tied keys than the reference's stable sort.
          at::Tensor sel = want;
          TensorMap scores;
          {
            c10::NoGradGuard ng;
            const TensorMap scored_in = prepare(in, u, reference ? at::kDouble : dt, at::Device(at::kCPU), true);
            if (!reference && dt != at::kDouble) sel = u.reference(scored_in).at(o);
            if (u.selection_scores) scores = u.selection_scores(scored_in);
          }
          c = selection_check(o, sel, outs.at(o), scores.get_or(o, at::Tensor()),
                              std::max(tie_tolerance(dtype), tie_tolerance(golden_dtype)));
        } else {
          c = check_json(o, "output", compare(want, outs.at(o)), thr_out);
        }
        ok = ok && c["status"] == "pass";
        checks.push_back(c);
        ++compared;
      }
      for (const auto& [n, t] : f.tensors) {
        if (n.rfind("grad_", 0) != 0) continue;
        if (!grads.has(n)) throw fail(fmt::format("'{}' given but no cotangent or no such differentiable input", n));
        if (t.sizes() != grads.at(n).sizes())
          throw fail(fmt::format("tensor '{}' has shape {} but the input has {}", n, c10::str(t.sizes()),
                                 c10::str(grads.at(n).sizes())));
        Json c = check_json(n, "gradient", compare(t, grads.at(n)), thr_grad);
        ok = ok && c["status"] == "pass";
        checks.push_back(c);
        ++compared;
      }
      if (compared == 0) throw fail("holds no expected output or gradient to compare");
      return {{"status", ok ? "pass" : "fail"}, {"checks", checks}};
    }));
  }
  return results;
}

}  // namespace mixbench
