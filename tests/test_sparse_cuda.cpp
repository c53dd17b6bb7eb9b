// On a machine with a GPU: the block-sparse attention kernels (block_sparse_attention_fast on CUDA)
// against the FP64 reference (reference::block_sparse_attention, per-token loops) — output and the
// gradients of Σ o·w in q, k, v — in fp32 (tight) and bf16 / fp16 (half-precision tolerance): GQA
// groups 1, 2, 4, 8, per-token rows (q_block 1), q_block = block_size and others, block sizes 4 …
// 128, −1 slots anywhere in a row, a partial last block, rows and queries without a visible key,
// head dims 64 and 128. Longer sequences (T ≈ 1–2K) against dense FP64 attention under the
// selection's mask (on the GPU; itself checked against the reference). The forward + backward
// captured in a CUDA graph replays what the eager calls compute, on new input values too. The op's
// CUDA path (conformance) runs the kernels. The tensor-core kernels (bf16 / fp16, q_block 1, blocks of
// ≥ 16 keys) on their own: block sizes 16 … 128 (key chunks of 16, 32, 64, partial chunks and
// blocks), GQA groups 1 … 8 (3: tiles splitting a query's heads), odd T, −1 slots, empty rows, topk
// beyond the causal blocks, T = 1, many work items per block; against the reference, against the
// CUDA-core kernels, inside a CUDA graph, without host synchronisation and at T = 32K (d12: moba's
// and nsa's block size and topk).
//   Under compute-sanitizer: --gtest_filter='SparseCuda.BlockSparseSmall*' (a few small cases of
//   both kernel sets).
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <random>
#include <set>
#include <string>
#include <vector>

#if defined(MIXBENCH_WITH_CUDA)
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "harness/errors.h"
#include "harness/registry.h"
#include "mixers/sparse/sparse.h"
#include "reference/sparse.h"
#include "tests/test_util.h"

namespace mixbench {
namespace {

struct Case {
  int64_t B, T, H, Hkv, D, bs, qb, topk;
  double empty = 0.0;       // chance that a slot the row could fill stays −1
  double empty_row = 0.0;   // chance that a whole row is −1
  std::string where() const {
    return fmt::format("B{} T{} H{} Hkv{} D{} bs{} qb{} topk{} empty{} empty_row{}", B, T, H, Hkv, D, bs, qb, topk, empty,
                       empty_row);
  }
};

// Random causal selections [B,Hkv,NQ,topk] int64: each row lists distinct blocks that start at or
// before its last query — the row's own last block most of the time (as the layers force it), the
// others at random — with −1 slots shuffled among them; a row may be all −1.
at::Tensor random_selection(const Case& c, std::mt19937& rng) {
  const int64_t NQ = (c.T + c.qb - 1) / c.qb;
  at::Tensor idx = at::full({c.B, c.Hkv, NQ, c.topk}, -1, at::TensorOptions().dtype(at::kLong));
  auto a = idx.accessor<int64_t, 4>();
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.Hkv; ++h)
      for (int64_t r = 0; r < NQ; ++r) {
        if (u(rng) < c.empty_row) continue;
        const int64_t last = std::min(c.T - 1, r * c.qb + c.qb - 1), avail = last / c.bs + 1;
        std::vector<int64_t> blocks;  // distinct, in random order
        if (avail <= 4 * c.topk) {
          for (int64_t i = 0; i < avail; ++i) blocks.push_back(i);
          std::shuffle(blocks.begin(), blocks.end(), rng);
        } else {
          std::uniform_int_distribution<int64_t> pick(0, avail - 1);
          while (int64_t(blocks.size()) < c.topk) {
            const int64_t i = pick(rng);
            if (std::find(blocks.begin(), blocks.end(), i) == blocks.end()) blocks.push_back(i);
          }
        }
        if (u(rng) < 0.8) {  // the own block first
          auto own = std::find(blocks.begin(), blocks.end(), avail - 1);
          if (own == blocks.end()) blocks.front() = avail - 1;
          else std::iter_swap(blocks.begin(), own);
        }
        std::vector<int64_t> slots(c.topk, -1);
        for (int64_t j = 0; j < std::min<int64_t>(c.topk, blocks.size()); ++j)
          if (u(rng) >= c.empty) slots[j] = blocks[j];
        std::shuffle(slots.begin(), slots.end(), rng);
        for (int64_t j = 0; j < c.topk; ++j) a[b][h][r][j] = slots[j];
      }
  return idx;
}

struct Grads {
  at::Tensor o, dq, dk, dv;
};

// o and the gradients of Σ o·w in q, k, v (w the cotangent), from fn(q, k, v).
template <class Fn>
Grads with_grads(const at::Tensor& q0, const at::Tensor& k0, const at::Tensor& v0, const at::Tensor& w, Fn&& fn) {
  at::Tensor q = q0.detach().clone().requires_grad_(true), k = k0.detach().clone().requires_grad_(true),
             v = v0.detach().clone().requires_grad_(true);
  at::Tensor o = fn(q, k, v);
  auto g = torch::autograd::grad({(o * w.to(o.scalar_type())).sum()}, {q, k, v});
  return {o.detach(), g[0], g[1], g[2]};
}

// Dense FP64 attention under the selection's mask ([B,H,S,T] on the inputs' device) for the
// queries ts (all when undefined): the check for sequences whose per-token reference would take
// minutes. Returns o [B,S,H,D].
at::Tensor dense_masked(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& idx, int64_t bs,
                        int64_t qb, double scale, at::Tensor ts = {}) {
  const int64_t B = q.size(0), T = q.size(1), Hkv = k.size(2), G = q.size(2) / Hkv;
  const int64_t NB = (T + bs - 1) / bs;
  auto lo = at::TensorOptions().dtype(at::kLong).device(q.device());
  at::Tensor ix = idx.to(q.device());
  if (!ts.defined()) ts = at::arange(T, lo);
  ts = ts.to(q.device());
  const int64_t S = ts.size(0);
  // rows[b,h,j,i]: query ts[j]'s row lists block i (the −1 slots go to a spare column NB)
  at::Tensor rix = ix.index_select(2, at::div(ts, qb, "floor"));                // [B,Hkv,S,topk]
  at::Tensor rows = at::zeros({B, Hkv, S, NB + 1}, lo.dtype(at::kBool));
  rows.scatter_(3, rix.masked_fill(rix < 0, NB), true);
  rows = rows.narrow(3, 0, NB);                                                 // [B,Hkv,S,NB]
  at::Tensor s = at::arange(T, lo);
  at::Tensor keys = rows.index_select(3, at::div(s, bs, "floor"));              // [B,Hkv,S,T]
  at::Tensor mask = keys.logical_and(s.view({1, T}) <= ts.view({S, 1}));        // [B,Hkv,S,T]
  mask = mask.repeat_interleave(G, 1);                                          // [B,H,S,T]
  at::Tensor qs = q.index_select(1, ts).transpose(1, 2);                        // [B,H,S,D]
  at::Tensor logits = at::matmul(qs, k.repeat_interleave(G, 2).permute({0, 2, 3, 1})) * scale;
  at::Tensor any = mask.any(-1, true);
  logits = logits.masked_fill(mask.logical_not().logical_and(any), -INFINITY);
  at::Tensor p = at::softmax(logits, -1).masked_fill(mask.logical_not(), 0.0);
  return at::matmul(p, v.repeat_interleave(G, 2).transpose(1, 2)).transpose(1, 2);  // [B,S,H,D]
}

using mixbench_test::rel_rms;

// Inputs representable in bf16 (drawn, rounded), so that one FP64 reference serves every dtype.
struct Inputs {
  at::Tensor q, k, v, w, idx;  // fp64 on the CPU, idx int64 on the CPU
};
Inputs make_inputs(const Case& c, uint64_t seed) {
  at::manual_seed(seed);
  std::mt19937 rng{uint32_t(seed)};
  auto r = [](std::vector<int64_t> sz) { return at::randn(sz).to(at::kBFloat16).to(at::kDouble); };
  return {r({c.B, c.T, c.H, c.D}), r({c.B, c.T, c.Hkv, c.D}), r({c.B, c.T, c.Hkv, c.D}), r({c.B, c.T, c.H, c.D}),
          random_selection(c, rng)};
}

Grads reference_grads(const Case& c, const Inputs& x, double scale) {
  return with_grads(x.q, x.k, x.v, x.w, [&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    return reference::block_sparse_attention(q, k, v, x.idx, c.bs, c.qb, scale);
  });
}

Grads fast_grads(const Case& c, const Inputs& x, double scale, at::ScalarType dt) {
  auto o = at::TensorOptions().device(at::kCUDA).dtype(dt);
  const at::Tensor idx = x.idx.to(at::kCUDA);
  return with_grads(x.q.to(o), x.k.to(o), x.v.to(o), x.w.to(o), [&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    return block_sparse_attention_fast(q, k, v, idx, c.bs, c.qb, scale);
  });
}

// The same through block_sparse_attention_cuda with the kernels `which`; `ran` gets the kernel notes.
Grads kernel_grads(const Case& c, const Inputs& x, double scale, at::ScalarType dt, BlockSparseKernels which,
                   std::string* ran = nullptr) {
  auto o = at::TensorOptions().device(at::kCUDA).dtype(dt);
  const at::Tensor idx = x.idx.to(at::kCUDA);
  take_kernel_notes();
  Grads g = with_grads(x.q.to(o), x.k.to(o), x.v.to(o), x.w.to(o), [&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    return block_sparse_attention_cuda(q, k, v, idx, c.bs, c.qb, scale, which);
  });
  const std::string notes = take_kernel_notes();
  if (ran) *ran = notes;
  return g;
}

// The kernel notes of one forward of block_sparse_attention_fast in dt.
std::string fast_kernel_of(const Case& c, const Inputs& x, double scale, at::ScalarType dt) {
  c10::NoGradGuard ng;
  auto o = at::TensorOptions().device(at::kCUDA).dtype(dt);
  take_kernel_notes();
  block_sparse_attention_fast(x.q.to(o), x.k.to(o), x.v.to(o), x.idx.to(at::kCUDA), c.bs, c.qb, scale);
  return take_kernel_notes();
}

// The output comes from the kernels' autograd function (not the LibTorch path).
bool ran_kernel(const Case& c, const Inputs& x, double scale, at::ScalarType dt) {
  auto o = at::TensorOptions().device(at::kCUDA).dtype(dt);
  at::Tensor q = x.q.to(o).requires_grad_(true);
  at::Tensor out = block_sparse_attention_fast(q, x.k.to(o), x.v.to(o), x.idx.to(at::kCUDA), c.bs, c.qb, scale);
  return out.grad_fn() && out.grad_fn()->name().find("BlockSparseCudaFn") != std::string::npos;
}

void expect_close(const Grads& ref, const Grads& got, double tol_o, double tol_g, const std::string& where) {
  EXPECT_LE(rel_rms(ref.o, got.o), tol_o) << where << ": o";
  EXPECT_LE(rel_rms(ref.dq, got.dq), tol_g) << where << ": dq";
  EXPECT_LE(rel_rms(ref.dk, got.dk), tol_g) << where << ": dk";
  EXPECT_LE(rel_rms(ref.dv, got.dv), tol_g) << where << ": dv";
  for (const at::Tensor* t : {&got.o, &got.dq, &got.dk, &got.dv}) EXPECT_TRUE(t->isfinite().all().item<bool>()) << where;
}

// fp32: the kernels compute in fp32 on fp32 inputs (exact here); the rounding of a few hundred
// products and exponentials, and dp − Δ cancelling in the score gradients.
constexpr double kTolF32 = 1e-5, kTolF32Grad = 5e-5;
// bf16 / fp16: inputs exact, fp32 inside, one rounding of o and of every gradient (bf16: 2^-9
// relative) plus the backward's use of the rounded o and cotangent.
constexpr double kTolHalf = 1e-2;

void check_against_reference(const std::vector<Case>& cases, const std::vector<at::ScalarType>& dtypes, uint64_t seed) {
  for (const Case& c : cases) {
    const Inputs x = make_inputs(c, seed++);
    const double scale = 1.0 / std::sqrt(double(c.D));
    const Grads ref = reference_grads(c, x, scale);
    for (at::ScalarType dt : dtypes) {
      const std::string where = fmt::format("{} {}", c10::toString(dt), c.where());
      ASSERT_TRUE(ran_kernel(c, x, scale, dt)) << where << ": the LibTorch path ran, not the kernels";
      const Grads got = fast_grads(c, x, scale, dt);
      ASSERT_EQ(got.o.scalar_type(), dt) << where;
      ASSERT_EQ(got.dk.scalar_type(), dt) << where;
      if (dt == at::kFloat) expect_close(ref, got, kTolF32, kTolF32Grad, where);
      else expect_close(ref, got, kTolHalf, kTolHalf, where);
    }
  }
}

// A few small cases of every kernel variant (G 1 and 4, q_block 1 / block / other, small and
// large blocks, D 64 and 128), quick enough for compute-sanitizer.
TEST(SparseCuda, BlockSparseSmallCases) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  check_against_reference({{1, 37, 2, 2, 64, 4, 1, 3, 0.2},
                           {1, 45, 4, 1, 128, 16, 16, 2},
                           {2, 29, 2, 1, 64, 8, 3, 3, 0.3, 0.1},
                           {1, 70, 1, 1, 128, 64, 1, 2}},
                          {at::kFloat, at::kBFloat16}, 11);
}

// A few small cases of the tensor-core kernels (key chunks of 16, 32 + partial, 64 × 2 over a
// partial block; GQA 2 and 1), quick enough for compute-sanitizer.
TEST(SparseCuda, BlockSparseSmallTensorCores) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const std::vector<Case> cases = {{1, 37, 4, 2, 64, 16, 1, 3, 0.2}, {1, 90, 2, 1, 128, 48, 1, 2, 0.1}, {1, 40, 2, 2, 64, 128, 1, 1}};
  uint64_t seed = 61;
  for (const Case& c : cases) {
    const Inputs x = make_inputs(c, seed++);
    const double scale = 1.0 / std::sqrt(double(c.D));
    const Grads ref = reference_grads(c, x, scale);
    for (at::ScalarType dt : {at::kBFloat16, at::kHalf}) {
      const std::string where = fmt::format("{} {}", c10::toString(dt), c.where());
      std::string ran;
      const Grads got = kernel_grads(c, x, scale, dt, BlockSparseKernels::TensorCores, &ran);
      EXPECT_EQ(ran, "block_sparse_mma") << where;
      expect_close(ref, got, kTolHalf, kTolHalf, where);
    }
  }
}

// fp32 and bf16 against the reference: GQA 1 / 2 / 4 / 8, q_block 1 / = block / other, block
// sizes 4, 16, 64, 128 (partial last blocks), −1 slots, D 64 and 128.
TEST(SparseCuda, BlockSparseMatchesReference) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  check_against_reference(
      {
          // per-token rows (qsa: many blocks of 4; nsa/seer/moba: blocks of 64 / 128)
          {1, 203, 2, 2, 128, 4, 1, 17, 0.1},
          {2, 150, 2, 2, 64, 16, 1, 5, 0.2},
          {1, 300, 2, 2, 128, 64, 1, 3},
          {1, 260, 2, 1, 128, 128, 1, 2, 0.3},
          // q_block = block_size and others, GQA groups
          {2, 131, 4, 2, 64, 16, 16, 4, 0.2},
          {1, 190, 8, 2, 128, 64, 64, 3},
          {1, 77, 4, 1, 64, 4, 8, 6, 0.3, 0.1},
          {1, 100, 8, 1, 64, 8, 5, 4, 0.2},
          {2, 90, 4, 4, 128, 16, 7, 3, 0.0, 0.15},
          {1, 150, 16, 2, 64, 16, 1, 4},  // G = 8
          {1, 64, 2, 1, 64, 16, 20, 1},   // a row listing only a later block: its first queries see nothing
      },
      {at::kFloat, at::kBFloat16}, 101);
}

// fp16 on two shapes (the third element type of the kernels).
TEST(SparseCuda, BlockSparseHalf) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  check_against_reference({{1, 120, 4, 2, 128, 16, 1, 4, 0.2}, {1, 99, 2, 2, 64, 4, 4, 9, 0.1}}, {at::kHalf}, 303);
}

// Rows that list nothing and queries before all of their row's blocks: o = 0 there, no gradient
// from them, and the other rows as the reference.
TEST(SparseCuda, BlockSparseEmptyRows) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const Case c{1, 96, 2, 2, 64, 16, 8, 2, 0.0, 0.0};
  Inputs x = make_inputs(c, 7);
  x.idx.narrow(2, 0, 3).fill_(-1);                    // rows 0–2 (queries 0–23): nothing
  x.idx.narrow(2, 5, 1).fill_(-1);                    // row 5 (queries 40–47) …
  x.idx.select(2, 5).select(2, 0).fill_(2);           // … lists only block 2 (keys 32–47)
  x.idx.narrow(2, 7, 1).fill_(-1);                    // row 7 (queries 56–63) lists nothing either
  const double scale = 0.125;
  const Grads ref = reference_grads(c, x, scale);
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16}) {
    const Grads got = fast_grads(c, x, scale, dt);
    const std::string where = fmt::format("{} empty rows", c10::toString(dt));
    EXPECT_EQ(got.o.narrow(1, 0, 24).abs().max().item<double>(), 0.0) << where;
    EXPECT_EQ(got.o.narrow(1, 56, 8).abs().max().item<double>(), 0.0) << where;
    EXPECT_EQ(got.dq.narrow(1, 0, 24).abs().max().item<double>(), 0.0) << where;
    EXPECT_EQ(got.dq.narrow(1, 56, 8).abs().max().item<double>(), 0.0) << where;
    // queries 40–47 see keys 32..t of block 2: each at least one
    EXPECT_GT(got.o.narrow(1, 40, 8).abs().amax({2, 3}).min().item<double>(), 0.0) << where;
    if (dt == at::kFloat) expect_close(ref, got, kTolF32, kTolF32Grad, where);
    else expect_close(ref, got, kTolHalf, kTolHalf, where);
  }
}

// Longer sequences against dense FP64 attention under the mask (itself matching the reference
// on the first, shorter case), per-token rows as the layers use them.
TEST(SparseCuda, BlockSparseLongSequences) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const std::vector<Case> cases = {
      {1, 160, 2, 1, 64, 16, 1, 4, 0.1},    // dense check against the reference
      {1, 2048, 6, 6, 128, 64, 1, 9},       // nsa-like, d12 heads
      {1, 1500, 4, 1, 128, 4, 1, 65, 0.05},  // qsa-like: 64 blocks of 4 + own, MQA, partial block
      {2, 1111, 8, 2, 64, 128, 1, 4},       // moba / seer-like, G = 4, partial block
      {1, 1024, 4, 2, 128, 64, 64, 6, 0.2},  // q_block = block_size
  };
  uint64_t seed = 500;
  for (const Case& c : cases) {
    const Inputs x = make_inputs(c, seed++);
    const double scale = 1.0 / std::sqrt(double(c.D));
    auto d64 = at::TensorOptions().device(at::kCUDA).dtype(at::kDouble);
    const Grads dense = with_grads(x.q.to(d64), x.k.to(d64), x.v.to(d64), x.w.to(d64),
                                   [&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
                                     return dense_masked(q, k, v, x.idx, c.bs, c.qb, scale);
                                   });
    if (&c == &cases.front()) expect_close(reference_grads(c, x, scale), dense, 1e-12, 1e-12, "dense vs reference");
    for (at::ScalarType dt : {at::kFloat, at::kBFloat16}) {
      const Grads got = fast_grads(c, x, scale, dt);
      const std::string where = fmt::format("{} {}", c10::toString(dt), c.where());
      if (dt == at::kFloat) expect_close(dense, got, kTolF32, kTolF32Grad, where);
      else expect_close(dense, got, kTolHalf, kTolHalf, where);
    }
  }
}

#if defined(MIXBENCH_WITH_CUDA)
// d12 shapes at T = 32K (per-token rows; nsa-like blocks of 64 and nsa's own 32 with top-8 + own,
// moba's 128 with top-2, qsa-like blocks of 4): the outputs of sampled queries and all of q, k, v's
// gradients through them (the cotangent is zero elsewhere) against dense FP64 attention of those
// queries — positions past int16 and every kernel's indexing at length; fp32 on the CUDA cores,
// bf16 on the tensor cores where they apply and on the CUDA cores — then the kernels' time
// (forward; forward + backward) in bf16, printed.
TEST(SparseCuda, BlockSparseLongRange) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const std::vector<std::pair<std::string, Case>> cases = {{"nsa-like", {1, 32768, 6, 6, 128, 64, 1, 17, 0.02}},
                                                           {"nsa", {1, 32768, 6, 6, 128, 32, 1, 9}},
                                                           {"moba", {1, 32768, 6, 6, 128, 128, 1, 2}},
                                                           {"qsa-like", {1, 32768, 6, 6, 128, 4, 1, 65, 0.02}}};
  uint64_t seed = 900;
  for (const auto& nc : cases) {
    const std::string& name = nc.first;
    const Case& c = nc.second;
    const Inputs x = make_inputs(c, seed++);
    const double scale = 1.0 / std::sqrt(double(c.D));
    std::set<int64_t> picked{0, 1, 63, 64, 65, 4095, c.T - 2, c.T - 1};
    std::mt19937 rng{uint32_t(seed)};
    while (picked.size() < 48) picked.insert(std::uniform_int_distribution<int64_t>(0, c.T - 1)(rng));
    const at::Tensor ts = at::tensor(std::vector<int64_t>(picked.begin(), picked.end()), at::TensorOptions().dtype(at::kLong));
    at::Tensor w = at::zeros_like(x.w);
    w.index_copy_(1, ts, x.w.index_select(1, ts));
    auto d64 = at::TensorOptions().device(at::kCUDA).dtype(at::kDouble);
    const Grads dense = with_grads(x.q.to(d64), x.k.to(d64), x.v.to(d64), x.w.index_select(1, ts).to(d64),
                                   [&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
                                     return dense_masked(q, k, v, x.idx, c.bs, c.qb, scale, ts);
                                   });
    struct Run {
      at::ScalarType dt;
      BlockSparseKernels which;
    };
    for (const Run& run : {Run{at::kFloat, BlockSparseKernels::CudaCores}, Run{at::kBFloat16, BlockSparseKernels::CudaCores},
                           Run{at::kBFloat16, BlockSparseKernels::TensorCores}}) {
      const at::ScalarType dt = run.dt;
      const bool mma = run.which == BlockSparseKernels::TensorCores;
      if (mma && c.bs < 16) continue;  // blocks of 4: the CUDA cores only
      auto o = at::TensorOptions().device(at::kCUDA).dtype(dt);
      const at::Tensor idx = x.idx.to(at::kCUDA);
      Grads got = with_grads(x.q.to(o), x.k.to(o), x.v.to(o), w.to(o), [&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
        return block_sparse_attention_cuda(q, k, v, idx, c.bs, c.qb, scale, run.which);
      });
      got.o = got.o.index_select(1, ts.to(at::kCUDA));
      const std::string where = fmt::format("{} {} {} {}", name, c10::toString(dt), mma ? "tensor cores" : "CUDA cores", c.where());
      if (dt == at::kFloat) expect_close(dense, got, kTolF32, kTolF32Grad, where);
      else expect_close(dense, got, kTolHalf, kTolHalf, where);
    }
    // time in bf16 (after a warm-up; CUDA events on the current stream)
    auto o = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
    at::Tensor q = x.q.to(o).requires_grad_(true), k = x.k.to(o).requires_grad_(true), v = x.v.to(o).requires_grad_(true);
    const at::Tensor idx = x.idx.to(at::kCUDA), wb = x.w.to(o);
    auto ms = [&](auto&& f) {
      f();
      at::cuda::CUDAEvent a(cudaEventDefault), b(cudaEventDefault);
      const int reps = 3;
      a.record();
      for (int i = 0; i < reps; ++i) f();
      b.record();
      b.synchronize();
      return a.elapsed_time(b) / reps;
    };
    for (BlockSparseKernels which : {BlockSparseKernels::CudaCores, BlockSparseKernels::TensorCores}) {
      if (which == BlockSparseKernels::TensorCores && c.bs < 16) continue;
      auto fwd = [&] { return block_sparse_attention_cuda(q, k, v, idx, c.bs, c.qb, scale, which); };
      auto fwd_bwd = [&] { torch::autograd::grad({(fwd() * wb).sum()}, {q, k, v}); };
      const double t_f = ms([&] { c10::NoGradGuard ng; fwd(); }), t_fb = ms(fwd_bwd);
      const double pairs = double(c.B) * c.T * c.H * (c.topk - 0.5) * c.bs;  // about: (topk − ½) blocks per query
      std::cout << fmt::format("[ timing ] {} T={} bf16 {}: forward {:.2f} ms, forward+backward {:.2f} ms ({:.1f} G query-key pairs/s forward)\n",
                               name, c.T, which == BlockSparseKernels::TensorCores ? "tensor cores" : "CUDA cores", t_f, t_fb,
                               pairs / (t_f * 1e6));
      EXPECT_GT(t_f, 0.0);
    }
  }
}
#endif

// Other head dims, mixed dtypes and CPU tensors take the LibTorch path, with the same results.
TEST(SparseCuda, BlockSparseFallbackShapes) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const Case c{1, 50, 2, 1, 32, 8, 1, 3, 0.2};
  const Inputs x = make_inputs(c, 9);
  const double scale = 0.2;
  EXPECT_FALSE(ran_kernel(c, x, scale, at::kFloat));
  expect_close(reference_grads(c, x, scale), fast_grads(c, x, scale, at::kFloat), kTolF32, kTolF32Grad, "D32 fallback");
}

// The op's CUDA path (what `mixbench conformance --device cuda` runs) goes through the kernels
// after its checks: the same output as the reference on a case with D = 64.
TEST(SparseCuda, BlockSparseOpCudaPath) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  c10::NoGradGuard ng;
  const Case c{2, 77, 4, 2, 64, 8, 1, 4, 0.2};
  const Inputs x = make_inputs(c, 21);
  Config p = Registry::get().op("block_sparse_attention").params.defaults();
  p = p.with("H", c.H).with("Hkv", c.Hkv).with("D", c.D).with("block_size", c.bs).with("q_block", c.qb).with("topk", c.topk);
  auto f = at::TensorOptions().device(at::kCUDA).dtype(at::kFloat);
  TensorMap in{{"q", x.q.to(f)}, {"k", x.k.to(f)}, {"v", x.v.to(f)}, {"block_indices", x.idx.to(at::kCUDA)}};
  const at::Tensor o = call_op("block_sparse_attention", Backend::CUDA, in, p).at("o");
  const at::Tensor ref = reference::block_sparse_attention(x.q, x.k, x.v, x.idx, c.bs, c.qb, 1.0 / std::sqrt(64.0));
  EXPECT_LE(rel_rms(ref, o), kTolF32);
  // and its checks still run: a block starting after its row
  TensorMap bad = in;
  at::Tensor idx = x.idx.clone();
  idx[0][0][3][0] = 1;  // row 3 (query 3) cannot list block 1 (keys 8…15)
  bad.set("block_indices", idx.to(at::kCUDA));
  EXPECT_THROW(call_op("block_sparse_attention", Backend::CUDA, bad, p), InputError);
}

#if defined(MIXBENCH_WITH_CUDA)
// Forward + backward of `which` captured in a CUDA graph on fixed buffers: a replay gives what the
// eager calls give, for the captured values and for new values copied into the same buffers.
void check_graph_capture(const Case& c, BlockSparseKernels which) {
  auto f = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  const double scale = 1.0 / std::sqrt(double(c.D));
  Inputs x = make_inputs(c, 31);
  at::Tensor q = x.q.to(f).requires_grad_(true), k = x.k.to(f).requires_grad_(true), v = x.v.to(f).requires_grad_(true);
  at::Tensor w = x.w.to(f), idx = x.idx.to(at::kCUDA);
  at::Tensor o_out = at::empty_like(w), dq_out = at::empty_like(w), dk_out = at::empty_like(k.detach()), dv_out = at::empty_like(dk_out);
  auto step = [&] {
    at::Tensor o = block_sparse_attention_cuda(q, k, v, idx, c.bs, c.qb, scale, which);
    auto g = torch::autograd::grad({(o * w).sum()}, {q, k, v});
    c10::NoGradGuard ng;
    o_out.copy_(o);
    dq_out.copy_(g[0]);
    dk_out.copy_(g[1]);
    dv_out.copy_(g[2]);
  };
  auto eager = [&] {
    Grads e = with_grads(q, k, v, w, [&](const at::Tensor& a, const at::Tensor& b, const at::Tensor& cc) {
      return block_sparse_attention_cuda(a, b, cc, idx, c.bs, c.qb, scale, which);
    });
    return e;
  };
  const bool mma = which == BlockSparseKernels::TensorCores;
  auto expect_replay = [&](const Grads& e, const std::string& where) {
    // The CUDA cores' o and dq: one thread's sums, bit for bit. Their dk, dv and every output of the
    // tensor cores are fp32 sums whose atomic additions may come in another order, rounded to bf16
    // (a last-bit difference here and there).
    if (!mma) {
      EXPECT_TRUE(at::equal(e.o, o_out)) << where;
      EXPECT_TRUE(at::equal(e.dq, dq_out)) << where;
    } else {
      EXPECT_LE(rel_rms(e.o, o_out), 4e-3) << where;
      EXPECT_LE(rel_rms(e.dq, dq_out), 4e-3) << where;
    }
    EXPECT_LE(rel_rms(e.dk, dk_out), 4e-3) << where;
    EXPECT_LE(rel_rms(e.dv, dv_out), 4e-3) << where;
  };
  c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
  at::cuda::CUDAGraph graph;
  {
    c10::cuda::CUDAStreamGuard sg(side);
    step();  // warm-up on the capture stream
    side.synchronize();
    graph.capture_begin();
    step();
    graph.capture_end();
  }
  const Grads e1 = eager();
  graph.replay();
  c10::cuda::device_synchronize();
  expect_replay(e1, "captured values");
  const Grads ref = reference_grads(c, x, scale);
  expect_close(ref, {o_out, dq_out, dk_out, dv_out}, kTolHalf, kTolHalf, "replay vs reference");
  // new values (and a new selection) in the same buffers
  const Inputs y = make_inputs(c, 32);
  {
    c10::NoGradGuard ng;
    q.copy_(y.q.to(f));
    k.copy_(y.k.to(f));
    v.copy_(y.v.to(f));
    w.copy_(y.w.to(f));
    idx.copy_(y.idx.to(at::kCUDA));
  }
  graph.replay();
  c10::cuda::device_synchronize();
  const Grads e2 = eager();
  expect_replay(e2, "new values");
  EXPECT_GT(rel_rms(e1.o, e2.o), 0.1) << "the replay must read the new inputs";
  expect_close(reference_grads(c, y, scale), {o_out, dq_out, dk_out, dv_out}, kTolHalf, kTolHalf,
               "replay of new values vs reference");
}

TEST(SparseCuda, BlockSparseGraphCapture) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  check_graph_capture({2, 300, 4, 2, 128, 16, 1, 6, 0.2}, BlockSparseKernels::CudaCores);
}

// The tensor cores in a graph: blocks of 16 (GQA 2) and of 128 (two key chunks, a partial last block).
TEST(SparseCuda, BlockSparseTensorCoresGraphCapture) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  check_graph_capture({2, 300, 4, 2, 128, 16, 1, 6, 0.2}, BlockSparseKernels::TensorCores);
  check_graph_capture({1, 333, 2, 2, 64, 128, 1, 2, 0.1}, BlockSparseKernels::TensorCores);
}

// Forward and backward of the tensor cores with CUDA's sync debug mode at error (after a warm-up):
// no host synchronisation.
TEST(SparseCuda, BlockSparseTensorCoresWithoutHostSync) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const Case c{1, 517, 6, 6, 128, 32, 1, 9, 0.1};
  const Inputs x = make_inputs(c, 41);
  const double scale = 1.0 / std::sqrt(double(c.D));
  kernel_grads(c, x, scale, at::kBFloat16, BlockSparseKernels::TensorCores);  // warm-up
  auto o = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  at::Tensor q = x.q.to(o).requires_grad_(true), k = x.k.to(o).requires_grad_(true), v = x.v.to(o).requires_grad_(true);
  const at::Tensor idx = x.idx.to(at::kCUDA), w = x.w.to(o);  // the copies to the device synchronise: before the guard
  mixbench_test::SyncDebugErrors no_sync;
  EXPECT_NO_THROW({
    at::Tensor out = block_sparse_attention_cuda(q, k, v, idx, c.bs, c.qb, scale, BlockSparseKernels::TensorCores);
    torch::autograd::grad({(out * w).sum()}, {q, k, v});
  });
}
#endif

// The kernels' choice: Auto takes the tensor cores for bf16 / fp16 per-token rows with blocks of ≥ 16
// keys, the CUDA cores for fp32, q_block > 1 and smaller blocks; forcing a set that cannot take the
// inputs is a UsageError.
TEST(SparseCuda, BlockSparseKernelChoice) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const double scale = 0.125;
  struct Want {
    Case c;
    at::ScalarType dt;
    std::string kernel;
  };
  const std::vector<Want> wants = {
      {{1, 40, 2, 2, 64, 16, 1, 2}, at::kBFloat16, "block_sparse_mma"},
      {{1, 40, 2, 2, 128, 128, 1, 2}, at::kHalf, "block_sparse_mma"},
      {{1, 40, 2, 2, 64, 16, 1, 2}, at::kFloat, "block_sparse_cuda"},
      {{1, 40, 2, 2, 64, 16, 16, 2}, at::kBFloat16, "block_sparse_cuda"},
      {{1, 40, 2, 2, 64, 8, 1, 2}, at::kBFloat16, "block_sparse_cuda"},
      {{1, 40, 2, 2, 32, 16, 1, 2}, at::kBFloat16, ""},  // the LibTorch path
  };
  for (const Want& w : wants) {
    const Inputs x = make_inputs(w.c, 3);
    EXPECT_EQ(fast_kernel_of(w.c, x, scale, w.dt), w.kernel) << w.c.where() << " " << c10::toString(w.dt);
    auto o = at::TensorOptions().device(at::kCUDA).dtype(w.dt);
    auto call = [&](BlockSparseKernels which) {
      return block_sparse_attention_cuda(x.q.to(o), x.k.to(o), x.v.to(o), x.idx.to(at::kCUDA), w.c.bs, w.c.qb, scale, which);
    };
    if (w.kernel != "block_sparse_mma") EXPECT_THROW(call(BlockSparseKernels::TensorCores), UsageError) << w.c.where();
    if (w.kernel.empty()) EXPECT_THROW(call(BlockSparseKernels::CudaCores), UsageError) << w.c.where();
    else EXPECT_NO_THROW(call(BlockSparseKernels::CudaCores)) << w.c.where();
  }
  // the scoped choice: CUDA cores for what Auto gives the tensor cores
  const Want& w = wants.front();
  const Inputs x = make_inputs(w.c, 3);
  {
    ScopedBlockSparseKernels scoped(BlockSparseKernels::CudaCores);
    EXPECT_EQ(fast_kernel_of(w.c, x, scale, w.dt), "block_sparse_cuda");
  }
  EXPECT_EQ(fast_kernel_of(w.c, x, scale, w.dt), "block_sparse_mma");
}

// The tensor cores against the FP64 reference in bf16 and fp16, and against the CUDA-core kernels
// on the same inputs (both rounding once at the end; the tensor cores also round the probabilities
// and score gradients to 16 bits before their products).
TEST(SparseCuda, BlockSparseTensorCoresMatchReference) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const std::vector<Case> cases = {
      {1, 37, 2, 2, 64, 16, 1, 3, 0.2},          // odd T, blocks of 16 (chunk 16), −1 slots
      {1, 150, 4, 2, 128, 32, 1, 9, 0.1},        // nsa-like: blocks of 32, 8 + own slots, GQA 2
      {2, 301, 2, 2, 128, 128, 1, 2},            // moba-like: 2 chunks of 64, partial last block, 2 work items per own block
      {1, 260, 6, 2, 64, 64, 1, 4, 0.3},         // GQA 3: a query's heads split across tiles of 64 and 32 items
      {1, 200, 8, 1, 128, 48, 1, 5, 0.2},        // MQA, G = 8: blocks of 48 (chunks 32 + partial 16), 6 forward work items per block
      {1, 90, 2, 2, 64, 100, 1, 3},              // one block of 90 keys (chunk 64 + partial), topk 3 > 1 causal block
      {1, 70, 4, 4, 128, 16, 1, 8, 0.0, 0.1},    // topk 8 > 5 blocks, 10% of the queries without any slot
      {2, 129, 4, 2, 64, 16, 1, 12, 0.5, 0.05},  // half the slots −1
      {1, 17, 2, 1, 128, 16, 1, 2},              // T = block + 1
      {1, 1, 2, 2, 64, 16, 1, 1},                // T = 1
      {1, 64, 2, 2, 64, 64, 1, 1},               // T = one block, one tile of 64 items
  };
  uint64_t seed = 700;
  for (const Case& c : cases) {
    const Inputs x = make_inputs(c, seed++);
    const double scale = 1.0 / std::sqrt(double(c.D));
    const Grads ref = reference_grads(c, x, scale);
    for (at::ScalarType dt : {at::kBFloat16, at::kHalf}) {
      const std::string where = fmt::format("{} {}", c10::toString(dt), c.where());
      ASSERT_EQ(fast_kernel_of(c, x, scale, dt), "block_sparse_mma") << where;
      std::string ran;
      const Grads got = kernel_grads(c, x, scale, dt, BlockSparseKernels::TensorCores, &ran);
      EXPECT_EQ(ran, "block_sparse_mma") << where;
      ASSERT_EQ(got.o.scalar_type(), dt) << where;
      ASSERT_EQ(got.dq.scalar_type(), dt) << where;
      ASSERT_EQ(got.dk.scalar_type(), dt) << where;
      expect_close(ref, got, kTolHalf, kTolHalf, where);
      const Grads old = kernel_grads(c, x, scale, dt, BlockSparseKernels::CudaCores);
      expect_close(old, got, kTolHalf, kTolHalf, where + " vs CUDA cores");
    }
  }
}

// Queries without any slot (all −1) get o = 0 and dq = 0 exactly, add nothing to dk, dv, and the
// others match the reference; a block listed only by such rows gets dk = dv = 0.
TEST(SparseCuda, BlockSparseTensorCoresEmptyQueries) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const Case c{1, 96, 4, 2, 64, 16, 1, 3, 0.0, 0.0};
  Inputs x = make_inputs(c, 17);
  x.idx.narrow(2, 0, 20).fill_(-1);   // queries 0–19: nothing (blocks 0 and 1 …)
  x.idx.narrow(2, 50, 3).fill_(-1);   // queries 50–52: nothing
  // … and no later query lists block 0 either: its keys get no gradient
  x.idx.masked_fill_(x.idx == 0, -1);
  const double scale = 1.0 / std::sqrt(double(c.D));
  const Grads ref = reference_grads(c, x, scale);
  for (at::ScalarType dt : {at::kBFloat16, at::kHalf}) {
    const std::string where = fmt::format("{} empty queries", c10::toString(dt));
    std::string ran;
    const Grads got = kernel_grads(c, x, scale, dt, BlockSparseKernels::TensorCores, &ran);
    EXPECT_EQ(ran, "block_sparse_mma") << where;
    EXPECT_EQ(got.o.narrow(1, 0, 20).abs().max().item<double>(), 0.0) << where;
    EXPECT_EQ(got.o.narrow(1, 50, 3).abs().max().item<double>(), 0.0) << where;
    EXPECT_EQ(got.dq.narrow(1, 0, 20).abs().max().item<double>(), 0.0) << where;
    EXPECT_EQ(got.dq.narrow(1, 50, 3).abs().max().item<double>(), 0.0) << where;
    EXPECT_EQ(got.dk.narrow(1, 0, 16).abs().max().item<double>(), 0.0) << where;
    EXPECT_EQ(got.dv.narrow(1, 0, 16).abs().max().item<double>(), 0.0) << where;
    EXPECT_GT(got.o.narrow(1, 20, 30).abs().amax({2, 3}).min().item<double>(), 0.0) << where;
    expect_close(ref, got, kTolHalf, kTolHalf, where);
  }
}

}  // namespace
}  // namespace mixbench
