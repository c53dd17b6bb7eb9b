// Sparse-attention family: sparse_attention and dsa_indexer — conformance at fp64 and fp32, FLA
// goldens, bad inputs, dense equivalence, deterministic ties, selection comparison.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>

#include <filesystem>

#include "tests/source_dir.h"
#include "harness/errors.h"
#include "harness/metrics.h"
#include "harness/registry.h"
#include "harness/safetensors.h"
#include "mixers/sparse/sparse.h"
#include "reference/sparse.h"
#include "suites/conformance.h"

namespace fs = std::filesystem;
using namespace mixbench;
using Json = nlohmann::json;

namespace {
auto f64 = at::TensorOptions().dtype(at::kDouble);
auto i64 = at::TensorOptions().dtype(at::kLong);

std::string golden_dir() { return std::string(mixbench_test::source_dir()) + "/tests/goldens"; }

TensorMap inputs_for(const std::string& op, const std::string& cfg, int64_t B, int64_t T, uint64_t seed = 5) {
  const OpSpec& s = Registry::get().op(op);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return s.make_inputs(s.params.parse(cfg), B, T, gen);
}
}  // namespace

TEST(Sparse, ConformanceFp64AndFp32) {
  for (const char* dtype : {"fp64", "fp32"}) {
    ConformanceOptions opt;
    opt.ops = {"sparse_attention", "dsa_indexer"};
    opt.dtype = dtype;
    opt.finite_differences = std::string(dtype) == "fp64";  // of the FP64 reference, once
    opt.fd_directions = 1;
    ConformanceSummary s;
    Json r = run_conformance(opt, s);
    EXPECT_EQ(s.failed, 0) << dtype;
    EXPECT_EQ(s.errors, 0) << dtype;
    int selection = 0, grads = 0;
    for (const auto& x : r) {
      EXPECT_EQ(x["status"], "pass") << x.dump();
      for (const auto& c : x["checks"]) {
        if (c["kind"] == "selection") {
          ++selection;
          EXPECT_EQ(c["threshold"], 0.0);
        }
        if (c["kind"] == "gradient" && x["op"] == "sparse_attention") ++grads;
      }
    }
    EXPECT_GE(selection, 9) << dtype;  // every dsa_indexer case
    EXPECT_GT(grads, 0) << dtype;
  }
}

TEST(Sparse, FlaGoldensPass) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(golden_dir())) {
    if (e.path().extension() != ".safetensors") continue;
    std::string op = read_safetensors(e.path().string()).metadata.at("op");
    if (op != "sparse_attention" && op != "dsa_indexer") continue;
    for (const char* dtype : {"fp64", "fp32"}) {
      ConformanceOptions opt;
      opt.dtype = dtype;
      Json r = run_golden(e.path().string(), opt);
      ASSERT_EQ(r.size(), 2u);
      for (const auto& x : r) {
        EXPECT_EQ(x["status"], "pass") << e.path() << " " << dtype << " " << x.dump();
        if (op == "dsa_indexer") EXPECT_EQ(x["checks"][0]["kind"], "selection");
      }
      // an output fault must fail the optimized pass
      opt.fault = "output";
      Json bad = run_golden(e.path().string(), opt);
      EXPECT_EQ(bad[1]["status"], "fail") << e.path();
    }
    ++n;
  }
  EXPECT_GE(n, 4);
}

TEST(Sparse, SelectionComparisonIgnoresOrderAndCountsRows) {
  at::Tensor a = at::tensor({0, 3, -1, 2, 1, -1}, i64).view({2, 3});
  at::Tensor b = at::tensor({3, -1, 0, -1, 1, 2}, i64).view({2, 3});
  EXPECT_EQ(compare_selection(a, b).rel_rms, 0.0);
  at::Tensor c = at::tensor({3, -1, 0, -1, 1, 0}, i64).view({2, 3});
  Comparison m = compare_selection(a, c);
  EXPECT_DOUBLE_EQ(m.rel_rms, 0.5);
  EXPECT_DOUBLE_EQ(m.max_abs, 2.0);  // sorted rows [-1,1,2] vs [-1,0,1] differ in 2 slots
  EXPECT_FALSE(compare_selection(a, a.view({3, 2})).shape_ok);
}

TEST(Sparse, DenseEquivalenceWhenEveryCausalKeyIsSelected) {
  const OpSpec& s = Registry::get().op("sparse_attention");
  for (const char* cfg : {"H=4,Hkv=2,D=8", "H=2,Hkv=2,D=8,Dv=12,scale=0.4", "H=3,Hkv=1,D=4"}) {
    Config p = s.params.parse(cfg);
    TensorMap in = inputs_for("sparse_attention", std::string(cfg) + ",topk=4", 2, 23);
    for (auto [dt, thr] : {std::pair{at::kDouble, 1e-12}, std::pair{at::kFloat, 1e-5}}) {
      for (const auto& [name, err] : s.invariants(in, p, Backend::CPU, dt)) EXPECT_LT(err, thr) << cfg << " " << name;
    }
  }
  // and directly: topk > T with the full causal set, -1 padded, through call_op
  TensorMap in = inputs_for("sparse_attention", "H=4,Hkv=1,D=8,topk=4", 1, 9);
  at::Tensor full = causal_full_indices(1, 9, in.at("q"));
  full = at::cat({full.flip(-1), at::full({1, 9, 3}, -1, i64)}, -1);  // 12 slots, shuffled order
  in.set("indices", full);
  Config p = s.params.parse("H=4,Hkv=1,D=8,topk=12");
  at::Tensor o = call_op("sparse_attention", Backend::CPU, in, p).at("o");
  Config pa = Registry::get().op("attention").params.defaults();
  at::Tensor dense = Registry::get().op("attention").reference(in, pa).at("o");
  EXPECT_LT(compare(dense, o).rel_rms, 1e-12);
}

TEST(Sparse, EmptyRowsGiveZeroAndFiniteGradients) {
  TensorMap in = inputs_for("sparse_attention", "H=2,Hkv=1,D=4,topk=3", 1, 6);
  at::Tensor idx = in.at("indices").clone();
  idx[0][4].fill_(-1);
  in.set("indices", idx);
  Config p = Registry::get().op("sparse_attention").params.parse("H=2,Hkv=1,D=4,topk=3");
  for (Backend b : {Backend::Reference, Backend::CPU}) {
    TensorMap x = in;
    at::Tensor q = in.at("q").clone().requires_grad_(true);
    x.set("q", q);
    at::Tensor o = call_op("sparse_attention", b, x, p).at("o");
    EXPECT_EQ(o[0][4].abs().max().item<double>(), 0.0);
    o.sum().backward();
    EXPECT_TRUE(at::isfinite(q.grad()).all().item<bool>());
  }
}

TEST(Sparse, BadInputsRaiseInputError) {
  const OpSpec& s = Registry::get().op("sparse_attention");
  Config p = s.params.parse("H=4,Hkv=2,D=8,topk=3");
  TensorMap good = inputs_for("sparse_attention", "H=4,Hkv=2,D=8,topk=3", 2, 7);
  EXPECT_NO_THROW(s.check_inputs(good, p));
  auto with = [&](const std::string& n, at::Tensor t) {
    TensorMap m = good;
    m.set(n, t);
    return m;
  };
  auto expect_error = [&](const TensorMap& m, const std::string& needle, const Config& cfg) {
    try {
      s.check_inputs(m, cfg);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_THROW(s.cpu(m, cfg), InputError);
    EXPECT_THROW(s.reference(m, cfg), InputError);
  };
  at::Tensor idx = good.at("indices");
  expect_error(with("indices", idx.slice(2, 0, 2).contiguous()), "[B,T,topk]", p);      // wrong topk
  expect_error(with("indices", idx.select(2, 0).contiguous()), "[B,T,topk]", p);        // 2 dims
  expect_error(with("indices", idx.to(at::kInt)), "int64", p);
  at::Tensor beyond = idx.clone();
  beyond[1][6][0] = 7;
  expect_error(with("indices", beyond), "index ≥ T", p);
  at::Tensor future = idx.clone();
  future[0][2][1] = 4;
  expect_error(with("indices", future), "non-causal", p);
  at::Tensor neg = idx.clone();
  neg[0][3][0] = -2;
  expect_error(with("indices", neg), "only −1", p);
  at::Tensor dup = at::full({2, 7, 3}, -1, i64);
  dup[1][5][0] = 2;
  dup[1][5][2] = 2;
  expect_error(with("indices", dup), "twice", p);
  expect_error(with("q", at::randn({2, 7, 3, 8}, f64)), "not a multiple", p);  // 3 heads, 2 KV heads
  expect_error(with("k", at::randn({2, 7, 2, 4}, f64)), "head dims", p);
  expect_error(with("v", at::randn({2, 6, 2, 8}, f64)), "batch and length", p);
  EXPECT_THROW(s.params.parse("H=6,Hkv=4"), InputError);

  const OpSpec& ix = Registry::get().op("dsa_indexer");
  Config pi = ix.params.parse("HI=4,DI=8,topk=5");
  TensorMap gi = inputs_for("dsa_indexer", "HI=4,DI=8,topk=5", 1, 9);
  EXPECT_NO_THROW(ix.check_inputs(gi, pi));
  TensorMap bad = gi;
  bad.set("k_idx", at::randn({1, 9, 6}, f64));
  EXPECT_THROW(ix.check_inputs(bad, pi), InputError);
  bad = gi;
  bad.set("w_idx", at::randn({1, 9, 3}, f64));
  EXPECT_THROW(ix.cpu(bad, pi), InputError);
  bad = gi;
  bad.set("q_idx", at::randn({1, 9, 32}, f64));
  EXPECT_THROW(ix.reference(bad, pi), InputError);
  EXPECT_THROW(ix.params.parse("activation=gelu"), InputError);
  EXPECT_THROW(ix.params.parse("topk=0"), InputError);
}

TEST(Sparse, IndexerTiesGoToTheLowestIndex) {
  // Every key identical: all visible scores tie, so query t selects keys 0..min(topk,t+1)-1.
  const int64_t T = 11, topk = 4;
  at::Tensor q = at::ones({1, T, 2, 3}, f64), k = at::ones({1, T, 3}, f64).mul(2), w = at::ones({1, T, 2}, f64);
  for (bool relu : {true, false}) {
    for (int path = 0; path < 2; ++path) {
      at::Tensor got = path == 0 ? reference::dsa_indexer(q, k, w, topk, 0.5, relu)
                                 : dsa_indexer_cpu(q, k, w, topk, 0.5, relu);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < topk; ++j)
          EXPECT_EQ(got[0][t][j].item<int64_t>(), j <= t ? j : -1) << "path " << path << " t " << t;
    }
  }
  // Partial ties: scores (by key) 1, 3, 3, 0, 3 → top-2 = {1, 2} (3 ties at 3, lowest two win).
  at::Tensor kk = at::tensor({1.0, 3.0, 3.0, 0.0, 3.0}, f64).view({1, 5, 1});
  at::Tensor qq = at::ones({1, 5, 1, 1}, f64);
  for (int path = 0; path < 2; ++path) {
    at::Tensor got = path == 0 ? reference::dsa_indexer(qq, kk, at::Tensor(), 2, 1.0, true)
                               : dsa_indexer_cpu(qq, kk, at::Tensor(), 2, 1.0, true);
    EXPECT_TRUE(at::equal(got[0][4], at::tensor({1, 2}, i64))) << got[0][4];
    EXPECT_TRUE(at::equal(got[0][0], at::tensor({0, -1}, i64))) << got[0][0];
  }
  // ReLU zeros tie too: with negative similarities everywhere every score is 0.
  at::Tensor neg = reference::dsa_indexer(qq * -1, kk, at::Tensor(), 3, 1.0, true);
  EXPECT_TRUE(at::equal(neg[0][4], at::tensor({0, 1, 2}, i64)));
  EXPECT_TRUE(at::equal(neg, dsa_indexer_cpu(qq * -1, kk, at::Tensor(), 3, 1.0, true)));
}

TEST(Sparse, IndexerFeedsSparseAttention) {
  // The indexer's output is a valid sparse_attention input (−1 padding, causal, no repeats).
  TensorMap ii = inputs_for("dsa_indexer", "HI=4,DI=8,topk=6", 2, 17);
  Config pi = Registry::get().op("dsa_indexer").params.parse("HI=4,DI=8,topk=6");
  at::Tensor idx = call_op("dsa_indexer", Backend::CPU, ii, pi).at("indices");
  TensorMap in = inputs_for("sparse_attention", "H=2,Hkv=2,D=8,topk=6", 2, 17);
  in.set("indices", idx);
  const OpSpec& s = Registry::get().op("sparse_attention");
  Config p = s.params.parse("H=2,Hkv=2,D=8,topk=6");
  EXPECT_NO_THROW(s.check_inputs(in, p));
  EXPECT_LT(compare(s.reference(in, p).at("o"), s.cpu(in, p).at("o")).rel_rms, 1e-12);
}
