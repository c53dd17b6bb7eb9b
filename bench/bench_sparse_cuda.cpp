// GPU timings of DSA's CUDA paths on d12's shapes: token-sparse attention (sparse_attention_fast:
// the token_sparse kernels; H = Hkv = 6, D = 128, K = 256 keys per query, bf16) forward and
// forward+backward, the indexer (dsa_indexer_fast: H_I = 3, D_I = 128, top-256) and the KL target
// in its two forms (dsa_selected_attention_mean), at B = 1 and T = 2K … 32K; CUDA events. Random
// distinct causal selections are drawn once per length.
// Block-sparse attention (block_sparse_attention_cuda, per-token rows) with moba's selection (blocks
// of 128, own block + 1) and nsa's (blocks of 32, 8 complete history blocks + own) on the CUDA-core
// and the tensor-core kernels, beside dense causal flash attention
// (at::_scaled_dot_product_flash_attention), at T = 8K and 32K, B = 1, H = Hkv = 6, D = 128, bf16:
// TFLOP/s of the useful work (4·D per visible query-key pair forward, 3× that forward + backward).
#if defined(MIXBENCH_WITH_CUDA)
#include <benchmark/benchmark.h>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/autograd.h>

#include <functional>
#include <string>

#include "mixers/sparse/sparse.h"
#include "bench/cuda_timing.h"

namespace {
using namespace mixbench;

constexpr int64_t kH = 6, kD = 128, kTopk = 256, kHI = 3;

// [1,T,K] int64: min(K, t+1) distinct keys ≤ t per query (uniform), −1 padded — the top-k of random
// causal scores, on the device.
at::Tensor random_selection(int64_t T, int64_t K) {
  auto f = at::TensorOptions().dtype(at::kFloat).device(at::kCUDA);
  at::Tensor out = at::full({1, T, K}, -1, f.dtype(at::kLong));
  for (int64_t q0 = 0; q0 < T; q0 += 1024) {
    const int64_t q1 = std::min(T, q0 + 1024);
    at::Tensor r = at::rand({q1 - q0, q1}, f);
    at::Tensor s = at::arange(q1, f.dtype(at::kLong)).view({1, q1}), t = at::arange(q0, q1, f.dtype(at::kLong)).view({-1, 1});
    r.masked_fill_(s > t, -1.0);
    const int64_t k = std::min(K, q1);
    auto [v, i] = at::topk(r, k, -1);
    out.slice(1, q0, q1).slice(2, 0, k).copy_(i.masked_fill(v < 0, -1).unsqueeze(0));
  }
  return out;
}

void time_calls(benchmark::State& state, const std::function<void()>& run) {
  try {
    for (int i = 0; i < 2; ++i) run();
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  mixbench_bench::time_cuda_iterations(state, run);
}

void BM_token_sparse(benchmark::State& state, bool backward) {
  if (!at::hasCUDA()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  const int64_t T = state.range(0);
  auto o = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
  at::Tensor q = at::randn({1, T, kH, kD}, o).requires_grad_(backward);
  at::Tensor k = at::randn({1, T, kH, kD}, o).requires_grad_(backward);
  at::Tensor v = at::randn({1, T, kH, kD}, o).requires_grad_(backward);
  const at::Tensor idx = random_selection(T, kTopk), dout = at::randn({1, T, kH, kD}, o);
  time_calls(state, [&] {
    at::Tensor out = sparse_attention_fast(q, k, v, idx, 1.0 / std::sqrt(double(kD)));
    if (backward) torch::autograd::grad({out}, {q, k, v}, {dout});
  });
  // 4·H·K·D per query forward (scores and P·V); forward + backward counts 3× the forward (the
  // training FLOPs' convention)
  const double flops = 4.0 * double(T * kH * kTopk * kD) * (backward ? 3.0 : 1.0);
  state.counters["T"] = double(T);
  state.counters["TFLOPs"] = benchmark::Counter(flops / 1e12, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(fmt::format("B=1 T={} H={} D={} K={} bf16 {}", T, kH, kD, kTopk, backward ? "fwd+bwd" : "fwd"));
}

void BM_indexer(benchmark::State& state) {
  if (!at::hasCUDA()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  const int64_t T = state.range(0);
  auto o = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
  const at::Tensor q = at::randn({1, T, kHI, kD}, o), k = at::randn({1, T, kD}, o), w = at::randn({1, T, kHI}, o);
  time_calls(state, [&] { dsa_indexer_fast(q, k, w, kTopk, 1.0 / std::sqrt(double(kD)), true); });
  state.counters["T"] = double(T);
  state.SetLabel(fmt::format("B=1 T={} H_I={} D_I={} top-{} bf16", T, kHI, kD, kTopk));
}

// DSA's KL target (dsa_selected_attention_mean: the attention's probabilities over each query's
// selected keys, averaged over the heads) in each form: keys gathered per query, or every score of a
// block of queries and the selected columns gathered from them.
void BM_dsa_target(benchmark::State& state, DsaScoreForm form) {
  if (!at::hasCUDA()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  const int64_t T = state.range(0);
  auto o = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
  const at::Tensor q = at::randn({1, T, kH, kD}, o), k = at::randn({1, T, kH, kD}, o);
  const at::Tensor idx = random_selection(T, kTopk);
  time_calls(state, [&] { dsa_selected_attention_mean(q, k, idx, 1.0 / std::sqrt(double(kD)), int64_t(256) << 20, form); });
  state.counters["T"] = double(T);
  state.SetLabel(fmt::format("B=1 T={} H={} D={} K={} bf16 {}", T, kH, kD, kTopk,
                             form == DsaScoreForm::Gathered ? "keys gathered per query" : "block scores, columns gathered"));
}

// Per-token block selections [1,Hkv,T,n + 1] int64 for blocks of bs: the own block t / bs and up to
// n distinct random complete blocks before it (fewer early on, −1 padded), on the device. moba: n =
// topk − 1 (own counted); nsa: n = topk (own appended).
at::Tensor random_block_selection(int64_t Hkv, int64_t T, int64_t bs, int64_t n) {
  auto f = at::TensorOptions().dtype(at::kFloat).device(at::kCUDA);
  auto lo = f.dtype(at::kLong);
  const int64_t NB = (T + bs - 1) / bs;
  at::Tensor out = at::full({1, Hkv, T, n + 1}, -1, lo);
  for (int64_t q0 = 0; q0 < T; q0 += 4096) {
    const int64_t q1 = std::min(T, q0 + 4096);
    at::Tensor own = at::div(at::arange(q0, q1, lo), bs, "floor");                   // [n_q]
    at::Tensor r = at::rand({Hkv, q1 - q0, NB}, f);
    r.masked_fill_(at::arange(NB, lo).view({1, 1, NB}) >= own.view({1, -1, 1}), -1.0);  // complete history blocks only
    auto [v, i] = at::topk(r, std::min(n, NB), -1);
    at::Tensor sel = i.masked_fill(v < 0, -1);
    out.slice(2, q0, q1).slice(3, 0, sel.size(2)).copy_(sel.unsqueeze(0));
    out.slice(2, q0, q1).select(3, n).copy_(own.view({1, 1, -1}).expand({1, Hkv, q1 - q0}));
  }
  return out;
}

// Query-key pairs the selection makes visible, times G query heads per KV head: Σ over listed
// blocks i of the keys s ≤ t in it (host sync, once per benchmark).
double visible_pairs(const at::Tensor& idx, int64_t T, int64_t bs, int64_t G) {
  auto lo = idx.options();
  at::Tensor t = at::arange(T, lo).view({1, 1, T, 1});
  at::Tensor s0 = idx.clamp_min(0) * bs;
  at::Tensor n = (at::minimum(s0 + bs, at::full({}, T, lo)).clamp_max(t + 1) - s0).clamp_min(0).masked_fill(idx < 0, 0);
  return double(n.sum().item<int64_t>()) * double(G);
}

enum class Which { CudaCores, TensorCores, DenseFlash };

struct BlockMethod {
  const char* name;
  int64_t bs, n;  // block size, random history blocks besides the own one
};
constexpr BlockMethod kMoba{"moba", 128, 1}, kNsa{"nsa", 32, 8};

void BM_block_sparse(benchmark::State& state, BlockMethod m, Which which, bool backward) {
  if (!at::hasCUDA()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  const int64_t T = state.range(0);
  const double scale = 1.0 / std::sqrt(double(kD));
  auto o = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
  at::Tensor q = at::randn({1, T, kH, kD}, o).requires_grad_(backward);
  at::Tensor k = at::randn({1, T, kH, kD}, o).requires_grad_(backward);
  at::Tensor v = at::randn({1, T, kH, kD}, o).requires_grad_(backward);
  const at::Tensor dout = at::randn({1, T, kH, kD}, o);
  double pairs = 0.0;
  std::function<void()> run;
  if (which == Which::DenseFlash) {
    pairs = double(kH) * double(T) * double(T + 1) / 2.0;
    run = [&] {
      // [B,H,T,D] views of the [B,T,H,D] tensors
      at::Tensor out = std::get<0>(at::_scaled_dot_product_flash_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                                           v.transpose(1, 2), 0.0, true, false, scale));
      if (backward) torch::autograd::grad({out}, {q, k, v}, {dout.transpose(1, 2)});
    };
  } else {
    const at::Tensor idx = random_block_selection(kH, T, m.bs, m.n);
    pairs = visible_pairs(idx, T, m.bs, 1);
    const BlockSparseKernels kern = which == Which::TensorCores ? BlockSparseKernels::TensorCores : BlockSparseKernels::CudaCores;
    run = [&, idx, kern] {
      at::Tensor out = block_sparse_attention_cuda(q, k, v, idx, m.bs, 1, scale, kern);
      if (backward) torch::autograd::grad({out}, {q, k, v}, {dout});
    };
  }
  time_calls(state, run);
  const double flops = 4.0 * double(kD) * pairs * (backward ? 3.0 : 1.0);
  state.counters["T"] = double(T);
  state.counters["pairs"] = pairs;
  state.counters["TFLOPs"] = benchmark::Counter(flops / 1e12, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(fmt::format("B=1 T={} H={} D={} bf16 {} {}", T, kH, kD,
                             which == Which::DenseFlash ? std::string("dense causal flash")
                                                        : fmt::format("block {} own + {} blocks", m.bs, m.n),
                             backward ? "fwd+bwd" : "fwd"));
}

int register_sparse() {
  for (bool bwd : {false, true})
    benchmark::RegisterBenchmark(fmt::format("sparse_cuda/token_sparse/{}", bwd ? "fwd_bwd" : "fwd").c_str(),
                                 BM_token_sparse, bwd)
        ->Arg(2048)->Arg(8192)->Arg(32768)
        ->UseManualTime()->Unit(benchmark::kMillisecond)->MinTime(0.2);
  benchmark::RegisterBenchmark("sparse_cuda/dsa_indexer", BM_indexer)
      ->Arg(2048)->Arg(8192)->Arg(32768)
      ->UseManualTime()->Unit(benchmark::kMillisecond)->MinTime(0.2);
  for (const auto& [form, fname] : {std::pair{DsaScoreForm::Gathered, "gathered"}, std::pair{DsaScoreForm::DenseScores, "dense_scores"}})
    benchmark::RegisterBenchmark(fmt::format("sparse_cuda/dsa_target/{}", fname).c_str(), BM_dsa_target, form)
        ->Arg(2048)->Arg(8192)->Arg(32768)
        ->UseManualTime()->Unit(benchmark::kMillisecond)->MinTime(0.2);
  // block_sparse/<method>/<kernels>/<pass>/T
  for (bool bwd : {false, true}) {
    const char* pass = bwd ? "fwd_bwd" : "fwd";
    for (const BlockMethod& m : {kMoba, kNsa})
      for (const auto& [which, kname] : {std::pair{Which::CudaCores, "cuda_cores"}, std::pair{Which::TensorCores, "tensor_cores"}})
        benchmark::RegisterBenchmark(fmt::format("sparse_cuda/block_sparse/{}/{}/{}", m.name, kname, pass).c_str(),
                                     BM_block_sparse, m, which, bwd)
            ->Arg(8192)->Arg(32768)
            ->UseManualTime()->Unit(benchmark::kMillisecond)->MinTime(0.2);
    benchmark::RegisterBenchmark(fmt::format("sparse_cuda/block_sparse/dense/flash/{}", pass).c_str(), BM_block_sparse,
                                 kMoba, Which::DenseFlash, bwd)
        ->Arg(8192)->Arg(32768)
        ->UseManualTime()->Unit(benchmark::kMillisecond)->MinTime(0.2);
  }
  return 0;
}
const int registered = register_sparse();
}  // namespace
#endif
