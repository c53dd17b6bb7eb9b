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
#include "tests/layer_case_inputs.h"
#include "suites/conformance.h"

using namespace mixbench;
using mixbench_test::case_inputs;
using mixbench_test::slice_inputs;
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

// ---------------------------------------------------------------- static caches (a captured decode step)
namespace {

// A layer cache set up as the model sets up a static one: the device position and the capacity.
TensorMap static_layer_cache(int64_t capacity) {
  TensorMap cache;
  cache.set("pos_dev", at::zeros({1}, at::TensorOptions().dtype(at::kLong)));
  cache.set("capacity", at::scalar_tensor(capacity, at::TensorOptions().dtype(at::kLong)));
  return cache;
}

// decode_error with a static cache of `capacity` tokens; `skew` offsets the device position. Also
// checks that no step moves a buffer (a captured step reads them where they were).
double static_decode_error(const MethodSpec& m, const CaseDef& c, const TensorMap& in, int64_t n, int64_t capacity,
                           int64_t skew = 0) {
  c10::NoGradGuard ng;
  LayerCtx ctx{c.layer, c.cfg.i("n_layer")};
  const int64_t T = in.at("x").size(1), Tp = T - n;
  at::Tensor full = m.forward(in, c.cfg, ctx, Backend::CPU).at("y");
  TensorMap cache = static_layer_cache(capacity);
  at::Tensor pre = m.prefill(slice_inputs(in, 0, Tp), cache, c.cfg, ctx, Backend::CPU).at("y");
  EXPECT_TRUE(cache_is_static(cache)) << m.name << ": prefill dropped the static markers";
  std::map<std::string, const void*> where;
  for (const auto& [name, t] : cache)
    if (name != "pos" && name != "capacity") where[name] = t.data_ptr();
  at::Tensor pos = cache.at("pos_dev");
  pos.fill_(Tp + skew);
  double err = compare(full.slice(1, 0, Tp), pre).rel_rms;
  for (int64_t t = Tp; t < T; ++t) {
    at::Tensor y = m.decode(slice_inputs(in, t, t + 1), cache, c.cfg, ctx, Backend::CPU).at("y");
    pos.add_(1);  // the model advances the shared position after every layer has run
    err = std::max(err, compare(full.slice(1, t, t + 1), y).rel_rms);
  }
  for (const auto& [name, t] : cache)
    if (where.count(name)) EXPECT_EQ(t.data_ptr(), where[name]) << m.name << ": '" << name << "' moved";
  return err;
}

}  // namespace

TEST(StaticDecode, EveryAttentionAndLinearLayerKeepsStaticCachesFp64) {
  size_t checked = 0;
  for (const auto& name : decode_methods()) {
    const MethodSpec& m = Registry::get().method(name);
    if (m.family != "attention" && m.family != "linear") continue;
    EXPECT_TRUE(m.static_decode) << name;
    for (const CaseDef& c : m.cases()) {
      if (c.T < 2) continue;
      TensorMap in = case_inputs(m, c, 7);
      const int64_t n = std::min<int64_t>(c.T - 1, 9);
      // exactly the tokens the case holds, and room to spare
      EXPECT_LT(static_decode_error(m, c, in, n, c.T), 1e-10) << name << " " << c.label;
      EXPECT_LT(static_decode_error(m, c, in, n, c.T + 40), 1e-10) << name << " " << c.label;
      ++checked;
    }
  }
  EXPECT_GE(checked, 40u);
}

TEST(StaticDecode, TheDevicePositionIsWhatTheStepReads) {
  // RoPE and the logit scale read the device position: off by one must show far above fp64 noise.
  for (const std::string name : {"dense_full", "gqa", "retnet", "lightning"}) {
    const MethodSpec& m = Registry::get().method(name);
    CaseDef c = m.cases()[1];
    TensorMap in = case_inputs(m, c, 7);
    EXPECT_GT(static_decode_error(m, c, in, 4, c.T + 3, 1), 1e-6) << name;
  }
  const MethodSpec& m = Registry::get().method("dense");
  CaseDef c = m.cases()[5];  // layer1_logit_scale, NoPE off: the scale reads the position
  TensorMap in = case_inputs(m, c, 7);
  EXPECT_LT(static_decode_error(m, c, in, 5, c.T), 1e-10);
  CaseDef h = m.cases()[7];  // layer1_hype_T40: NoPE with the logit scale at inference
  TensorMap hin = case_inputs(m, h, 7);
  EXPECT_GT(static_decode_error(m, h, hin, 5, h.T + 2, 2), 1e-6);
}

TEST(StaticDecode, WindowedLayersKeepARingOfTheWindow) {
  const MethodSpec& m = Registry::get().method("dense");
  CaseDef c = m.cases()[4];  // layer2_T70, 9 visible keys: the ring wraps several times
  TensorMap in = case_inputs(m, c, 3);
  c10::NoGradGuard ng;
  LayerCtx ctx{c.layer, c.cfg.i("n_layer")};
  TensorMap cache = static_layer_cache(100);
  m.prefill(slice_inputs(in, 0, 30), cache, c.cfg, ctx, Backend::CPU);
  EXPECT_EQ(cache.at("k").size(1), 9);
  EXPECT_LT(static_decode_error(m, c, in, 40, 100), 1e-10);
}

TEST(StaticDecode, ModelStepsMatchModelForwardAndReuseTheirBuffers) {
  c10::NoGradGuard ng;
  for (const std::string name : {"dense", "dense_full", "mqa", "lightning", "retnet", "gla", "gdn", "kda", "deltanet",
                                 "gdn_hybrid_swa", "mla", "mla_qknorm", "kda_hybrid"}) {
    const MethodSpec& m = Registry::get().method(name);
    std::string over = "n_layer=4,d_model=64,head_dim=16,seq_len=24,vocab=50";
    if (name == "dense" || name == "gdn_hybrid_swa") over += ",short_window=5";
    Config cfg = m.config.parse(over);
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(11);
    Model model = build_model(m, cfg, gen, at::TensorOptions().dtype(at::kDouble), /*random_nonzero=*/true);
    ASSERT_TRUE(model_has_static_decode(model)) << name;
    const int64_t B = 2, T = 21, Tp = 9;
    at::Tensor idx = at::randint(50, {B, T}, gen, at::TensorOptions().dtype(at::kLong));
    at::Tensor full = model_forward(model, idx, Backend::CPU);
    ModelCache cache;
    std::vector<const void*> buffers;
    for (int pass = 0; pass < 2; ++pass) {  // the second prefill reuses the first one's buffers
      at::Tensor lp = model_prefill(model, idx.slice(1, 0, Tp), Backend::CPU, &cache, T);
      EXPECT_LT(compare(full.slice(1, Tp - 1, Tp), lp).rel_rms, 1e-10) << name;
      EXPECT_EQ(cache.pos_dev.item<int64_t>(), Tp);
      for (int64_t t = Tp; t < T; ++t) {
        at::Tensor lt = model_decode_step(model, idx.slice(1, t, t + 1), cache, Backend::CPU);
        EXPECT_LT(compare(full.slice(1, t, t + 1), lt).rel_rms, 1e-10) << name << " t=" << t << " pass " << pass;
      }
      EXPECT_EQ(cache.pos, T);
      EXPECT_EQ(cache.pos_dev.item<int64_t>(), T);
      std::vector<const void*> now;
      for (const auto& l : cache.layers)
        for (const auto& [n, t] : l)
          if (n != "pos" && n != "capacity") now.push_back(t.data_ptr());
      now.push_back(cache.prev_embed.data_ptr());
      if (pass == 1) EXPECT_EQ(now, buffers) << name << ": a second prefill moved the static buffers";
      buffers = now;
    }
    // the cache is full: one more step is refused
    EXPECT_THROW(model_decode_step(model, idx.slice(1, 0, 1), cache, Backend::CPU), InputError) << name;
  }
}

TEST(StaticDecode, RefusesWhatItCannotHold) {
  c10::NoGradGuard ng;
  const MethodSpec& m = Registry::get().method("dense_full");
  Config cfg = m.config.parse("n_layer=2,d_model=64,head_dim=16,seq_len=8,vocab=32");
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(1);
  Model model = build_model(m, cfg, gen, at::TensorOptions().dtype(at::kDouble), true);
  at::Tensor idx = at::zeros({1, 6}, at::TensorOptions().dtype(at::kLong));
  ModelCache cache;
  EXPECT_THROW(model_prefill(model, idx, Backend::CPU, &cache, 6), InputError);  // no room for a decoded token
  EXPECT_THROW(model_prefill(model, idx, Backend::CPU, &cache, -1), UsageError);
  // methods whose hooks or stream keep no fixed-size state
  for (const std::string name : {"huginn", "mor"}) {
    const MethodSpec& other = Registry::get().method(name);
    Model om = build_model(other, other.config.parse("n_layer=4,d_model=64,head_dim=16,seq_len=8,vocab=32"), gen,
                           at::TensorOptions().dtype(at::kDouble), true);
    EXPECT_FALSE(model_has_static_decode(om)) << name;
    if (model_has_decode(om)) {
      ModelCache oc;
      EXPECT_THROW(model_prefill(om, idx, Backend::CPU, &oc, 16), UsageError) << name;
    }
  }
  for (const std::string name : {"dense", "gdn", "gdn_hybrid", "residual_standard", "mla", "kda_hybrid", "ut_act",
                                 "moba_hybrid", "deeploop"}) {
    const MethodSpec& ok = Registry::get().method(name);
    Model om = build_model(ok, ok.config.parse("n_layer=4,d_model=64,head_dim=16,seq_len=8,vocab=32"), gen,
                           at::TensorOptions().dtype(at::kDouble), true);
    EXPECT_TRUE(model_has_static_decode(om)) << name;
  }
}
