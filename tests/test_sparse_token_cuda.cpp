// On a machine with a GPU: the token-sparse attention kernels (sparse_attention_fast on CUDA) against
// the FP64 reference, forward and gradients (fp32 tight, bf16 / fp16 at their rounding; GQA and MQA,
// D 64 and 128, −1 slots anywhere, rows with no key, K below t + 1 and above T, key tiles crossed),
// their capture in a CUDA graph (forward + backward replayed against eager), the op's CUDA path
// routing to them; and the CUDA selections (dsa_indexer_fast, block_topk_fast) against the
// reference: exactly, slot by slot, where the arithmetic is exact (integer inputs, many tied
// scores), else as sets with ties accepted. The small cases (SparseTokenCuda.Small*) suit
// compute-sanitizer.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#if defined(MIXBENCH_WITH_CUDA)
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "harness/registry.h"
#include "mixers/sparse/sparse.h"
#include "mixers/sparse/token_sparse_cuda.h"
#include "reference/sparse.h"
#include "suites/conformance_checks.h"
#include "tests/test_util.h"

namespace mixbench {
namespace {

using mixbench_test::rel_rms;

bool all_finite(const at::Tensor& x) { return at::isfinite(x.detach().to(at::kCPU, at::kDouble)).all().item<bool>(); }

struct Shape {
  int64_t B, T, H, Hkv, D, K;
  std::string str() const { return fmt::format("B{} T{} H{} Hkv{} D{} K{}", B, T, H, Hkv, D, K); }
};

// q, k, v (FP64, CPU) and indices [B,T,K] (random distinct causal keys, −1 anywhere) from the op's
// own case generator.
TensorMap inputs_of(const Shape& s, uint64_t seed) {
  const OpSpec& op = Registry::get().op("sparse_attention");
  const Config c = op.params.parse(fmt::format("H={},Hkv={},D={},topk={}", s.H, s.Hkv, s.D, s.K));
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return op.make_inputs(c, s.B, s.T, gen);
}

struct Result {
  at::Tensor o, dq, dk, dv;
};

// o and the gradients of Σ o·dO in q, k, v through `fn` on (q, k, v) given in their final dtype/device.
template <class Fn>
Result run(Fn fn, const at::Tensor& q0, const at::Tensor& k0, const at::Tensor& v0, const at::Tensor& dout) {
  at::Tensor q = q0.detach().clone().requires_grad_(true), k = k0.detach().clone().requires_grad_(true),
             v = v0.detach().clone().requires_grad_(true);
  at::Tensor o = fn(q, k, v);
  auto g = torch::autograd::grad({o}, {q, k, v}, {dout.to(o.scalar_type())});
  return {o.detach(), g[0], g[1], g[2]};
}

// The kernels on CUDA in dtype dt against the FP64 reference on the same (rounded) values.
void check_against_reference(const Shape& s, at::ScalarType dt, double tol_o, double tol_g, uint64_t seed,
                             const at::Tensor& idx_override = at::Tensor()) {
  TensorMap in = inputs_of(s, seed);
  const at::Tensor idx = idx_override.defined() ? idx_override : in.at("indices");
  const double scale = 1.0 / std::sqrt(double(s.D));
  auto cu = at::TensorOptions().device(at::kCUDA).dtype(dt);
  const at::Tensor q = in.at("q").to(cu), k = in.at("k").to(cu), v = in.at("v").to(cu);
  const at::Tensor dout = at::randn({s.B, s.T, s.H, s.D}, at::TensorOptions().dtype(at::kDouble));
  ASSERT_TRUE(sparse_attention_kernel_applies(q, k, v, idx.to(at::kCUDA))) << s.str();
  const Result got = run([&](const at::Tensor& a, const at::Tensor& b, const at::Tensor& c) {
    return sparse_attention_fast(a, b, c, idx.to(at::kCUDA), scale);
  }, q, k, v, dout.to(cu));
  auto d = [](const at::Tensor& x) { return x.to(at::kCPU, at::kDouble); };
  const Result ref = run([&](const at::Tensor& a, const at::Tensor& b, const at::Tensor& c) {
    return reference::sparse_attention(a, b, c, idx, scale);
  }, d(q), d(k), d(v), d(dout.to(dt)));
  const std::string where = fmt::format("{} {}", c10::toString(dt), s.str());
  ASSERT_EQ(got.o.scalar_type(), dt) << where;
  ASSERT_EQ(got.dk.scalar_type(), dt) << where;
  EXPECT_TRUE(all_finite(got.o) && all_finite(got.dq) && all_finite(got.dk) && all_finite(got.dv)) << where;
  EXPECT_LE(rel_rms(ref.o, got.o), tol_o) << where << " o";
  EXPECT_LE(rel_rms(ref.dq, got.dq), tol_g) << where << " dq";
  EXPECT_LE(rel_rms(ref.dk, got.dk), tol_g) << where << " dk";
  EXPECT_LE(rel_rms(ref.dv, got.dv), tol_g) << where << " dv";
  // rows without a key: o = 0 exactly, and no gradient reaches q there
  const at::Tensor empty = (idx < 0).all(-1);  // [B,T]
  if (empty.any().item<bool>()) {
    const at::Tensor e = empty.view({s.B, s.T, 1, 1}).to(at::kCUDA);
    EXPECT_EQ(got.o.masked_select(e.expand_as(got.o)).abs().max().item<double>(), 0.0) << where;
    EXPECT_EQ(got.dq.masked_select(e.expand_as(got.dq)).abs().max().item<double>(), 0.0) << where;
  }
}

const std::vector<Shape>& small_shapes() {
  static const std::vector<Shape> s = {
      {1, 1, 2, 2, 64, 4},     // one query, K > T
      {2, 37, 4, 2, 64, 8},    // GQA, K < t + 1 for most rows
      {1, 45, 6, 6, 128, 16},  // d12's heads
      {2, 33, 8, 1, 64, 5},    // MQA, K not a multiple of the tile
      {1, 20, 2, 2, 128, 64},  // K > T: most slots −1
      {2, 70, 4, 4, 64, 40},   // several key tiles per row
      {1, 90, 6, 3, 128, 50},  // GQA at D 128, several tiles
  };
  return s;
}

#define REQUIRE_CUDA() \
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device"

TEST(SparseTokenCuda, SmallFp32MatchesTheReference) {
  REQUIRE_CUDA();
  uint64_t seed = 11;
  for (const Shape& s : small_shapes()) check_against_reference(s, at::kFloat, 1e-5, 5e-5, seed++);
}

TEST(SparseTokenCuda, SmallHalfPrecisionMatchesTheReference) {
  REQUIRE_CUDA();
  uint64_t seed = 21;
  for (const Shape& s : small_shapes()) check_against_reference(s, at::kBFloat16, 1e-2, 2e-2, seed++);
  check_against_reference({2, 37, 4, 2, 64, 8}, at::kHalf, 2e-3, 5e-3, 31);
  check_against_reference({1, 45, 6, 6, 128, 16}, at::kHalf, 2e-3, 5e-3, 32);
}

// Rows whose slots are all −1 (every query of one batch, and scattered queries of the other,
// including t = 0): o = 0 there, finite gradients, the other rows as the reference.
TEST(SparseTokenCuda, SmallEmptyRows) {
  REQUIRE_CUDA();
  for (const Shape& s : {Shape{2, 40, 4, 2, 64, 12}, Shape{2, 40, 6, 6, 128, 12}}) {
    at::Tensor idx = inputs_of(s, 41).at("indices").clone();
    idx.select(0, 0).fill_(-1);
    for (int64_t t : {0, 3, 17, 39}) idx.select(0, 1).select(0, t).fill_(-1);
    check_against_reference(s, at::kFloat, 1e-5, 5e-5, 41, idx);
    check_against_reference(s, at::kBFloat16, 1e-2, 2e-2, 41, idx);
  }
}

// Every causal key selected, in a scrambled slot order with −1 between: dense causal attention.
TEST(SparseTokenCuda, SmallFullSelectionIsDenseAttention) {
  REQUIRE_CUDA();
  const Shape s{1, 48, 4, 2, 64, 60};
  at::Tensor full = causal_full_indices(1, 48, at::zeros({1}));                       // [1,48,48]
  full = at::cat({full, at::full({1, 48, 12}, -1, full.options())}, 2);               // K = 60
  const at::Tensor perm = at::randperm(60, at::TensorOptions().dtype(at::kLong));
  check_against_reference(s, at::kFloat, 1e-5, 5e-5, 51, full.index_select(2, perm).contiguous());
}

// The op's CUDA path (what conformance --device cuda runs) goes through the kernels: the same
// output, bit for bit, as sparse_attention_kernel; shapes the kernels are not built for fall back.
TEST(SparseTokenCuda, SmallOpRoutesToTheKernels) {
  REQUIRE_CUDA();
  c10::NoGradGuard ng;
  const Shape s{2, 37, 4, 2, 64, 8};
  TensorMap in = inputs_of(s, 61);
  TensorMap cu;
  for (const auto& [n, t] : in) cu.set(n, at::isFloatingType(t.scalar_type()) ? t.to(at::kCUDA, at::kFloat) : t.to(at::kCUDA));
  const Config p = Registry::get().op("sparse_attention").params.parse("H=4,Hkv=2,D=64,topk=8");
  const at::Tensor via_op = call_op("sparse_attention", Backend::CUDA, cu, p).at("o");
  const at::Tensor direct = sparse_attention_kernel(cu.at("q"), cu.at("k"), cu.at("v"), cu.at("indices"), 1.0 / 8.0);
  EXPECT_TRUE(at::equal(via_op, direct));

  auto opt = at::TensorOptions().device(at::kCUDA);
  const at::Tensor i3 = at::zeros({1, 4, 2}, opt.dtype(at::kLong));
  EXPECT_FALSE(sparse_attention_kernel_applies(at::zeros({1, 4, 2, 32}, opt), at::zeros({1, 4, 2, 32}, opt),
                                               at::zeros({1, 4, 2, 32}, opt), i3));  // D 32
  EXPECT_FALSE(sparse_attention_kernel_applies(at::zeros({1, 4, 2, 64}, opt), at::zeros({1, 4, 2, 64}, opt),
                                               at::zeros({1, 4, 2, 32}, opt), i3));  // Dv ≠ D
  EXPECT_FALSE(sparse_attention_kernel_applies(at::zeros({1, 4, 2, 64}, opt.dtype(at::kDouble)),
                                               at::zeros({1, 4, 2, 64}, opt.dtype(at::kDouble)),
                                               at::zeros({1, 4, 2, 64}, opt.dtype(at::kDouble)), i3));  // fp64
  EXPECT_FALSE(sparse_attention_kernel_applies(at::zeros({1, 4, 3, 64}, opt), at::zeros({1, 4, 2, 64}, opt),
                                               at::zeros({1, 4, 2, 64}, opt), i3));  // H % Hkv ≠ 0
  // the fallback for D 32 still gives the reference
  const Shape s32{1, 20, 2, 2, 32, 6};
  TensorMap in32 = inputs_of(s32, 62);
  const at::Tensor o32 = sparse_attention_fast(in32.at("q").to(opt.dtype(at::kFloat)), in32.at("k").to(opt.dtype(at::kFloat)),
                                               in32.at("v").to(opt.dtype(at::kFloat)), in32.at("indices").to(at::kCUDA), 0.2);
  EXPECT_LE(rel_rms(reference::sparse_attention(in32.at("q"), in32.at("k"), in32.at("v"), in32.at("indices"), 0.2), o32),
            1e-5);
}

// Non-contiguous inputs (views of a packed qkv projection) give the contiguous inputs' results.
TEST(SparseTokenCuda, SmallStridedInputs) {
  REQUIRE_CUDA();
  c10::NoGradGuard ng;
  const Shape s{2, 30, 4, 4, 64, 10};
  TensorMap in = inputs_of(s, 71);
  auto cu = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  const at::Tensor packed = at::cat({in.at("q"), in.at("k"), in.at("v")}, 2).to(cu);  // [B,T,3H,D]
  const at::Tensor q = packed.slice(2, 0, 4), k = packed.slice(2, 4, 8), v = packed.slice(2, 8, 12);
  const at::Tensor idx = in.at("indices").to(at::kCUDA);
  EXPECT_TRUE(at::equal(sparse_attention_fast(q, k, v, idx, 0.125),
                        sparse_attention_fast(q.contiguous(), k.contiguous(), v.contiguous(), idx, 0.125)));
}

#if defined(MIXBENCH_WITH_CUDA)
// Forward + backward captured in a CUDA graph and replayed on new values (copied into the captured
// inputs) against eager runs on those values. dk / dv sum with atomics, so up to their rounding.
TEST(SparseTokenCuda, SmallGraphCaptureReplaysEager) {
  REQUIRE_CUDA();
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16}) {
    const Shape s{2, 64, 6, 3, 128, 24};
    auto cu = at::TensorOptions().device(at::kCUDA).dtype(dt);
    const double scale = 1.0 / std::sqrt(128.0);
    TensorMap a = inputs_of(s, 81), b = inputs_of(s, 82);
    at::Tensor q = a.at("q").to(cu).requires_grad_(true), k = a.at("k").to(cu).requires_grad_(true),
               v = a.at("v").to(cu).requires_grad_(true);
    at::Tensor idx = a.at("indices").to(at::kCUDA), dout = at::randn({s.B, s.T, s.H, s.D}, cu);
    at::Tensor o_s, dq_s, dk_s, dv_s;
    auto step = [&] {
      at::Tensor o = sparse_attention_fast(q, k, v, idx, scale);
      auto g = torch::autograd::grad({o}, {q, k, v}, {dout});
      o_s = o.detach();
      dq_s = g[0];
      dk_s = g[1];
      dv_s = g[2];
    };
    c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
    {
      c10::cuda::CUDAStreamGuard sg(side);
      step();  // warm-up on the capture stream
    }
    c10::cuda::device_synchronize();
    at::cuda::CUDAGraph graph;
    {
      c10::cuda::CUDAStreamGuard sg(side);
      graph.capture_begin();
      step();
      graph.capture_end();
    }
    c10::cuda::device_synchronize();
    {
      c10::NoGradGuard ng;
      q.copy_(b.at("q").to(cu));
      k.copy_(b.at("k").to(cu));
      v.copy_(b.at("v").to(cu));
      idx.copy_(b.at("indices").to(at::kCUDA));
      dout.copy_(at::randn_like(dout));
    }
    graph.replay();
    c10::cuda::device_synchronize();
    const Result eager = run([&](const at::Tensor& x, const at::Tensor& y, const at::Tensor& z) {
      return sparse_attention_fast(x, y, z, idx, scale);
    }, q, k, v, dout);
    const double tol = dt == at::kFloat ? 1e-6 : 1e-2;
    const std::string where = c10::toString(dt);
    EXPECT_TRUE(at::equal(o_s, eager.o)) << where;  // forward: no atomics, the same kernels
    EXPECT_TRUE(at::equal(dq_s, eager.dq)) << where;
    EXPECT_LE(rel_rms(eager.dk, dk_s), tol) << where;
    EXPECT_LE(rel_rms(eager.dv, dv_s), tol) << where;
    // and the replay is of the new values, not the captured ones
    const Result ref = run([&](const at::Tensor& x, const at::Tensor& y, const at::Tensor& z) {
      return reference::sparse_attention(x, y, z, idx.cpu(), scale);
    }, q.detach().to(at::kCPU, at::kDouble), k.detach().to(at::kCPU, at::kDouble), v.detach().to(at::kCPU, at::kDouble),
                           dout.to(at::kCPU, at::kDouble));
    EXPECT_LE(rel_rms(ref.o, o_s), dt == at::kFloat ? 1e-5 : 1e-2) << where;
    EXPECT_LE(rel_rms(ref.dk, dk_s), dt == at::kFloat ? 5e-5 : 2e-2) << where;
  }
}
#endif

// Longer rows (d12's shape at T 2048, K 256, bf16) against the fp32 LibTorch path on the same
// inputs: many key tiles, keys anywhere in the sequence.
TEST(SparseTokenCuda, LongRowsMatchTheLibTorchPath) {
  REQUIRE_CUDA();
  for (const Shape& s : {Shape{1, 2048, 6, 6, 128, 256}, Shape{2, 1024, 8, 2, 64, 128}}) {
    TensorMap in = inputs_of(s, 91);
    auto cu = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
    const at::Tensor q = in.at("q").to(cu), k = in.at("k").to(cu), v = in.at("v").to(cu);
    const at::Tensor idx = in.at("indices").to(at::kCUDA), dout = at::randn({s.B, s.T, s.H, s.D}, cu);
    const double scale = 1.0 / std::sqrt(double(s.D));
    const Result got = run([&](const at::Tensor& a, const at::Tensor& b, const at::Tensor& c) {
      return sparse_attention_fast(a, b, c, idx, scale);
    }, q, k, v, dout);
    auto f = [](const at::Tensor& x) { return x.to(at::kFloat); };
    const Result ref = run([&](const at::Tensor& a, const at::Tensor& b, const at::Tensor& c) {
      return sparse_attention_cpu(a, b, c, idx, scale);
    }, f(q), f(k), f(v), f(dout));
    EXPECT_LE(rel_rms(ref.o, got.o), 1e-2) << s.str();
    EXPECT_LE(rel_rms(ref.dq, got.dq), 2e-2) << s.str();
    EXPECT_LE(rel_rms(ref.dk, got.dk), 2e-2) << s.str();
    EXPECT_LE(rel_rms(ref.dv, got.dv), 2e-2) << s.str();
  }
}

// ---------------------------------------------------------------- selections

// Indexer inputs; ties: integers from {−2,−1,1,2} (the op's tie cases), exact in every dtype.
TensorMap indexer_inputs(int64_t B, int64_t T, int64_t HI, int64_t DI, bool ties, uint64_t seed) {
  const OpSpec& op = Registry::get().op("dsa_indexer");
  const Config c = op.params.parse(fmt::format("HI={},DI={},ties={}", HI, DI, ties ? "true" : "false"));
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return op.make_inputs(c, B, T, gen);
}

// Integer inputs and a power-of-two scale: every score is exact in fp32, so the CUDA selection must
// equal the reference's slot by slot (the same keys among the many ties — the lowest — in the same
// order), whatever the block size.
TEST(SparseTokenCuda, SmallIndexerTiesExact) {
  REQUIRE_CUDA();
  for (int64_t budget : {int64_t(256) << 20, int64_t(1) << 12})
    for (bool relu : {true, false})
      for (auto [B, T, HI, DI, topk] : std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>>{
               {2, 70, 2, 4, 6}, {1, 150, 3, 5, 40}, {1, 33, 4, 8, 64}}) {
        TensorMap in = indexer_inputs(B, T, HI, DI, true, 101 + T);
        const at::Tensor ref = reference::dsa_indexer(in.at("q_idx"), in.at("k_idx"), in.at("w_idx"), topk, 0.5, relu);
        for (at::ScalarType dt : {at::kFloat, at::kBFloat16}) {
          auto cu = at::TensorOptions().device(at::kCUDA).dtype(dt);
          const at::Tensor got = dsa_indexer_topk(in.at("q_idx").to(cu).to(at::kFloat), in.at("k_idx").to(cu).to(at::kFloat),
                                                  in.at("w_idx").to(cu).to(at::kFloat), topk, 0.5, relu, budget);
          EXPECT_TRUE(at::equal(ref, got.cpu())) << fmt::format("T{} topk{} relu{} budget{}", T, topk, relu, budget);
          const at::Tensor fast =
              dsa_indexer_fast(in.at("q_idx").to(cu), in.at("k_idx").to(cu), in.at("w_idx").to(cu), topk, 0.5, relu);
          EXPECT_TRUE(at::equal(ref, fast.cpu())) << fmt::format("fast {} T{} topk{}", c10::toString(dt), T, topk);
        }
      }
}

// Gaussian inputs: as sets per row, keys tied (within fp32 rounding) with the k-th score exchangeable,
// and the slots in descending reference score.
TEST(SparseTokenCuda, IndexerMatchesTheReference) {
  REQUIRE_CUDA();
  using conformance_detail::compare_selection_ties;
  const OpSpec& op = Registry::get().op("dsa_indexer");
  for (auto [B, T, HI, DI, topk] : std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>>{
           {2, 300, 4, 32, 32}, {1, 1100, 8, 64, 256}, {1, 700, 3, 128, 700}}) {
    TensorMap in = indexer_inputs(B, T, HI, DI, false, 111 + T);
    const Config p = op.params.parse(fmt::format("topk={},HI={},DI={}", topk, HI, DI));
    const double scale = 1.0 / std::sqrt(double(DI));
    const at::Tensor ref = reference::dsa_indexer(in.at("q_idx"), in.at("k_idx"), in.at("w_idx"), topk, scale, true);
    const at::Tensor scores = op.selection_scores(in, p).at("indices");  // [B,T,T] FP64, −inf = future
    auto cu = at::TensorOptions().device(at::kCUDA).dtype(at::kFloat);
    for (int64_t budget : {int64_t(256) << 20, int64_t(1) << 16}) {
      const at::Tensor got = dsa_indexer_topk(in.at("q_idx").to(cu), in.at("k_idx").to(cu), in.at("w_idx").to(cu), topk,
                                              scale, true, budget).cpu();
      const std::string where = fmt::format("T{} topk{} budget{}", T, topk, budget);
      EXPECT_EQ(compare_selection_ties(ref, got, scores, conformance_detail::tie_tolerance("fp32")).cmp.rel_rms, 0.0) << where;
      // −1 exactly where the reference pads, and valid slots in descending score
      EXPECT_TRUE(at::equal(ref < 0, got < 0)) << where;
      const at::Tensor sc = at::gather(scores, 2, got.clamp_min(0)).masked_fill(got < 0, -1e300);
      const at::Tensor drop = sc.slice(2, 1) - sc.slice(2, 0, -1);  // ≤ 0 up to rounding
      EXPECT_LE(drop.masked_select(got.slice(2, 1) >= 0).max().item<double>(), 1e-4) << where;
    }
    // through the op's CUDA path (the conformance check's selection rule)
    TensorMap cin;
    for (const auto& [n, t] : in) cin.set(n, t.to(cu));
    const at::Tensor via_op = call_op("dsa_indexer", Backend::CUDA, cin, p).at("indices").cpu();
    EXPECT_EQ(compare_selection_ties(ref, via_op, scores, conformance_detail::tie_tolerance("fp32")).cmp.rel_rms, 0.0);
  }
}

// block_topk on CUDA (fp32 scores: no arithmetic, so the selection is block_topk_cpu's exactly, ties
// and order included), Gaussian and heavily tied scores, both own-block rules.
TEST(SparseTokenCuda, SmallBlockTopkEqualsTheCpuPath) {
  REQUIRE_CUDA();
  const OpSpec& op = Registry::get().op("block_topk");
  for (const std::string& kv : {"block_size=4,topk=3", "block_size=2,topk=4,S=3,ties=true", "block_size=5,topk=16,S=1",
                                "block_size=4,topk=3,own=counted", "block_size=2,topk=4,S=3,own=counted,ties=true",
                                "block_size=1,topk=64,S=2,ties=true", "block_size=5,topk=16,own=counted"}) {
    const Config p = op.params.parse(kv);
    for (int64_t T : {1, 37, 301}) {
      at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(uint64_t(T));
      const at::Tensor sc = op.make_inputs(p, 2, T, gen).at("scores").to(at::kFloat);
      const bool counted = p.s("own") == "counted";
      const at::Tensor want = block_topk_cpu(sc, p.i("block_size"), p.i("topk"), counted);
      const at::Tensor got = block_topk_fast(sc.to(at::kCUDA), p.i("block_size"), p.i("topk"), counted);
      EXPECT_TRUE(at::equal(want, got.cpu())) << kv << " T" << T;
      const at::Tensor got16 =
          block_topk_fast(sc.to(at::kCUDA, at::kBFloat16), p.i("block_size"), p.i("topk"), counted).cpu();
      const at::Tensor want16 = block_topk_cpu(sc.to(at::kBFloat16).to(at::kFloat), p.i("block_size"), p.i("topk"), counted);
      EXPECT_TRUE(at::equal(want16, got16)) << kv << " T" << T << " bf16";
    }
  }
}

}  // namespace
}  // namespace mixbench
