// Tests of the harness itself: registry, configs, metric, safetensors, goldens, reports, CLI,
// NVTX naming, accountant audits — and mutation tests proving every conformance check can fail.
#include <gtest/gtest.h>
#include <fmt/format.h>

#include <fmt/format.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>

#include <filesystem>
#include <fstream>

#include "tests/source_dir.h"
#include "harness/alloc.h"
#include "harness/backbone.h"
#include "harness/cli/cli.h"
#include "harness/errors.h"
#include "harness/flop_counter.h"
#include "harness/io.h"
#include "harness/metrics.h"
#include "harness/nvtx.h"
#include "harness/registry.h"
#include "harness/report.h"
#include "harness/safetensors.h"
#include "suites/conformance.h"

namespace fs = std::filesystem;
using namespace mixbench;
using Json = nlohmann::json;

namespace {

fs::path tmpdir() {
  static fs::path d = [] {
    fs::path p = fs::temp_directory_path() / fmt::format("mixbench_test_{}", ::getpid());
    fs::create_directories(p);
    return p;
  }();
  return d;
}

int cli(std::vector<std::string> args) { return run_cli(args); }

Json read_json(const fs::path& p) { return Json::parse(read_file(p.string())); }

void expect_valid_report(const fs::path& p) {
  Json r = read_json(p);
  auto errs = validate_json(r, report_schema());
  EXPECT_TRUE(errs.empty()) << p << ": " << (errs.empty() ? "" : errs[0]);
}

std::string golden_dir() { return std::string(mixbench_test::source_dir()) + "/tests/goldens"; }

}  // namespace

// ---------------------------------------------------------------- registry and configs
TEST(Registry, UnknownNamesSuggestClosest) {
  try {
    Registry::get().method("dense_ful");
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("dense_full"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Registry::get().op("atention_x"), UsageError);
}

TEST(Registry, EveryMethodIsComplete) {
  for (const MethodSpec* m : Registry::get().methods()) {
    EXPECT_FALSE(m->citation.empty()) << m->name;
    EXPECT_FALSE(m->cases().empty()) << m->name;
    for (const auto& op : m->ops) EXPECT_TRUE(Registry::get().has_op(op)) << m->name << " uses unknown op " << op;
  }
}

TEST(Config, ValidatesTypesBoundsAndRules) {
  const MethodSpec& m = Registry::get().method("gqa");
  EXPECT_THROW(m.config.parse("n_layer=-1"), InputError);
  EXPECT_THROW(m.config.parse("n_layer=abc"), InputError);
  EXPECT_THROW(m.config.parse("no_such_field=1"), InputError);
  EXPECT_THROW(m.config.parse("d_model=96,head_dim=64"), InputError);             // not divisible
  EXPECT_THROW(m.config.parse("d_model=192,head_dim=64,kv_ratio=2"), InputError);  // 3 heads / 2
  EXPECT_THROW(m.config.parse("window_pattern=SXL"), InputError);
  const OpSpec& op = Registry::get().op("attention");
  EXPECT_THROW(op.params.parse("window=-3"), InputError);
  EXPECT_THROW(op.params.parse("H=6,Hkv=4"), InputError);
  Config c = m.config.parse("n_layer=4,seq_len=2k");
  EXPECT_EQ(c.i("seq_len"), 2048);
  EXPECT_EQ(c.hash(), m.config.parse("seq_len=2048,n_layer=4").hash());
}

TEST(Config, ShapeChecksRejectBadInputs) {
  const OpSpec& op = Registry::get().op("attention");
  Config p = op.params.defaults();
  auto o = at::TensorOptions().dtype(at::kDouble);
  TensorMap bad{{"q", at::randn({1, 5, 3, 8}, o)}, {"k", at::randn({1, 5, 2, 8}, o)}, {"v", at::randn({1, 5, 2, 8}, o)}};
  EXPECT_THROW(op.check_inputs(bad, p), InputError);
  TensorMap bad_d{{"q", at::randn({1, 5, 2, 8}, o)}, {"k", at::randn({1, 5, 2, 4}, o)}, {"v", at::randn({1, 5, 2, 8}, o)}};
  EXPECT_THROW(op.check_inputs(bad_d, p), InputError);
}

// ---------------------------------------------------------------- metric
TEST(Metric, RelativeRmsAndNonFinite) {
  at::Tensor a = at::ones({10}, at::kDouble);
  at::Tensor b = a * (1 + 1e-3);
  Comparison c = compare(a, b);
  EXPECT_NEAR(c.rel_rms, 1e-3, 1e-9);
  EXPECT_NEAR(c.max_abs, 1e-3, 1e-12);
  at::Tensor n = a.clone();
  n[3] = std::numeric_limits<double>::quiet_NaN();
  EXPECT_FALSE(compare(a, n).finite);
  EXPECT_FALSE(compare(a, at::ones({11}, at::kDouble)).shape_ok);
  // a numerically zero reference switches to absolute error
  Comparison z = compare(at::zeros({4}, at::kDouble), at::full({4}, 1e-3, at::kDouble));
  EXPECT_TRUE(z.absolute);
  EXPECT_NEAR(z.rel_rms, 1e-3, 1e-12);
  EXPECT_GT(z.rel_rms, threshold("fp32", TensorKind::Gradient));
  EXPECT_LT(threshold("fp64", TensorKind::Output), threshold("fp32", TensorKind::Output));
  EXPECT_THROW(parse_dtype("fp8"), UsageError);
}

TEST(Poison, OutputsAreNaNWhilePoisoning) {
  {
    PoisonScope p(true);
    at::Tensor t = alloc_output({3, 4}, at::TensorOptions().dtype(at::kFloat));
    EXPECT_TRUE(at::isnan(t).all().item<bool>());
    EXPECT_FALSE(compare(at::zeros({3, 4}, at::kDouble), t).finite);
  }
  EXPECT_FALSE(PoisonScope::active());
}

// ---------------------------------------------------------------- conformance
TEST(Conformance, AttentionMethodsPassFp64AndFp32) {
  for (const char* dtype : {"fp64", "fp32"}) {
    ConformanceOptions opt;
    opt.methods = {"dense_full", "dense", "mqa", "gqa"};
    opt.ops = {"attention"};
    opt.dtype = dtype;
    opt.finite_differences = std::string(dtype) == "fp64";  // of the FP64 reference, once
    opt.fd_directions = 1;
    ConformanceSummary s;
    Json r = run_conformance(opt, s);
    EXPECT_EQ(s.failed, 0) << dtype;
    EXPECT_EQ(s.errors, 0) << dtype;
    EXPECT_GT(s.passed, 40) << dtype;
    // layer-level gradients reach every parameter, and fd checks ran
    bool saw_fd = false, saw_param_grad = false;
    for (const auto& x : r) {
      saw_fd = saw_fd || x["level"] == "fd";
      if (x.contains("checks"))
        for (const auto& c : x["checks"]) saw_param_grad = saw_param_grad || c["tensor"] == "grad_ve_gate";
    }
    EXPECT_EQ(saw_fd, std::string(dtype) == "fp64");  // of the FP64 reference, in the fp64 pass
    EXPECT_TRUE(saw_param_grad);
  }
}

// Every registered op and method: a 1e-3 relative perturbation of the optimized output, or of a
// gradient, must turn every case into a failure.
class Mutation : public ::testing::TestWithParam<std::string> {};

TEST_P(Mutation, PerturbedOutputsAndGradientsFail) {
  // "method_<name>" or "op_<name>" (a method and an op may share a name, e.g. gla)
  const std::string param = GetParam();
  const bool is_method = param.rfind("method_", 0) == 0;
  const std::string which = param.substr(is_method ? 7 : 3);
  for (const char* fault : {"output", "gradient"}) {
    ConformanceOptions opt;
    opt.dtype = "fp64";
    opt.finite_differences = false;
    opt.fault = fault;
    if (is_method) opt.methods = {which};
    else opt.ops = {which};
    ConformanceSummary s;
    Json r = run_conformance(opt, s);
    ASSERT_GT(r.size(), 0u);
    const std::string kind = fault;  // "output" | "gradient": the kind of check that must now fail
    for (const auto& x : r) {
      ASSERT_TRUE(x.contains("checks")) << which << " " << x.dump();
      int perturbed = 0;
      for (const auto& c : x["checks"]) {
        // an output fault also drops one key per row of every selection output (kind "selection")
        const bool hit = c["kind"] == kind || (kind == "output" && c["kind"] == "selection");
        if (!hit) continue;
        ++perturbed;
        EXPECT_EQ(c["status"], "fail") << which << " " << fault << " " << x["case"] << " " << c["tensor"];
      }
      if (perturbed > 0) EXPECT_EQ(x["status"], "fail") << which << " " << x["case"];
      if (kind == "output") EXPECT_GT(perturbed, 0) << which << " " << x["case"];
    }
  }
}

std::vector<std::string> all_units() {
  std::vector<std::string> out;
  for (auto* m : Registry::get().methods()) out.push_back("method_" + m->name);
  for (auto* o : Registry::get().ops()) out.push_back("op_" + o->name);
  return out;
}
INSTANTIATE_TEST_SUITE_P(AllRegistered, Mutation, ::testing::ValuesIn(all_units()),
                         [](const auto& info) { return info.param; });

// ---------------------------------------------------------------- safetensors and goldens
TEST(Safetensors, RoundTrip) {
  TensorMap t{{"a", at::randn({2, 3}, at::kDouble)}, {"b", at::arange(5, at::kLong)}, {"c", at::randn({4}, at::kFloat)}};
  fs::path p = tmpdir() / "rt.safetensors";
  write_safetensors(p.string(), t, {{"op", "attention"}, {"window", "3"}});
  SafetensorsFile f = read_safetensors(p.string());
  EXPECT_EQ(f.metadata.at("window"), "3");
  for (const auto& [n, x] : t) EXPECT_TRUE(at::equal(f.tensors.at(n), x)) << n;
}

namespace {
// Writes raw bytes: 8-byte header length, header text, data.
void write_raw(const fs::path& p, uint64_t header_len, const std::string& header, size_t data_bytes) {
  std::ofstream out(p, std::ios::binary);
  for (int i = 0; i < 8; ++i) out.put(char((header_len >> (8 * i)) & 0xff));
  out << header;
  out << std::string(data_bytes, '\0');
}
}  // namespace

TEST(Safetensors, RejectsMalformedFiles) {
  fs::path d = tmpdir();
  {
    std::ofstream(d / "short.safetensors") << "abc";
  }
  EXPECT_THROW(read_safetensors((d / "short.safetensors").string()), InputError);
  write_raw(d / "big_header.safetensors", 1000, "{}", 0);
  EXPECT_THROW(read_safetensors((d / "big_header.safetensors").string()), InputError);
  std::string h = R"({"a":{"dtype":"Q7","shape":[2],"data_offsets":[0,16]}})";
  write_raw(d / "dtype.safetensors", h.size(), h, 16);
  EXPECT_THROW(read_safetensors((d / "dtype.safetensors").string()), InputError);
  h = R"({"a":{"dtype":"F64","shape":[2],"data_offsets":[0,16]},"b":{"dtype":"F64","shape":[2],"data_offsets":[8,24]}})";
  write_raw(d / "overlap.safetensors", h.size(), h, 24);
  EXPECT_THROW(read_safetensors((d / "overlap.safetensors").string()), InputError);
  h = R"({"a":{"dtype":"F64","shape":[4],"data_offsets":[0,32]}})";
  write_raw(d / "range.safetensors", h.size(), h, 16);
  EXPECT_THROW(read_safetensors((d / "range.safetensors").string()), InputError);
  h = R"({"a":{"dtype":"F64","shape":[3],"data_offsets":[0,16]}})";
  write_raw(d / "size.safetensors", h.size(), h, 16);
  EXPECT_THROW(read_safetensors((d / "size.safetensors").string()), InputError);
  h = R"({"a":{"dtype":"F64","shape":[2],"data_offsets":[0,16]})";  // broken JSON
  write_raw(d / "json.safetensors", h.size(), h, 16);
  EXPECT_THROW(read_safetensors((d / "json.safetensors").string()), InputError);
  // and the CLI turns each into exit 2 without writing a report
  for (const char* f : {"short", "big_header", "dtype", "overlap", "range", "size", "json"}) {
    fs::path out = d / fmt::format("{}_report.json", f);
    EXPECT_EQ(cli({"conformance", "--golden", (d / (std::string(f) + ".safetensors")).string(), "--out", out.string()}), 2) << f;
    EXPECT_FALSE(fs::exists(out)) << f;
  }
}

TEST(Golden, OwnGoldenRoundTripAndBadGoldens) {
  fs::path g = tmpdir() / "attn_w5.safetensors";
  ASSERT_EQ(cli({"golden", "--op", "attention", "--config", "H=4,Hkv=2,D=8,window=5", "--seq-len", "21", "--out", g.string()}), 0);
  fs::path rep = tmpdir() / "golden_report.json";
  EXPECT_EQ(cli({"conformance", "--golden", g.string(), "--dtype", "fp32", "--out", rep.string()}), 0);
  expect_valid_report(rep);
  Json r = read_json(rep);
  ASSERT_EQ(r["results"].size(), 2u);  // reference and optimized
  for (const auto& x : r["results"]) EXPECT_EQ(x["checks"].size(), 4u);  // o, grad_q, grad_k, grad_v
  // missing tensor, wrong shape, wrong op
  SafetensorsFile f = read_safetensors(g.string());
  TensorMap missing = f.tensors;
  missing.erase("k");
  write_safetensors((tmpdir() / "missing.safetensors").string(), missing, f.metadata);
  EXPECT_EQ(cli({"conformance", "--golden", (tmpdir() / "missing.safetensors").string()}), 2);
  TensorMap wrong = f.tensors;
  wrong.set("o", wrong.at("o").slice(1, 0, 20).contiguous());
  write_safetensors((tmpdir() / "wrong.safetensors").string(), wrong, f.metadata);
  EXPECT_EQ(cli({"conformance", "--golden", (tmpdir() / "wrong.safetensors").string()}), 2);
  auto meta = f.metadata;
  meta["op"] = "no_such_op";
  write_safetensors((tmpdir() / "op.safetensors").string(), f.tensors, meta);
  EXPECT_EQ(cli({"conformance", "--golden", (tmpdir() / "op.safetensors").string()}), 2);
  // a golden whose expected output is off fails with exit 1
  TensorMap off = f.tensors;
  off.set("o", off.at("o") * 1.001);
  write_safetensors((tmpdir() / "off.safetensors").string(), off, f.metadata);
  EXPECT_EQ(cli({"conformance", "--golden", (tmpdir() / "off.safetensors").string()}), 1);
}

TEST(Golden, FlashLinearAttentionGoldensPass) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(golden_dir())) {
    if (e.path().extension() != ".safetensors") continue;
    std::string op = read_safetensors(e.path().string()).metadata.at("op");
    if (!Registry::get().has_op(op)) continue;
    for (const char* dtype : {"fp64", "fp32"}) {
      ConformanceOptions opt;
      opt.dtype = dtype;
      Json r = run_golden(e.path().string(), opt);
      for (const auto& x : r) EXPECT_EQ(x["status"], "pass") << e.path() << " " << dtype << " " << x.dump();
    }
    ++n;
  }
  EXPECT_GE(n, 2);
}

// ---------------------------------------------------------------- accountant
TEST(Accountant, NanochatD24Anchor) {
  const MethodSpec& m = Registry::get().method("dense");
  Config cfg = m.config.parse("n_layer=24,seq_len=2048");
  ModelCost mc = account_model(m, cfg, CostQuery{2048, 2048, 2});
  // nanochat estimate_flops() at d24: 6·729,810,648 + 396,361,728
  EXPECT_DOUBLE_EQ(mc.train_flops_nanochat, 4775225616.0);
  EXPECT_NEAR(mc.train_flops_nanochat / 1e9, 4.775, 0.0005);
  EXPECT_EQ(mc.params.matmul, 729810648);
  // d12 anchor from nanochat.md: 7.597e8
  ModelCost d12 = account_model(m, m.config.parse("n_layer=12"), CostQuery{2048, 2048, 2});
  EXPECT_NEAR(d12.train_flops_nanochat / 1e8, 7.597, 0.001);
}

// For every registered method: the accountant's parameters equal the built model's exactly and
// its forward FLOPs agree within 2% with the matmuls and attention pairs LibTorch executed.
class Audit : public ::testing::TestWithParam<std::string> {};
TEST_P(Audit, ParamsExactFlopsWithin2Percent) {
  const MethodSpec& m = Registry::get().method(GetParam());
  for (int64_t T : {48, 200}) {
    Config cfg = m.cases().front().cfg.with("seq_len", T);
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(3);
    Model model = build_model(m, cfg, gen, at::TensorOptions().dtype(at::kFloat), true);
    ParamCount built = count_params(model);
    ModelCost mc = account_model(m, cfg, CostQuery{T, T, 4});
    EXPECT_EQ(built.total(), mc.params.total()) << T;
    EXPECT_EQ(built.matmul, mc.params.matmul) << T;
    EXPECT_EQ(built.transformer_matrices, mc.params.transformer_matrices) << T;
    EXPECT_EQ(built.scalars, mc.params.scalars) << T;
    EXPECT_EQ(built.value_embeds, mc.params.value_embeds) << T;
    const int64_t B = 2;
    at::Tensor idx = at::randint(model.dims.vocab, {B, T}, gen, at::TensorOptions().dtype(at::kLong));
    c10::NoGradGuard ng;
    FlopCounter fc;
    model_forward(model, idx, Backend::CPU);
    // element-wise work the counter cannot see is documented by the method and added back
    const double counted = fc.total() / double(B * T) + mc.uncounted_flops;
    EXPECT_NEAR(counted / mc.fwd_flops, 1.0, 0.02) << GetParam() << " T=" << T << " counted " << counted
                                                   << " accountant " << mc.fwd_flops;
  }
}
INSTANTIATE_TEST_SUITE_P(AllMethods, Audit, ::testing::ValuesIn([] {
                           std::vector<std::string> v;
                           for (auto* m : Registry::get().methods()) v.push_back(m->name);
                           return v;
                         }()),
                         [](const auto& info) { return info.param; });

TEST(Accountant, FlopCounterCountsWhatRuns) {
  c10::NoGradGuard ng;
  FlopCounter fc;
  at::mm(at::randn({3, 5}), at::randn({5, 7}));
  EXPECT_DOUBLE_EQ(fc.total(), 2.0 * 3 * 5 * 7);
  at::Tensor q = at::randn({1, 2, 10, 4});
  at::scaled_dot_product_attention(q, q, q, {}, 0.0, true);
  EXPECT_DOUBLE_EQ(fc.total(), 2.0 * 3 * 5 * 7 + 2.0 * (4 + 4) * 55 * 2);
  const double before = fc.total();
  at::Tensor A = at::randn({2, 6, 6}).tril(), Bm = at::randn({2, 6, 3});
  at::linalg_solve_triangular(A, Bm, /*upper=*/false, /*left=*/true, /*unitriangular=*/true);
  EXPECT_DOUBLE_EQ(fc.total() - before, 2.0 * 6 * 5 * 3);
}

// ---------------------------------------------------------------- reports and CLI
TEST(Reports, ConformanceReportValidatesAndRenders) {
  fs::path out = tmpdir() / "conf.json";
  ASSERT_EQ(cli({"conformance", "--methods", "mqa", "--dtype", "fp32", "--no-fd", "--out", out.string()}), 0);
  expect_valid_report(out);
  Json r = read_json(out);
  EXPECT_EQ(r["kind"], "conformance");
  // the command as typed, subcommand included
  EXPECT_EQ(r["command"].get<std::string>().rfind("mixbench conformance --methods mqa", 0), 0u) << r["command"];
  EXPECT_EQ(r["thresholds"]["fp32"]["output"], 1e-5);
  for (const auto& e : fs::directory_iterator(tmpdir())) EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos);
  testing::internal::CaptureStdout();
  EXPECT_EQ(cli({"report", out.string()}), 0);
  std::string md = testing::internal::GetCapturedStdout();
  EXPECT_NE(md.find("| pass | mqa |"), std::string::npos) << md.substr(0, 400);
  // a broken report is rejected
  write_file_atomic((tmpdir() / "broken.json").string(), "{\"kind\": 3}");
  EXPECT_EQ(cli({"report", (tmpdir() / "broken.json").string()}), 2);
  EXPECT_EQ(cli({"validate", (tmpdir() / "broken.json").string()}), 1);
}

TEST(Reports, AccountReportValidates) {
  fs::path out = tmpdir() / "acct.json";
  ASSERT_EQ(cli({"account", "--method", "dense", "--config", "n_layer=2,d_model=128,head_dim=32,vocab=256,seq_len=64,short_window=16",
                 "--audit", "--out", out.string()}), 0);
  expect_valid_report(out);
  Json r = read_json(out);
  EXPECT_EQ(r["command"].get<std::string>().rfind("mixbench account --method dense", 0), 0u) << r["command"];
  EXPECT_TRUE(r["results"][0]["audit"]["params_match"].get<bool>());
  EXPECT_LT(r["results"][0]["audit"]["fwd_flops_rel_diff"].get<double>(), 0.02);
}

TEST(Reports, SchemaRejectsMissingFields) {
  Json r = make_report(RunInfo{"conformance", {"mixbench"}, Json::object(), Json::object()}, Json::array());
  EXPECT_TRUE(validate_json(r, report_schema()).empty());
  Json bad = r;
  bad.erase("git_commit");
  EXPECT_FALSE(validate_json(bad, report_schema()).empty());
  bad = r;
  bad["results"] = Json::array({{{"status", "weird"}}});
  EXPECT_FALSE(validate_json(bad, report_schema()).empty());
}

TEST(Cli, ExitCodes) {
  EXPECT_EQ(cli({"frobnicate"}), 2);
  EXPECT_EQ(cli({"conformance", "--methods", "dense_fulll"}), 2);
  EXPECT_EQ(cli({"conformance", "--ops", "nope"}), 2);
  EXPECT_EQ(cli({"conformance", "--methods", "mqa", "--dtype", "fp7"}), 2);
  EXPECT_EQ(cli({"conformance", "--methods", "mqa", "--bogus"}), 2);
  EXPECT_EQ(cli({"account", "--method", "dense", "--config", "kv_ratio=5"}), 2);
  EXPECT_EQ(cli({"account"}), 2);
  fs::path out = tmpdir() / "fault.json";
  EXPECT_EQ(cli({"conformance", "--methods", "mqa", "--no-fd", "--inject-fault", "output", "--out", out.string()}), 1);
  expect_valid_report(out);
  testing::internal::CaptureStdout();
  EXPECT_EQ(cli({"list", "--json"}), 0);
  Json l = Json::parse(testing::internal::GetCapturedStdout());
  EXPECT_GE(l["methods"].size(), 4u);
  for (const auto& m : l["methods"]) {
    EXPECT_TRUE(m["reference"].get<bool>());
    EXPECT_TRUE(m["cpu"].get<bool>());
    EXPECT_TRUE(m["accountant"].get<bool>());
  }
}

// ---------------------------------------------------------------- NVTX naming
TEST(Nvtx, RangesNameMethodOpPhase) {
  NvtxRange::start_recording();
  ConformanceOptions opt;
  opt.methods = {"dense"};
  opt.finite_differences = false;
  ConformanceSummary s;
  run_conformance(opt, s);
  auto names = NvtxRange::stop_recording();
  auto has = [&](const std::string& n) { return std::find(names.begin(), names.end(), n) != names.end(); };
  EXPECT_TRUE(has("dense.attention.forward"));
  EXPECT_TRUE(has("dense.layer.forward"));
  EXPECT_TRUE(has("dense.layer.backward"));
  EXPECT_TRUE(has("dense.layer.case_layer0_T1"));
  // no name holds '/', which Nsight's filters read as the nesting of push/pop ranges
  for (const auto& n : names) EXPECT_EQ(n.find('/'), std::string::npos) << n;
}
