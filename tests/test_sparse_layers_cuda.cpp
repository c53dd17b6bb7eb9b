// On a machine with a GPU: the sparse layers (dsa, moba, qsa, nsa, seer) on CUDA — layer
// conformance at fp32 and bf16 with the reference on the optimized path's selection, forward and
// backward without host synchronisation (CUDA's sync debug mode set to error), a forward + backward
// captured in a CUDA graph and replayed equal to the eager one, and the teachers' peak memory at
// T = 64K bounded by their query chunks. Skipped without a GPU.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#if defined(MIXBENCH_WITH_CUDA)
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <string>
#include <vector>

#include "harness/backbone.h"
#include "harness/registry.h"
#include "mixers/sparse/sparse.h"
#include "mixers/sparse/sparse_method.h"
#include "suites/conformance.h"
#include "suites/train.h"
#include "tests/test_util.h"

namespace mixbench {
namespace {

using Json = nlohmann::json;

const std::vector<std::string> kSparse = {"dsa", "moba", "qsa", "nsa", "seer"};

double rel_rms(const at::Tensor& ref, const at::Tensor& got) {
  const at::Tensor r = ref.to(at::kDouble).cpu(), g = got.to(at::kDouble).cpu();
  return ((r - g).pow(2).mean() / (r.pow(2).mean() + 1e-300)).sqrt().item<double>();
}

// The layer inputs and parameters of method m's case `label`-like config at B, T on the GPU in dt,
// parameters requiring gradients.
struct LayerCase {
  Config cfg;
  LayerCtx ctx;
  TensorMap in;
  std::vector<std::string> names;  // the differentiable inputs
};
LayerCase gpu_case(const MethodSpec& m, int64_t B, int64_t T, at::ScalarType dt) {
  const CaseDef c = m.cases().back();  // the last case: the odd shapes (block 5, top-3 / top-20, …)
  LayerCase lc{c.cfg, LayerCtx{c.layer, c.cfg.i("n_layer")}, {}, {}};
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(7);
  TensorMap in = m.make_inputs(c.cfg, lc.ctx, B, T, gen);
  for (const auto& d : m.params(c.cfg, lc.ctx)) in.set(d.name, random_param(d, gen, at::TensorOptions().dtype(at::kDouble)));
  for (const auto& [n, t] : in) {
    lc.in.set(n, t.to(at::kCUDA, dt).detach().requires_grad_(true));
    lc.names.push_back(n);
  }
  return lc;
}

// y·cy + aux_loss and its gradients with respect to every input.
std::pair<TensorMap, TensorMap> forward_backward(const MethodSpec& m, const LayerCase& lc, const at::Tensor& cy) {
  TensorMap out = m.forward(lc.in, lc.cfg, lc.ctx, Backend::CUDA);
  at::Tensor loss = (out.at("y") * cy).sum();
  if (out.has("aux_loss")) loss = loss + out.at("aux_loss");
  std::vector<at::Tensor> leaves;
  for (const auto& n : lc.names) leaves.push_back(lc.in.at(n));
  auto g = torch::autograd::grad({loss}, leaves, {}, false, false, /*allow_unused=*/true);
  TensorMap grads;
  for (size_t i = 0; i < g.size(); ++i)
    if (g[i].defined()) grads.set(lc.names[i], g[i]);
  TensorMap o;
  for (const auto& [n, t] : out) o.set(n, t.detach());
  return {o, grads};
}

}  // namespace

// Layer conformance on the GPU: every case of every sparse method passes at fp32 and bf16, the
// reference attending with the optimized path's selection and the selection checked tie-aware; the
// indexers' KL gradients of dsa and qsa within 1e-2.
TEST(SparseLayersCuda, ConformanceFp32AndBf16) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  for (const char* dtype : {"fp32", "bf16"}) {
    ConformanceOptions opt;
    opt.methods = kSparse;
    opt.backend = Backend::CUDA;
    opt.dtype = dtype;
    opt.finite_differences = false;
    ConformanceSummary s;
    Json r = run_conformance(opt, s);
    EXPECT_EQ(s.failed, 0) << dtype;
    EXPECT_EQ(s.errors, 0) << dtype;
    EXPECT_EQ(s.skipped, 0) << dtype;
    int rows = 0, indexer_grads = 0;
    for (const auto& x : r) {
      EXPECT_EQ(x["status"], "pass") << x.dump();
      if (x["level"] != "layer") continue;
      ++rows;
      EXPECT_EQ(x.value("reference_selection", ""), "optimized") << x.dump();
      // The gradients reaching dsa's and qsa's indexers only through their KL, computed in fp32
      // (indexer_precision): within the bf16 op-level gradient threshold, as on the CPU
      // (SparseMethods.IndexerKlGradientsBf16).
      for (const auto& c : x["checks"]) {
        const std::string t = c["tensor"];
        if (c["kind"] != "gradient" || (t.rfind("grad_idx_", 0) != 0 && t.rfind("grad_qsa_w", 0) != 0)) continue;
        ++indexer_grads;
        EXPECT_LE(c["rel_rms"].get<double>(), 1e-2) << dtype << " " << x["method"] << " " << x["case"] << " " << t;
      }
    }
    EXPECT_GE(rows, 35) << dtype;  // 7–8 cases per method
    EXPECT_EQ(indexer_grads, 8 * 5 + 7 * 2) << dtype;  // dsa: 5 indexer tensors per case, qsa: 2
  }
}

#if defined(MIXBENCH_WITH_CUDA)

// Forward and backward of every sparse layer, after one warm-up pass (cached constants), with CUDA's
// sync debug mode at error: any host synchronisation (.item(), a copy to the CPU, nonzero) throws.
TEST(SparseLayersCuda, ForwardBackwardWithoutHostSync) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  for (const auto& name : kSparse) {
    const MethodSpec& m = Registry::get().method(name);
    for (auto dt : {at::kFloat, at::kBFloat16}) {
      LayerCase lc = gpu_case(m, 2, 301, dt);
      at::Tensor cy = at::randn({2, 301, lc.in.at("x").size(2)}, at::TensorOptions().device(at::kCUDA).dtype(dt));
      forward_backward(m, lc, cy);  // warm-up
      mixbench_test::SyncDebugErrors no_sync;
      EXPECT_NO_THROW(forward_backward(m, lc, cy)) << name << " " << c10::toString(dt);
    }
  }
}

// A forward + backward captured in a CUDA graph (as the trainer captures a step) and replayed on new
// inputs copied into the captured buffers: the same outputs, selection and gradients as the eager
// pass on those inputs.
TEST(SparseLayersCuda, ForwardBackwardCapturedInAGraph) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  for (const auto& name : kSparse) {
    const MethodSpec& m = Registry::get().method(name);
    LayerCase lc = gpu_case(m, 2, 203, at::kFloat);
    const int64_t D = lc.in.at("x").size(2);
    auto o = at::TensorOptions().device(at::kCUDA);
    at::Tensor cy = at::randn({2, 203, D}, o);
    c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
    TensorMap g_out, g_grad;
    at::cuda::CUDAGraph graph;
    c10::cuda::getCurrentCUDAStream().synchronize();
    {
      c10::cuda::CUDAStreamGuard sg(side);
      forward_backward(m, lc, cy);  // warm-up on the capture stream
      side.synchronize();
      graph.capture_begin();
      std::tie(g_out, g_grad) = forward_backward(m, lc, cy);
      graph.capture_end();
    }
    c10::cuda::getCurrentCUDAStream().synchronize();
    // new inputs into the captured buffers, replay, against eager on the same inputs
    at::Tensor x2 = at::randn(lc.in.at("x").sizes(), o);
    {
      c10::NoGradGuard ng;
      lc.in.at("x").copy_(x2);
    }
    graph.replay();
    c10::cuda::getCurrentCUDAStream().synchronize();
    auto [e_out, e_grad] = forward_backward(m, lc, cy);
    EXPECT_TRUE(at::equal(g_out.at("selection"), e_out.at("selection"))) << name;
    EXPECT_LT(rel_rms(e_out.at("y"), g_out.at("y")), 1e-5) << name;
    if (e_out.has("aux_loss")) EXPECT_LT(rel_rms(e_out.at("aux_loss"), g_out.at("aux_loss")), 1e-5) << name;
    for (const auto& [n, g] : e_grad) {
      ASSERT_TRUE(g_grad.has(n)) << name << " " << n;
      EXPECT_LT(rel_rms(g, g_grad.at(n)), 1e-5) << name << " " << n;
    }
  }
}

// moba, nsa and seer at head dim 128 in bf16 with blocks of 16 … 32 keys (their block-sparse
// attention on the tensor cores) against the same layers with it on the CUDA cores: the same
// selection, and the output and every gradient within bf16 rounding of each other.
TEST(SparseLayersCuda, TensorCoreAttentionMatchesCudaCores) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const std::vector<std::pair<std::string, std::string>> runs = {
      {"moba", "moba_block=32,moba_topk=3"}, {"nsa", "nsa_block=16,nsa_topk=3,nsa_window=40"}, {"seer", "seer_block=16,seer_topk=3"}};
  for (const auto& [name, knobs] : runs) {
    const MethodSpec& m = Registry::get().method(name);
    const CaseDef c = m.cases().back();
    const Config cfg = m.config.parse("d_model=256,head_dim=128," + knobs, &c.cfg);
    LayerCase lc{cfg, LayerCtx{c.layer, cfg.i("n_layer")}, {}, {}};
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(11);
    TensorMap in = m.make_inputs(cfg, lc.ctx, 2, 333, gen);
    for (const auto& d : m.params(cfg, lc.ctx)) in.set(d.name, random_param(d, gen, at::TensorOptions().dtype(at::kDouble)));
    for (const auto& [n, t] : in) {
      lc.in.set(n, t.to(at::kCUDA, at::kBFloat16).detach().requires_grad_(true));
      lc.names.push_back(n);
    }
    at::Tensor cy = at::randn({2, 333, 256}, at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16));
    take_kernel_notes();
    auto [t_out, t_grad] = forward_backward(m, lc, cy);
    EXPECT_NE(take_kernel_notes().find("block_sparse_mma"), std::string::npos) << name;
    TensorMap c_out, c_grad;
    {
      ScopedBlockSparseKernels scoped(BlockSparseKernels::CudaCores);
      std::tie(c_out, c_grad) = forward_backward(m, lc, cy);
    }
    const std::string notes = take_kernel_notes();
    EXPECT_EQ(notes.find("block_sparse_mma"), std::string::npos) << name << ": " << notes;
    EXPECT_NE(notes.find("block_sparse_cuda"), std::string::npos) << name << ": " << notes;
    EXPECT_TRUE(at::equal(t_out.at("selection"), c_out.at("selection"))) << name;
    EXPECT_LT(rel_rms(c_out.at("y"), t_out.at("y")), 1e-2) << name;
    for (const auto& [n, g] : c_grad) {
      ASSERT_TRUE(t_grad.has(n)) << name << " " << n;
      EXPECT_LT(rel_rms(g, t_grad.at(n)), 1e-2) << name << " " << n;
    }
  }
}

// The teachers at T = 64K (gpu-d12's 6 heads of 128, seer's 64-key blocks, qsa's 4-key blocks and
// 64 + 1 selected blocks): peak memory above the inputs stays within the outputs (twice: the
// chunks, then their concatenation) plus two chunk budgets; unchunked, the [B,H,T,T] probabilities
// alone would need 100 GB.
TEST(SparseLayersCuda, TeachersMemoryBoundedAt64K) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  c10::NoGradGuard ng;
  const int64_t B = 1, T = 65536, H = 6, dh = 128;
  auto o = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  at::Tensor q = at::randn({B, T, H, dh}, o), k = at::randn({B, T, H, dh}, o);
  const double scale = 1.0 / std::sqrt(double(dh));
  const c10::DeviceIndex dev = c10::cuda::current_device();
  auto allocated = [&] {
    return c10::cuda::CUDACachingAllocator::getDeviceStats(dev).allocated_bytes[0].current;
  };
  auto peak = [&] { return c10::cuda::CUDACachingAllocator::getDeviceStats(dev).allocated_bytes[0].peak; };
  {
    const int64_t bs = 64, NC = T / bs;
    c10::cuda::getCurrentCUDAStream().synchronize();
    const int64_t base = allocated();
    c10::cuda::CUDACachingAllocator::resetPeakStats(dev);
    at::Tensor gt = sparse_layer::seer_teacher(q, k, bs, scale);
    c10::cuda::getCurrentCUDAStream().synchronize();
    const int64_t out_bytes = B * H * T * NC * 4;
    EXPECT_EQ(gt.sizes(), (std::vector<int64_t>{B, H, T, NC}));
    EXPECT_LE(peak() - base, 2 * out_bytes + 2 * sparse_layer::kChunkBytes);
    // rows with candidates sum to 1
    EXPECT_LT((gt.narrow(2, bs, T - bs).sum(-1) - 1).abs().max().item<double>(), 1e-3);
  }
  {
    const int64_t bs = 4, NC = T / bs, n = 64;
    at::Tensor sel = block_topk_fast(at::randn({B, 1, T, NC}, o), bs, n, false).squeeze(1);  // [B,T,n+1]
    c10::cuda::getCurrentCUDAStream().synchronize();
    const int64_t base = allocated();
    c10::cuda::CUDACachingAllocator::resetPeakStats(dev);
    at::Tensor pt = sparse_layer::qsa_teacher(q, k, sel, bs, scale);
    c10::cuda::getCurrentCUDAStream().synchronize();
    const int64_t out_bytes = B * T * n * 4;
    EXPECT_EQ(pt.sizes(), (std::vector<int64_t>{B, T, n}));
    EXPECT_LE(peak() - base, 2 * out_bytes + 2 * sparse_layer::kChunkBytes);
  }
}

// The trainer with --graph auto on a sparse method: the full-attention warm-up steps run eagerly,
// the first step after them is captured (with the optimizer) and replayed for the rest of the run;
// the losses stay finite and the run equals the same run without graphs to bf16 rounding. moba (no
// warm-up) is captured from its second step; moba and nsa also at head dim 64 with blocks of 16 (bf16:
// the tensor-core block-sparse kernels in the captured step).
TEST(SparseLayersCuda, TrainerCapturesTheStepAfterTheWarmup) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const std::vector<std::pair<std::string, std::string>> runs = {
      {"dsa", "n_layer=2,d_model=64,head_dim=32,seq_len=64,dsa_topk=8,idx_heads=2,idx_dim=8,idx_rope_dim=4,"
              "full_attention_warmup_steps=3"},
      {"qsa", "n_layer=2,d_model=64,head_dim=32,seq_len=64,qsa_block=4,qsa_topk=3,qsa_heads=4,qsa_dim=8,qsa_group=2,"
              "qsa_rope_dim=4,full_attention_warmup_steps=3"},
      {"seer", "n_layer=2,d_model=64,head_dim=32,seq_len=64,seer_block=4,seer_topk=2,seer_gate_dim=8,"
               "full_attention_warmup_steps=3"},
      {"nsa", "n_layer=2,d_model=64,head_dim=32,seq_len=64,nsa_block=4,nsa_topk=2,nsa_window=8"},
      {"moba", "n_layer=2,d_model=64,head_dim=32,seq_len=64,moba_block=8,moba_topk=2"},
      // head dim 64, blocks of 16 in bf16: the tensor-core block-sparse kernels inside the captured step
      {"moba", "n_layer=2,d_model=128,head_dim=64,seq_len=64,moba_block=16,moba_topk=2"},
      {"nsa", "n_layer=2,d_model=128,head_dim=64,seq_len=64,nsa_block=16,nsa_topk=2,nsa_window=8"}};
  for (const auto& [method, cfg] : runs) {
    TrainOptions o;
    o.method = method;
    o.config = cfg;
    o.steps = 8;
    o.batch = 2;
    o.eval_every = 8;
    o.eval_batches = 1;
    o.probe_sequences = 0;
    o.device = "cuda";
    o.log_every = 1;
    TrainResult g = run_train(o);
    EXPECT_TRUE(g.graph) << method << ": " << g.graph_reason;
    EXPECT_EQ(g.graph_scope, "step") << method << ": " << g.graph_reason;
    ASSERT_EQ(g.losses.size(), 8u) << method;
    o.graph = "off";
    TrainResult e = run_train(o);
    ASSERT_EQ(e.losses.size(), 8u) << method;
    for (size_t i = 0; i < 8; ++i) {
      EXPECT_TRUE(std::isfinite(g.losses[i])) << method << " step " << i;
      EXPECT_NEAR(g.losses[i], e.losses[i], 0.05 * std::abs(e.losses[i])) << method << " step " << i;
    }
  }
}

#endif  // MIXBENCH_WITH_CUDA

}  // namespace mixbench
