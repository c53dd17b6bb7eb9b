// On a machine with a GPU: the split-KV decode kernel against the LibTorch path over the masked
// cache (every head-dim it is built for, GQA groups larger than a block's, rings, the logit scale,
// positions far below the capacity), and the captured decode step (DecodeGraph, with the fused
// short-convolution and delta-rule step kernels of the static caches) against the eager steps it
// replaces: the same logits, token by token, at every position.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

#include "harness/backbone.h"
#include "harness/decode_graph.h"
#include "harness/errors.h"
#include "harness/metrics.h"
#include "harness/registry.h"
#include "mixers/attention/attention.h"
#include "mixers/linear/delta_layer.h"
#include "tests/test_util.h"

namespace mixbench {
namespace {

// MIXBENCH_DECODE_METHODS=a,b (e.g. under compute-sanitizer): the methods of the captured-step check
std::vector<std::string> decode_methods() {
  std::vector<std::string> all = {"dense_full", "dense", "gqa", "gdn", "kda", "deltanet", "retnet", "gdn_hybrid_swa",
                                  "hc", "mhc", "attnres"};
  const char* env = std::getenv("MIXBENCH_DECODE_METHODS");
  if (!env) return all;
  std::vector<std::string> out;
  std::string s(env);
  for (size_t a = 0; a <= s.size();) {
    const size_t b = std::min(s.find(',', a), s.size());
    if (b > a) out.push_back(s.substr(a, b - a));
    a = b + 1;
  }
  return out;
}

using mixbench_test::rel_rms;

TEST(DecodeCuda, SplitKvKernelMatchesTheMaskedPath) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  c10::NoGradGuard ng;
  at::manual_seed(5);
  // B, H, Hkv, D, cap, pos, logit scale a
  const std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, double> cases[] = {
      {1, 6, 6, 128, 1100, 1023, 0.0},  {2, 8, 2, 128, 4096, 17, 0.0},   {3, 16, 1, 64, 300, 299, 0.0},
      {1, 12, 12, 64, 9, 70, 0.0},       {2, 4, 4, 256, 2048, 2000, 4.0}, {8, 32, 2, 128, 513, 0, 0.0},
      {1, 6, 6, 128, 131072, 131000, 0.0}};
  // MIXBENCH_DECODE_SMALL=1 (under compute-sanitizer): the cases up to 8K slots only
  const bool small = std::getenv("MIXBENCH_DECODE_SMALL") != nullptr;
  for (auto dt : {at::kFloat, at::kBFloat16})
    for (const auto& [B, H, Hkv, D, cap, pos, a] : cases) {
      if (small && cap > 8192) continue;
      auto opts = at::TensorOptions().device(at::kCUDA).dtype(dt);
      at::Tensor q = at::randn({B, H, D}, opts), K = at::randn({B, cap, Hkv, D}, opts), V = at::randn({B, cap, Hkv, D}, opts);
      at::Tensor p = at::full({1}, pos, opts.dtype(at::kLong));
      const double scale = 1.0 / std::sqrt(double(D));
      at::Tensor ref = attention_decode_static_reference(q.to(at::kDouble), K.to(at::kDouble), V.to(at::kDouble), p, scale, a);
      at::Tensor got = attention_decode_static(q, K, V, p, scale, a);
      ASSERT_EQ(got.scalar_type(), dt);
      const std::string where = fmt::format("{} B{} H{} Hkv{} D{} cap{} pos{} a{}", c10::toString(dt), B, H, Hkv, D, cap, pos, a);
      EXPECT_LE(rel_rms(ref, got), dt == at::kFloat ? 1e-5 : 1e-2) << where;
      // the position decides which slots count: slot pos gets a key along its queries (the largest
      // score, whatever the logit scale) and a large value, so reading up to pos and up to pos − 1 must
      // differ by far more than the rounding; each against the reference at its own position
      if (pos > 0 && pos < cap) {
        at::Tensor K2 = K.clone(), V2 = V.clone();
        K2.select(1, pos).copy_(q.view({B, Hkv, H / Hkv, D}).sum(2));
        V2.select(1, pos).fill_(1000.0);
        at::Tensor with = attention_decode_static(q, K2, V2, p, scale, a), without = attention_decode_static(q, K2, V2, p - 1, scale, a);
        EXPECT_GT(rel_rms(with, without), 0.5) << where << ": the position is not what the kernel reads";
        auto ref_at = [&](const at::Tensor& pp) {
          return attention_decode_static_reference(q.to(at::kDouble), K2.to(at::kDouble), V2.to(at::kDouble), pp, scale, a);
        };
        const double tol = dt == at::kFloat ? 1e-5 : 1e-2;
        EXPECT_LE(rel_rms(ref_at(p), with), tol) << where << " with slot pos";
        EXPECT_LE(rel_rms(ref_at(p - 1), without), tol) << where << " at pos - 1";
      }
    }
}

TEST(DecodeCuda, QkvStepKernelMatchesTheLibTorchPath) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  c10::NoGradGuard ng;
  at::manual_seed(9);
  // B, H, Hkv, D, cap, pos, value embedding, RoPE base (0 = none)
  const std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, double> cases[] = {
      {1, 6, 6, 128, 1100, 1023, true, 100000.0}, {1, 6, 6, 128, 1100, 517, false, 100000.0},
      {3, 8, 2, 64, 9, 70, true, 10000.0},        {2, 4, 1, 16, 40, 0, true, 100000.0},
      {2, 12, 4, 256, 300, 299, false, 100000.0}, {2, 4, 4, 64, 33, 5, true, 0.0},
      {5, 2, 2, 1024, 16, 15, true, 500.0}};
  for (auto dt : {at::kFloat, at::kBFloat16})
    for (const auto& [B, H, Hkv, D, cap, pos, with_ve, base] : cases) {
      auto opts = at::TensorOptions().device(at::kCUDA).dtype(dt);
      const int64_t N = (H + 2 * Hkv) * D + (with_ve ? Hkv : 0);
      // p as a GEMM leaves it: its q|k|v parts of the scale of projections of a normalised input
      at::Tensor p = at::randn({B, N}, opts);
      at::Tensor ve = with_ve ? at::randn({B, Hkv * D}, opts) : at::Tensor();
      at::Tensor K = at::randn({B, cap, Hkv, D}, opts), V = at::randn({B, cap, Hkv, D}, opts);
      at::Tensor K0 = K.clone(), V0 = V.clone();
      at::Tensor pd = at::full({1}, pos, opts.dtype(at::kLong));
      const std::string where = fmt::format("{} B{} H{} Hkv{} D{} cap{} pos{} ve{} base{}", c10::toString(dt), B, H, Hkv, D,
                                            cap, pos, with_ve, base);
      // fp64 reference on the same inputs, and the same LibTorch path in the kernel's dtype
      at::Tensor Kr = K0.to(at::kDouble), Vr = V0.to(at::kDouble);
      at::Tensor qr = attention_decode_qkv_reference(p.to(at::kDouble), with_ve ? ve.to(at::kDouble) : ve, pd, Kr, Vr, H, base);
      at::Tensor Kt = K0.clone(), Vt = V0.clone();
      at::Tensor qt = attention_decode_qkv_reference(p, ve, pd, Kt, Vt, H, base);
      at::Tensor q = attention_decode_qkv(p, ve, pd, K, V, H, base);
      ASSERT_EQ(q.sizes(), (at::IntArrayRef{B, H, D})) << where;
      ASSERT_EQ(q.scalar_type(), dt);
      const int64_t slot = pos % cap;
      const double tol = dt == at::kFloat ? 1e-5 : 1e-2;
      EXPECT_LE(rel_rms(qr, q), tol) << where << " q";
      EXPECT_LE(rel_rms(Kr.select(1, slot), K.select(1, slot)), tol) << where << " k";
      EXPECT_LE(rel_rms(Vr.select(1, slot), V.select(1, slot)), tol) << where << " v";
      // against the eager arithmetic in the same dtype: the same roundings, so at most an ulp apart
      const double same = dt == at::kFloat ? 1e-6 : 4e-3;
      EXPECT_LE(rel_rms(qt, q), same) << where << " q vs the LibTorch path";
      EXPECT_LE(rel_rms(Kt.select(1, slot), K.select(1, slot)), same) << where << " k vs the LibTorch path";
      EXPECT_LE(rel_rms(Vt.select(1, slot), V.select(1, slot)), same) << where << " v vs the LibTorch path";
      // every other slot untouched
      at::Tensor other = at::ones({cap}, at::TensorOptions().dtype(at::kBool).device(at::kCUDA));
      other[slot] = false;
      EXPECT_TRUE(at::equal(K.index({at::indexing::Slice(), other}), K0.index({at::indexing::Slice(), other}))) << where;
      EXPECT_TRUE(at::equal(V.index({at::indexing::Slice(), other}), V0.index({at::indexing::Slice(), other}))) << where;
      // q and k are RMS-normalised to 1.2 per head
      const at::Tensor rms = q.to(at::kDouble).pow(2).mean(-1).sqrt();
      EXPECT_LE((rms - 1.2).abs().max().item<double>(), dt == at::kFloat ? 1e-4 : 2e-2) << where;
    }
  // a view of a wider GEMM output (row stride > its width) is refused by shape, not read wrongly
  auto opts = at::TensorOptions().device(at::kCUDA).dtype(at::kFloat);
  at::Tensor K = at::zeros({1, 4, 1, 16}, opts), V = at::zeros({1, 4, 1, 16}, opts);
  at::Tensor pd = at::zeros({1}, opts.dtype(at::kLong));
  EXPECT_THROW(attention_decode_qkv(at::randn({1, 63}, opts), at::Tensor(), pd, K, V, 1, 0.0), InputError);
  EXPECT_THROW(attention_decode_qkv(at::randn({1, 48}, opts), at::randn({1, 16}, opts), pd, K, V, 1, 0.0), InputError);
}

TEST(DecodeCuda, GatedDeltaStepFormsItsGates) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  c10::NoGradGuard ng;
  at::manual_seed(13);
  // B, H, K, V
  const std::tuple<int64_t, int64_t, int64_t, int64_t> cases[] = {{1, 6, 128, 128}, {3, 4, 64, 32}, {2, 2, 16, 16}, {2, 3, 256, 64}};
  for (auto dt : {at::kFloat, at::kBFloat16})
    for (const auto& [B, H, K, V] : cases) {
      auto opts = at::TensorOptions().device(at::kCUDA).dtype(dt);
      auto f32 = opts.dtype(at::kFloat);
      auto unit = [](const at::Tensor& t) { return t / t.to(at::kFloat).pow(2).sum(-1, true).sqrt().to(t.scalar_type()); };
      const linear::DeltaQKV qkv{unit(at::randn({B, 1, H, K}, opts)), unit(at::randn({B, 1, H, K}, opts)),
                                 at::randn({B, 1, H, V}, opts)};
      // β's and the decay's raw projections as views of one wider GEMM row (row stride 2H + 5)
      const at::Tensor raw = at::randn({B, 1, 2 * H + 5}, opts);
      const at::Tensor b_lin = raw.narrow(-1, 0, H), a_lin = raw.narrow(-1, H, H);
      const at::Tensor neg_a = -at::rand({H}, f32).mul(2.0).exp();
      at::Tensor dt_bias = at::randn({H}, f32) * 2.0;
      dt_bias[0] = 25.0;  // softplus past its threshold on head 0
      const at::Tensor S0 = at::randn({B, H, K, V}, f32) * 0.1;
      auto make_cache = [&](const at::Tensor& S) {
        TensorMap c;
        c.set("pos_dev", at::zeros({1}, opts.dtype(at::kLong)));
        c.set("capacity", at::scalar_tensor(int64_t(64), at::TensorOptions().dtype(at::kLong)));
        c.set("state", S);
        set_cache_pos(c, 5);
        return c;
      };
      TensorMap cache = make_cache(S0.clone());
      const at::Tensor o = linear::gated_delta_static_step(qkv, b_lin, a_lin, neg_a, dt_bias, Backend::CUDA, cache);
      // fp64 LibTorch: the gates' ops, then the delta rule's step
      auto d64 = [](const at::Tensor& t) { return t.to(at::kDouble); };
      TensorMap ref = make_cache(d64(S0));
      const at::Tensor o_ref = linear::gated_delta_static_step({d64(qkv.q), d64(qkv.k), d64(qkv.v)}, d64(b_lin), d64(a_lin),
                                                               d64(neg_a), d64(dt_bias), Backend::CUDA, ref);
      const std::string where = fmt::format("{} B{} H{} K{} V{}", c10::toString(dt), B, H, K, V);
      ASSERT_EQ(o.sizes(), (at::IntArrayRef{B, 1, H, V})) << where;
      ASSERT_EQ(o.scalar_type(), dt) << where;
      const double tol = dt == at::kFloat ? 1e-5 : 1e-2;
      EXPECT_LE(rel_rms(o_ref, o), tol) << where << " o";
      EXPECT_LE(rel_rms(ref.at("state"), cache.at("state")), dt == at::kFloat ? 1e-6 : 1e-3) << where << " state";
      EXPECT_EQ(cache_pos(cache), 6) << where;
      // the decay matters: a state updated without it is far from the one with it
      EXPECT_GT(rel_rms(ref.at("state"), d64(S0)), 1e-2) << where;
    }
}

TEST(DecodeCuda, CapturedStepsMatchEagerSteps) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  c10::NoGradGuard ng;
  for (auto dt : {at::kFloat, at::kBFloat16})
    for (const std::string& name : decode_methods()) {
      const MethodSpec& m = Registry::get().method(name);
      std::string over = "n_layer=4,d_model=256,head_dim=64,seq_len=64,vocab=97";
      if (name == "dense" || name == "gdn_hybrid_swa") over += ",short_window=12";
      Config cfg = m.config.parse(over);
      at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(3);
      Model model = build_model(m, cfg, gen, at::TensorOptions().dtype(at::kFloat), true);
      TensorMap moved;
      for (const auto& [n, p] : model.params) moved.set(n, p.to(at::kCUDA, dt));
      model.params = moved;
      ASSERT_TRUE(model_has_static_decode(model)) << name;
      // MIXBENCH_DECODE_SMALL=1 (under compute-sanitizer): fewer steps
      const bool small = std::getenv("MIXBENCH_DECODE_SMALL") != nullptr;
      const int64_t B = 2, T = small ? 26 : 48, Tp = 20;
      at::Tensor idx = at::randint(97, {B, T}, gen, at::TensorOptions().dtype(at::kLong)).to(at::kCUDA);
      // the eager path: growing caches, host positions
      ModelCache eager;
      model_prefill(model, idx.slice(1, 0, Tp), Backend::CUDA, &eager);
      std::vector<at::Tensor> want;
      for (int64_t t = Tp; t < T; ++t) want.push_back(model_decode_step(model, idx.slice(1, t, t + 1), eager, Backend::CUDA));
      // the captured step, teacher-forced with the same tokens
      ModelCache cache;
      model_prefill(model, idx.slice(1, 0, Tp), Backend::CUDA, &cache, T + 4);
      DecodeGraph g(model, cache, idx.slice(1, Tp, Tp + 1).contiguous());
      const double tol = dt == at::kFloat ? 1e-4 : 3e-2;
      EXPECT_LE(rel_rms(want[0], g.logits()), tol) << name << " warm-up step";
      for (int64_t t = Tp + 1; t < T; ++t) {
        g.input().copy_(idx.slice(1, t, t + 1));
        g.step();
        EXPECT_LE(rel_rms(want[size_t(t - Tp)], g.logits()), tol) << name << " " << c10::toString(dt) << " t=" << t;
      }
      EXPECT_EQ(cache.pos, T);
      EXPECT_EQ(cache.pos_dev.item<int64_t>(), T);
      // greedy: the step feeds its own argmax back
      g.step();
      EXPECT_TRUE(at::equal(g.input(), g.logits().argmax(-1))) << name;
    }
}

}  // namespace
}  // namespace mixbench
