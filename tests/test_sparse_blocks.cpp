// Block-selecting sparse-attention methods qsa, nsa and seer: conformance at fp64 and fp32
// (that a perturbed path fails every case is AllRegistered/Mutation's test), equality with dense_full when every causal key is selected, the
// auxiliary losses reaching only the indexer / gate, bad knobs, and the accountant audit
// (parameter counts exact, forward FLOPs within 2% of FlopCounter).
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>

#include "harness/backbone.h"
#include "harness/errors.h"
#include "harness/flop_counter.h"
#include "harness/registry.h"
#include "suites/conformance.h"

using namespace mixbench;
using Json = nlohmann::json;

namespace {

const std::vector<std::string> kMethods = {"qsa", "nsa", "seer"};
const std::string kShape = "n_layer=4,d_model=64,head_dim=16,seq_len=64,vocab=64";

double rel(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor x = a.to(at::kDouble), y = b.to(at::kDouble);
  return (x - y).pow(2).mean().sqrt().item<double>() / (x.pow(2).mean().sqrt().item<double>() + 1e-12);
}

TensorMap layer_inputs(const MethodSpec& m, const Config& cfg, int64_t layer, int64_t B, int64_t T, uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  LayerCtx ctx{layer, model_dims(cfg).n_layer};
  TensorMap in = m.make_inputs(cfg, ctx, B, T, gen);
  for (const auto& d : m.params(cfg, ctx)) in.set(d.name, random_param(d, gen, at::TensorOptions().dtype(at::kDouble)));
  return in;
}

ConformanceSummary run(const std::string& dtype, const std::string& fault, Json* out = nullptr) {
  ConformanceOptions opt;
  opt.methods = kMethods;
  opt.dtype = dtype;
  opt.fault = fault;
  opt.finite_differences = dtype == "fp64" && fault.empty();
  opt.fd_directions = 1;
  ConformanceSummary s;
  Json r = run_conformance(opt, s);
  if (out) *out = r;
  return s;
}

}  // namespace

TEST(SparseBlocks, ConformanceFp64AndFp32) {
  for (const char* dtype : {"fp64", "fp32"}) {
    Json r;
    ConformanceSummary s = run(dtype, "", &r);
    EXPECT_EQ(s.failed, 0) << dtype;
    EXPECT_EQ(s.errors, 0) << dtype;
    EXPECT_GE(s.passed, 21) << dtype;  // 7 cases per method
    int aux_total = 0, grad_total = 0;
    for (const auto& x : r) {
      EXPECT_EQ(x["status"], "pass") << x.dump();
      for (const auto& c : x["checks"]) {
        if (c["tensor"] == "aux_loss") ++aux_total;
        if ((c["tensor"] == "grad_qsa_wq" || c["tensor"] == "grad_seer_wk" || c["tensor"] == "grad_nsa_cmp_k") &&
            c["kind"] == "gradient")
          ++grad_total;
      }
    }
    EXPECT_GE(aux_total, 14) << dtype;   // every qsa and seer case compares aux_loss
    EXPECT_GE(grad_total, 21) << dtype;  // and the indexer / gate / compression gradients
  }
}

// T within the budget: every causal key is attended, so qsa and seer equal dense_full's layer on
// the same weights (reference and optimized paths). NSA mixes three branches; with zero gate
// weights (all gates ½) and zero compression maps (compressed values 0) it equals dense_full
// when the window also covers T. Beyond the budget every method differs from dense attention.
TEST(SparseBlocks, EverythingSelectedEqualsDenseFull) {
  const MethodSpec& dense = Registry::get().method("dense_full");
  struct C {
    std::string method, cfg;
    int64_t T, layer;
  };
  for (const C& c : {C{"qsa", ",qsa_block=4,qsa_topk=3,qsa_heads=4,qsa_dim=8,qsa_group=2,qsa_rope_dim=4", 16, 0},
                     C{"qsa", ",qsa_block=5,qsa_topk=2,qsa_heads=4,qsa_dim=8,qsa_group=4,qsa_rope_dim=8,kv_ratio=2", 13, 1},
                     C{"seer", ",seer_block=4,seer_topk=2,seer_gate_dim=8", 12, 0},
                     C{"seer", ",seer_block=3,seer_topk=4,seer_gate_dim=8,kv_ratio=2", 15, 3},
                     C{"nsa", ",nsa_block=4,nsa_topk=3,nsa_window=16", 16, 0},
                     C{"nsa", ",nsa_block=5,nsa_topk=2,nsa_window=40,kv_ratio=0", 14, 1}}) {
    const MethodSpec& m = Registry::get().method(c.method);
    Config cfg = m.config.parse(kShape + c.cfg);
    LayerCtx ctx{c.layer, 4};
    auto prepare = [&](int64_t B, int64_t T, uint64_t seed) {
      TensorMap in = layer_inputs(m, cfg, c.layer, B, T, seed);
      if (c.method == "nsa")
        for (const char* n : {"nsa_gate", "nsa_cmp_k", "nsa_cmp_v"}) in.set(n, at::zeros_like(in.at(n)));
      return in;
    };
    TensorMap in = prepare(2, c.T, 11);
    Config dcfg = dense.config.parse(kShape + ",kv_ratio=" + std::to_string(cfg.i("kv_ratio")));
    at::Tensor yd = dense.reference(in, dcfg, ctx).at("y");
    EXPECT_LT(rel(yd, m.reference(in, cfg, ctx).at("y")), 1e-12) << c.method << c.cfg;
    EXPECT_LT(rel(yd, m.forward(in, cfg, ctx, Backend::CPU).at("y")), 1e-12) << c.method << c.cfg;
    TensorMap longer = prepare(1, 4 * c.T + 7, 12);
    at::Tensor yl = dense.reference(longer, dcfg, ctx).at("y");
    EXPECT_GT(rel(yl, m.forward(longer, cfg, ctx, Backend::CPU).at("y")), 1e-6) << c.method << c.cfg;
    EXPECT_GT(rel(yl, m.reference(longer, cfg, ctx).at("y")), 1e-6) << c.method << c.cfg;
  }
}

// aux_loss reaches only the indexer (qsa_*) / gate (seer_*) parameters, and y none of them; NSA has
// no auxiliary loss and y reaches every parameter (its branches are trained end to end).
TEST(SparseBlocks, AuxLossTrainsOnlyTheGate) {
  struct C {
    std::string method, cfg, prefix;
  };
  for (const C& c : {C{"qsa", ",qsa_block=4,qsa_topk=2,qsa_heads=4,qsa_dim=8,qsa_group=2,qsa_rope_dim=4", "qsa_"},
                     C{"seer", ",seer_block=4,seer_topk=2,seer_gate_dim=8,kv_ratio=2", "seer_"},
                     C{"nsa", ",nsa_block=4,nsa_topk=2,nsa_window=6", "nsa_"}}) {
    const MethodSpec& m = Registry::get().method(c.method);
    Config cfg = m.config.parse(kShape + c.cfg);
    LayerCtx ctx{1, 4};
    TensorMap in = layer_inputs(m, cfg, 1, 2, 29, 21);
    std::vector<std::string> names;
    std::vector<at::Tensor> leaves;
    for (const auto& [n, t] : in) {
      t.requires_grad_(true);
      names.push_back(n);
      leaves.push_back(t);
    }
    for (Backend b : {Backend::CPU, Backend::Reference}) {
      TensorMap out = b == Backend::CPU ? m.forward(in, cfg, ctx, b) : m.reference(in, cfg, ctx);
      auto gy = torch::autograd::grad({out.at("y").sum()}, leaves, {}, true, false, /*allow_unused=*/true);
      if (c.method == "nsa") {
        EXPECT_FALSE(out.has("aux_loss"));
        for (size_t i = 0; i < names.size(); ++i)
          EXPECT_TRUE(gy[i].defined() && gy[i].abs().max().item<double>() > 0) << c.method << " " << names[i];
        continue;
      }
      ASSERT_TRUE(out.has("aux_loss"));
      EXPECT_EQ(out.at("aux_loss").dim(), 0);
      EXPECT_GT(out.at("aux_loss").item<double>(), 0.0);
      auto ga = torch::autograd::grad({out.at("aux_loss")}, leaves, {}, false, false, /*allow_unused=*/true);
      for (size_t i = 0; i < names.size(); ++i) {
        const bool gate = names[i].rfind(c.prefix, 0) == 0;
        const bool aux_nonzero = ga[i].defined() && ga[i].abs().max().item<double>() > 0;
        const bool y_nonzero = gy[i].defined() && gy[i].abs().max().item<double>() > 0;
        EXPECT_EQ(aux_nonzero, gate) << c.method << " " << names[i];
        EXPECT_EQ(y_nonzero, !gate) << c.method << " " << names[i];
      }
    }
  }
}

TEST(SparseBlocks, BadKnobsAreInputErrors) {
  const MethodSpec& q = Registry::get().method("qsa");
  EXPECT_THROW(q.config.parse(kShape + ",qsa_rope_dim=3"), InputError);
  EXPECT_THROW(q.config.parse(kShape + ",qsa_heads=6,qsa_group=4"), InputError);
  EXPECT_THROW(q.config.parse(kShape + ",qsa_dim=8,qsa_rope_dim=16"), InputError);
  EXPECT_ANY_THROW(Registry::get().method("seer").config.parse(kShape + ",seer_block=0"));
  EXPECT_ANY_THROW(Registry::get().method("nsa").config.parse(kShape + ",nsa_window=0"));
}

// Parameters: the accountant's counts equal the built tensors exactly (every layer, VE or not).
// FLOPs: FlopCounter on the layer's forward plus the documented element-wise part
// (uncounted_flops) agrees with fwd_flops within 2%, at lengths inside and beyond the budget.
TEST(SparseBlocks, AccountantAudit) {
  const std::string shape = "n_layer=4,d_model=128,head_dim=32,seq_len=256,vocab=64";
  const std::map<std::string, std::string> knobs = {
      {"qsa", ",qsa_block=4,qsa_topk=8,qsa_heads=8,qsa_dim=16,qsa_group=4,qsa_rope_dim=8"},
      {"nsa", ",nsa_block=8,nsa_topk=4,nsa_window=24,kv_ratio=2"},
      {"seer", ",seer_block=8,seer_topk=3,seer_gate_dim=16,kv_ratio=2"}};
  for (const auto& name : kMethods) {
    const MethodSpec& m = Registry::get().method(name);
    Config c = m.config.parse(shape + knobs.at(name));
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
      EXPECT_EQ(m.ve_dim(c, ctx) > 0, ctx.layer % 2 == 1);
    }
    for (int64_t layer : {0, 1}) {
      for (int64_t T : {19, 37, 130}) {
        LayerCtx ctx{layer, 4};
        TensorMap in = layer_inputs(m, c, layer, 2, T, 11);
        TensorMap in32;
        for (const auto& [n, t] : in) in32.set(n, t.to(at::kFloat));
        double counted = 0;
        {
          c10::NoGradGuard ng;
          FlopCounter fc;
          m.forward(in32, c, ctx, Backend::CPU);
          counted = fc.total() / double(2 * T);
        }
        CostQuery q;
        q.T = T;
        LayerCost lc = m.account(c, ctx, q);
        EXPECT_NEAR((counted + lc.uncounted_flops) / lc.fwd_flops, 1.0, 0.02)
            << name << " layer " << layer << " T " << T << ": counted " << counted << " + " << lc.uncounted_flops
            << " accountant " << lc.fwd_flops;
      }
    }
  }
}
