// MLA and its QK-norm variants (mla, mla_qknorm, mla_nope_qknorm): registration with every part,
// the latent widths' rule (seed 001: d/2 and d/6), QK-norm on the reconstructed heads, the latent
// RMSNorms' learnable weights, conformance (fp64 with finite differences, fp32), absorbed decode
// with the key factors cached, the accountant's audit and the iso-FLOP calibration at every preset.
#include <gtest/gtest.h>
#include <fmt/format.h>

#include <fmt/format.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "harness/backbone.h"
#include "harness/errors.h"
#include "harness/registry.h"
#include "suites/account.h"
#include "suites/conformance.h"
#include "suites/leaderboard.h"
#include "suites/train_presets.h"

using namespace mixbench;
using Json = nlohmann::json;

namespace {

const std::vector<std::string> kMla = {"mla", "mla_qknorm", "mla_nope_qknorm"};

double rel(const at::Tensor& a, const at::Tensor& b) { return (a - b).norm().item<double>() / b.norm().item<double>(); }

// Layer inputs x [B,T,d] and random parameters of `m` at cfg (layer 1 of 4), FP64.
TensorMap layer_inputs(const MethodSpec& m, const Config& cfg, int64_t B, int64_t T, uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const LayerCtx ctx{1, 4, -1};
  TensorMap in = m.make_inputs(cfg, ctx, B, T, gen);
  for (const ParamDef& p : m.params(cfg, ctx)) in.set(p.name, random_param(p, gen, at::TensorOptions().dtype(at::kDouble)));
  return in;
}

std::vector<int64_t> shape_of(const MethodSpec& m, const Config& cfg, const std::string& name) {
  for (const ParamDef& p : m.params(cfg, LayerCtx{1, 4, -1}))
    if (p.name == name) return p.shape;
  return {};
}

Config small_cfg(const MethodSpec& m) {
  const std::string rope = m.name == "mla_nope_qknorm" ? "" : ",mla_rope_dim=8";
  return m.config.parse("n_layer=4,d_model=64,head_dim=16,seq_len=64,vocab=64,mla_q_latent=40,mla_kv_latent=24" + rope);
}

}  // namespace

TEST(MlaVariants, RegisteredWithEveryPart) {
  for (const auto& n : kMla) {
    ASSERT_TRUE(Registry::get().has_method(n)) << n;
    const MethodSpec& m = Registry::get().method(n);
    EXPECT_EQ(m.family, "attention") << n;
    EXPECT_TRUE(bool(m.reference)) << n;
    EXPECT_TRUE(bool(m.forward)) << n;
    EXPECT_TRUE(bool(m.account)) << n;
    EXPECT_TRUE(m.has_decode()) << n;
    EXPECT_EQ(m.ops, std::vector<std::string>{"attention"}) << n;
#if defined(MIXBENCH_WITH_CUDA)
    EXPECT_TRUE(m.has_cuda) << n;
#endif
  }
  // the NoPE variant has no rotary knobs at all; the others refuse an odd rotary width
  EXPECT_EQ(Registry::get().method("mla_nope_qknorm").config.find("mla_rope_dim"), nullptr);
  EXPECT_EQ(Registry::get().method("mla_nope_qknorm").config.find("rope_base"), nullptr);
  EXPECT_THROW(Registry::get().method("mla_nope_qknorm").config.parse("mla_rope_dim=8"), InputError);
  EXPECT_THROW(Registry::get().method("mla_qknorm").config.parse("mla_rope_dim=3"), InputError);
  for (const auto& n : {"mla_qknorm", "mla_nope_qknorm"}) {
    bool wq = false;
    for (const ParamDef& p : Registry::get().method(n).params(small_cfg(Registry::get().method(n)), LayerCtx{1, 4, -1})) {
      EXPECT_NE(p.name, "c_gate") << n;  // no output gate
      wq = wq || p.name == "w_qr";
    }
    EXPECT_EQ(wq, std::string(n) == "mla_qknorm") << n;
  }
}

// Seed 001: query latent 768 and KV latent 256 at d_model 1536 (12 heads of 128): d/2 and d/6,
// each rounded up to a multiple of 16 and at least 16 — for every variant and kda_hybrid's layers.
TEST(MlaVariants, LatentWidthsFollowTheSeedRule) {
  struct Want {
    int64_t d, dh, ql, kvl;
  };
  const std::vector<Want> want = {{1536, 128, 768, 256}, {768, 128, 384, 128}, {384, 64, 192, 64},
                                  {128, 32, 64, 32},     {96, 32, 48, 16},     {32, 16, 16, 16}};
  for (const auto& n : kMla) {
    const MethodSpec& m = Registry::get().method(n);
    for (const Want& w : want) {
      const Config cfg = m.config.parse(fmt::format("n_layer=4,d_model={},head_dim={}", w.d, w.dh));
      EXPECT_EQ(shape_of(m, cfg, "w_dq"), (std::vector<int64_t>{w.ql, w.d})) << n << " d " << w.d;
      EXPECT_EQ(shape_of(m, cfg, "w_dkv"), (std::vector<int64_t>{w.kvl, w.d})) << n << " d " << w.d;
      EXPECT_EQ(shape_of(m, cfg, "q_norm"), (std::vector<int64_t>{w.ql})) << n;
      EXPECT_EQ(shape_of(m, cfg, "kv_norm"), (std::vector<int64_t>{w.kvl})) << n;
    }
    // explicit widths win
    const Config own = m.config.parse("n_layer=4,d_model=768,head_dim=128,mla_q_latent=100,mla_kv_latent=50");
    EXPECT_EQ(shape_of(m, own, "w_dq")[0], 100);
    EXPECT_EQ(shape_of(m, own, "w_dkv")[0], 50);
    // the accountant states the widths in use
    const LayerCost lc = m.account(m.config.parse("n_layer=4,d_model=1536,head_dim=128"), LayerCtx{0, 4, -1},
                                   CostQuery{2048, 2048, 2});
    EXPECT_NE(lc.formula.find("q latent 768, kv latent 256"), std::string::npos) << lc.formula;
  }
  const MethodSpec& h = Registry::get().method("kda_hybrid");
  int mla_layers = 0;
  for (const auto& l : layer_methods(h, h.config.parse("n_layer=12,d_model=1536,head_dim=128")))
    if (l.method->name == "mla") {
      ++mla_layers;
      EXPECT_EQ(l.cfg.i("mla_rope_dim"), 0);
      EXPECT_EQ(shape_of(*l.method, l.cfg, "w_dq"), (std::vector<int64_t>{768, 1536}));
      EXPECT_EQ(shape_of(*l.method, l.cfg, "w_dkv"), (std::vector<int64_t>{256, 1536}));
    }
  EXPECT_EQ(mla_layers, 3);
}

// QK-norm acts on the reconstructed heads: scaling W_UQ and W_QR, or W_UK and W_KR, by 10 leaves
// a QK-norm variant's output unchanged (the normalised heads are the same) but changes mla's
// (its logits grow tenfold).
TEST(MlaVariants, QkNormMakesTheOutputBlindToTheHeadsScale) {
  for (const auto& n : kMla) {
    const MethodSpec& m = Registry::get().method(n);
    const Config cfg = small_cfg(m);
    const TensorMap in = layer_inputs(m, cfg, 2, 11, 5);
    const LayerCtx ctx{1, 4, -1};
    const at::Tensor y = m.forward(in, cfg, ctx, Backend::CPU).at("y");
    // a whole query or key head: with RoPE its rotary part too
    for (const auto& which : std::vector<std::vector<std::string>>{{"w_uq", "w_qr"}, {"w_uk", "w_kr"}}) {
      TensorMap big = in;
      for (const auto& w : which)
        if (big.has(w)) big.set(w, in.at(w) * 10.0);
      const double r = rel(m.forward(big, cfg, ctx, Backend::CPU).at("y"), y);
      const double r_ref = rel(m.reference(big, cfg, ctx).at("y"), m.reference(in, cfg, ctx).at("y"));
      if (n == "mla") {
        EXPECT_GT(r, 1e-2) << n << " " << which[0];
        EXPECT_GT(r_ref, 1e-2) << n << " " << which[0];
      } else {
        // only the RMSNorm's eps (float32 epsilon against the heads' mean square) tells them apart
        EXPECT_LT(r, 1e-6) << n << " " << which[0];
        EXPECT_LT(r_ref, 1e-6) << n << " " << which[0];
      }
    }
  }
}

// DeepSeek's q_norm / kv_norm: learnable weights, initialised to 1, which change the output and
// receive gradients (equal in the optimized path and the FP64 reference).
TEST(MlaVariants, LatentNormWeightsAreLearnable) {
  for (const auto& n : kMla) {
    const MethodSpec& m = Registry::get().method(n);
    const Config cfg = small_cfg(m);
    for (const ParamDef& p : m.params(cfg, LayerCtx{1, 4, -1}))
      if (p.name == "q_norm" || p.name == "kv_norm") {
        EXPECT_EQ(p.init, "const") << n;
        EXPECT_EQ(p.init_a, 1.0) << n;
        EXPECT_EQ(p.group, ParamGroup::Scalar) << n;
        EXPECT_FALSE(p.matmul) << n;
      }
    TensorMap in = layer_inputs(m, cfg, 2, 9, 7);
    const LayerCtx ctx{1, 4, -1};
    for (const char* w : {"q_norm", "kv_norm"}) {
      TensorMap other = in;
      other.set(w, in.at(w) * 1.5 - 0.2);
      EXPECT_GT(rel(m.forward(other, cfg, ctx, Backend::CPU).at("y"), m.forward(in, cfg, ctx, Backend::CPU).at("y")), 1e-3)
          << n << " " << w;
    }
    auto grads = [&](bool reference) {
      TensorMap t = in;
      for (const char* w : {"q_norm", "kv_norm"}) t.set(w, in.at(w).clone().requires_grad_(true));
      at::Tensor y = reference ? m.reference(t, cfg, ctx).at("y") : m.forward(t, cfg, ctx, Backend::CPU).at("y");
      (y * at::cos(y * 3.0)).sum().backward();
      return std::make_pair(t.at("q_norm").grad(), t.at("kv_norm").grad());
    };
    auto [gq, gkv] = grads(false);
    auto [rq, rkv] = grads(true);
    ASSERT_TRUE(gq.defined() && gkv.defined()) << n;
    EXPECT_GT(gq.abs().max().item<double>(), 1e-6) << n;
    EXPECT_GT(gkv.abs().max().item<double>(), 1e-6) << n;
    EXPECT_LT(rel(gq, rq), 1e-10) << n;
    EXPECT_LT(rel(gkv, rkv), 1e-10) << n;
  }
}

TEST(MlaVariants, ConformanceFp64AndFp32) {
  for (const std::string dtype : {"fp64", "fp32"}) {
    ConformanceOptions opt{{"mla_qknorm", "mla_nope_qknorm"}, {}, Backend::CPU, dtype};
    opt.finite_differences = dtype == "fp64";  // of the FP64 reference's gradients
    opt.fd_directions = 1;
    ConformanceSummary s;
    const Json r = run_conformance(opt, s);
    EXPECT_EQ(s.failed + s.errors, 0) << dtype;
    int layer_cases = 0, decode_cases = 0, norm_grads = 0;
    for (const auto& x : r) {
      EXPECT_EQ(x["status"], "pass") << x.dump();
      if (x["method"].is_null()) continue;  // the attention op's own cases
      layer_cases += x["level"] == "layer";
      decode_cases += x["level"] == "invariant";
      for (const auto& c : x["checks"])
        if ((c["tensor"] == "grad_q_norm" || c["tensor"] == "grad_kv_norm") && c["kind"] == "gradient") ++norm_grads;
    }
    EXPECT_EQ(layer_cases, 4 + 3) << dtype;  // mla_qknorm's 4 cases (one NoPE), mla_nope_qknorm's 3
    EXPECT_EQ(decode_cases, 3 + 2) << dtype;  // prefill + decode ≡ forward, every case but T1
    EXPECT_EQ(norm_grads, 2 * layer_cases) << dtype;
  }
}

namespace {
// Prefill of the first 7 of 12 tokens (B = 2) into `cache`, then absorbed decode steps to the end, each
// against the forward; a static cache's device position is advanced after each step as the model does.
void decode_against_forward(const std::string& n, TensorMap& cache, uint64_t seed) {
  const MethodSpec& m = Registry::get().method(n);
  const Config cfg = small_cfg(m);
  const int64_t B = 2, T = 12, pre = 7;
  const TensorMap in = layer_inputs(m, cfg, B, T, seed);
  const LayerCtx ctx{1, 4, -1};
  const at::Tensor y = m.forward(in, cfg, ctx, Backend::CPU).at("y");
  TensorMap head = in;
  head.set("x", in.at("x").slice(1, 0, pre));
  const at::Tensor yp = m.prefill(head, cache, cfg, ctx, Backend::CPU).at("y");
  EXPECT_LT(rel(yp, y.slice(1, 0, pre)), 1e-12) << n;
  if (cache_is_static(cache)) cache.at("pos_dev").fill_(pre);
  for (int64_t t = pre; t < T; ++t) {
    TensorMap step = in;
    step.set("x", in.at("x").slice(1, t, t + 1));
    const at::Tensor yt = m.decode(step, cache, cfg, ctx, Backend::CPU).at("y");
    if (cache_is_static(cache)) cache.at("pos_dev").add_(1);
    EXPECT_LT(rel(yt, y.slice(1, t, t + 1)), 1e-11) << n << " t " << t;
  }
  EXPECT_EQ(cache_pos(cache), T) << n;
}
}  // namespace

// Prefill(T − n) + n absorbed decode steps reproduce the forward; the cache holds the KV latent,
// the rotary key and, with QK-norm, one factor per key head — never K or V — as the accountant bills.
TEST(MlaVariants, AbsorbedDecodeMatchesTheForwardAndCachesLatentsOnly) {
  for (const auto& n : kMla) {
    const MethodSpec& m = Registry::get().method(n);
    const Config cfg = small_cfg(m);
    const int64_t B = 2, T = 12, H = 4, dr = n == "mla_nope_qknorm" ? 0 : 8;
    const LayerCtx ctx{1, 4, -1};
    TensorMap cache;
    decode_against_forward(n, cache, 11);
    EXPECT_FALSE(cache.has("k"));
    EXPECT_FALSE(cache.has("v"));
    EXPECT_TRUE(cache.at("ckv").sizes().equals({B, T, 24})) << n;
    EXPECT_EQ(cache.has("kr"), dr > 0) << n;
    EXPECT_EQ(cache.has("kf"), n != "mla") << n;
    if (n != "mla") EXPECT_TRUE(cache.at("kf").sizes().equals({B, T, H})) << n;
    const int64_t per_token = 24 + dr + (n == "mla" ? 0 : H);
    EXPECT_EQ(cache_bytes(cache), B * T * per_token * 8) << n;
    EXPECT_DOUBLE_EQ(m.account(cfg, ctx, CostQuery{64, 64, 2}).cache_bytes_per_token, per_token * 2.0) << n;
  }
}

// A static cache (the captured decode step's): without QK-norm the latent and the rotary key share one
// buffer [B,capacity,1,P], P = kvl + dr rounded up to 64/128/256 (the split-KV decode kernel's widths;
// zeros past kvl + dr), and the step, multi-query attention over it, still reproduces the forward; with
// QK-norm the buffers stay separate (the key factors).
TEST(MlaVariants, StaticCacheJoinsLatentAndRotaryKeyForTheSplitKvStep) {
  c10::NoGradGuard ng;
  for (const auto& n : kMla) {
    const int64_t B = 2, T = 12, cap = 20, dr = n == "mla_nope_qknorm" ? 0 : 8;
    TensorMap cache;
    cache.set("pos_dev", at::zeros({1}, at::TensorOptions().dtype(at::kLong)));
    cache.set("capacity", at::scalar_tensor(cap, at::TensorOptions().dtype(at::kLong)));
    decode_against_forward(n, cache, 13);
    const bool joint = n == "mla";
    EXPECT_EQ(cache.has("ckr"), joint) << n;
    EXPECT_EQ(cache.has("ckv"), !joint) << n;
    if (!joint) continue;
    const at::Tensor& ckr = cache.at("ckr");
    EXPECT_TRUE(ckr.sizes().equals({B, cap, 1, 64})) << n;  // 24 + 8 → 64
    EXPECT_EQ(cache_bytes(cache), B * cap * 64 * 8) << n;
    // rows [c_KV | k_R | 0] for the T tokens, zeros past them and in the pad
    EXPECT_GT(ckr.slice(1, 0, T).narrow(3, 0, 24).abs().min().item<double>(), 0.0) << n;
    EXPECT_GT(ckr.slice(1, 0, T).narrow(3, 24, dr).abs().max().item<double>(), 0.0) << n;
    EXPECT_TRUE(at::equal(ckr.narrow(3, 32, 32), at::zeros({B, cap, 1, 32}, at::kDouble))) << n;
    EXPECT_TRUE(at::equal(ckr.slice(1, T, cap), at::zeros({B, cap - T, 1, 64}, at::kDouble))) << n;
    // the step's folded weights: x → [c_Q | c_KV | k_R], c_Q → the H queries [W_UKᵀ q_C | q_R | 0] of P
    // each, the H outputs of P → y (zero columns past kvl)
    ASSERT_TRUE(cache.has("w.in") && cache.has("w.q") && cache.has("w.o")) << n;
    const at::Tensor &wx = cache.at("w.in"), &wq = cache.at("w.q"), &wo = cache.at("w.o");
    const int64_t ql = wq.size(1), H = wq.size(0) / 64;
    EXPECT_EQ(wq.size(0), H * 64) << n;
    EXPECT_EQ(wx.size(0), ql + 24 + dr) << n;
    EXPECT_TRUE(wo.sizes().equals({wx.size(1), H * 64})) << n;
    EXPECT_TRUE(at::equal(wq.view({H, 64, ql}).narrow(1, 32, 32), at::zeros({H, 32, ql}, at::kDouble))) << n;
    EXPECT_TRUE(at::equal(wo.view({-1, H, 64}).narrow(2, 24, 40), at::zeros({wo.size(0), H, 40}, at::kDouble))) << n;
  }
}

TEST(MlaVariants, AccountantAuditPasses) {
  for (const auto& n : kMla)
    for (const std::string extra : {"", ",mla_q_latent=48,mla_kv_latent=16"}) {
      AccountOptions opt;
      opt.method = n;
      opt.config = "n_layer=2,d_model=128,head_dim=32,vocab=256,seq_len=64" + extra;
      opt.audit = true;
      const AccountResult r = run_account(opt);
      EXPECT_TRUE(r.row["audit"]["params_match"].get<bool>()) << n << extra;
      EXPECT_LT(r.row["audit"]["fwd_flops_rel_diff"].get<double>(), 1e-6) << n << extra;
      EXPECT_TRUE(r.audit_passed()) << n << extra;
      // the latent norms' weights are the layer's only scalars
      const int64_t ql = extra.empty() ? 64 : 48, kvl = extra.empty() ? 32 : 16;
      const MethodSpec& m = Registry::get().method(n);
      EXPECT_EQ(m.account(r.config, LayerCtx{0, 2, -1}, r.query).params.scalars, ql + kvl) << n;
    }
}

TEST(MlaVariants, CalibrationWithinTwoPercentAtEveryPreset) {
  for (auto it = train_presets_table().begin(); it != train_presets_table().end(); ++it)
    for (const auto& n : {"mla", "mla_qknorm", "mla_nope_qknorm", "kda_hybrid"}) {
      const Calibration c = calibrate(n, it.key());
      EXPECT_TRUE(c.within) << it.key() << " " << n << " residual " << c.residual;
      EXPECT_LE(std::abs(c.residual), 0.02) << it.key() << " " << n;
    }
}
