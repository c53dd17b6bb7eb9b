// On a machine with a GPU: the fused element-wise kernels against LibTorch's unfused arithmetic in
// float64 — the causal short convolution + SiLU of the delta-rule layers (strip edges, sequence
// starts and ends, every width 1..8, channel counts that do not fill a block), the MLP's ReLU² and
// the resid / x0 mix (packed and unpacked element counts) — forward and gradients.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "harness/metrics.h"
#include "harness/fused_ops.h"
#include "mixers/linear/delta_layer.h"

namespace mixbench {
namespace {

double rel_rms(const at::Tensor& ref, const at::Tensor& got) {
  const at::Tensor r = ref.to(at::kDouble).cpu(), g = got.to(at::kDouble).cpu();
  return ((r - g).pow(2).mean() / (r.pow(2).mean() + 1e-300)).sqrt().item<double>();
}

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
      for (size_t i = 0; i < g.size(); ++i) EXPECT_LE(rel_rms(g2[i], g[i]), tol) << where << " grad " << i;
      EXPECT_EQ(g[0][0].item<double>(), 0.0) << "only the used element of the vector gets a gradient";
    }
}

}  // namespace
}  // namespace mixbench
