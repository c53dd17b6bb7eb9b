// The selections' sort-free path (the CUDA path of dsa_indexer and block_topk, and the layers' path on
// every device for fp32): topk_lowest_index is a stable descending sort's first k columns (ties to
// the lower index, −0.0 = +0.0, ±inf); dsa_indexer_topk equals dsa_indexer_cpu at any query-block
// size (exactly where the scores are exact, as tie-aware sets otherwise); block_topk_keys equals
// block_topk_cpu; the block size stays within its memory budget. All on the CPU (the same LibTorch
// code runs on CUDA; tests/test_sparse_token_cuda.cpp repeats the checks there).
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "harness/errors.h"
#include "harness/registry.h"
#include "mixers/sparse/sparse.h"
#include "mixers/sparse/token_sparse_cuda.h"
#include "reference/sparse.h"
#include "reference/sparse_blocks.h"
#include "suites/conformance_checks.h"

using namespace mixbench;

namespace {

at::Tensor stable_topk(const at::Tensor& s, int64_t k) {
  return std::get<1>(at::sort(s, /*stable=*/true, /*dim=*/-1, /*descending=*/true)).slice(-1, 0, k);
}

TensorMap indexer_inputs(int64_t B, int64_t T, int64_t HI, int64_t DI, bool ties, uint64_t seed) {
  const OpSpec& op = Registry::get().op("dsa_indexer");
  const Config c = op.params.parse(fmt::format("HI={},DI={},ties={}", HI, DI, ties ? "true" : "false"));
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return op.make_inputs(c, B, T, gen);
}

}  // namespace

TEST(SparseTopkKeys, TopkLowestIndexIsTheStableSortsPrefix) {
  at::manual_seed(3);
  const float inf = std::numeric_limits<float>::infinity();
  // small integers (most scores tie), signed zeros, infinities, tiny and huge magnitudes
  at::Tensor ints = at::randint(-3, 4, {5, 7, 40}).to(at::kFloat);
  at::Tensor zeros = at::randint(0, 2, {5, 7, 40}).to(at::kFloat) * 0.0 * (at::randint(0, 2, {5, 7, 40}) * 2 - 1);
  at::Tensor mixed = at::randn({5, 7, 40}) * at::pow(10.0, at::randint(-30, 30, {5, 7, 40}).to(at::kFloat));
  at::Tensor specials = at::tensor({inf, -inf, 0.0f, -0.0f, 1.0f, -1.0f, 1e-38f, -1e-38f, 3e38f, -3e38f, -inf, inf, -0.0f, 0.0f})
                            .view({1, 14});
  for (const at::Tensor& s : {ints, zeros, mixed, specials, at::cat({ints, zeros}, -1)}) {
    const int64_t n = s.size(-1);
    for (int64_t k : {int64_t(0), int64_t(1), int64_t(5), n / 2, n}) {
      const at::Tensor got = topk_lowest_index(s, k);
      EXPECT_EQ(got.scalar_type(), at::kLong);
      EXPECT_TRUE(at::equal(got, stable_topk(s.masked_fill(s == 0, 0.0), k))) << "k=" << k << " n=" << n;
    }
  }
  // −0.0 and +0.0 are one score: the lower index first, whichever zero it holds
  const at::Tensor z = at::tensor({0.0f, -0.0f, 0.0f, -0.0f});
  EXPECT_TRUE(at::equal(topk_lowest_index(z.flip(0), 4), at::arange(4, at::TensorOptions().dtype(at::kLong))));
  EXPECT_THROW(topk_lowest_index(z.to(at::kDouble), 2), InputError);
  EXPECT_THROW(topk_lowest_index(z, 5), InputError);
}

TEST(SparseTopkKeys, IndexerBlockStaysWithinItsBudget) {
  // B·n·T·(4·H_I + 40) bytes per block
  EXPECT_EQ(dsa_indexer_block(1, 32768, 64, int64_t(256) << 20), (int64_t(256) << 20) / (32768LL * 296));
  EXPECT_EQ(dsa_indexer_block(1, 32768, 64, int64_t(256) << 20), 27);
  EXPECT_EQ(dsa_indexer_block(1, 2048, 3, int64_t(256) << 20), kDsaIndexerQueryBlock);  // capped: the causal waste
  EXPECT_EQ(dsa_indexer_block(2, 100, 3, int64_t(256) << 20), 100);          // the whole sequence in one block
  EXPECT_EQ(dsa_indexer_block(8, 1 << 20, 64, int64_t(256) << 20), 1);      // never below one query
  for (auto [B, T, HI] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{1, 65536, 3}, {4, 8192, 8}, {2, 300, 1}}) {
    const int64_t n = dsa_indexer_block(B, T, HI, int64_t(256) << 20);
    EXPECT_LE(B * n * T * (4 * HI + 40), int64_t(256) << 20);
    EXPECT_LE(n, kDsaIndexerQueryBlock);
    EXPECT_TRUE(n == std::min(T, kDsaIndexerQueryBlock) || B * (n + 1) * T * (4 * HI + 40) > (int64_t(256) << 20))
        << "not the largest block";
  }
}

// Integer inputs and a power-of-two scale: every fp32 score is exact, so the sort-free path must
// equal the stable-sort path and the FP64 reference slot by slot, at every block size.
TEST(SparseTopkKeys, IndexerTopkEqualsTheSortOnTies) {
  for (auto [B, T, HI, DI, topk] : std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>>{
           {2, 70, 2, 4, 6}, {1, 47, 3, 5, 9}, {1, 33, 4, 8, 64}, {2, 1, 2, 4, 3}}) {
    TensorMap in = indexer_inputs(B, T, HI, DI, true, 7 + T);
    const at::Tensor q = in.at("q_idx").to(at::kFloat), k = in.at("k_idx").to(at::kFloat), w = in.at("w_idx").to(at::kFloat);
    for (bool relu : {true, false}) {
      const at::Tensor ref = reference::dsa_indexer(in.at("q_idx"), in.at("k_idx"), in.at("w_idx"), topk, 0.5, relu);
      const at::Tensor sorted = dsa_indexer_cpu(q, k, w, topk, 0.5, relu);
      EXPECT_TRUE(at::equal(ref, sorted));
      // budgets giving blocks of 1, a few and all queries
      for (int64_t budget : {int64_t(1), B * T * (4 * HI + 40) * 7, int64_t(256) << 20}) {
        const std::string where = fmt::format("T{} topk{} relu{} budget{}", T, topk, relu, budget);
        EXPECT_TRUE(at::equal(sorted, dsa_indexer_topk(q, k, w, topk, 0.5, relu, budget))) << where;
        EXPECT_TRUE(at::equal(dsa_indexer_cpu(q, k, at::Tensor(), topk, 0.5, relu),
                              dsa_indexer_topk(q, k, at::Tensor(), topk, 0.5, relu, budget)))
            << where << " (no weights)";
      }
      // the layers' entry point: bf16 inputs (integers are exact) take the same path
      EXPECT_TRUE(at::equal(sorted, dsa_indexer_fast(q.to(at::kBFloat16), k.to(at::kBFloat16), w.to(at::kBFloat16), topk,
                                                     0.5, relu)));
    }
  }
}

// Gaussian inputs: tie-aware sets against the reference (the conformance rule), −1 where it pads,
// slots in descending score; fp64 inputs keep the stable sort of FP64 scores.
TEST(SparseTopkKeys, IndexerTopkMatchesTheReference) {
  const OpSpec& op = Registry::get().op("dsa_indexer");
  for (auto [B, T, HI, DI, topk] : std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>>{
           {2, 90, 4, 16, 16}, {1, 130, 3, 32, 130}, {1, 60, 2, 8, 1}}) {
    TensorMap in = indexer_inputs(B, T, HI, DI, false, 17 + T);
    const Config p = op.params.parse(fmt::format("topk={},HI={},DI={}", topk, HI, DI));
    const double scale = 1.0 / std::sqrt(double(DI));
    const at::Tensor ref = reference::dsa_indexer(in.at("q_idx"), in.at("k_idx"), in.at("w_idx"), topk, scale, true);
    const at::Tensor scores = op.selection_scores(in, p).at("indices");
    for (int64_t budget : {int64_t(1), int64_t(256) << 20}) {
      const at::Tensor got = dsa_indexer_topk(in.at("q_idx").to(at::kFloat), in.at("k_idx").to(at::kFloat),
                                              in.at("w_idx").to(at::kFloat), topk, scale, true, budget);
      const std::string where = fmt::format("T{} topk{} budget{}", T, topk, budget);
      EXPECT_EQ(conformance_detail::compare_selection_ties(ref, got, scores, conformance_detail::tie_tolerance("fp32"))
                    .cmp.rel_rms,
                0.0)
          << where;
      EXPECT_TRUE(at::equal(ref < 0, got < 0)) << where;
      const at::Tensor sc = at::gather(scores, 2, got.clamp_min(0));
      const at::Tensor both = got.slice(2, 1) >= 0;
      if (both.any().item<bool>())
        EXPECT_LE((sc.slice(2, 1) - sc.slice(2, 0, -1)).masked_select(both).max().item<double>(), 1e-5) << where;
    }
    // the op's CUDA path is the same function: on CPU tensors it runs here
    const at::Tensor via = op.cuda(in, p).at("indices");
    EXPECT_TRUE(at::equal(via, dsa_indexer_cpu(in.at("q_idx"), in.at("k_idx"), in.at("w_idx"), topk, scale, true)))
        << "fp64 inputs keep the stable sort";
  }
}

// block_topk_keys is block_topk_cpu (the same scores, no arithmetic): every case shape of the op, tied
// and Gaussian scores, both own-block rules, fp32 and bf16 scores through block_topk_fast.
TEST(SparseTopkKeys, BlockTopkKeysEqualsTheSort) {
  const OpSpec& op = Registry::get().op("block_topk");
  for (const std::string& kv : {"block_size=4,topk=3", "block_size=2,topk=4,S=3,ties=true", "block_size=5,topk=16,S=1",
                                "block_size=1,topk=5", "block_size=4,topk=3,own=counted",
                                "block_size=2,topk=4,S=3,own=counted,ties=true", "block_size=8,topk=1,own=counted,S=3",
                                "block_size=5,topk=16,own=counted", "block_size=1,topk=40,S=2,ties=true"}) {
    const Config p = op.params.parse(kv);
    const bool counted = p.s("own") == "counted";
    for (int64_t T : {1, 4, 37, 130}) {
      at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(uint64_t(T) + 5);
      const at::Tensor sc = op.make_inputs(p, 2, T, gen).at("scores").to(at::kFloat);
      const at::Tensor want = block_topk_cpu(sc, p.i("block_size"), p.i("topk"), counted);
      EXPECT_TRUE(at::equal(want, block_topk_keys(sc, p.i("block_size"), p.i("topk"), counted))) << kv << " T" << T;
      const at::Tensor sc16 = sc.to(at::kBFloat16);
      EXPECT_TRUE(at::equal(block_topk_cpu(sc16.to(at::kFloat), p.i("block_size"), p.i("topk"), counted),
                            block_topk_fast(sc16, p.i("block_size"), p.i("topk"), counted)))
          << kv << " T" << T << " bf16";
      // and the reference, the op's contract
      const at::Tensor ref = reference::block_topk(sc.to(at::kDouble), p.i("block_size"), p.i("topk"), counted);
      EXPECT_TRUE(at::equal(ref, want)) << kv << " T" << T << " reference";
    }
  }
  // a scored history block whose score is −inf stays out of the appended selection, as in the sort path
  at::Tensor s = at::tensor({1.0f, -std::numeric_limits<float>::infinity(), 2.0f}).view({1, 1, 1, 3}).expand({1, 1, 12, 3});
  s = s.contiguous();
  EXPECT_TRUE(at::equal(block_topk_cpu(s, 4, 3, false), block_topk_keys(s, 4, 3, false)));
}

// The token-sparse kernels never apply to CPU tensors; the CPU path is unchanged.
TEST(SparseTopkKeys, KernelsApplyOnlyOnCuda) {
  const at::Tensor q = at::randn({1, 4, 2, 64});
  at::Tensor idx = at::zeros({1, 4, 2}, at::TensorOptions().dtype(at::kLong));
  idx.select(2, 1).fill_(-1);  // every query reads key 0
  EXPECT_FALSE(sparse_attention_kernel_applies(q, q, q, idx));
  EXPECT_TRUE(at::equal(sparse_attention_fast(q, q, q, idx, 0.1), sparse_attention_cpu(q, q, q, idx, 0.1)));
}
