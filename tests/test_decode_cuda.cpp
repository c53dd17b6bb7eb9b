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
#include "harness/metrics.h"
#include "harness/registry.h"
#include "mixers/attention/attention.h"
#include "tests/test_util.h"

namespace mixbench {
namespace {

// MIXBENCH_DECODE_METHODS=a,b (e.g. under compute-sanitizer): the methods of the captured-step check
std::vector<std::string> decode_methods() {
  std::vector<std::string> all = {"dense_full", "dense", "gqa", "gdn", "kda", "deltanet", "retnet", "gdn_hybrid_swa"};
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
