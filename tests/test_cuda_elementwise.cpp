// On a machine with a GPU: the fused element-wise kernels against LibTorch's unfused arithmetic in
// float64, forward and gradients — the causal short convolution + SiLU of the delta-rule layers
// (strip edges, sequence starts and ends, every width 1..8, channel counts that do not fill a
// block), the MLP's ReLU², the resid / x0 mix (packed and unpacked element counts), the row norms
// of the delta-rule layers (gated RMSNorm with SiLU / sigmoid gates, with and without a gain, and
// the q/k L2 norm: row lengths that do and do not fill the packed kernels, misaligned buffers,
// more rows than the backward's blocks), the value-embedding gate v + 3·sigmoid(z)·ve, and the
// delta layers' q|k|v (one GEMM, one conv launch split three ways).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>

#include <cmath>

#include "harness/metrics.h"
#include "harness/fused_ops.h"
#include "mixers/linear/delta_layer.h"
#include "tests/test_util.h"

namespace mixbench {
namespace {

using mixbench_test::rel_rms;

TEST(CudaElementwise, ShortConvSiluMatchesTheUnfusedPath) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  at::manual_seed(21);
  for (auto dt : {at::kFloat, at::kBFloat16})
    for (int64_t W : {1, 2, 3, 4, 8})
      for (auto [B, T, C] : {std::tuple<int64_t, int64_t, int64_t>{2, 1, 5}, {1, 31, 40}, {2, 32, 33}, {3, 33, 64}, {2, 100, 130}}) {
        at::Tensor x = at::randn({B, T, C}, at::kDouble), w = 0.5 * at::randn({C, W}, at::kDouble);
        at::Tensor dy = at::randn({B, T, C}, at::kDouble);
        // the reference: the same function's LibTorch path in float64 on the CPU
        at::Tensor xr = x.clone().requires_grad_(true), wr = w.clone().requires_grad_(true);
        at::Tensor yr = linear::short_conv_silu(xr, wr);
        auto gr = torch::autograd::grad({yr}, {xr, wr}, {dy});
        at::Tensor xg = x.to(at::kCUDA).to(dt).requires_grad_(true), wg = w.to(at::kCUDA).to(dt).requires_grad_(true);
        at::Tensor yg = linear::short_conv_silu(xg, wg);
        ASSERT_EQ(yg.scalar_type(), dt);
        auto gg = torch::autograd::grad({yg}, {xg, wg}, {dy.to(at::kCUDA).to(dt)});
        // inputs rounded to the dtype: compare against the reference at the rounded inputs
        const double tol = dt == at::kFloat ? 1e-5 : 2e-2;
        at::Tensor xq = xg.detach().to(at::kDouble).cpu().requires_grad_(true), wq = wg.detach().to(at::kDouble).cpu().requires_grad_(true);
        at::Tensor yq = linear::short_conv_silu(xq, wq);
        auto gq = torch::autograd::grad({yq}, {xq, wq}, {dy.to(dt).to(at::kDouble)});
        const std::string where = std::string(c10::toString(dt)) + " W" + std::to_string(W) + " B" + std::to_string(B) +
                                  " T" + std::to_string(T) + " C" + std::to_string(C);
        EXPECT_LE(rel_rms(yq, yg), tol) << where;
        EXPECT_LE(rel_rms(gq[0], gg[0]), tol) << where << " dx";
        EXPECT_LE(rel_rms(gq[1], gg[1]), tol) << where << " dw";
        EXPECT_GT(rel_rms(gr[0], at::zeros_like(gr[0])), 0.1) << "a non-trivial case";
      }
}

TEST(CudaElementwise, ReluSquareMatchesTheUnfusedPath) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  at::manual_seed(22);
  for (auto dt : {at::kFloat, at::kBFloat16, at::kHalf})
    for (int64_t n : {1, 7, 8, 4096, 4099}) {
      at::Tensor h = at::randn({n}, at::TensorOptions().device(at::kCUDA).dtype(dt)).requires_grad_(true);
      at::Tensor dy = at::randn_like(h);
      at::Tensor y = relu_square(h);
      auto g = torch::autograd::grad({y}, {h}, {dy});
      // LibTorch's unfused ops on the same inputs: the same fp32 arithmetic and one rounding
      at::Tensor h2 = h.detach().clone().requires_grad_(true);
      at::Tensor y2 = at::relu(h2).square();
      auto g2 = torch::autograd::grad({y2}, {h2}, {dy});
      EXPECT_LE(rel_rms(y2, y), dt == at::kFloat ? 1e-7 : 4e-3) << c10::toString(dt) << " n" << n;
      EXPECT_LE(rel_rms(g2[0], g[0]), dt == at::kFloat ? 1e-7 : 4e-3) << c10::toString(dt) << " n" << n << " grad";
      // a view with an odd offset takes the unpacked kernel
      at::Tensor big = at::randn({n + 1}, h.options());
      EXPECT_LE(rel_rms(at::relu(big.narrow(0, 1, n)).square(), relu_square(big.narrow(0, 1, n))), dt == at::kFloat ? 1e-7 : 4e-3);
    }
}

TEST(CudaElementwise, ScaledSumMatchesTheUnfusedPath) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  at::manual_seed(23);
  for (auto dt : {at::kFloat, at::kBFloat16})
    for (int64_t n : {3, 8, 4096 * 3, 100003}) {
      auto o = at::TensorOptions().device(at::kCUDA).dtype(dt);
      // a and b as the stream passes them: elements of a parameter vector
      at::Tensor lam = at::randn({4}, o).requires_grad_(true), mu = at::randn({4}, o).requires_grad_(true);
      at::Tensor x = at::randn({n}, o).requires_grad_(true), x0 = at::randn({n}, o).requires_grad_(true);
      at::Tensor dy = at::randn({n}, o);
      at::Tensor y = scaled_sum(lam[2], x, mu[1], x0);
      auto g = torch::autograd::grad({y}, {lam, x, mu, x0}, {dy});
      // float64 on the CPU from the same inputs
      auto d = [](const at::Tensor& t) { return t.detach().to(at::kDouble).cpu().requires_grad_(true); };
      at::Tensor l2 = d(lam), x2 = d(x), m2 = d(mu), x02 = d(x0);
      at::Tensor y2 = l2[2] * x2 + m2[1] * x02;
      auto g2 = torch::autograd::grad({y2}, {l2, x2, m2, x02}, {dy.to(at::kDouble).cpu()});
      const double tol = dt == at::kFloat ? 1e-6 : 1e-2;
      const std::string where = std::string(c10::toString(dt)) + " n" + std::to_string(n);
      EXPECT_LE(rel_rms(y2, y), tol) << where;
      EXPECT_LE(rel_rms(g2[1], g[1]), tol) << where << " grad x";
      EXPECT_LE(rel_rms(g2[3], g[3]), tol) << where << " grad x0";
      // The scalars' gradients are fp32 sums of n products dy·x (dy·x0) in the order the blocks finish:
      // their error is bounded by the sum of the terms' magnitudes, not by the (cancelling) sum itself.
      // Blocked fp32 summation: |error| <= (log2 n + a few)·2^-24·Σ|terms| < 1e-6·Σ|terms| here.
      // (bf16: the result's own rounding to bf16 dominates; relative to the sum as for the others)
      for (auto [i, other] : {std::pair{size_t(0), x2}, std::pair{size_t(2), x02}}) {
        if (dt != at::kFloat) {
          EXPECT_LE(rel_rms(g2[i], g[i]), tol) << where << " grad " << i;
          continue;
        }
        const double terms = (dy.to(at::kDouble).cpu() * other.detach()).abs().sum().item<double>();
        const double err = (g2[i].detach() - g[i].detach().to(at::kDouble).cpu()).abs().max().item<double>();
        EXPECT_LE(err, 1e-6 * terms) << where << " grad " << i << " (sum of |terms| " << terms << ")";
      }
      EXPECT_EQ(g[0][0].item<double>(), 0.0) << "only the used element of the vector gets a gradient";
    }
}

// The row norm on the GPU (fresh inputs in dtype dt, `shape` [..., D]; x at an element offset
// that breaks 16-byte alignment when odd_offset) against the same function's CPU path in float64
// at the rounded inputs: forward, dx, dw (with a gain) and dg (with a gate). fused: whether the
// kernels must have run (the node's name) or LibTorch's ops (rows the kernels do not take).
void expect_row_norm_matches(at::ScalarType dt, const std::vector<int64_t>& shape, bool l2, bool gain, NormGate act,
                             bool odd_offset, bool fused) {
  const int64_t D = shape.back();
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  auto o = at::TensorOptions().device(at::kCUDA).dtype(dt);
  at::Tensor x = (odd_offset ? at::randn({n + 1}, o).narrow(0, 1, n) : at::randn({n}, o)).view(shape).detach();
  x.requires_grad_(true);
  at::Tensor w = gain ? (1.0 + 0.5 * at::randn({D}, o)).detach().requires_grad_(true) : at::Tensor();
  at::Tensor g = act != NormGate::None ? (2.0 * at::randn(shape, o)).detach().requires_grad_(true) : at::Tensor();
  at::Tensor dy = at::randn(shape, o);
  auto run = [&](const at::Tensor& xi, const at::Tensor& wi, const at::Tensor& gi) {
    return l2 ? l2_normalize(xi, 1e-6) : rms_norm_gated(xi, wi, 1e-5, gi, act);
  };
  std::vector<at::Tensor> inputs{x};
  if (gain) inputs.push_back(w);
  if (g.defined()) inputs.push_back(g);
  at::Tensor y = run(x, w, g);
  ASSERT_EQ(y.scalar_type(), dt);
  ASSERT_EQ(y.sizes(), x.sizes());
  const std::string node = y.grad_fn()->name();
  std::string where = std::string(c10::toString(dt)) + (l2 ? " l2" : " rms") + (gain ? " gain" : "") +
                      (act == NormGate::Silu ? " silu" : act == NormGate::Sigmoid ? " sigmoid" : "") + " D" +
                      std::to_string(D) + " rows" + std::to_string(n / D) + (odd_offset ? " odd offset" : "");
  EXPECT_EQ(node.find("RowNorm") != std::string::npos, fused) << where << ": " << node;
  auto gr = torch::autograd::grad({y}, inputs, {dy});
  // float64 on the CPU from the same (rounded) inputs
  auto d = [](const at::Tensor& t) { return t.defined() ? t.detach().to(at::kDouble).cpu().requires_grad_(true) : t; };
  at::Tensor x2 = d(x), w2 = d(w), g2 = d(g);
  std::vector<at::Tensor> inputs2{x2};
  if (gain) inputs2.push_back(w2);
  if (g2.defined()) inputs2.push_back(g2);
  at::Tensor y2 = run(x2, w2, g2);
  auto gr2 = torch::autograd::grad({y2}, inputs2, {dy.to(at::kDouble).cpu()});
  const double tol = dt == at::kFloat ? 1e-5 : dt == at::kHalf ? 2e-3 : 1e-2;
  EXPECT_LE(rel_rms(y2, y), tol) << where;
  const char* names[] = {"dx", gain ? "dw" : "dg", "dg"};
  for (size_t i = 0; i < gr.size(); ++i) {
    EXPECT_EQ(gr[i].scalar_type(), dt) << where << " " << names[i];
    EXPECT_LE(rel_rms(gr2[i], gr[i]), tol) << where << " " << names[i];
    EXPECT_GT(rel_rms(gr2[i], at::zeros_like(gr2[i])), 0.1) << where << " a non-trivial gradient " << names[i];
  }
}

TEST(CudaElementwise, GatedRmsNormMatchesTheUnfusedPath) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  at::manual_seed(24);
  // [.., D]: packs of 4 (8, 128, 512, 1024), single elements (33, 130), more rows than the
  // backward's 1024 blocks × 8 warps (grid-stride, partial gains summed)
  const std::vector<std::vector<int64_t>> shapes = {{3, 8}, {2, 37, 3, 33}, {1, 5, 2, 128}, {2, 3, 130},
                                                    {3, 512}, {2, 1024}, {4, 1000, 3, 128}};
  for (auto dt : {at::kFloat, at::kBFloat16, at::kHalf})
    for (const auto& shape : shapes)
      for (auto act : {NormGate::None, NormGate::Silu, NormGate::Sigmoid})
        for (bool gain : {true, false}) {
          if (act == NormGate::None && !gain) continue;  // the L2 test's shape of kernel
          expect_row_norm_matches(dt, shape, false, gain, act, false, true);
        }
  // a buffer off 16-byte alignment: the single-element kernel up to 256, LibTorch's ops beyond;
  // rows over 1024 (or over 256 and not a multiple of 4) stay on LibTorch's ops
  for (auto dt : {at::kFloat, at::kBFloat16}) {
    expect_row_norm_matches(dt, {7, 128}, false, true, NormGate::Silu, true, true);
    expect_row_norm_matches(dt, {7, 512}, false, true, NormGate::Silu, true, false);
    expect_row_norm_matches(dt, {3, 257}, false, true, NormGate::Sigmoid, false, false);
    expect_row_norm_matches(dt, {3, 1028}, false, true, NormGate::None, false, false);
  }
}

TEST(CudaElementwise, L2NormMatchesTheUnfusedPath) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  at::manual_seed(25);
  for (auto dt : {at::kFloat, at::kBFloat16, at::kHalf})
    for (const auto& shape : std::vector<std::vector<int64_t>>{{5, 8}, {2, 37, 3, 33}, {2, 9, 4, 128}, {4, 1000, 3, 128}, {3, 1024}})
      expect_row_norm_matches(dt, shape, true, false, NormGate::None, false, true);
  for (auto dt : {at::kFloat, at::kBFloat16}) {
    expect_row_norm_matches(dt, {11, 128}, true, false, NormGate::None, true, true);
    expect_row_norm_matches(dt, {2, 300}, true, false, NormGate::None, true, false);
  }
}

// v + 3·sigmoid(z)·e (the value-embedding gate) on the GPU against the CPU path in float64 at the
// rounded inputs; v at an element offset that breaks 16-byte alignment when odd_offset.
void expect_gated_add_matches(at::ScalarType dt, const std::vector<int64_t>& shape, bool odd_offset, bool fused) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  auto o = at::TensorOptions().device(at::kCUDA).dtype(dt);
  const std::vector<int64_t> zshape(shape.begin(), shape.end() - 1);
  at::Tensor v = (odd_offset ? at::randn({n + 1}, o).narrow(0, 1, n) : at::randn({n}, o)).view(shape).detach();
  v.requires_grad_(true);
  at::Tensor z = (2.0 * at::randn(zshape, o)).detach().requires_grad_(true);
  at::Tensor e = at::randn(shape, o).requires_grad_(true);
  at::Tensor dy = at::randn(shape, o);
  at::Tensor y = gated_add(v, z, 3.0, e);
  ASSERT_EQ(y.scalar_type(), dt);
  const std::string where = std::string(c10::toString(dt)) + " D" + std::to_string(shape.back()) + " rows" +
                            std::to_string(n / shape.back()) + (odd_offset ? " odd offset" : "");
  EXPECT_EQ(std::string(y.grad_fn()->name()).find("GatedAddFn") != std::string::npos, fused) << where;
  auto g = torch::autograd::grad({y}, {v, z, e}, {dy});
  auto d = [](const at::Tensor& t) { return t.detach().to(at::kDouble).cpu().requires_grad_(true); };
  at::Tensor v2 = d(v), z2 = d(z), e2 = d(e);
  at::Tensor y2 = v2 + (3.0 * at::sigmoid(z2)).unsqueeze(-1) * e2;  // LibTorch's unfused arithmetic
  auto g2 = torch::autograd::grad({y2}, {v2, z2, e2}, {dy.to(at::kDouble).cpu()});
  const double tol = dt == at::kFloat ? 1e-5 : dt == at::kHalf ? 2e-3 : 1e-2;
  EXPECT_LE(rel_rms(y2, y), tol) << where;
  const char* names[] = {"dv", "dz", "de"};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(g[i].sizes(), g2[i].sizes()) << where << " " << names[i];
    EXPECT_LE(rel_rms(g2[i], g[i]), tol) << where << " " << names[i];
    EXPECT_GT(rel_rms(g2[i], at::zeros_like(g2[i])), 0.1) << where << " a non-trivial " << names[i];
  }
}

TEST(CudaElementwise, GatedAddMatchesTheUnfusedPath) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  at::manual_seed(27);
  for (auto dt : {at::kFloat, at::kBFloat16, at::kHalf})
    for (const auto& shape : std::vector<std::vector<int64_t>>{
             {2, 37, 3, 16}, {1, 5, 2, 128}, {3, 33}, {2, 7, 1, 130}, {4, 1000, 3, 128}, {2, 1024}})
      expect_gated_add_matches(dt, shape, false, true);
  for (auto dt : {at::kFloat, at::kBFloat16}) {
    expect_gated_add_matches(dt, {5, 128}, true, true);    // misaligned: the single-element kernel
    expect_gated_add_matches(dt, {5, 512}, true, false);   // misaligned and over 256: LibTorch's ops
    expect_gated_add_matches(dt, {2, 1028}, false, false);  // over 1024: LibTorch's ops
  }
}

// Whether the autograd graph behind t holds a node whose name contains `name` (a few levels).
bool graph_has(const std::shared_ptr<torch::autograd::Node>& fn, const std::string& name, int depth) {
  if (!fn || depth < 0) return false;
  if (fn->name().find(name) != std::string::npos) return true;
  for (const auto& e : fn->next_edges())
    if (graph_has(e.function, name, depth - 1)) return true;
  return false;
}

TEST(CudaElementwise, DeltaQkvMatchesTheUnfusedPath) {
  // q|k|v of the delta layers on a GPU (one GEMM against the concatenated weights, one conv launch
  // split into q, k, v, the fused L2 norm, the value embedding) against the CPU path's three GEMMs
  // and three convolutions in float64, forward and the gradients of x and every weight
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  at::manual_seed(26);
  struct Shape {
    int64_t B, T, d, H, K, V, W;
    bool ve;
  };
  // channel splits inside a warp's 32 lanes (48 | 96 of 120), on its edges (128 | 256 of 384), short sequences
  for (auto dt : {at::kFloat, at::kBFloat16})
    for (const Shape& sh : {Shape{2, 37, 32, 3, 16, 8, 4, true}, Shape{1, 70, 48, 2, 64, 64, 3, false},
                            Shape{3, 5, 16, 1, 16, 16, 2, true}, Shape{1, 33, 64, 1, 128, 128, 4, true}}) {
      linear::DeltaDims dd{sh.d, sh.H, sh.K, sh.V, sh.W, 1e-5};
      const double s = 1.0 / std::sqrt(double(sh.d));
      std::vector<std::pair<std::string, at::Tensor>> leaves = {
          {"x", at::randn({sh.B, sh.T, sh.d}, at::kDouble)},
          {"q_proj", s * at::randn({sh.H * sh.K, sh.d}, at::kDouble)},
          {"k_proj", s * at::randn({sh.H * sh.K, sh.d}, at::kDouble)},
          {"v_proj", s * at::randn({sh.H * sh.V, sh.d}, at::kDouble)},
          {"q_conv", 0.5 * at::randn({sh.H * sh.K, sh.W}, at::kDouble)},
          {"k_conv", 0.5 * at::randn({sh.H * sh.K, sh.W}, at::kDouble)},
          {"v_conv", 0.5 * at::randn({sh.H * sh.V, sh.W}, at::kDouble)}};
      if (sh.ve) {
        leaves.push_back({"ve", at::randn({sh.B, sh.T, sh.H * sh.V}, at::kDouble)});
        leaves.push_back({"ve_gate", 0.3 * at::randn({sh.H, 12}, at::kDouble)});
      }
      at::Tensor dq = at::randn({sh.B, sh.T, sh.H, sh.K}, at::kDouble), dk = at::randn_like(dq),
                 dv = at::randn({sh.B, sh.T, sh.H, sh.V}, at::kDouble);
      // the GPU path, then the CPU path at the same (rounded) inputs
      TensorMap gin, cin;
      std::vector<at::Tensor> gl, cl;
      for (auto& [name, t] : leaves) {
        at::Tensor g = t.to(at::kCUDA).to(dt).requires_grad_(true);
        at::Tensor c = g.detach().to(at::kDouble).cpu().requires_grad_(true);
        gin.set(name, g);
        cin.set(name, c);
        gl.push_back(g);
        cl.push_back(c);
      }
      linear::DeltaQKV gq = linear::delta_qkv(gin, dd), cq = linear::delta_qkv(cin, dd);
      const std::string where = std::string(c10::toString(dt)) + " B" + std::to_string(sh.B) + " T" +
                                std::to_string(sh.T) + " H" + std::to_string(sh.H) + " K" + std::to_string(sh.K) +
                                " V" + std::to_string(sh.V) + " W" + std::to_string(sh.W) + (sh.ve ? " ve" : "");
      EXPECT_TRUE(graph_has(gq.q.grad_fn(), "ShortConvSiluSplitFn", 4)) << where << ": the split conv ran";
      EXPECT_TRUE(graph_has(gq.q.grad_fn(), "RowNormFn", 0)) << where << ": the fused L2 norm ran";
      auto gg = torch::autograd::grad({gq.q, gq.k, gq.v}, gl,
                                      {dq.to(at::kCUDA).to(dt), dk.to(at::kCUDA).to(dt), dv.to(at::kCUDA).to(dt)});
      auto cg = torch::autograd::grad({cq.q, cq.k, cq.v}, cl, {dq.to(dt).to(at::kDouble), dk.to(dt).to(at::kDouble),
                                                              dv.to(dt).to(at::kDouble)});
      const double tol = dt == at::kFloat ? 1e-5 : 2e-2;
      EXPECT_LE(rel_rms(cq.q, gq.q), tol) << where << " q";
      EXPECT_LE(rel_rms(cq.k, gq.k), tol) << where << " k";
      EXPECT_LE(rel_rms(cq.v, gq.v), tol) << where << " v";
      for (size_t i = 0; i < leaves.size(); ++i) {
        EXPECT_EQ(gg[i].scalar_type(), dt) << where << " d" << leaves[i].first;
        EXPECT_LE(rel_rms(cg[i], gg[i]), tol) << where << " d" << leaves[i].first;
        EXPECT_GT(rel_rms(cg[i], at::zeros_like(cg[i])), 0.1) << where << " a non-trivial d" << leaves[i].first;
      }
    }
}

TEST(RowNorm, RejectsAGateWithoutAnActivation) {
  // on any device: the combination is a programming error, not a silent ungated norm
  at::Tensor x = at::randn({2, 4}), w = at::ones({4});
  EXPECT_THROW(rms_norm_gated(x, w, 1e-5, at::randn({2, 4}), NormGate::None), std::invalid_argument);
  EXPECT_THROW(rms_norm_gated(x, w, 1e-5, at::Tensor(), NormGate::Silu), std::invalid_argument);
}

}  // namespace
}  // namespace mixbench
