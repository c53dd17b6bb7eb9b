// Parameter names of other implementations (harness/foreign_names.h) and layer/model goldens
// (suites/unit_golden.h) in process: conversions both ways, the errors naming the tensor, a golden's
// round trip and its failure on an injected fault. tests/golden_levels.py checks the same through
// the command line, with the goldens of nanochat's GPT and flash-linear-attention's layers.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <fmt/format.h>

#include <filesystem>

#include "tests/source_dir.h"
#include "harness/backbone.h"
#include "harness/errors.h"
#include "harness/foreign_names.h"
#include "harness/args.h"
#include "harness/registry.h"
#include "harness/safetensors.h"
#include "suites/unit_golden.h"

namespace mixbench {
namespace {

namespace fs = std::filesystem;
const at::TensorOptions kF64 = at::TensorOptions().dtype(at::kDouble);

std::vector<std::pair<std::string, std::vector<int64_t>>> shapes(const TensorMap& m) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  for (const auto& [n, t] : m) out.emplace_back(n, t.sizes().vec());
  return out;
}

Model small_dense(int64_t vocab) {
  const MethodSpec& m = Registry::get().method("dense");
  const Config cfg = m.config.parse(fmt::format("n_layer=4,d_model=64,head_dim=32,seq_len=64,vocab={}", vocab));
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(3);
  return build_model(m, cfg, gen, kF64, true);
}

TEST(ForeignNames, NanochatModelPadsTheVocabularyAndReadsBack) {
  Model model = small_dense(60);
  const ParamAliases a = model_aliases(*model.method, model.cfg, "nanochat");
  EXPECT_EQ(a.aliases.size(), model.params.size());  // every parameter has a nanochat name
  const TensorMap theirs = to_foreign(model.params, a, "nanochat");
  ASSERT_TRUE(theirs.has("transformer.wte.weight"));
  EXPECT_EQ(theirs.at("transformer.wte.weight").sizes().vec(), (std::vector<int64_t>{64, 64}));  // 60 → 64 rows
  EXPECT_EQ(theirs.at("transformer.wte.weight").slice(0, 60).abs().max().item<double>(), 0.0);
  EXPECT_TRUE(theirs.has("transformer.h.3.attn.ve_gate.weight"));  // the last layer has a value embedding
  EXPECT_TRUE(theirs.has("value_embeds.1.weight"));
  EXPECT_FALSE(theirs.has("value_embeds.0.weight"));
  EXPECT_TRUE(theirs.has("transformer.h.2.mlp.c_fc.weight"));
  const TensorMap back = from_foreign(theirs, a, shapes(model.params), "nanochat", "test");
  for (const auto& [n, t] : model.params) EXPECT_TRUE(at::equal(back.at(n), t)) << n;
}

TEST(ForeignNames, ErrorsNameTheTensor) {
  Model model = small_dense(64);
  const ParamAliases a = model_aliases(*model.method, model.cfg, "nanochat");
  TensorMap theirs = to_foreign(model.params, a, "nanochat");
  auto message = [&](const TensorMap& t) {
    try {
      from_foreign(t, a, shapes(model.params), "nanochat", "ckpt");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  TensorMap extra = theirs;
  extra.set("transformer.h.9.attn.c_q.weight", at::zeros({1}));
  EXPECT_NE(message(extra).find("'transformer.h.9.attn.c_q.weight' is not a parameter"), std::string::npos) << message(extra);
  TensorMap missing = theirs;
  missing.erase("x0_lambdas");
  EXPECT_NE(message(missing).find("'x0_lambdas' is missing"), std::string::npos) << message(missing);
  TensorMap shaped = theirs;
  shaped.set("transformer.h.0.attn.c_k.weight", at::zeros({32, 64}, kF64));
  EXPECT_NE(message(shaped).find("'transformer.h.0.attn.c_k.weight' has shape"), std::string::npos) << message(shaped);
  EXPECT_THROW(model_aliases(Registry::get().method("gdn"), Registry::get().method("gdn").config.defaults(), "nanochat"),
               UsageError);
  EXPECT_THROW(check_scheme("hf"), UsageError);
}

TEST(ForeignNames, FlaConvReshapeAndRetnetRotationSign) {
  const MethodSpec& gdn = Registry::get().method("gdn");
  const Config cfg = gdn.cases().front().cfg;
  const LayerCtx ctx{0, cfg.i("n_layer")};
  const ParamAliases a = layer_aliases(gdn, cfg, ctx, "fla");
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(1);
  TensorMap ours;
  for (const auto& d : gdn.params(cfg, ctx)) ours.set(d.name, random_param(d, gen, kF64));
  const TensorMap theirs = to_foreign(ours, a, "fla");
  const at::Tensor& conv = theirs.at("q_conv1d.weight");
  ASSERT_EQ(conv.dim(), 3);
  EXPECT_EQ(conv.size(1), 1);
  EXPECT_TRUE(at::equal(conv.squeeze(1), ours.at("q_conv")));
  EXPECT_TRUE(theirs.has("A_log") && theirs.has("dt_bias") && theirs.has("o_norm.weight"));

  const MethodSpec& ret = Registry::get().method("retnet");
  const Config rc = ret.cases().front().cfg;
  const ParamAliases ra = layer_aliases(ret, rc, ctx, "fla");
  TensorMap rp;
  for (const auto& d : ret.params(rc, ctx)) rp.set(d.name, random_param(d, gen, kF64));
  const TensorMap rt = to_foreign(rp, ra, "fla");
  const int64_t dh = model_dims(rc).head_dim;
  // the first half of head 0's rows as they are, the second half negated; v untouched
  EXPECT_TRUE(at::equal(rt.at("q_proj.weight").slice(0, 0, dh / 2), rp.at("w_q").slice(0, 0, dh / 2)));
  EXPECT_TRUE(at::equal(rt.at("q_proj.weight").slice(0, dh / 2, dh), -rp.at("w_q").slice(0, dh / 2, dh)));
  EXPECT_TRUE(at::equal(rt.at("v_proj.weight"), rp.at("w_v")));
  const TensorMap back = from_foreign(rt, ra, shapes(rp), "fla", "test");
  for (const auto& [n, t] : rp) EXPECT_TRUE(at::equal(back.at(n), t)) << n;
}

// nanochat's init_weights() constants (recorded in the original golden's metadata by
// tests/goldens/make_original_goldens.py) against mixbench's initialisation of the same model.
TEST(NanochatInit, ScalarsAndZeroInitsMatchTheOriginal) {
  const std::string path = std::string(mixbench_test::source_dir()) + "/tests/goldens/original/nanochat_dense.safetensors";
  const SafetensorsFile f = read_safetensors(path);
  const MethodSpec& m = Registry::get().method("dense");
  const Config cfg = config_from_metadata(m, f.metadata, path);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const Model model = build_model(m, cfg, gen, at::TensorOptions().dtype(at::kFloat));
  const ParamAliases a = model_aliases(m, cfg, "nanochat");
  auto ours_of = [&](const std::string& theirs) {
    for (const auto& x : a.aliases)
      if (x.theirs == theirs) return x.ours;
    return std::string();
  };
  for (const char* n : {"resid_lambdas", "x0_lambdas", "backout_lambda", "smear_lambda"}) {
    const std::string key = std::string("nanochat_init.") + n;
    ASSERT_TRUE(f.metadata.count(key)) << key;
    const at::Tensor ours = model.params.at(ours_of(n)).to(at::kDouble).reshape({-1});
    size_t i = 0;
    for (const auto& v : split(f.metadata.at(key), ',')) {
      ASSERT_LT(int64_t(i), ours.numel()) << n;
      EXPECT_NEAR(ours[int64_t(i)].item<double>(), std::stod(v), 1e-7) << n << "[" << i << "]";
      ++i;
    }
    EXPECT_EQ(int64_t(i), ours.numel()) << n;
  }
  for (const auto& n : split(f.metadata.at("nanochat_init.zero"), ',')) {
    const std::string ours = ours_of(n);
    ASSERT_FALSE(ours.empty()) << n;
    EXPECT_EQ(model.params.at(ours).abs().max().item<double>(), 0.0) << n << " is zero-initialised by nanochat";
  }
  for (const auto& [n, t] : model.params)  // and nothing else is zero
    if (t.abs().max().item<double>() == 0.0) {
      const ParamAlias* x = alias_of_ours(a, n);
      ASSERT_NE(x, nullptr);
      EXPECT_NE(f.metadata.at("nanochat_init.zero").find(x->theirs), std::string::npos) << n << " is zero here only";
    }
}

TEST(UnitGolden, LayerAndModelRoundTripAndFaults) {
  const fs::path dir = fs::temp_directory_path() / "mixbench_unit_golden_test";
  fs::create_directories(dir);
  struct Case {
    std::string method, level, names;
  };
  std::vector<std::string> written;
  for (const Case& c : {Case{"deltanet", "layer", "fla"}, Case{"dense", "model", "nanochat"}}) {
    UnitGoldenRequest req;
    req.method = c.method;
    req.level = c.level;
    req.names = c.names;
    req.seq_len = 7;
    const std::string path = (dir / (c.method + ".safetensors")).string();
    write_unit_golden(req, path);
    written.push_back(path);
    for (const char* dt : {"fp64", "fp32"}) {
      ConformanceOptions opt;
      opt.dtype = dt;
      const auto rows = run_unit_golden(path, opt);
      ASSERT_EQ(rows.size(), 2u);
      for (const auto& r : rows) EXPECT_EQ(r["status"], "pass") << c.method << " " << dt << ": " << r.dump();
    }
    for (const char* fault : {"output", "gradient"}) {
      ConformanceOptions opt;
      opt.fault = fault;
      const auto rows = run_unit_golden(path, opt);
      EXPECT_EQ(rows[0]["status"], "pass");  // the reference pass
      EXPECT_EQ(rows[1]["status"], "fail") << c.method << " with an injected " << fault << " fault";
    }
  }
  for (const auto& p : written) fs::remove(p);
  fs::remove(dir);
}

}  // namespace
}  // namespace mixbench
