// The conformance driver over subjects: a made-up subject shows what the driver does with each part
// (case, skip reason, finite differences, invariants in the subject's order, fault injection,
// tallies), and the registered subjects come in report order with their skip reasons.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <set>
#include <stdexcept>
#include <string>

#include "harness/cli/cli.h"
#include "harness/registry.h"
#include "suites/conformance.h"
#include "suites/conformance_subject.h"

using namespace mixbench;
using namespace mixbench::conformance_detail;

namespace {

// y = x² (reference) and x² · (1 + err) (optimized); one case that runs, one that is skipped. The
// running case's follow-ups: an invariant "/first" (adding a shape key), finite differences, and
// an invariant "/throws" that fails with an exception.
Subject toy_subject(double err) {
  Subject s;
  CaseDef run, skip;
  run.label = "runs";
  run.B = 2;
  run.T = 3;
  skip.label = "skipped";
  s.cases = {run, skip};
  s.make = [err](const CaseDef& c) {
    SubjectCase k;
    k.unit.method = "toy";
    k.unit.name = "square";
    k.unit.level = "layer";
    k.unit.reference = [](const TensorMap& in) { return TensorMap{{"y", in.at("x") * in.at("x")}}; };
    k.unit.optimized = [err](const TensorMap& in, Backend) {
      return TensorMap{{"y", in.at("x") * in.at("x") * (1.0 + err)}};
    };
    k.seed = 42;
    at::Generator gen = make_gen(k.seed);
    k.inputs.set("x", at::randn({c.B, c.T, 4}, gen, at::TensorOptions().dtype(at::kDouble)));
    k.base = {{"method", "toy"}, {"case", c.label}, {"level", "layer"}, {"shape", {{"B", c.B}, {"T", c.T}}}};
    if (c.label == "skipped") k.skip_reason = "not here";
    k.nvtx = "toy/case:" + c.label;
    FollowUp first;
    first.kind = FollowUp::Invariant;
    first.case_suffix = "/first";
    first.run = [] { return Json{{"status", "pass"}, {"checks", Json::array()}, {"shape", {{"steps", 3}}}}; };
    FollowUp throws;
    throws.kind = FollowUp::Invariant;
    throws.case_suffix = "/throws";
    throws.run = []() -> Json { throw std::runtime_error("broken invariant"); };
    k.follow_ups = {first, FollowUp{}, throws};
    return k;
  };
  return s;
}

}  // namespace

TEST(ConformanceDriver, RunsEachPartOfASubjectInOrder) {
  ConformanceOptions opt;
  ConformanceSummary sum;
  Json rows = run_subjects({toy_subject(0.0)}, opt, sum);
  ASSERT_EQ(rows.size(), 5u) << rows.dump();
  // the case: y and grad_x, both passing
  EXPECT_EQ(rows[0]["case"], "runs");
  EXPECT_EQ(rows[0]["status"], "pass");
  ASSERT_EQ(rows[0]["checks"].size(), 2u);
  EXPECT_EQ(rows[0]["checks"][0]["tensor"], "y");
  EXPECT_EQ(rows[0]["checks"][1]["tensor"], "grad_x");
  EXPECT_TRUE(rows[0].contains("seconds"));
  // the follow-ups in the subject's order
  EXPECT_EQ(rows[1]["level"], "invariant");
  EXPECT_EQ(rows[1]["case"], "runs/first");
  EXPECT_EQ(rows[1]["shape"], Json({{"B", 2}, {"T", 3}, {"steps", 3}}));  // the case's shape and the invariant's
  EXPECT_EQ(rows[2]["level"], "fd");
  EXPECT_EQ(rows[2]["backend"], "reference");
  EXPECT_EQ(rows[2]["dtype"], "fp64");
  EXPECT_EQ(rows[2]["case"], "runs");
  EXPECT_EQ(rows[2]["status"], "pass");
  EXPECT_EQ(rows[2]["checks"].size(), 2u);  // two random directions for x
  EXPECT_EQ(rows[3]["case"], "runs/throws");
  EXPECT_EQ(rows[3]["status"], "error");
  EXPECT_EQ(rows[3]["message"], "broken invariant");
  // the skipped case: its base, the reason, nothing run
  EXPECT_EQ(rows[4]["case"], "skipped");
  EXPECT_EQ(rows[4]["status"], "skipped");
  EXPECT_EQ(rows[4]["reason"], "not here");
  EXPECT_FALSE(rows[4].contains("checks"));
  EXPECT_EQ(sum.passed, 3);
  EXPECT_EQ(sum.failed, 0);
  EXPECT_EQ(sum.errors, 1);
  EXPECT_EQ(sum.skipped, 1);

  // --fd-directions: that many random directions per input tensor
  ConformanceOptions three = opt;
  three.fd_directions = 3;
  ConformanceSummary s3;
  Json rows3 = run_subjects({toy_subject(0.0)}, three, s3);
  ASSERT_EQ(rows3.size(), 5u);
  ASSERT_EQ(rows3[2]["checks"].size(), 3u);
  EXPECT_EQ(rows3[2]["checks"][2]["tensor"], "grad_x·u2");
  EXPECT_EQ(run_cli({"conformance", "--ops", "attention", "--fd-directions", "0", "--quiet"}), 2);

  // without finite differences the fd row goes, the invariants stay
  opt.finite_differences = false;
  ConformanceSummary s2;
  Json no_fd = run_subjects({toy_subject(0.0)}, opt, s2);
  ASSERT_EQ(no_fd.size(), 4u);
  for (const auto& r : no_fd) EXPECT_NE(r["level"], "fd");
}

TEST(ConformanceDriver, AFaultOrAnErrorShowsInTheCaseAndSkipsTheFollowUps) {
  ConformanceOptions opt;
  opt.fault = "gradient";
  ConformanceSummary sum;
  Json rows = run_subjects({toy_subject(0.0)}, opt, sum);
  ASSERT_EQ(rows.size(), 2u) << rows.dump();  // the case and the skipped case only
  EXPECT_EQ(rows[0]["status"], "fail");
  EXPECT_EQ(rows[0]["checks"][0]["status"], "pass");  // y untouched
  EXPECT_EQ(rows[0]["checks"][1]["status"], "fail");  // grad_x perturbed
  EXPECT_EQ(sum.failed, 1);
  EXPECT_EQ(sum.skipped, 1);
  // a wrong optimized path fails its case without any fault injected
  ConformanceOptions plain;
  ConformanceSummary s2;
  Json wrong = run_subjects({toy_subject(1e-3)}, plain, s2);
  EXPECT_EQ(wrong[0]["status"], "fail");
  EXPECT_EQ(s2.failed, 1);
}

TEST(ConformanceSubjects, RegisteredSubjectsInReportOrderWithTheirSkips) {
  // ops first, then methods; at fp32 a hybrid is a model subject (checked against the model
  // thresholds or its baseline) and its layer methods follow it at layer level
  ConformanceOptions opt;
  opt.dtype = "fp32";
  opt.ops = {"attention"};
  opt.methods = {"hypenet"};
  std::vector<Subject> subjects = conformance_subjects(opt);
  ASSERT_GE(subjects.size(), 3u);
  const SubjectCase op = subjects[0].make(subjects[0].cases.at(0));
  EXPECT_EQ(op.base["level"], "op");
  EXPECT_EQ(op.base["op"], "attention");
  EXPECT_TRUE(op.skip_reason.empty());
  const SubjectCase model = subjects[1].make(subjects[1].cases.at(0));
  EXPECT_EQ(model.base["level"], "model");
  EXPECT_EQ(model.base["method"], "hypenet");
  EXPECT_TRUE(model.skip_reason.empty()) << model.skip_reason;
  EXPECT_EQ(model.unit.level, "model");
  EXPECT_TRUE(uses_baseline(opt.dtype, model.unit.level));
  // in bf16 the hybrid's model case is skipped, naming where its layers are checked
  ConformanceOptions half = opt;
  half.dtype = "bf16";
  const std::vector<Subject> hs = conformance_subjects(half);
  const SubjectCase hm = hs[1].make(hs[1].cases.at(0));
  EXPECT_NE(hm.skip_reason.find("layer methods are checked at layer level"), std::string::npos) << hm.skip_reason;
  std::set<std::string> layer_methods_seen;
  for (size_t i = 2; i < subjects.size(); ++i) {
    const SubjectCase l = subjects[i].make(subjects[i].cases.at(0));
    EXPECT_EQ(l.base["level"], "layer");
    layer_methods_seen.insert(l.base["method"].get<std::string>());
  }
  EXPECT_FALSE(layer_methods_seen.empty());
  // at fp64 the hybrid is a model subject with its decode invariant and finite differences
  opt.dtype = "fp64";
  subjects = conformance_subjects(opt);
  ASSERT_EQ(subjects.size(), 2u);
  const SubjectCase m64 = subjects[1].make(subjects[1].cases.at(0));
  EXPECT_TRUE(m64.skip_reason.empty());
  EXPECT_EQ(m64.unit.level, "model");
  EXPECT_TRUE(m64.unit.nondiff.count("idx"));
  // a layer subject: the method's decode invariant follows the case
  ConformanceOptions lo;
  lo.methods = {"gqa"};
  subjects = conformance_subjects(lo);
  ASSERT_EQ(subjects.size(), 1u);
  ASSERT_TRUE(Registry::get().method("gqa").has_decode());
  int with_decode = 0;
  for (const CaseDef& c : subjects[0].cases) {
    const SubjectCase k = subjects[0].make(c);
    bool decode = false;
    for (const auto& f : k.follow_ups) decode = decode || f.case_suffix == "/decode";
    EXPECT_EQ(decode, c.T >= 2) << c.label;  // a decode needs a prefill of at least one token
    with_decode += decode;
  }
  EXPECT_GT(with_decode, 0);
}

namespace {

// A model-level toy whose every computation loses precision the same way: y = (x + 32) − 32, exact
// in FP64, rounded to a spacing of 2⁻² near 32 in bf16 (an RMS error of ~0.07 against x ~ N(0,1),
// above the model output threshold 3e-2). The optimized path does the same arithmetic, times
// (1 + err).
Subject shifted_subject(double err) {
  Subject s;
  CaseDef c;
  c.label = "shifted";
  c.B = 4;
  c.T = 64;
  s.cases = {c};
  s.make = [err](const CaseDef& c) {
    SubjectCase k;
    k.unit.method = "toy";
    k.unit.name = "model";
    k.unit.level = "model";
    k.unit.reference = [](const TensorMap& in) { return TensorMap{{"y", (in.at("x") + 32.0) - 32.0}}; };
    k.unit.optimized = [err](const TensorMap& in, Backend) {
      return TensorMap{{"y", ((in.at("x") + 32.0) - 32.0) * (1.0 + err)}};
    };
    k.seed = 7;
    at::Generator gen = make_gen(k.seed);
    k.inputs.set("x", at::randn({c.B, c.T, 8}, gen, at::TensorOptions().dtype(at::kDouble)));
    k.base = {{"method", "toy"}, {"case", c.label}, {"level", "model"}};
    return k;
  };
  return s;
}

Json only_case(const Subject& s, const std::string& dtype) {
  ConformanceOptions opt;
  opt.dtype = dtype;
  opt.finite_differences = false;
  ConformanceSummary sum;
  Json rows = run_subjects({s}, opt, sum);
  EXPECT_EQ(rows.size(), 1u) << rows.dump();
  return rows.at(0);
}

}  // namespace

TEST(ConformanceBaseline, ModelChecksBelowFp64AcceptWhatAPlainImplementationInTheDtypeGets) {
  // bf16: the optimized path is as far from FP64 as the reference's code run in bf16: it passes by
  // the baseline, which the check records
  Json r = only_case(shifted_subject(0.0), "bf16");
  ASSERT_EQ(r["status"], "pass") << r.dump();
  const Json& y = r["checks"][0];
  EXPECT_EQ(y["tensor"], "y");
  EXPECT_GT(y["rel_rms"].get<double>(), y["threshold"].get<double>());  // the threshold alone fails it
  EXPECT_EQ(y["criterion"], "baseline");
  EXPECT_NEAR(y["baseline_rel_rms"].get<double>(), y["rel_rms"].get<double>(), 1e-12);
  EXPECT_TRUE(r.contains("baseline"));
  EXPECT_EQ(r["baseline_samples"], 1);  // no check failed: the case's own inputs only
  // a wrong optimized path (20 % off) is more than twice the baseline's error away and fails
  Json bad = only_case(shifted_subject(0.2), "bf16");
  EXPECT_EQ(bad["status"], "fail") << bad.dump();
  EXPECT_EQ(bad["checks"][0]["criterion"], "baseline");
  EXPECT_EQ(bad["checks"][1]["status"], "fail");  // grad_x: (1 + err) · dy
  // a failing case also ran the baseline on inputs moved by one rounding, which did not rescue it
  EXPECT_EQ(bad["baseline_samples"], kBaselineSamples);
  EXPECT_LT(bad["checks"][0]["baseline_rel_rms"].get<double>(), 0.1);
  // fp32: the shift costs nothing that the threshold does not allow; the same fault fails there too
  Json f32 = only_case(shifted_subject(0.0), "fp32");
  EXPECT_EQ(f32["status"], "pass");
  EXPECT_EQ(f32["checks"][0]["criterion"], "threshold");
  EXPECT_EQ(only_case(shifted_subject(0.2), "fp32")["status"], "fail");
  // fp64 runs no baseline
  Json f64 = only_case(shifted_subject(0.0), "fp64");
  EXPECT_EQ(f64["status"], "pass");
  EXPECT_FALSE(f64["checks"][0].contains("criterion"));
  EXPECT_FALSE(f64.contains("baseline"));
}

TEST(ConformanceBaseline, ACheckPassesByTheThresholdOrByTwiceTheBaselineOnly) {
  auto cmp = [](double rel, bool finite = true) {
    Comparison c;
    c.rel_rms = rel;
    c.finite = finite;
    return c;
  };
  EXPECT_EQ(baseline_check_json("t", "gradient", cmp(0.05), 0.1, cmp(0.0))["criterion"], "threshold");
  EXPECT_EQ(baseline_check_json("t", "gradient", cmp(0.05), 0.1, cmp(0.0))["status"], "pass");
  EXPECT_EQ(baseline_check_json("t", "gradient", cmp(0.3), 0.1, cmp(0.2))["status"], "pass");
  EXPECT_EQ(baseline_check_json("t", "gradient", cmp(0.3), 0.1, cmp(0.2))["criterion"], "baseline");
  EXPECT_EQ(baseline_check_json("t", "gradient", cmp(0.5), 0.1, cmp(0.2))["status"], "fail");
  // a non-finite result never passes; a non-finite baseline leaves the threshold alone
  EXPECT_EQ(baseline_check_json("t", "gradient", cmp(0.01, false), 0.1, cmp(1.0))["status"], "fail");
  Json nb = baseline_check_json("t", "gradient", cmp(0.3), 0.1, cmp(0.2, false));
  EXPECT_EQ(nb["status"], "fail");
  EXPECT_TRUE(nb["baseline_rel_rms"].is_null());
  EXPECT_TRUE(uses_baseline("bf16", "model"));
  EXPECT_TRUE(uses_baseline("fp32", "model"));
  EXPECT_FALSE(uses_baseline("fp64", "model"));
  EXPECT_FALSE(uses_baseline("bf16", "layer"));
}
