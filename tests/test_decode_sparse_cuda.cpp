// On a machine with a GPU: the decode steps of the sparse-attention layers and of the models that
// became capturable with them (the sparse hybrids, the fixed-count loops) captured in a CUDA graph
// and replayed position after position, against the eager steps on the same GPU (fp32, bf16) and,
// at fp32, against the FP64 forward on the CPU; the selection the steps share (block_topk_own)
// against block_topk on the GPU, ties included; the length-aware row products (row_scores, row_mix)
// against their masked whole-buffer definition, eagerly and replayed from one capture at several
// positions.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "harness/backbone.h"
#include "harness/decode_graph.h"
#include "harness/registry.h"
#include "mixers/attention/attention.h"
#include "mixers/sparse/sparse.h"
#include "mixers/sparse/sparse_decode.h"
#include "tests/layer_case_inputs.h"
#include "tests/test_util.h"

namespace mixbench {
namespace {

using mixbench_test::case_inputs;
using mixbench_test::rel_rms;
using mixbench_test::slice_inputs;

const std::vector<std::string> kSparse = {"moba", "dsa", "qsa", "nsa", "seer"};
const std::vector<std::string> kModels = {"moba",    "dsa",         "qsa",         "nsa",
                                          "seer",    "moba_hybrid", "qsa_hybrid",  "deeploop",
                                          "fixed_recursive", "lt2_gdn", "lt2_hybrid_full_gdn", "lt2_hybrid_gdn_dsa",
                                          "loopformer_fixed2", "ouro", "ut_act"};

TEST(SparseDecodeCuda, BlockTopkOwnMatchesBlockTopk) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(9);
  // B, S, T, N (appended: complete blocks; counted: every block), block, topk, ties
  struct Case {
    int64_t B, S, T, bs, topk;
    bool counted, ties;
  };
  const Case cases[] = {{2, 3, 37, 4, 3, false, false}, {1, 1, 70, 5, 4, false, true}, {2, 4, 41, 2, 4, true, true},
                        {1, 2, 33, 8, 16, true, false}, {3, 1, 300, 64, 4, false, false}};
  for (auto dt : {at::kFloat, at::kBFloat16})
    for (const Case& c : cases) {
      const int64_t N = c.counted ? (c.T + c.bs - 1) / c.bs : c.T / c.bs;
      auto o = at::TensorOptions().dtype(at::kDouble);
      at::Tensor s = c.ties ? at::relu(at::randint(-2, 3, {c.B, c.S, c.T, N}, gen, o)) : at::randn({c.B, c.S, c.T, N}, gen, o);
      const at::Tensor sg = s.to(at::kCUDA, dt);
      const at::Tensor want = block_topk_fast(sg, c.bs, c.topk, c.counted);
      const at::Tensor own = at::div(at::arange(c.T, sg.options().dtype(at::kLong)), c.bs, "floor");
      const at::Tensor got = block_topk_own(sg, own, c.topk, c.counted);
      EXPECT_TRUE(at::equal(want.cpu(), got.cpu())) << c10::toString(dt) << " T" << c.T << " bs" << c.bs;
    }
}

// sparse_decode::row_scores / row_mix on the GPU (their kernels: the position read on the device):
// the rows the position reaches as the masked whole-buffer products (cuBLAS), 0 past them, the
// buffer's rows past the reach (NaN) never read; one capture replayed at other positions.
TEST(SparseDecodeCuda, RowProductsMatchTheMaskedBuffer) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  c10::NoGradGuard ng;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(21);
  const auto cpu = at::TensorOptions().dtype(at::kDouble);
  struct Types {
    at::ScalarType q, buf;
  };
  const Types types[] = {{at::kFloat, at::kFloat},     {at::kBFloat16, at::kBFloat16}, {at::kHalf, at::kHalf},
                         {at::kFloat, at::kBFloat16}, {at::kFloat, at::kHalf}};
  for (const Types& ty : types)
    for (int64_t D : {16, 72, 128})
      for (int64_t per : {1, 8}) {
        const int64_t B = 2, S = 3, G = 4, L = 137, last = per == 1 ? 100 : 600;
        const at::Tensor q = at::randn({B, S, G, D}, gen, cpu).to(at::kCUDA, ty.q);
        const at::Tensor w = at::randn({B, S, G}, gen, cpu).to(at::kCUDA, ty.q);
        const at::Tensor p = at::rand({B, S, G, L}, gen, cpu).to(at::kCUDA, ty.q);
        const at::Tensor K = at::randn({B, L, S, D}, gen, cpu).to(at::kCUDA, ty.buf);
        const at::Tensor V = at::randn({B, L, S, D}, gen, cpu).to(at::kCUDA, ty.buf);
        // the masked definition reads clean buffers; the kernels get NaN in the rows past the reach
        // of the last position checked
        const at::Tensor Kc = K.clone(), Vc = V.clone();
        const int64_t beyond = std::min(last / per + 1, L);
        ASSERT_LT(beyond, L);
        K.narrow(1, beyond, L - beyond).fill_(NAN);
        V.narrow(1, beyond, L - beyond).fill_(NAN);
        const double tol = ty.q == at::kFloat && ty.buf == at::kFloat ? 1e-5 : 1e-2;
        at::Tensor pos = at::zeros({1}, at::TensorOptions().dtype(at::kLong).device(at::kCUDA));
        at::Tensor s, sw, mix;
        auto work = [&] {
          s = sparse_decode::row_scores(q, K, pos, per);
          sw = sparse_decode::row_scores(q, K, pos, per, w);
          mix = sparse_decode::row_mix(p, V, pos, per);
        };
        auto check = [&](int64_t at_pos, const char* how) {
          const std::string where = fmt::format("{} over {} D{} per {} pos {} {}", c10::toString(ty.q), c10::toString(ty.buf),
                                                D, per, at_pos, how);
          const int64_t n = std::min(at_pos / per + 1, L);
          EXPECT_LE(rel_rms(sparse_decode::row_scores_masked(q, Kc, pos, per).narrow(3, 0, n), s.narrow(3, 0, n)), tol) << where;
          EXPECT_LE(rel_rms(sparse_decode::row_scores_masked(q, Kc, pos, per, w).narrow(2, 0, n), sw.narrow(2, 0, n)), tol)
              << where;
          EXPECT_LE(rel_rms(sparse_decode::row_mix_masked(p, Vc, pos, per), mix), tol) << where;
          EXPECT_EQ(s.narrow(3, n, L - n).abs().max().item<double>(), 0.0) << where;
          EXPECT_EQ(sw.narrow(2, n, L - n).abs().max().item<double>(), 0.0) << where;
          EXPECT_TRUE(at::isfinite(mix).all().item<bool>()) << where;
        };
        for (int64_t at_pos : {int64_t(0), int64_t(40), last}) {
          pos.fill_(at_pos);
          work();
          check(at_pos, "eager");
        }
        // captured at one position, replayed at others
        pos.fill_(3);
        CapturedWork cw(-1);
        cw.run(work);
        ASSERT_NO_THROW(cw.capture(work));
        for (int64_t at_pos : {int64_t(9), int64_t(77), last}) {
          pos.fill_(at_pos);
          cw.replay();
          check(at_pos, "replayed");
        }
      }
}

// Each sparse layer at fp32 and bf16: prefill, then the step captured once (CapturedWork) and
// replayed at every later position, against the eager steps on the GPU (growing caches, host
// positions) and, at fp32, against the FP64 forward on the CPU.
TEST(SparseDecodeCuda, CapturedLayerStepsMatchEagerSteps) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  c10::NoGradGuard ng;
  for (auto dt : {at::kFloat, at::kBFloat16})
    for (const auto& name : kSparse) {
      const MethodSpec& m = Registry::get().method(name);
      ASSERT_TRUE(m.static_decode) << name;
      const std::vector<CaseDef> cases = m.cases();
      for (size_t ci : {size_t(2), size_t(4), size_t(5), size_t(6)}) {
        const CaseDef& c = cases.at(ci);
        const LayerCtx ctx{c.layer, c.cfg.i("n_layer")};
        const std::string where = fmt::format("{} {} {}", name, c.label, c10::toString(dt));
        const TensorMap in64 = case_inputs(m, c, 5);
        const at::Tensor full64 = m.forward(in64, c.cfg, ctx, Backend::CPU).at("y");
        TensorMap in;
        for (const auto& [n, t] : in64) in.set(n, t.to(at::kCUDA, dt));
        const int64_t T = c.T, n = std::min<int64_t>(20, T - 2), Tp = T - n;
        // eager
        TensorMap eager;
        m.prefill(slice_inputs(in, 0, Tp), eager, c.cfg, ctx, Backend::CUDA);
        std::vector<at::Tensor> want;
        for (int64_t t = Tp; t < T; ++t) want.push_back(m.decode(slice_inputs(in, t, t + 1), eager, c.cfg, ctx, Backend::CUDA).at("y"));
        // captured
        TensorMap sc;
        sc.set("pos_dev", at::zeros({1}, at::TensorOptions().dtype(at::kLong).device(at::kCUDA)));
        sc.set("capacity", at::scalar_tensor(T + 7, at::TensorOptions().dtype(at::kLong)));
        m.prefill(slice_inputs(in, 0, Tp), sc, c.cfg, ctx, Backend::CUDA);
        sc.at("pos_dev").fill_(Tp);
        TensorMap step_in = slice_inputs(in, Tp, Tp + 1);
        for (const char* nm : {"x", "ve"})
          if (step_in.has(nm)) step_in.set(nm, step_in.at(nm).clone());
        at::Tensor y;
        auto step = [&] {
          y = m.decode(step_in, sc, c.cfg, ctx, Backend::CUDA).at("y");
          sc.at("pos_dev").add_(1);
        };
        CapturedWork w(-1);
        w.run(step);
        std::vector<at::Tensor> got = {y.clone()};
        ASSERT_NO_THROW(w.capture(step)) << where;
        for (int64_t t = Tp + 1; t < T; ++t) {
          for (const char* nm : {"x", "ve"})
            if (step_in.has(nm)) step_in.at(nm).copy_(in.at(nm).slice(1, t, t + 1));
          w.replay();
          got.push_back(y.clone());
        }
        EXPECT_EQ(sc.at("pos_dev").item<int64_t>(), T) << where;
        const double tol = dt == at::kFloat ? 1e-4 : 3e-2;
        for (int64_t i = 0; i < n; ++i) {
          EXPECT_LE(rel_rms(want[size_t(i)], got[size_t(i)]), tol) << where << " t=" << Tp + i << " captured vs eager";
          if (dt == at::kFloat)
            EXPECT_LE(rel_rms(full64.slice(1, Tp + i, Tp + i + 1), want[size_t(i)]), 1e-4) << where << " t=" << Tp + i
                                                                                            << " eager vs fp64 forward";
        }
      }
    }
}

// The models: DecodeGraph's captured token step (embedding, every layer, head, greedy argmax)
// against the eager model_decode_step, teacher-forced with the same tokens. A model with DSA layers
// also runs with every key selected (dsa_topk past the sequence): its top-k then has no near-tied
// choice that the captured step's bf16 roundings could flip, so a difference there is not a
// selection's; at bf16 only that variant runs.
TEST(SparseDecodeCuda, CapturedModelStepsMatchEagerSteps) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  c10::NoGradGuard ng;
  const int64_t B = 2, T = 44, Tp = 13;
  for (auto dt : {at::kFloat, at::kBFloat16})
    for (const auto& name : kModels) {
      const MethodSpec& m = Registry::get().method(name);
      CaseDef c0;
      for (const CaseDef& c : m.cases())
        if (c.T >= 2) {
          c0 = c;
          break;
        }
      std::vector<std::pair<Config, std::string>> cfgs = {{c0.cfg, ""}};
      if (c0.cfg.has("dsa_topk") && c0.cfg.i("dsa_topk") < T) {
        // At bf16 the model's own top-k is left out: lt2_hybrid_gdn_dsa's captured and eager steps
        // then differ at a few steps by 0.03–0.2 (rel. RMS) while the same model with every key
        // selected agrees, i.e. the selection flips on near-tied indexer scores. The selection
        // itself is checked tie-aware by the sparse layer tests.
        if (dt != at::kFloat) cfgs.clear();
        cfgs.push_back({c0.cfg.with("dsa_topk", int64_t(T + 4)), " (every key selected)"});
      }
      for (const auto& [cfg, variant] : cfgs) {
        const std::string where = name + variant + " " + c10::toString(dt);
        at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(3);
        Model model = build_model(m, cfg, gen, at::TensorOptions().dtype(at::kFloat), true);
        TensorMap moved;
        for (const auto& [n, p] : model.params) moved.set(n, p.to(at::kCUDA, dt));
        model.params = moved;
        ASSERT_TRUE(model_has_static_decode(model)) << where;
        const int64_t V = cfg.i("vocab");
        at::Tensor idx = at::randint(V, {B, T}, gen, at::TensorOptions().dtype(at::kLong)).to(at::kCUDA);
        ModelCache eager;
        model_prefill(model, idx.slice(1, 0, Tp), Backend::CUDA, &eager);
        std::vector<at::Tensor> want;
        for (int64_t t = Tp; t < T; ++t) want.push_back(model_decode_step(model, idx.slice(1, t, t + 1), eager, Backend::CUDA));
        ModelCache cache;
        model_prefill(model, idx.slice(1, 0, Tp), Backend::CUDA, &cache, T + 4);
        std::unique_ptr<DecodeGraph> g;
        ASSERT_NO_THROW(g = std::make_unique<DecodeGraph>(model, cache, idx.slice(1, Tp, Tp + 1).contiguous())) << where;
        const double tol = dt == at::kFloat ? 1e-4 : 3e-2;
        EXPECT_LE(rel_rms(want[0], g->logits()), tol) << where << " warm-up step";
        for (int64_t t = Tp + 1; t < T; ++t) {
          g->input().copy_(idx.slice(1, t, t + 1));
          g->step();
          EXPECT_LE(rel_rms(want[size_t(t - Tp)], g->logits()), tol) << where << " t=" << t;
        }
        EXPECT_EQ(cache.pos, T) << where;
        EXPECT_EQ(cache.pos_dev.item<int64_t>(), T) << where;
        // a new prefill into the same buffers, and the same graph replays from its position
        model_prefill(model, idx.slice(1, 0, Tp + 2), Backend::CUDA, &cache, T + 4);
        g->restart(idx.slice(1, Tp + 2, Tp + 3).contiguous());
        g->step();
        EXPECT_LE(rel_rms(want[2], g->logits()), tol) << where << " after a second prefill";
      }
    }
}

// Attention over listed cache slots (the sparse methods' decode: dsa's selected keys, moba's
// blocks): the split-KV kernel over the list against the gathered LibTorch path in fp64 on the CPU,
// lists shared by a row's KV heads or one per KV head, GQA groups, empty and invalid entries, the
// same bits on every repeat of the launch (its arrival counters reused).
TEST(SparseDecodeCuda, ListedKeysKernelMatchesTheGatheredPath) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  c10::NoGradGuard ng;
  at::manual_seed(23);
  struct Shape {
    int64_t B, H, Hkv, D, cap, n, S;
  };
  for (auto dt : {at::kFloat, at::kBFloat16})
    for (const Shape& sh : {Shape{2, 6, 6, 128, 300, 64, 1}, Shape{3, 8, 2, 64, 100, 40, 2}, Shape{1, 4, 1, 256, 50, 50, 1},
                            Shape{2, 12, 6, 128, 2048, 256, 6}}) {
      const auto opts = at::TensorOptions().device(at::kCUDA).dtype(dt);
      const at::Tensor q = at::randn({sh.B, sh.H, sh.D}, opts), K = at::randn({sh.B, sh.cap, sh.Hkv, sh.D}, opts),
                       V = at::randn({sh.B, sh.cap, sh.Hkv, sh.D}, opts);
      // distinct slots per list, a quarter of the entries −1 or marked invalid, the first always valid
      at::Tensor keys = at::empty({sh.B, sh.S, sh.n}, at::kLong);
      for (int64_t b = 0; b < sh.B; ++b)
        for (int64_t s = 0; s < sh.S; ++s) keys[b][s].copy_(at::randperm(sh.cap, at::kLong).slice(0, 0, sh.n));
      const at::Tensor r = at::rand({sh.B, sh.S, sh.n});
      keys.masked_fill_(r < 0.12, -1);
      at::Tensor valid = (r >= 0.25).logical_or(r < 0.12);
      keys.select(2, 0).clamp_min_(0);
      valid.select(2, 0).fill_(true);
      valid = valid.logical_and(keys >= 0);
      const std::string where = fmt::format("{} B{} H{} Hkv{} D{} cap{} n{} S{}", c10::toString(dt), sh.B, sh.H, sh.Hkv,
                                            sh.D, sh.cap, sh.n, sh.S);
      const double scale = 1.0 / std::sqrt(double(sh.D));
      const at::Tensor want = sparse_decode::attend_keys(q.cpu().to(at::kDouble), K.cpu().to(at::kDouble),
                                                         V.cpu().to(at::kDouble), keys, valid, scale);
      const at::Tensor kd = keys.to(at::kCUDA), vd = valid.to(at::kCUDA);
      const at::Tensor got = attention_decode_listed(q, K, V, kd, vd, scale);
      ASSERT_TRUE(got.defined()) << where << ": the kernel did not take the shapes";
      EXPECT_LE(rel_rms(want, got.cpu().to(at::kDouble)), dt == at::kFloat ? 1e-5 : 1e-2) << where;
      // through attend_keys on the GPU: the same launch
      EXPECT_TRUE(at::equal(got, sparse_decode::attend_keys(q, K, V, kd, vd, scale))) << where;
      for (int rep = 0; rep < 3; ++rep)
        EXPECT_TRUE(at::equal(got, attention_decode_listed(q, K, V, kd, vd, scale))) << where << " rep " << rep;
    }
  // one list per query head is not the kernel's: the caller's LibTorch path
  const auto o = at::TensorOptions().device(at::kCUDA);
  const at::Tensor q = at::randn({1, 4, 64}, o), K = at::randn({1, 16, 2, 64}, o);
  const at::Tensor keys = at::zeros({1, 4, 3}, o.dtype(at::kLong));
  EXPECT_FALSE(attention_decode_listed(q, K, K, keys, keys >= 0, 0.1).defined());
}

}  // namespace
}  // namespace mixbench
