// Incremental decoding: every method's prefill/decode hooks against its forward, the model-level
// prefill + token-by-token decode against model_forward, and the conformance suite's decode check.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>

#include "harness/backbone.h"
#include "harness/errors.h"
#include "harness/metrics.h"
#include "harness/registry.h"
#include "suites/conformance.h"

using namespace mixbench;
using Json = nlohmann::json;

namespace {

// Every single-mixer method with decode hooks (a hybrid dispatches to its layers' hooks; test_hybrid
// checks hybrids as whole models).
std::vector<std::string> decode_methods() {
  std::vector<std::string> out;
  for (const auto* m : Registry::get().methods())
    if (m->has_decode() && !m->is_hybrid()) out.push_back(m->name);
  return out;
}

TensorMap slice_inputs(const TensorMap& in, int64_t a, int64_t b) {
  TensorMap s = in;
  s.set("x", in.at("x").slice(1, a, b));
  if (in.has("ve")) s.set("ve", in.at("ve").slice(1, a, b));
  return s;
}

// Layer inputs and random parameters of a method's case, FP64.
TensorMap case_inputs(const MethodSpec& m, const CaseDef& c, uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  LayerCtx ctx{c.layer, c.cfg.i("n_layer")};
  TensorMap in = m.make_inputs(c.cfg, ctx, c.B, c.T, gen);
  for (const auto& def : m.params(c.cfg, ctx)) in.set(def.name, random_param(def, gen, at::TensorOptions().dtype(at::kDouble)));
  return in;
}

// Max rel-RMS of prefill(T−n) + n decode steps against forward(T) over the last n positions.
// `skew` shifts the cache position before every step (0 = correct use).
double decode_error(const MethodSpec& m, const CaseDef& c, const TensorMap& in, int64_t n, int64_t skew = 0) {
  c10::NoGradGuard ng;
  LayerCtx ctx{c.layer, c.cfg.i("n_layer")};
  const int64_t T = in.at("x").size(1), Tp = T - n;
  at::Tensor full = m.forward(in, c.cfg, ctx, Backend::CPU).at("y");
  TensorMap cache;
  at::Tensor pre = m.prefill(slice_inputs(in, 0, Tp), cache, c.cfg, ctx, Backend::CPU).at("y");
  double err = compare(full.slice(1, 0, Tp), pre).rel_rms;
  for (int64_t t = Tp; t < T; ++t) {
    EXPECT_EQ(cache_pos(cache), t);
    if (skew) set_cache_pos(cache, cache_pos(cache) + skew);
    at::Tensor y = m.decode(slice_inputs(in, t, t + 1), cache, c.cfg, ctx, Backend::CPU).at("y");
    if (skew) set_cache_pos(cache, cache_pos(cache) - skew);
    err = std::max(err, compare(full.slice(1, t, t + 1), y).rel_rms);
  }
  return err;
}

}  // namespace

TEST(Decode, EveryAttentionAndLinearMethodRegistersHooks) {
  size_t n = 0;
  for (const auto* m : Registry::get().methods())
    if (m->family == "attention" || m->family == "linear") {
      EXPECT_TRUE(m->has_decode()) << m->name;
      ++n;
    }
  EXPECT_GE(n, 12u);
  EXPECT_GE(decode_methods().size(), n);
}

TEST(Decode, LayerPrefillPlusStepsMatchesForwardFp64) {
  for (const auto& name : decode_methods()) {
    const MethodSpec& m = Registry::get().method(name);
    for (const CaseDef& c : m.cases()) {
      if (c.T < 2) continue;
      TensorMap in = case_inputs(m, c, 7);
      for (int64_t n : {int64_t(1), std::min<int64_t>(c.T - 1, 9)}) {
        EXPECT_LT(decode_error(m, c, in, n), 1e-10) << name << " " << c.label << " n=" << n;
      }
    }
  }
}

TEST(Decode, WrongPositionIsDetected) {
  // RoPE (attention, retnet, lightning) and the logit scale depend on the position: a cache
  // position off by one must show up far above the fp64 threshold.
  for (const std::string name : {"dense_full", "gqa", "retnet", "lightning"}) {
    const MethodSpec& m = Registry::get().method(name);
    CaseDef c = m.cases()[1];
    TensorMap in = case_inputs(m, c, 7);
    EXPECT_GT(decode_error(m, c, in, 4, 1), 1e-6) << name;
  }
  // With the HypeNet logit scale on (it depends on the position too), decoding still matches.
  const MethodSpec& m = Registry::get().method("dense");
  CaseDef c = m.cases()[5];  // layer1_logit_scale
  ASSERT_GT(c.cfg.f("logit_scale_a"), 0);
  TensorMap in = case_inputs(m, c, 7);
  EXPECT_LT(decode_error(m, c, in, 5), 1e-10);
}

TEST(Decode, WindowedCacheKeepsOnlyTheWindow) {
  const MethodSpec& m = Registry::get().method("dense");
  CaseDef c = m.cases()[4];  // layer2_T70, short window of 8 left keys (9 visible)
  ASSERT_EQ(c.layer, 2);
  TensorMap in = case_inputs(m, c, 3);
  c10::NoGradGuard ng;
  LayerCtx ctx{c.layer, c.cfg.i("n_layer")};
  TensorMap cache;
  m.prefill(slice_inputs(in, 0, 60), cache, c.cfg, ctx, Backend::CPU);
  EXPECT_EQ(cache.at("k").size(1), 9);
  m.decode(slice_inputs(in, 60, 61), cache, c.cfg, ctx, Backend::CPU);
  EXPECT_EQ(cache.at("k").size(1), 9);
  EXPECT_EQ(cache_pos(cache), 61);
  EXPECT_LT(decode_error(m, c, in, 12), 1e-10);
}

TEST(Decode, ModelTokenByTokenMatchesModelForward) {
  c10::NoGradGuard ng;
  for (const std::string name : {"dense", "gqa", "lightning", "gla", "gdn", "kda"}) {
    const MethodSpec& m = Registry::get().method(name);
    std::string over = "n_layer=4,d_model=64,head_dim=16,seq_len=24,vocab=50";
    if (name == "dense") over += ",short_window=5";
    Config cfg = m.config.parse(over);
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(11);
    Model model = build_model(m, cfg, gen, at::TensorOptions().dtype(at::kDouble), /*random_nonzero=*/true);
    const int64_t B = 2, T = 21, Tp = 9;
    at::Tensor idx = at::randint(50, {B, T}, gen, at::TensorOptions().dtype(at::kLong));
    at::Tensor full = model_forward(model, idx, Backend::CPU);
    // last-position prefill without a cache
    at::Tensor last = model_prefill(model, idx, Backend::CPU);
    ASSERT_EQ(last.sizes(), (std::vector<int64_t>{B, 1, 50}));
    EXPECT_LT(compare(full.slice(1, T - 1), last).rel_rms, 1e-10) << name;
    ModelCache cache;
    at::Tensor lp = model_prefill(model, idx.slice(1, 0, Tp), Backend::CPU, &cache);
    EXPECT_LT(compare(full.slice(1, Tp - 1, Tp), lp).rel_rms, 1e-10) << name;
    EXPECT_EQ(cache.pos, Tp);
    for (int64_t t = Tp; t < T; ++t) {
      at::Tensor lt = model_decode_step(model, idx.slice(1, t, t + 1), cache, Backend::CPU);
      EXPECT_LT(compare(full.slice(1, t, t + 1), lt).rel_rms, 1e-10) << name << " t=" << t;
    }
    EXPECT_EQ(cache.pos, T);
    // the smear reads the previous token: decoding a different previous token changes the logits
    ModelCache c2;
    model_prefill(model, idx.slice(1, 0, Tp), Backend::CPU, &c2);
    c2.prev_embed = c2.prev_embed * 0.5;
    at::Tensor off = model_decode_step(model, idx.slice(1, Tp, Tp + 1), c2, Backend::CPU);
    EXPECT_GT(compare(full.slice(1, Tp, Tp + 1), off).rel_rms, 1e-8) << name;
  }
}

TEST(Decode, DecodeStepNeedsAFilledCache) {
  const MethodSpec& m = Registry::get().method("gqa");
  Config cfg = m.config.parse("n_layer=2,d_model=64,head_dim=16,seq_len=8,vocab=32");
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(1);
  Model model = build_model(m, cfg, gen, at::TensorOptions().dtype(at::kDouble), true);
  ModelCache cache;
  at::Tensor idx = at::zeros({1, 1}, at::TensorOptions().dtype(at::kLong));
  EXPECT_THROW(model_decode_step(model, idx, cache, Backend::CPU), InputError);
  model_prefill(model, idx, Backend::CPU, &cache);
  EXPECT_THROW(model_decode_step(model, at::zeros({1, 2}, idx.options()), cache, Backend::CPU), InputError);
}

TEST(Decode, ConformanceRecordsDecodeInvariants) {
  for (const std::string dtype : {"fp64", "fp32"}) {
    ConformanceOptions opt;
    opt.methods = {"dense", "gdn"};
    opt.dtype = dtype;
    opt.finite_differences = false;
    ConformanceSummary sum;
    Json res = run_conformance(opt, sum);
    std::map<std::string, int> n;
    for (const auto& r : res) {
      const std::string cs = r["case"];
      if (r["level"] != "invariant" || cs.find("/decode") == std::string::npos) continue;
      ++n[r["method"].get<std::string>()];
      EXPECT_EQ(r["status"], "pass") << r.dump();
      ASSERT_EQ(r["checks"].size(), 2u);
      EXPECT_EQ(r["checks"][1]["tensor"], "decode_y");
      EXPECT_EQ(r["checks"][1]["threshold"].get<double>(), threshold(dtype, TensorKind::Output, true));
    }
    for (const auto& mname : opt.methods) EXPECT_GE(n[mname], 4) << mname;
    EXPECT_EQ(sum.failed, 0);
    EXPECT_EQ(sum.errors, 0);
  }
}
