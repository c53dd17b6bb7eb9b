// Decoding of the sparse-attention layers (moba, dsa, qsa, nsa, seer) and of the models built on
// them or on a loop plan: eager caches and static caches (MethodSpec::static_decode,
// model_has_static_decode) against the forward and against each other, token by token; the static
// step reads only what lies at or before the device position, and its products over the buffers
// stop at the position (sparse_decode::row_scores / row_mix), whatever the capacity; the adaptive
// loops stay eager.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>

#include <limits>
#include <map>

#include "harness/backbone.h"
#include "harness/errors.h"
#include "harness/flop_counter.h"
#include "harness/metrics.h"
#include "harness/registry.h"
#include "tests/layer_case_inputs.h"
#include "mixers/sparse/sparse.h"
#include "mixers/sparse/sparse_decode.h"

using namespace mixbench;
using mixbench_test::case_inputs;
using mixbench_test::slice_inputs;

namespace {

std::vector<std::string> sparse_methods() {
  std::vector<std::string> out;
  for (const auto* m : Registry::get().methods())
    if (m->family == "sparse") out.push_back(m->name);
  return out;
}

// Every model whose decode became static here: the sparse layers, the hybrids of them, the looped
// models with a fixed loop count, and the residual-stream variants (hc, mhc, attnres: a token's
// streams or sources are its own).
const std::vector<std::string>& static_models() {
  static const std::vector<std::string> names = {
      "moba", "dsa", "qsa", "nsa", "seer", "moba_hybrid", "qsa_hybrid", "deeploop", "fixed_recursive", "lt2_gdn",
      "lt2_hybrid_full_gdn", "lt2_hybrid_gdn_dsa", "loopformer_fixed2", "ouro", "ut_act", "hc", "mhc", "attnres"};
  return names;
}

TensorMap static_layer_cache(int64_t capacity) {
  TensorMap cache;
  cache.set("pos_dev", at::zeros({1}, at::TensorOptions().dtype(at::kLong)));
  cache.set("capacity", at::scalar_tensor(capacity, at::TensorOptions().dtype(at::kLong)));
  return cache;
}

// prefill(T − n) and n decode steps of a layer: the prefill's output, then each step's. `capacity`
// 0: an eager cache; else a static one (the test advances its device position as the model does).
// `garbage`: before every step, every static buffer row past the position is overwritten with
// large values (a step must not read them). `moved` receives whether a static buffer moved.
std::vector<at::Tensor> layer_decode(const MethodSpec& m, const CaseDef& c, const TensorMap& in, int64_t n,
                                     int64_t capacity, bool garbage = false, bool* moved = nullptr, int64_t skew = 0) {
  c10::NoGradGuard ng;
  LayerCtx ctx{c.layer, c.cfg.i("n_layer")};
  const int64_t T = in.at("x").size(1), Tp = T - n;
  TensorMap cache = capacity > 0 ? static_layer_cache(capacity) : TensorMap();
  std::vector<at::Tensor> out = {m.prefill(slice_inputs(in, 0, Tp), cache, c.cfg, ctx, Backend::CPU).at("y")};
  std::map<std::string, const void*> where;
  for (const auto& [name, t] : cache)
    if (name != "pos" && name != "capacity") where[name] = t.data_ptr();
  if (capacity > 0) cache.at("pos_dev").fill_(Tp + skew);
  for (int64_t t = Tp; t < T; ++t) {
    if (garbage) {
      for (const auto& [name, buf] : cache) {
        if (name == "pos" || name == "pos_dev" || name == "capacity" || buf.dim() < 2) continue;
        // per-token buffers have `capacity` rows: rows past t; per-block ones: blocks past t's own
        // block (the rings hold live tokens only and are left alone)
        const int64_t rows = buf.size(1);
        if (rows == capacity) buf.narrow(1, t + 1, rows - t - 1).fill_(1e3);
        else if (rows < capacity && name != "ikt" && name != "gkt") {
          const int64_t bs = c.cfg.i(m.name + "_block");  // moba_block, qsa_block, nsa_block, seer_block
          EXPECT_EQ(rows, (capacity + bs - 1) / bs) << m.name << " " << name;
          const int64_t past = t / bs + 1;
          if (past < rows) buf.narrow(1, past, rows - past).fill_(-1e3);
        }
      }
    }
    out.push_back(m.decode(slice_inputs(in, t, t + 1), cache, c.cfg, ctx, Backend::CPU).at("y"));
    if (capacity > 0) cache.at("pos_dev").add_(1);
    else EXPECT_EQ(cache_pos(cache), t + 1) << m.name;
  }
  if (moved) {
    *moved = false;
    for (const auto& [name, t] : cache)
      if (where.count(name) && t.data_ptr() != where[name]) *moved = true;
  }
  return out;
}

double worst_against(const std::vector<at::Tensor>& got, const at::Tensor& full) {
  const int64_t T = full.size(1), n = int64_t(got.size()) - 1;
  double err = compare(full.slice(1, 0, T - n), got[0]).rel_rms;
  for (int64_t i = 1; i <= n; ++i) err = std::max(err, compare(full.slice(1, T - n + i - 1, T - n + i), got[size_t(i)]).rel_rms);
  return err;
}

double worst_between(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  double err = 0;
  for (size_t i = 0; i < a.size(); ++i) err = std::max(err, compare(a[i], b[i]).rel_rms);
  return err;
}

}  // namespace

TEST(SparseDecode, EverySparseLayerRegistersStaticHooks) {
  const auto names = sparse_methods();
  EXPECT_GE(names.size(), 5u);
  for (const auto& name : names) {
    const MethodSpec& m = Registry::get().method(name);
    EXPECT_TRUE(m.has_decode()) << name;
    EXPECT_TRUE(m.static_decode) << name;
  }
}

TEST(SparseDecode, BlockTopkOwnIsBlockTopkAtGivenOwnBlocks) {
  // the decode steps' selection: with own = t / bs it is block_topk's, ties and −1 slots included
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(9);
  auto o = at::TensorOptions().dtype(at::kDouble);
  for (bool counted : {false, true})
    for (bool ties : {false, true})
      for (auto dt : {at::kDouble, at::kFloat}) {
        const int64_t B = 2, S = 3, T = 41, bs = 4, N = counted ? (T + bs - 1) / bs : T / bs;
        at::Tensor s = ties ? at::relu(at::randint(-2, 3, {B, S, T, N}, gen, o)) : at::randn({B, S, T, N}, gen, o);
        s = s.to(dt);
        const at::Tensor own = at::div(at::arange(T, o.dtype(at::kLong)), bs, "floor");
        for (int64_t topk : {1, 3, 16}) {
          const at::Tensor want = block_topk_cpu(s, bs, topk, counted);
          EXPECT_TRUE(at::equal(want, block_topk_own(s, own, topk, counted))) << counted << ties << topk;
          // one row at another own block: the rows of block_topk at that position
          const int64_t t = 29;
          const at::Tensor one = block_topk_own(s.narrow(2, t, 1), own.narrow(0, t, 1), topk, counted);
          EXPECT_TRUE(at::equal(want.narrow(2, t, 1), one)) << counted << ties << topk;
        }
      }
}

TEST(SparseDecode, EagerAndStaticStepsMatchTheForwardFp64) {
  size_t checked = 0;
  for (const auto& name : sparse_methods()) {
    const MethodSpec& m = Registry::get().method(name);
    for (const CaseDef& c : m.cases()) {
      if (c.T < 2) continue;
      TensorMap in = case_inputs(m, c, 7);
      at::Tensor full;
      {
        c10::NoGradGuard ng;
        full = m.forward(in, c.cfg, LayerCtx{c.layer, c.cfg.i("n_layer")}, Backend::CPU).at("y");
      }
      // a short prefill (most blocks complete while decoding) and a long one
      for (int64_t n : {c.T - 1, std::min<int64_t>(c.T - 1, 9)}) {
        const std::string where = name + " " + c.label + " n=" + std::to_string(n);
        const auto eager = layer_decode(m, c, in, n, 0);
        EXPECT_LT(worst_against(eager, full), 1e-10) << where << " eager";
        for (int64_t cap : {c.T, c.T + 40}) {
          bool moved = true;
          const auto st = layer_decode(m, c, in, n, cap, false, &moved);
          EXPECT_LT(worst_against(st, full), 1e-10) << where << " static cap " << cap;
          EXPECT_LT(worst_between(st, eager), 1e-12) << where << " static cap " << cap << " vs eager";
          EXPECT_FALSE(moved) << where << ": a static buffer moved";
        }
        ++checked;
      }
    }
  }
  EXPECT_GE(checked, 60u);
}

TEST(SparseDecode, TheStaticStepReadsNothingPastItsPosition) {
  for (const auto& name : sparse_methods()) {
    const MethodSpec& m = Registry::get().method(name);
    for (const CaseDef& c : m.cases()) {
      if (c.T < 30) continue;
      TensorMap in = case_inputs(m, c, 11);
      const int64_t n = c.T - 5;
      const auto clean = layer_decode(m, c, in, n, c.T + 17);
      const auto dirty = layer_decode(m, c, in, n, c.T + 17, /*garbage=*/true);
      EXPECT_LT(worst_between(clean, dirty), 1e-13) << name << " " << c.label << ": rows past the position were read";
    }
  }
}

TEST(SparseDecode, TheDevicePositionIsWhatTheStepReads) {
  // RoPE, the causal masks and the own block follow the device position: off by one shows far above fp64 noise
  for (const auto& name : sparse_methods()) {
    const MethodSpec& m = Registry::get().method(name);
    const CaseDef c = m.cases()[2];  // B2_T37: selections smaller than the context
    ASSERT_GE(c.T, 30) << name;
    TensorMap in = case_inputs(m, c, 7);
    at::Tensor full;
    {
      c10::NoGradGuard ng;
      full = m.forward(in, c.cfg, LayerCtx{c.layer, c.cfg.i("n_layer")}, Backend::CPU).at("y");
    }
    EXPECT_LT(worst_against(layer_decode(m, c, in, 20, c.T + 3), full), 1e-10) << name;
    EXPECT_GT(worst_against(layer_decode(m, c, in, 20, c.T + 3, false, nullptr, 1), full), 1e-6) << name;
  }
}

TEST(SparseDecode, DecodingAttendsToTheSelectionNotToEveryKey) {
  // With a budget below the context the layer is not dense attention: the selection a step makes
  // matters. The dense-equivalent configuration (every key selected) is the forward's own check;
  // here a step whose keys were all selected would differ from the sparse forward.
  const MethodSpec& dense = Registry::get().method("dense_full");
  for (const auto& name : sparse_methods()) {
    const MethodSpec& m = Registry::get().method(name);
    const CaseDef c = m.cases()[2];
    TensorMap in = case_inputs(m, c, 7);
    c10::NoGradGuard ng;
    LayerCtx ctx{c.layer, c.cfg.i("n_layer")};
    const auto steps = layer_decode(m, c, in, 10, c.T + 5);
    // the same projections through dense causal attention (dense_full shares the layer's parameters)
    Config dc = dense.config.parse("n_layer=4,d_model=64,head_dim=16,seq_len=64,vocab=64");
    dc = dc.with("kv_ratio", c.cfg.i("kv_ratio"));
    const at::Tensor yd = dense.forward(in, dc, ctx, Backend::CPU).at("y");
    const int64_t T = c.T;
    EXPECT_GT(compare(yd.slice(1, T - 1, T), steps.back()).rel_rms, 1e-4) << name << ": the last step attends like dense attention";
  }
}

// sparse_decode::row_scores and row_mix: the CPU path computes the rows the position reaches (j ≤
// pos / per) and gives 0 past them, as the device-side definition (the whole buffer masked) does;
// rows past the reach (NaN here) are never read, and the products' FLOPs follow the reach.
TEST(SparseDecode, RowProductsStopAtThePosition) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(4);
  const auto o64 = at::TensorOptions().dtype(at::kDouble);
  const int64_t B = 2, S = 3, G = 2, D = 8, L = 23;
  for (int64_t per : {1, 4})
    for (int64_t p : {0, 5, 17, 60}) {
      const std::string where = "per " + std::to_string(per) + " pos " + std::to_string(p);
      const int64_t n = std::min(p / per + 1, L);
      const at::Tensor pos = at::full({1}, p, o64.dtype(at::kLong));
      const at::Tensor q = at::randn({B, S, G, D}, gen, o64), w = at::randn({B, S, G}, gen, o64);
      at::Tensor K = at::randn({B, L, S, D}, gen, o64), V = at::randn({B, L, S, D}, gen, o64);
      const at::Tensor pr = at::randn({B, S, G, L}, gen, o64);
      const at::Tensor want = at::matmul(q, K.narrow(1, 0, n).permute({0, 2, 3, 1}));
      const at::Tensor want_w = at::matmul(w.unsqueeze(-2), at::relu(want)).squeeze(-2);
      const at::Tensor want_mix = at::matmul(pr.narrow(3, 0, n), V.narrow(1, 0, n).permute({0, 2, 1, 3}));
      if (n < L) {
        K.narrow(1, n, L - n).fill_(std::numeric_limits<double>::quiet_NaN());
        V.narrow(1, n, L - n).fill_(std::numeric_limits<double>::quiet_NaN());
      }
      double flops = 0;
      at::Tensor got, got_w, got_mix;
      {
        FlopCounter fc;
        got = sparse_decode::row_scores(q, K, pos, per);
        got_w = sparse_decode::row_scores(q, K, pos, per, w);
        got_mix = sparse_decode::row_mix(pr, V, pos, per);
        flops = fc.total();
      }
      // the products of the reached rows only: q·K twice, w·relu once, p·V once
      EXPECT_DOUBLE_EQ(flops, double(B * S) * (2.0 * 2 * G * D * n + 2.0 * G * n + 2.0 * G * n * D)) << where;
      ASSERT_EQ(got.sizes(), at::IntArrayRef({B, S, G, L})) << where;
      ASSERT_EQ(got_w.sizes(), at::IntArrayRef({B, S, L})) << where;
      ASSERT_EQ(got_mix.sizes(), at::IntArrayRef({B, S, G, D})) << where;
      EXPECT_TRUE(at::allclose(got.narrow(3, 0, n), want, 1e-13, 1e-13)) << where;
      EXPECT_TRUE(at::allclose(got_w.narrow(2, 0, n), want_w, 1e-13, 1e-13)) << where;
      EXPECT_TRUE(at::allclose(got_mix, want_mix, 1e-13, 1e-13)) << where;
      if (n < L) {
        EXPECT_TRUE(at::equal(got.narrow(3, n, L - n), at::zeros({B, S, G, L - n}, o64))) << where;
        EXPECT_TRUE(at::equal(got_w.narrow(2, n, L - n), at::zeros({B, S, L - n}, o64))) << where;
      }
      // the device-side definition agrees (the path of a GPU without the kernels' dtypes)
      EXPECT_TRUE(at::allclose(sparse_decode::row_scores_masked(q, K, pos, per), got, 1e-13, 1e-13)) << where;
      EXPECT_TRUE(at::allclose(sparse_decode::row_scores_masked(q, K, pos, per, w), got_w, 1e-13, 1e-13)) << where;
      EXPECT_TRUE(at::allclose(sparse_decode::row_mix_masked(pr, V, pos, per), got_mix, 1e-13, 1e-13)) << where;
      // fp32 queries over a half-precision buffer: the buffer converted as read
      const at::Tensor q32 = q.to(at::kFloat), Kb = K.to(at::kBFloat16);
      EXPECT_TRUE(at::allclose(sparse_decode::row_scores(q32, Kb, pos, per).narrow(3, 0, n),
                               at::matmul(q32, Kb.narrow(1, 0, n).to(at::kFloat).permute({0, 2, 3, 1})), 1e-6, 1e-6))
          << where;
    }
}

// A static cache's step computes its products up to the position, not over its capacity: the
// FLOPs of a prefill and its decode steps are the same at two capacities (every selection as
// large at both).
TEST(SparseDecode, StaticStepWorkFollowsThePositionNotTheCapacity) {
  for (const auto& name : sparse_methods()) {
    const MethodSpec& m = Registry::get().method(name);
    const CaseDef c = m.cases()[2];  // B2_T37
    TensorMap in = case_inputs(m, c, 7);
    double flops[2] = {0, 0};
    std::vector<at::Tensor> out[2];
    const int64_t caps[2] = {c.T + 3, c.T + 203};
    for (int i = 0; i < 2; ++i) {
      FlopCounter fc;
      out[i] = layer_decode(m, c, in, 20, caps[i]);
      flops[i] = fc.total();
    }
    EXPECT_GT(flops[0], 0) << name;
    EXPECT_DOUBLE_EQ(flops[1], flops[0]) << name << ": the static step's work grows with the capacity";
    EXPECT_LT(worst_between(out[0], out[1]), 1e-12) << name;
  }
}

TEST(StaticDecodeModels, SparseLoopAndStreamModelsMatchForwardAndEager) {
  c10::NoGradGuard ng;
  for (const auto& name : static_models()) {
    const MethodSpec& m = Registry::get().method(name);
    CaseDef c0;
    for (const CaseDef& c : m.cases())
      if (c.T >= 2) {
        c0 = c;
        break;
      }
    const Config& cfg = c0.cfg;
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(13);
    Model model = build_model(m, cfg, gen, at::TensorOptions().dtype(at::kDouble), /*random_nonzero=*/true);
    ASSERT_TRUE(model_has_decode(model)) << name;
    ASSERT_TRUE(model_has_static_decode(model)) << name;
    const int64_t B = 2, T = 26, Tp = 5, V = cfg.i("vocab");
    at::Tensor idx = at::randint(V, {B, T}, gen, at::TensorOptions().dtype(at::kLong));
    at::Tensor full = model_forward(model, idx, Backend::CPU);
    ModelCache eager;
    std::vector<at::Tensor> want = {model_prefill(model, idx.slice(1, 0, Tp), Backend::CPU, &eager)};
    for (int64_t t = Tp; t < T; ++t) want.push_back(model_decode_step(model, idx.slice(1, t, t + 1), eager, Backend::CPU));
    for (int64_t t = Tp - 1; t < T; ++t)
      EXPECT_LT(compare(full.slice(1, t, t + 1), want[size_t(t - Tp + 1)]).rel_rms, 1e-10) << name << " eager t=" << t;
    ModelCache cache;
    std::vector<const void*> buffers;
    for (int pass = 0; pass < 2; ++pass) {  // the second prefill reuses the first one's buffers
      std::vector<at::Tensor> got = {model_prefill(model, idx.slice(1, 0, Tp), Backend::CPU, &cache, T + 3)};
      for (int64_t t = Tp; t < T; ++t) got.push_back(model_decode_step(model, idx.slice(1, t, t + 1), cache, Backend::CPU));
      EXPECT_LT(worst_between(got, want), 1e-12) << name << " static vs eager, pass " << pass;
      EXPECT_EQ(cache.pos_dev.item<int64_t>(), T) << name;
      std::vector<const void*> now;
      for (const auto& l : cache.layers)
        for (const auto& [n, t] : l)
          if (n != "pos" && n != "capacity") now.push_back(t.data_ptr());
      if (pass == 1) EXPECT_EQ(now, buffers) << name << ": a second prefill moved the static buffers";
      buffers = now;
    }
  }
}

TEST(StaticDecodeModels, AdaptiveOrRoutedLoopsStayEager) {
  // huginn draws its initial state on the host per position, mor routes tokens with a top-k over the
  // sequence (no decode at all): neither keeps a static cache, and a static prefill is refused.
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(1);
  for (const std::string name : {"huginn", "mor"}) {
    const MethodSpec& m = Registry::get().method(name);
    Model model = build_model(m, m.cases()[0].cfg, gen, at::TensorOptions().dtype(at::kDouble), true);
    EXPECT_FALSE(model_has_static_decode(model)) << name;
    ModelCache cache;
    at::Tensor idx = at::zeros({1, 4}, at::TensorOptions().dtype(at::kLong));
    EXPECT_THROW(model_prefill(model, idx, Backend::CPU, &cache, 16), UsageError) << name;
  }
}
