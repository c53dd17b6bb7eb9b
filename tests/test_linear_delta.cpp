// Tests of the delta-rule family: ops delta_rule, gated_delta_rule, kda and methods deltanet,
// gdn, kda — conformance at fp64/fp32 (that a perturbed path fails is AllRegistered/Mutation's
// test), invariants (chunked == recurrent, prefill + decode == prefill, split == one pass), and the
// accountant audit (parameter counts exact, forward FLOPs within 2% of FlopCounter).
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>

#include "harness/backbone.h"
#include "harness/errors.h"
#include "harness/flop_counter.h"
#include "harness/metrics.h"
#include "harness/registry.h"
#include "mixers/linear/delta_layer.h"
#include "reference/delta.h"
#include "suites/conformance.h"

namespace {

using namespace mixbench;

const std::vector<std::string> kOps = {"delta_rule", "gated_delta_rule", "kda"};
const std::vector<std::string> kMethods = {"deltanet", "gdn", "kda"};

ConformanceSummary run(const std::vector<std::string>& ops, const std::vector<std::string>& methods,
                       const std::string& dtype, const std::string& fault = "", bool fd = true) {
  ConformanceOptions o;
  o.ops = ops;
  o.methods = methods;
  o.dtype = dtype;
  o.fault = fault;
  o.finite_differences = fd && dtype == "fp64";  // of the FP64 reference, once
  o.fd_directions = 1;
  ConformanceSummary s;
  nlohmann::json r = run_conformance(o, s);
  for (const auto& x : r)
    if (x["status"] != "pass" && fault.empty()) ADD_FAILURE() << x.dump();
  return s;
}

TEST(LinearDeltaOps, Registered) {
  for (const auto& n : kOps) EXPECT_TRUE(Registry::get().has_op(n)) << n;
  for (const auto& n : kMethods) EXPECT_TRUE(Registry::get().has_method(n)) << n;
}

TEST(LinearDeltaOps, ConformanceFp64) {
  ConformanceSummary s = run(kOps, {}, "fp64");
  EXPECT_GT(s.passed, 0);
  EXPECT_EQ(s.failed, 0);
  EXPECT_EQ(s.errors, 0);
}

TEST(LinearDeltaOps, ConformanceFp32) {
  ConformanceSummary s = run(kOps, {}, "fp32", "", false);
  EXPECT_GT(s.passed, 0);
  EXPECT_EQ(s.failed, 0);
  EXPECT_EQ(s.errors, 0);
}

TEST(LinearDeltaOps, Invariants) {
  for (const auto& name : kOps) {
    const OpSpec& spec = Registry::get().op(name);
    ASSERT_TRUE(bool(spec.invariants));
    for (const CaseDef& c : spec.cases()) {
      at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(99);
      TensorMap in = spec.make_inputs(c.cfg, c.B, c.T, gen);
      for (const auto& d : c.drop) in.erase(d);
      for (auto [dt, thr] : {std::pair{at::kDouble, 1e-10}, std::pair{at::kFloat, 1e-5}}) {
        auto res = spec.invariants(in, c.cfg, Backend::CPU, dt);
        EXPECT_GE(res.size(), c.T >= 2 ? 6u : 2u);
        for (const auto& [n, e] : res) EXPECT_LE(e, thr) << name << "/" << c.label << "/" << n;
      }
    }
  }
}

// The invariants can fail: a decode step from a wrong state disagrees with the chunked pass.
TEST(LinearDeltaOps, InvariantDetectsWrongState) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(5);
  auto o = at::TensorOptions().dtype(at::kDouble);
  at::Tensor q = at::randn({1, 9, 2, 4}, gen, o), k = at::randn({1, 9, 2, 4}, gen, o);
  k = k / k.norm(2, -1, true);
  at::Tensor v = at::randn({1, 9, 2, 5}, gen, o), b = at::sigmoid(at::randn({1, 9, 2}, gen, o));
  at::Tensor g = at::log_sigmoid(at::randn({1, 9, 2}, gen, o));
  auto full = linear::delta_chunked(q, k, v, b, g, 0.5, at::Tensor());
  auto pre = linear::delta_chunked(q.narrow(1, 0, 8), k.narrow(1, 0, 8), v.narrow(1, 0, 8), b.narrow(1, 0, 8),
                                   g.narrow(1, 0, 8), 0.5, at::Tensor());
  auto ok = linear::delta_step(q.select(1, 8), k.select(1, 8), v.select(1, 8), b.select(1, 8), g.select(1, 8), 0.5, pre.ht);
  auto bad = linear::delta_step(q.select(1, 8), k.select(1, 8), v.select(1, 8), b.select(1, 8), g.select(1, 8), 0.5,
                                pre.ht * 1.01);
  EXPECT_LT((ok.o - full.o.select(1, 8)).abs().max().item<double>(), 1e-12);
  EXPECT_GT((bad.o - full.o.select(1, 8)).abs().max().item<double>(), 1e-6);
}

TEST(LinearDeltaOps, RejectsBadShapes) {
  const OpSpec& spec = Registry::get().op("kda");
  Config c = spec.params.defaults();
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(1);
  TensorMap in = spec.make_inputs(c, 1, 5, gen);
  in.set("g", at::zeros({1, 5, 2}, at::kDouble));  // per-head gate given to the per-key-dim op
  EXPECT_THROW(spec.check_inputs(in, c), InputError);
}

TEST(LinearDeltaMethods, ConformanceFp64) {
  ConformanceSummary s = run({}, kMethods, "fp64");
  EXPECT_GT(s.passed, 0);
  EXPECT_EQ(s.failed, 0);
  EXPECT_EQ(s.errors, 0);
}

TEST(LinearDeltaMethods, ConformanceFp32) {
  ConformanceSummary s = run({}, kMethods, "fp32", "", false);
  EXPECT_GT(s.passed, 0);
  EXPECT_EQ(s.failed, 0);
  EXPECT_EQ(s.errors, 0);
}

// kda with the random parameters below has per-token decays of −3 or so: the CPU path's per-key
// scores are then formed pair by pair (explicit decays, fewer FLOPs than the chunk products the
// accountant bills). The gate offset of its conformance cases keeps the decays in the product form.
Config audit_config(const MethodSpec& m) {
  return m.config.parse(std::string("n_layer=4,d_model=128,head_dim=32,head_v_dim=16,seq_len=256,vocab=64") +
                        (m.name == "kda" ? ",gate_bias_offset=-5" : ""));
}

TEST(LinearDeltaMethods, AccountantParamsExact) {
  for (const auto& name : kMethods) {
    const MethodSpec& m = Registry::get().method(name);
    Config c = audit_config(m);
    for (int64_t layer = 0; layer < 4; ++layer) {
      LayerCtx ctx{layer, 4};
      at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(3);
      int64_t matrices = 0, scalars = 0, matmul = 0;
      for (const auto& def : m.params(c, ctx)) {
        at::Tensor t = random_param(def, gen, at::TensorOptions().dtype(at::kFloat));
        if (def.group == ParamGroup::Scalar) scalars += t.numel();
        else if (def.group == ParamGroup::TransformerMatrix) matrices += t.numel();
        else ADD_FAILURE() << name << ": unexpected group for " << def.name;
        if (def.matmul) matmul += t.numel();
      }
      LayerCost lc = m.account(c, ctx, CostQuery{});
      EXPECT_EQ(lc.params.transformer_matrices, matrices) << name << " layer " << layer;
      EXPECT_EQ(lc.params.scalars, scalars) << name << " layer " << layer;
      EXPECT_EQ(lc.params.matmul, matmul) << name << " layer " << layer;
      EXPECT_EQ(lc.params.wte + lc.params.lm_head + lc.params.value_embeds, 0);
      EXPECT_EQ(m.ve_dim(c, ctx) > 0, ctx.layer % 2 == 1);  // n_layer = 4: layers 1 and 3
    }
  }
}

// Forward FLOPs: FlopCounter sees the projections and the chunk's matrix products; the short
// convolutions (explicit shifted sums) and the triangular solve are added from their documented
// formulas (delta_uncounted_flops) before comparing with the accountant.
TEST(LinearDeltaMethods, AccountantFlopsMatchCounter) {
  for (const auto& name : kMethods) {
    const MethodSpec& m = Registry::get().method(name);
    Config c = audit_config(m);
    linear::DeltaDims d = linear::delta_dims(c);
    for (int64_t layer : {0, 1}) {
      for (int64_t T : {37, 130}) {
        LayerCtx ctx{layer, 4};
        at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(11);
        TensorMap in = m.make_inputs(c, ctx, 1, T, gen);
        for (const auto& def : m.params(c, ctx)) in.set(def.name, random_param(def, gen, at::TensorOptions().dtype(at::kDouble)));
        TensorMap in32;
        for (const auto& [n, t] : in) in32.set(n, t.to(at::kFloat));
        double counted = 0;
        {
          c10::NoGradGuard ng;
          FlopCounter fc;
          m.forward(in32, c, ctx, Backend::CPU);
          counted = fc.total();
        }
        CostQuery q;
        q.T = T;
        const double expected = m.account(c, ctx, q).fwd_flops * double(T);
        const double measured = counted + linear::delta_uncounted_flops(d, T) * double(T);
        EXPECT_NEAR(measured / expected, 1.0, 0.02) << name << " layer " << layer << " T " << T
                                                   << ": counted " << counted << " expected " << expected;
      }
    }
  }
}

// The per-key-dim pair scores (sub-blocks of per-dim decays, products below them) are the naive
// Σ_d a_t k_j exp(G_t − G_j) over j ≤ t, values and gradients, in fp64 at every sub-block size
// (one row, a divisor of C, all of C, a non-divisor: one block), with decays strong enough that
// e^{G_r − G_j} for j after r would overflow; finite in fp32 there too.
TEST(LinearDeltaChunked, KeyGatePairScoresAreTheNaiveSum) {
  const auto o = at::TensorOptions().dtype(at::kDouble);
  const int64_t B = 1, H = 2, N = 3, C = 16, K = 5;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(uint64_t(5));
  for (double strength : {0.3, 60.0}) {
    const at::Tensor a = at::randn({B, H, N, C, K}, gen, o).requires_grad_(true), kc = at::randn({B, H, N, C, K}, gen, o).requires_grad_(true);
    const at::Tensor G = (at::log_sigmoid(at::randn({B, H, N, C, K}, gen, o)) * strength).cumsum(-2).requires_grad_(true);
    const at::Tensor diff = G.unsqueeze(-2) - G.unsqueeze(-3);                           // [B,H,N,C_t,C_j,K]
    const at::Tensor upper = at::ones({C, C}, o.dtype(at::kBool)).triu(1).unsqueeze(-1);
    const at::Tensor naive = (a.unsqueeze(-2) * kc.unsqueeze(-3) * diff.masked_fill(upper, 0).exp()).masked_fill(upper, 0).sum(-1);
    const at::Tensor w = at::randn({B, H, N, C, C}, gen, o);
    const auto gn = torch::autograd::grad({(naive * w).sum()}, {a, kc, G});
    for (int64_t sub : {int64_t(1), int64_t(4), int64_t(8), C, int64_t(5)}) {
      const at::Tensor p = linear::key_gate_pair_scores(a, kc, G, sub);
      const std::string what = fmt::format("strength {} sub {}", strength, sub);
      ASSERT_TRUE(p.sizes().equals(naive.sizes())) << what;
      EXPECT_LE((p - naive).abs().max().item<double>(), 1e-12 * (1 + naive.abs().max().item<double>())) << what;
      EXPECT_EQ(at::triu(p, 1).abs().max().item<double>(), 0.0) << what << ": nothing above the diagonal";
      const auto gp = torch::autograd::grad({(p * w).sum()}, {a, kc, G});
      for (size_t i = 0; i < gp.size(); ++i)
        EXPECT_LE((gp[i] - gn[i]).abs().max().item<double>(), 1e-10 * (1 + gn[i].abs().max().item<double>()))
            << what << " gradient " << i;
    }
    const at::Tensor p32 = linear::key_gate_pair_scores(a.detach().to(at::kFloat), kc.detach().to(at::kFloat), G.detach().to(at::kFloat));
    EXPECT_TRUE(at::isfinite(p32).all().item<bool>()) << "strength " << strength;
  }
}

// Sequences of several blocks (kDeltaBlockChunks chunks each, the state carried between blocks, a
// short last block): output, final state and all gradients match the FP64 recurrence, for every
// gate kind; with a small chunk (many blocks) and with the default one.
TEST(LinearDeltaChunked, SeveralBlocksMatchReference) {
  const int64_t H = 2, K = 8, V = 6;
  const auto o = at::TensorOptions().dtype(at::kDouble);
  struct Run {
    linear::DeltaGate gate;
    int64_t chunk, T;
  };
  const int64_t small = 4, tail = 3;
  for (const Run& r : {Run{linear::DeltaGate::None, small, 2 * small * linear::kDeltaBlockChunks + tail},
                       Run{linear::DeltaGate::Head, small, 2 * small * linear::kDeltaBlockChunks + tail},
                       Run{linear::DeltaGate::Key, small, 2 * small * linear::kDeltaBlockChunks + tail},
                       Run{linear::DeltaGate::Head, linear::kDeltaChunk, linear::kDeltaChunk * linear::kDeltaBlockChunks + 37}}) {
    const int64_t T = r.T;
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(uint64_t(17 + T));
    at::Tensor k = at::randn({1, T, H, K}, gen, o);
    std::vector<at::Tensor> x = {at::randn({1, T, H, K}, gen, o), k / k.norm(2, -1, true), at::randn({1, T, H, V}, gen, o),
                                 at::sigmoid(at::randn({1, T, H}, gen, o)), at::randn({1, H, K, V}, gen, o)};
    if (r.gate == linear::DeltaGate::Head) x.push_back(at::log_sigmoid(at::randn({1, T, H}, gen, o)) / 4);
    if (r.gate == linear::DeltaGate::Key) x.push_back(at::log_sigmoid(at::randn({1, T, H, K}, gen, o)) / 4);
    for (auto& t : x) t.requires_grad_(true);
    const at::Tensor g = x.size() > 5 ? x[5] : at::Tensor();
    linear::DeltaResult c = linear::delta_chunked(x[0], x[1], x[2], x[3], g, 0.4, x[4], r.chunk);
    auto [orf, hr] = reference::delta_recurrent(x[0], x[1], x[2], x[3], g, 0.4, x[4]);
    const std::string what = "gate " + std::to_string(int(r.gate)) + " chunk " + std::to_string(r.chunk);
    EXPECT_LE(compare(orf, c.o).rel_rms, threshold("fp64", TensorKind::Output)) << what;
    EXPECT_LE(compare(hr, c.ht).rel_rms, threshold("fp64", TensorKind::Output)) << what;
    const int64_t last = T % (r.chunk * linear::kDeltaBlockChunks);
    EXPECT_LE(compare(orf.narrow(1, T - last, last), c.o.narrow(1, T - last, last)).rel_rms,
              threshold("fp64", TensorKind::Output)) << what;
    const at::Tensor wo = at::randn(c.o.sizes(), gen, o), wh = at::randn(c.ht.sizes(), gen, o);
    auto gc = torch::autograd::grad({(c.o * wo).sum() + (c.ht * wh).sum()}, x);
    auto gr = torch::autograd::grad({(orf * wo).sum() + (hr * wh).sum()}, x);
    for (size_t i = 0; i < x.size(); ++i)
      EXPECT_LE(compare(gr[i], gc[i]).rel_rms, threshold("fp64", TensorKind::Gradient)) << what << " input " << i;
  }
}

// The raw-buffer CPU forward (delta_rule, gated_delta_rule, kda) against the FP64 recurrence: fp64
// to fp64 precision and fp32 to the fp32 threshold, with tail chunks, T = 1, K ≠ V, with and without
// h0 and with B, H > 1, weak gates (decays folded into the products) and strong ones (gate_mul 4:
// explicit decays in fp32; 40: in fp64 too); its gradients are those of delta_chunked.
TEST(LinearDeltaChunked, CpuForwardMatchesReference) {
  const auto o64 = at::TensorOptions().dtype(at::kDouble);
  struct Shape {
    int64_t B, T, H, K, V;
    bool h0;
    double gate_mul = 0.5;  // g = logsigmoid(randn)·gate_mul; 4, 40: strong decays (Γ formed explicitly)
  };
  const std::vector<Shape> shapes = {{1, 1, 2, 8, 8, true},    {2, 1, 1, 8, 4, false},  {1, 70, 2, 8, 12, true},
                                     {2, 70, 3, 16, 8, false}, {1, 200, 2, 12, 20, true}, {1, 128, 1, 8, 8, true},
                                     {1, 64, 2, 64, 64, false}, {1, 150, 2, 8, 12, true, 40.0},
                                     {1, 130, 1, 16, 8, false, 4.0}};
  for (linear::DeltaGate gate : {linear::DeltaGate::None, linear::DeltaGate::Head, linear::DeltaGate::Key}) {
    for (const Shape& sh : shapes) {
      at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(uint64_t(31 + sh.T + sh.K));
      at::Tensor k = at::randn({sh.B, sh.T, sh.H, sh.K}, gen, o64);
      k = k / k.norm(2, -1, true);
      const at::Tensor q = at::randn({sh.B, sh.T, sh.H, sh.K}, gen, o64), v = at::randn({sh.B, sh.T, sh.H, sh.V}, gen, o64),
                       beta = at::sigmoid(at::randn({sh.B, sh.T, sh.H}, gen, o64)),
                       h0 = sh.h0 ? at::randn({sh.B, sh.H, sh.K, sh.V}, gen, o64) : at::Tensor(),
                       g = gate == linear::DeltaGate::Head ? at::log_sigmoid(at::randn({sh.B, sh.T, sh.H}, gen, o64)) * sh.gate_mul
                           : gate == linear::DeltaGate::Key
                               ? at::log_sigmoid(at::randn({sh.B, sh.T, sh.H, sh.K}, gen, o64)) * sh.gate_mul
                               : at::Tensor();
      const std::string what = "gate " + std::to_string(int(gate)) + " B" + std::to_string(sh.B) + " T" +
                               std::to_string(sh.T) + " H" + std::to_string(sh.H) + " K" + std::to_string(sh.K) +
                               " V" + std::to_string(sh.V) + (sh.h0 ? " h0" : "") +
                               " gate_mul " + std::to_string(sh.gate_mul);
      auto [orf, hr] = reference::delta_recurrent(q, k, v, beta, g, 0.3, h0);
      {
        c10::NoGradGuard ng;
        linear::DeltaResult c = linear::delta_chunked_cpu(q, k, v, beta, g, 0.3, h0);
        ASSERT_EQ(c.o.scalar_type(), at::kDouble) << what;
        ASSERT_TRUE(c.o.sizes().equals(orf.sizes())) << what;
        EXPECT_LE(compare(orf, c.o).rel_rms, threshold("fp64", TensorKind::Output)) << what;
        EXPECT_LE(compare(hr, c.ht).rel_rms, threshold("fp64", TensorKind::Output)) << what;
        auto f = [](const at::Tensor& x) { return x.defined() ? x.to(at::kFloat) : x; };
        linear::DeltaResult c32 = linear::delta_chunked_cpu(f(q), f(k), f(v), f(beta), f(g), 0.3, f(h0));
        ASSERT_EQ(c32.o.scalar_type(), at::kFloat) << what;
        EXPECT_LE(compare(orf, c32.o).rel_rms, threshold("fp32", TensorKind::Output)) << what;
        EXPECT_LE(compare(hr, c32.ht).rel_rms, threshold("fp32", TensorKind::Output)) << what;
      }
      std::vector<at::Tensor> x = {q.clone(), k.clone(), v.clone(), beta.clone()};
      if (g.defined()) x.push_back(g.clone());
      if (h0.defined()) x.push_back(h0.clone());
      for (auto& t : x) t.requires_grad_(true);
      const at::Tensor gx = g.defined() ? x[4] : at::Tensor(), hx = h0.defined() ? x.back() : at::Tensor();
      linear::DeltaResult a = linear::delta_chunked_cpu(x[0], x[1], x[2], x[3], gx, 0.3, hx);
      linear::DeltaResult b = linear::delta_chunked(x[0], x[1], x[2], x[3], gx, 0.3, hx);
      const at::Tensor wo = at::randn(a.o.sizes(), gen, o64), wh = at::randn(a.ht.sizes(), gen, o64);
      auto ga = torch::autograd::grad({(a.o * wo).sum() + (a.ht * wh).sum()}, x);
      auto gb = torch::autograd::grad({(b.o * wo).sum() + (b.ht * wh).sum()}, x);
      for (size_t i = 0; i < x.size(); ++i)
        EXPECT_LE(compare(gb[i], ga[i]).rel_rms, 1e-12) << what << " input " << i;
    }
  }
}

}  // namespace

// The explicit backward of the gated delta rule (two walks + batched products) equals autograd
// through delta_chunked to fp64 precision: tail chunks, T = 1, K ≠ V, several chunks, with and
// without h0, without an output gradient or without a final-state gradient, weak and strong gates.
TEST(LinearDeltaChunked, ExplicitBackwardMatchesAutograd) {
  const auto o64 = at::TensorOptions().dtype(at::kDouble);
  struct Shape {
    int64_t B, T, H, K, V;
    bool h0, d_o, dht;
    double gate_mul;
  };
  const std::vector<Shape> shapes = {{1, 1, 2, 8, 8, true, true, true, 0.5},     {2, 37, 2, 8, 12, false, true, true, 1.0},
                                     {1, 130, 2, 16, 8, true, true, false, 0.25}, {2, 200, 1, 12, 20, true, false, true, 2.0},
                                     {1, 64, 3, 8, 8, false, true, true, 8.0},     {1, 129, 1, 32, 16, true, true, true, 0.1}};
  for (const Shape& sh : shapes) {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(uint64_t(7 + sh.T + sh.K));
    at::Tensor k = at::randn({sh.B, sh.T, sh.H, sh.K}, gen, o64);
    k = k / k.norm(2, -1, true);
    std::vector<at::Tensor> x = {at::randn({sh.B, sh.T, sh.H, sh.K}, gen, o64), k,
                                 at::randn({sh.B, sh.T, sh.H, sh.V}, gen, o64),
                                 at::sigmoid(at::randn({sh.B, sh.T, sh.H}, gen, o64)),
                                 at::log_sigmoid(at::randn({sh.B, sh.T, sh.H}, gen, o64)) * sh.gate_mul};
    if (sh.h0) x.push_back(at::randn({sh.B, sh.H, sh.K, sh.V}, gen, o64));
    for (auto& t : x) t.requires_grad_(true);
    const at::Tensor h0 = sh.h0 ? x[5] : at::Tensor();
    linear::DeltaResult r = linear::delta_chunked(x[0], x[1], x[2], x[3], x[4], 0.3, h0);
    const at::Tensor d_o = sh.d_o ? at::randn(r.o.sizes(), gen, o64) : at::Tensor();
    const at::Tensor dht = sh.dht ? at::randn(r.ht.sizes(), gen, o64) : at::Tensor();
    at::Tensor loss = at::zeros({}, o64);
    if (sh.d_o) loss = loss + (r.o * d_o).sum();
    if (sh.dht) loss = loss + (r.ht * dht).sum();
    auto ga = torch::autograd::grad({loss}, x, {}, std::nullopt, false, /*allow_unused=*/true);
    for (size_t i = 0; i < x.size(); ++i)
      if (!ga[i].defined()) ga[i] = at::zeros_like(x[i]);  // q without an output gradient
    linear::DeltaGrads e = linear::gated_delta_backward(x[0].detach(), x[1].detach(), x[2].detach(), x[3].detach(),
                                                        x[4].detach(), 0.3, sh.h0 ? h0.detach() : at::Tensor(), d_o, dht);
    const std::string what = "B" + std::to_string(sh.B) + " T" + std::to_string(sh.T) + " K" + std::to_string(sh.K) +
                             " V" + std::to_string(sh.V) + " gate_mul " + std::to_string(sh.gate_mul);
    const std::vector<at::Tensor> mine = {e.dq, e.dk, e.dv, e.dbeta, e.dg, e.dh0};
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_TRUE(mine[i].defined()) << what << " input " << i;
      ASSERT_TRUE(mine[i].sizes().equals(x[i].sizes())) << what << " input " << i;
      EXPECT_LE(compare(ga[i], mine[i]).rel_rms, 1e-10) << what << " input " << i;
    }
    EXPECT_EQ(e.dh0.defined(), sh.h0) << what;
  }
}
