// The fused ops of a static-cache decode step (harness/decode_ops.h). On the CPU: their stand-ins are
// the backbone's unfused ops bit for bit (the CPU decode path's numerics do not change). On a machine
// with a GPU: each kernel against the same op in float64 on the CPU at the rounded inputs (odd row
// widths, several rows, fp32 / bf16 / fp16, every mix), and against LibTorch's unfused path in the
// same dtype; the captured decode step of a d12 model counted in kernels and held to a bound.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <iostream>
#include <map>
#include <vector>
#include <string>
#include <tuple>

#include "harness/backbone.h"
#include "harness/decode_graph.h"
#include "harness/decode_ops.h"
#include "harness/errors.h"
#include "harness/fused_ops.h"
#include "harness/registry.h"
#include "mixers/attention/attention.h"
#if defined(MIXBENCH_WITH_CUDA)
#include "mixers/attention/decode_attention_kernel.h"
#endif
#include "mixers/linear/delta_layer.h"
#include "tests/test_util.h"

namespace mixbench {
namespace {

using mixbench_test::rel_rms;

const char* mix_name(ResidualMix m) {
  return m == ResidualMix::None ? "none" : m == ResidualMix::Scaled ? "scaled" : "backout";
}

// The backbone's unfused arithmetic of residual_norm, written out.
ResidualNorm unfused_residual_norm(const at::Tensor& x, const at::Tensor& y, ResidualMix mix, const at::Tensor& a,
                                   const at::Tensor& b, const at::Tensor& z) {
  ResidualNorm o;
  o.sum = y.defined() ? x + y : x;
  o.residual = mix == ResidualMix::Scaled ? scaled_sum(a, o.sum, b, z) : mix == ResidualMix::Backout ? o.sum - b * z : o.sum;
  o.normed = backbone_rms_norm(o.residual);
  return o;
}

TEST(DecodeFused, CpuStandInsAreTheUnfusedOpsBitForBit) {
  c10::NoGradGuard ng;
  at::manual_seed(31);
  for (auto dt : {at::kFloat, at::kDouble, at::kBFloat16})
    for (ResidualMix mix : {ResidualMix::None, ResidualMix::Scaled, ResidualMix::Backout})
      for (bool with_y : {false, true}) {
        const auto o = at::TensorOptions().dtype(dt);
        const at::Tensor x = at::randn({3, 1, 37}, o), y = with_y ? at::randn({3, 1, 37}, o) : at::Tensor(),
                         z = at::randn({3, 1, 37}, o), a = at::randn({4}, o)[1], b = at::randn({1}, o);
        const bool scaled = mix == ResidualMix::Scaled, any = mix != ResidualMix::None;
        const ResidualNorm got = residual_norm(x, y, mix, scaled ? a : at::Tensor(), any ? b : at::Tensor(),
                                               any ? z : at::Tensor(), /*keep_sum=*/true);
        const ResidualNorm want = unfused_residual_norm(x, y, mix, a, b, z);
        const std::string where = fmt::format("{} {} y={}", c10::toString(dt), mix_name(mix), with_y);
        EXPECT_TRUE(at::equal(got.residual, want.residual)) << where;
        EXPECT_TRUE(at::equal(got.normed, want.normed)) << where;
        EXPECT_TRUE(at::equal(got.sum, want.sum)) << where;
        // with the MLP's first GEMM and relu² after it: the same update, then relu(normed·Wᵀ)²
        const at::Tensor W = at::randn({9, 37}, o);
        const ResidualNorm gl = residual_norm_linear(x, y, mix, scaled ? a : at::Tensor(), any ? b : at::Tensor(),
                                                     any ? z : at::Tensor(), true, W, /*relu_square=*/true);
        EXPECT_TRUE(at::equal(gl.residual, want.residual)) << where << " (with the GEMM)";
        EXPECT_TRUE(at::equal(gl.sum, want.sum)) << where << " (with the GEMM)";
        EXPECT_TRUE(at::equal(gl.out, relu_square(at::linear(want.normed, W)))) << where << " (with the GEMM)";
        EXPECT_FALSE(gl.normed.defined()) << where;
        // the plain GEMV, with the normed rows beside it
        const ResidualNorm gp = residual_norm_linear(x, y, mix, scaled ? a : at::Tensor(), any ? b : at::Tensor(),
                                                     any ? z : at::Tensor(), true, W, /*relu_square=*/false, /*with_normed=*/true);
        EXPECT_TRUE(at::equal(gp.residual, want.residual)) << where << " (plain GEMV)";
        EXPECT_TRUE(at::equal(gp.normed, want.normed)) << where << " (plain GEMV)";
        EXPECT_TRUE(at::equal(gp.out, at::linear(want.normed, W))) << where << " (plain GEMV)";
      }
  // the embedding with its smear, and the previous embedding replaced in place
  for (auto dt : {at::kFloat, at::kBFloat16}) {
    const auto o = at::TensorOptions().dtype(dt);
    const at::Tensor wte = at::randn({11, 40}, o), w = at::randn({1, 24}, o), lam = at::randn({1}, o);
    const at::Tensor idx = at::tensor({3, 10}, at::kLong).view({2, 1}), prev0 = at::randn({2, 1, 40}, o);
    const at::Tensor ve1 = at::randn({11, 8}, o), ve2 = at::randn({11, 13}, o);
    at::Tensor prev = prev0.clone();
    const EmbedStep got = embed_smear_step(wte, idx, w, lam, prev, {ve1, ve2});
    const at::Tensor e = backbone_rms_norm(at::embedding(wte, idx));
    const at::Tensor want = e + lam * at::sigmoid(at::linear(e.slice(2, 0, 24), w)) * prev0;
    EXPECT_TRUE(at::equal(got.x, want)) << c10::toString(dt);
    EXPECT_TRUE(at::equal(prev, e)) << c10::toString(dt) << ": prev holds the new embedding";
    ASSERT_EQ(got.gathered.size(), 2u);
    EXPECT_TRUE(at::equal(got.gathered[0], at::embedding(ve1, idx))) << c10::toString(dt);
    EXPECT_TRUE(at::equal(got.gathered[1], at::embedding(ve2, idx))) << c10::toString(dt);
  }
  // the MLP's GEMVs: the GEMM (and relu²) they stand for
  for (auto dt : {at::kFloat, at::kBFloat16}) {
    const auto o = at::TensorOptions().dtype(dt);
    const at::Tensor h = at::randn({2, 1, 24}, o), W = at::randn({9, 24}, o);
    EXPECT_TRUE(at::equal(linear_rows(h, W), at::linear(h, W))) << c10::toString(dt);
    EXPECT_TRUE(at::equal(linear_relu_square(h, W), relu_square(at::linear(h, W)))) << c10::toString(dt);
  }
  // the softcap, with and without the position's advance
  const at::Tensor l = 30 * at::randn({2, 1, 50}), pos = at::full({1}, 7, at::kLong);
  EXPECT_TRUE(at::equal(softcap_logits(l, 15.0, pos), 15.0 * at::tanh(l / 15.0)));
  EXPECT_EQ(pos.item<int64_t>(), 8);
  EXPECT_TRUE(at::equal(softcap_logits(l.to(at::kBFloat16), 15.0), 15.0 * at::tanh(l.to(at::kBFloat16).to(at::kFloat) / 15.0)));
  EXPECT_EQ(pos.item<int64_t>(), 8);
}

// Every value in `bad` of the environment variable `name` makes `read` throw an InputError whose
// message holds `message` with the value in place of {}.
template <class F>
void expect_refused(const char* name, std::initializer_list<const char*> bad, F read, const std::string& message) {
  for (const char* v : bad) {
    mixbench_test::EnvGuard env(name, v);
    try {
      read();
      ADD_FAILURE() << name << " accepted '" << v << "'";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(fmt::format(fmt::runtime(message), v)), std::string::npos) << e.what();
    }
  }
}

// MIXBENCH_DECODE_GEMV_ROWS: the most rows the GEMV kernels take (0 when unset); anything but a whole
// number 0..8 is refused with its value named. MIXBENCH_DECODE_PDL: 1 or unset on, 0 off, else refused.
// MIXBENCH_DECODE_SPLIT_BY: auto (unset), kv or query, else refused.
TEST(DecodeFused, KnobsFromTheEnvironment) {
  {
    mixbench_test::EnvGuard env("MIXBENCH_DECODE_PDL", "0");
    EXPECT_FALSE(decode_pdl_enabled());
  }
  {
    mixbench_test::EnvGuard env("MIXBENCH_DECODE_PDL", "1");
    EXPECT_TRUE(decode_pdl_enabled());
  }
  expect_refused("MIXBENCH_DECODE_PDL", {"yes", "", "2"}, decode_pdl_enabled, "MIXBENCH_DECODE_PDL must be 0 or 1, not '{}'");
  {
    mixbench_test::EnvGuard env("MIXBENCH_DECODE_GEMV_ROWS", "0");
    EXPECT_EQ(decode_gemv_max_rows(), 0);
  }
  {
    mixbench_test::EnvGuard env("MIXBENCH_DECODE_GEMV_ROWS", "2");
    EXPECT_EQ(decode_gemv_max_rows(), 2);
    // the CPU path is unchanged by it
    const at::Tensor x = at::randn({1, 1, 8}), W = at::randn({4, 8});
    EXPECT_TRUE(at::equal(linear_rows(x, W), at::linear(x, W)));
  }
  if (!std::getenv("MIXBENCH_DECODE_GEMV_ROWS")) EXPECT_EQ(decode_gemv_max_rows(), 0);
  if (!std::getenv("MIXBENCH_DECODE_SPLIT_MIN")) EXPECT_EQ(decode_split_min_slots(), 16);
  {
    mixbench_test::EnvGuard env("MIXBENCH_DECODE_SPLIT_MIN", "64");
    EXPECT_EQ(decode_split_min_slots(), 64);
  }
  expect_refused("MIXBENCH_DECODE_SPLIT_MIN", {"0", "8", "48", "512", "", "sixteen"}, decode_split_min_slots,
                 "MIXBENCH_DECODE_SPLIT_MIN must be 16, 32, 64, 128 or 256 cache slots, not '{}'");
  if (!std::getenv("MIXBENCH_DECODE_SPLIT_BY")) {
    EXPECT_EQ(decode_split_by(), "auto");
    // auto: the KV rows, but never fewer than one batch's query heads
    EXPECT_EQ(decode_split_rows(1, 6, 1), 6);   // mqa, B = 1: the query heads
    EXPECT_EQ(decode_split_rows(1, 6, 3), 6);   // gqa
    EXPECT_EQ(decode_split_rows(8, 6, 1), 8);   // mqa, B = 8: the KV rows
    EXPECT_EQ(decode_split_rows(8, 6, 3), 24);
    EXPECT_EQ(decode_split_rows(2, 6, 6), 12);  // no grouping: every rule gives B·H
  }
  {
    mixbench_test::EnvGuard env("MIXBENCH_DECODE_SPLIT_BY", "query");
    EXPECT_EQ(decode_split_by(), "query");
    EXPECT_EQ(decode_split_rows(8, 6, 1), 48);
  }
  {
    mixbench_test::EnvGuard env("MIXBENCH_DECODE_SPLIT_BY", "kv");
    EXPECT_EQ(decode_split_by(), "kv");
    EXPECT_EQ(decode_split_rows(1, 6, 1), 1);
  }
  expect_refused("MIXBENCH_DECODE_SPLIT_BY", {"", "q", "heads"}, [] { return decode_split_rows(1, 2, 1); },
                 "MIXBENCH_DECODE_SPLIT_BY must be auto, kv or query, not '{}'");
  expect_refused("MIXBENCH_DECODE_ARGMAX_KERNEL", {"on", "", "2"}, decode_argmax_kernel_enabled,
                 "MIXBENCH_DECODE_ARGMAX_KERNEL must be 0 or 1, not '{}'");
  expect_refused("MIXBENCH_DECODE_GEMV_ROWS", {"9", "-1", "2.5", "", "eight", "08"}, decode_gemv_max_rows,
                 "MIXBENCH_DECODE_GEMV_ROWS must be a whole number of rows in 0..8, not '{}'");
}

#if defined(MIXBENCH_WITH_CUDA)
TEST(DecodeFused, SplitsFillTheGpuAndKeepTheShortestSplit) {
  // d12 at batch 1 (6 KV heads, 132 multiprocessors): a 1K cache in 16 splits of 64 slots, or 64 of 16
  EXPECT_EQ(attn_decode_cuda::choose_splits(1, 6, 1024, 132, 64), 16);
  EXPECT_EQ(attn_decode_cuda::choose_splits(1, 6, 1024, 132, 16), 64);
  EXPECT_EQ(attn_decode_cuda::choose_splits(1, 6, 1024, 132, 256), 4);
  // a long cache: about eight blocks per multiprocessor whatever the shortest split
  EXPECT_EQ(attn_decode_cuda::choose_splits(1, 6, 32768, 132, 16), 176);
  EXPECT_EQ(attn_decode_cuda::choose_splits(8, 6, 32768, 132, 64), 22);
  // never fewer than one, never more than 1024
  EXPECT_EQ(attn_decode_cuda::choose_splits(64, 64, 8, 132, 16), 1);
  EXPECT_EQ(attn_decode_cuda::choose_splits(1, 1, 1 << 20, 4096, 16), 1024);
}
#endif

TEST(DecodeFused, RejectsAMixWithoutItsInputs) {
  const at::Tensor x = at::randn({1, 1, 8});
  EXPECT_THROW(residual_norm(x, at::Tensor(), ResidualMix::Scaled, at::Tensor(), at::ones({1}), x), std::invalid_argument);
  EXPECT_THROW(residual_norm(x, at::Tensor(), ResidualMix::Backout, at::Tensor(), at::ones({1}), at::Tensor()),
               std::invalid_argument);
  EXPECT_THROW(embed_smear_step(at::randn({5, 8}), at::zeros({1, 2}, at::kLong), at::randn({1, 4}), at::ones({1}),
                                at::zeros({1, 1, 8})),
               InputError);
  EXPECT_THROW(residual_norm_linear(x, at::Tensor(), ResidualMix::Scaled, at::Tensor(), at::ones({1}), x, false,
                                    at::randn({4, 8}), true),
               std::invalid_argument);
  // a weight whose K is not x's
  EXPECT_THROW(residual_norm_linear(x, at::Tensor(), ResidualMix::None, {}, {}, {}, false, at::randn({4, 7}), false),
               InputError);
  EXPECT_THROW(linear_rows(at::randn({1, 1, 8}), at::randn({4, 7})), InputError);
  EXPECT_THROW(linear_relu_square(at::randn({1, 1, 8}), at::randn({4, 7})), InputError);
  EXPECT_THROW(linear_rows(at::randn({1, 1, 8}), at::randn({8})), InputError);
}

// ------------------------------------------------------------------------------------------- GPU

at::Tensor cuda(const at::Tensor& t, at::ScalarType dt) { return t.to(at::kCUDA, dt); }
// `name` built at `config` (seed `seed`, fp32 init) with its parameters moved to the GPU in bf16.
Model bf16_cuda_model(const std::string& name, const std::string& config, uint64_t seed, at::Generator& gen) {
  const MethodSpec& m = Registry::get().method(name);
  gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  Model model = build_model(m, m.config.parse(config), gen, at::TensorOptions().dtype(at::kFloat), true);
  TensorMap moved;
  for (const auto& [n, p] : model.params) moved.set(n, p.to(at::kCUDA, at::kBFloat16));
  model.params = moved;
  return model;
}
at::Tensor f64(const at::Tensor& t) { return t.detach().to(at::kCPU, at::kDouble); }
at::Tensor d64(const at::Tensor& t) { return t.to(at::kDouble); }

TEST(DecodeFusedCuda, ResidualNormMatchesFp64AndTheUnfusedPath) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  c10::NoGradGuard ng;
  at::manual_seed(32);
  for (auto dt : {at::kFloat, at::kBFloat16, at::kHalf})
    for (int64_t D : {1, 7, 24, 255, 256, 257, 768, 1000, 4099, 8192})
      for (int64_t rows : {1, 3, 8})
        for (ResidualMix mix : {ResidualMix::None, ResidualMix::Scaled, ResidualMix::Backout})
          for (bool with_y : {false, true}) {
            const at::Tensor x = cuda(at::randn({rows, 1, D}), dt), y = with_y ? cuda(at::randn({rows, 1, D}), dt) : at::Tensor(),
                             z = cuda(at::randn({rows, 1, D}), dt);
            // a, b: one element of a per-step vector (a view), as the stream passes them
            const at::Tensor a = cuda(1.0 + 0.25 * at::randn({5}), dt)[2], b = cuda(0.5 + 0.25 * at::randn({1}), dt);
            const bool scaled = mix == ResidualMix::Scaled, any = mix != ResidualMix::None;
            const at::Tensor ua = scaled ? a : at::Tensor(), ub = any ? b : at::Tensor(), uz = any ? z : at::Tensor();
            const ResidualNorm got = residual_norm(x, y, mix, ua, ub, uz, /*keep_sum=*/true);
            ASSERT_EQ(got.residual.scalar_type(), dt);
            ASSERT_EQ(got.normed.sizes(), x.sizes());
            // float64 on the CPU at the rounded inputs
            const ResidualNorm ref = residual_norm(f64(x), with_y ? f64(y) : at::Tensor(), mix, scaled ? f64(a) : at::Tensor(),
                                                   any ? f64(b) : at::Tensor(), any ? f64(z) : at::Tensor(), true);
            // LibTorch's unfused path in the same dtype on the GPU
            const ResidualNorm lt = unfused_residual_norm(x, y, mix, a, b, z);
            const std::string where = fmt::format("{} D{} rows{} {} y={}", c10::toString(dt), D, rows, mix_name(mix), with_y);
            const double tol = dt == at::kFloat ? 2e-6 : dt == at::kHalf ? 2e-3 : 1e-2;
            EXPECT_LE(rel_rms(ref.residual, got.residual), tol) << where << " residual";
            EXPECT_LE(rel_rms(ref.normed, got.normed), tol) << where << " normed";
            EXPECT_LE(rel_rms(ref.sum, got.sum), tol) << where << " sum";
            EXPECT_LE(rel_rms(lt.residual, got.residual), tol) << where << " residual vs unfused";
            EXPECT_LE(rel_rms(lt.normed, got.normed), tol) << where << " normed vs unfused";
            // the normed rows have unit RMS (rows wide enough that eps does not show)
            if (D >= 24) {
              const at::Tensor ms = f64(got.normed).pow(2).mean(-1);
              EXPECT_LE((ms - 1).abs().max().item<double>(), dt == at::kFloat ? 1e-4 : 3e-2) << where;
            }
          }
  // a strided x (a view) is read through a contiguous copy
  const at::Tensor big = at::randn({3, 2, 64}, at::TensorOptions().device(at::kCUDA));
  const at::Tensor xv = big.slice(1, 1, 2);
  const ResidualNorm got = residual_norm(xv, at::Tensor(), ResidualMix::None, {}, {}, {});
  EXPECT_LE(rel_rms(residual_norm(f64(xv), at::Tensor(), ResidualMix::None, {}, {}, {}).normed, got.normed), 2e-6);
}

// residual_norm with a GEMV of its normed rows in the same launch (relu² after it: the MLP's c_fc; none:
// a mixer's input projection, with the normed rows written too) against the kernels one after the
// other (residual_norm, then linear_relu_square or linear_rows on its normed rows): the same
// statistics and the same per-warp products, so the same values bit for bit; the rows the fused
// kernel does not take (more than 8, or more than 12000 numbers in all) go through those ops.
TEST(DecodeFusedCuda, ResidualNormWithAGemvIsTheKernelsOneAfterTheOther) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  c10::NoGradGuard ng;
  at::manual_seed(37);
  for (const bool relu2 : {true, false})
    for (auto dt : {at::kFloat, at::kBFloat16, at::kHalf})
      for (auto [D, N] : {std::pair<int64_t, int64_t>{7, 5}, {24, 40}, {768, 3072}, {1000, 97}, {1500, 33}, {2048, 64}})
        for (int64_t rows : {1, 3, 8, 9})
          for (ResidualMix mix : {ResidualMix::None, ResidualMix::Scaled, ResidualMix::Backout}) {
            const bool with_y = rows != 3;
            const at::Tensor x = cuda(at::randn({rows, 1, D}), dt), y = with_y ? cuda(at::randn({rows, 1, D}), dt) : at::Tensor(),
                             z = cuda(at::randn({rows, 1, D}), dt), W = cuda(at::randn({N, D}) / std::sqrt(double(D)), dt);
            const at::Tensor a = cuda(1.0 + 0.25 * at::randn({5}), dt)[2], b = cuda(0.5 + 0.25 * at::randn({1}), dt);
            const bool scaled = mix == ResidualMix::Scaled, any = mix != ResidualMix::None;
            const at::Tensor ua = scaled ? a : at::Tensor(), ub = any ? b : at::Tensor(), uz = any ? z : at::Tensor();
            const ResidualNorm got = residual_norm_linear(x, y, mix, ua, ub, uz, /*keep_sum=*/true, W, relu2, !relu2);
            const ResidualNorm two = residual_norm(x, y, mix, ua, ub, uz, true);
            const at::Tensor h = relu2 ? linear_relu_square(two.normed, W) : linear_rows(two.normed, W);
            const std::string where = fmt::format("{} {} D{} N{} rows{} {} y={}", relu2 ? "relu²" : "plain", c10::toString(dt),
                                                  D, N, rows, mix_name(mix), with_y);
            ASSERT_EQ(got.out.sizes(), (at::IntArrayRef{rows, 1, N})) << where;
            EXPECT_TRUE(at::equal(got.residual, two.residual)) << where << " residual";
            EXPECT_TRUE(at::equal(got.sum, two.sum)) << where << " sum";
            EXPECT_TRUE(at::equal(got.out, h)) << where << " the GEMV: max diff "
                                               << (f64(got.out) - f64(h)).abs().max().item<double>();
            if (relu2) {
              EXPECT_FALSE(got.normed.defined()) << where;
            } else {
              ASSERT_TRUE(got.normed.defined()) << where;
              EXPECT_TRUE(at::equal(got.normed, two.normed)) << where << " normed";
            }
            // and near float64 (a non-trivial case: some relu² outputs positive)
            const at::Tensor n64 = residual_norm(f64(x), with_y ? f64(y) : at::Tensor(), mix, scaled ? f64(a) : at::Tensor(),
                                                 any ? f64(b) : at::Tensor(), any ? f64(z) : at::Tensor())
                                       .normed;
            const at::Tensor p64 = at::linear(n64, f64(W)), ref = relu2 ? at::relu(p64).square() : p64;
            EXPECT_LE(rel_rms(ref, got.out), dt == at::kFloat ? 1e-5 : dt == at::kHalf ? 5e-3 : 3e-2) << where;
            if (relu2) EXPECT_GT(f64(got.out).gt(0).to(at::kDouble).mean().item<double>(), 0.1) << where;
          }
}

// MIXBENCH_DECODE_GEMV_ROWS=0: the ops take LibTorch's path (residual_norm, then the GEMM through
// at::linear) on the GPU too, so their values are that path's bit for bit.
TEST(DecodeFusedCuda, GemvRowsZeroTakesTheGemm) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  c10::NoGradGuard ng;
  at::manual_seed(41);
  mixbench_test::EnvGuard env("MIXBENCH_DECODE_GEMV_ROWS", "0");
  for (auto dt : {at::kFloat, at::kBFloat16})
    for (int64_t rows : {1, 8}) {
      const at::Tensor x = cuda(at::randn({rows, 1, 768}), dt), y = cuda(at::randn({rows, 1, 768}), dt),
                       W = cuda(at::randn({3072, 768}) / 28.0, dt), W2 = cuda(at::randn({768, 3072}) / 55.0, dt);
      const ResidualNorm two = residual_norm(x, y, ResidualMix::None, {}, {}, {});
      const at::Tensor gemm = at::linear(two.normed, W);
      const std::string where = fmt::format("{} rows{}", c10::toString(dt), rows);
      EXPECT_TRUE(at::equal(residual_norm_linear(x, y, ResidualMix::None, {}, {}, {}, false, W, false).out, gemm)) << where;
      EXPECT_TRUE(at::equal(linear_relu_square(two.normed, W), relu_square(gemm))) << where;
      EXPECT_TRUE(at::equal(linear_rows(gemm, W2), at::linear(gemm, W2))) << where;
    }
}

// The captured step's own kernels as programmatic dependent launches (each waits for the kernel
// before it to complete, then lets the next one be scheduled) against ordinary launches: the same
// kernels on the same inputs, so the same logits bit for bit at every step; a kernel reading its
// predecessor's output before that output is complete would not reproduce them.
TEST(DecodeFusedCuda, ProgrammaticLaunchesChangeNoValue) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  c10::NoGradGuard ng;
  mixbench_test::EnvGuard gemv("MIXBENCH_DECODE_GEMV_ROWS", "8");  // the GEMV kernels too (cuBLAS by default)
  for (const std::string name : {"dense_full", "gqa", "gdn", "mla"}) {
    at::Generator gen;
    const Model model = bf16_cuda_model(name, "n_layer=4,seq_len=256", 6, gen);
    const int64_t V = model.dims.vocab, Tp = 40, T = 72, B = 2;
    const at::Tensor idx = at::randint(V, {B, T}, gen, at::TensorOptions().dtype(at::kLong)).to(at::kCUDA);
    std::vector<std::vector<at::Tensor>> logits(2);
    for (int pdl = 0; pdl < 2; ++pdl) {
      mixbench_test::EnvGuard env("MIXBENCH_DECODE_PDL", pdl ? "1" : "0");
      ModelCache cache;
      model_prefill(model, idx.slice(1, 0, Tp), Backend::CUDA, &cache, T + 4);
      DecodeGraph g(model, cache, idx.slice(1, Tp, Tp + 1).contiguous());
      logits[pdl].push_back(g.logits().clone());
      for (int64_t t = Tp + 1; t < T; ++t) {
        g.input().copy_(idx.slice(1, t, t + 1));
        g.step();
        logits[pdl].push_back(g.logits().clone());
      }
    }
    ASSERT_EQ(logits[0].size(), logits[1].size());
    for (size_t i = 0; i < logits[0].size(); ++i)
      EXPECT_TRUE(at::equal(logits[0][i], logits[1][i])) << name << " step " << i << ": max diff "
                                                         << (logits[0][i] - logits[1][i]).abs().max().item<double>();
  }
}

TEST(DecodeFused, EmbedSmearRefusesAGateWiderThanTheModel) {
  c10::NoGradGuard ng;
  const auto lng = at::TensorOptions().dtype(at::kLong);
  at::Tensor prev = at::randn({1, 1, 24});
  // the gate reads the first G channels of the embedding: G = 32 > d = 24 is refused, G = 24 is not
  EXPECT_THROW(embed_smear_step(at::randn({97, 24}), at::zeros({1, 1}, lng), at::randn({1, 32}), at::ones({1}), prev),
               InputError);
  EXPECT_NO_THROW(embed_smear_step(at::randn({97, 24}), at::zeros({1, 1}, lng), at::randn({1, 24}), at::ones({1}), prev));
}

TEST(DecodeFusedCuda, EmbedSmearMatchesFp64AndReplacesThePreviousEmbedding) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  c10::NoGradGuard ng;
  at::manual_seed(33);
  for (auto dt : {at::kFloat, at::kBFloat16, at::kHalf})
    for (int64_t D : {24, 25, 130, 768, 1031})
      for (int64_t G : {1, 24, 32})
        for (int64_t B : {1, 3}) {
          const int64_t V = 97;
          if (G > D) continue;  // the gate reads the first G channels (refused: the CPU test below)
          // the gate's dot product O(1): σ away from 0 and 1
          const at::Tensor wte = cuda(at::randn({V, D}), dt), w = cuda(at::randn({1, G}) / std::sqrt(double(G)), dt),
                           lam = cuda(0.5 + at::rand({1}), dt);
          const at::Tensor idx = at::randint(V, {B, 1}, at::TensorOptions().dtype(at::kLong)).to(at::kCUDA);
          const at::Tensor prev0 = cuda(at::randn({B, 1, D}), dt);
          // value-embedding tables gathered in the same launch: none, one, several of odd widths
          std::vector<at::Tensor> tables;
          for (int64_t t = 0; t < G % 3; ++t) tables.push_back(cuda(at::randn({V, 7 + 64 * t}), dt));
          at::Tensor prev = prev0.clone();
          const EmbedStep step = embed_smear_step(wte, idx, w, lam, prev, tables);
          const at::Tensor got = step.x;
          ASSERT_EQ(step.gathered.size(), tables.size());
          for (size_t t = 0; t < tables.size(); ++t)
            EXPECT_TRUE(at::equal(step.gathered[t], at::embedding(tables[t], idx))) << "table " << t;
          at::Tensor pref = f64(prev0);
          const at::Tensor ref = embed_smear_step(f64(wte), idx.cpu(), f64(w), f64(lam), pref).x;
          at::Tensor prev_lt = prev0.clone();  // LibTorch's unfused ops in the same dtype
          const at::Tensor e = backbone_rms_norm(at::embedding(wte, idx));
          const at::Tensor lt = e + lam * at::sigmoid(at::linear(e.slice(2, 0, G), w)) * prev_lt;
          const std::string where = fmt::format("{} D{} G{} B{}", c10::toString(dt), D, G, B);
          const double tol = dt == at::kFloat ? 2e-6 : dt == at::kHalf ? 2e-3 : 1e-2;
          ASSERT_EQ(got.sizes(), prev0.sizes()) << where;
          EXPECT_LE(rel_rms(ref, got), tol) << where << " x";
          EXPECT_LE(rel_rms(pref, prev), tol) << where << " prev";
          EXPECT_LE(rel_rms(lt, got), tol) << where << " x vs unfused";
          EXPECT_LE(rel_rms(e, prev), tol) << where << " prev vs unfused";
          // the smear matters: the result is not the embedding alone
          EXPECT_GT(rel_rms(e, got), 1e-3) << where;
        }
}

TEST(DecodeFusedCuda, SoftcapMatchesTheUnfusedPathAndAdvancesThePosition) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  c10::NoGradGuard ng;
  at::manual_seed(34);
  for (auto dt : {at::kFloat, at::kBFloat16, at::kHalf})
    for (int64_t n : {1, 97, 32771}) {
      const at::Tensor l = cuda(30 * at::randn({2, 1, n}), dt);
      const at::Tensor pos = at::full({1}, 41, at::TensorOptions().dtype(at::kLong).device(at::kCUDA));
      const at::Tensor got = softcap_logits(l, 15.0, pos);
      ASSERT_EQ(got.scalar_type(), at::kFloat);
      const at::Tensor ref = 15.0 * at::tanh(f64(l) / 15.0);
      const at::Tensor lt = 15.0 * at::tanh(l.to(at::kFloat) / 15.0);
      const std::string where = fmt::format("{} n{}", c10::toString(dt), n);
      EXPECT_LE(rel_rms(ref, got), 1e-6) << where;
      EXPECT_LE(rel_rms(lt, got), 1e-6) << where;
      EXPECT_EQ(pos.item<int64_t>(), 42) << where;
      (void)softcap_logits(l, 15.0);
      EXPECT_EQ(pos.item<int64_t>(), 42) << where << ": no position, no advance";
    }
}

TEST(DecodeFusedCuda, GemvKernelsMatchFp64AndTheUnfusedPath) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  c10::NoGradGuard ng;
  at::manual_seed(35);
  for (const bool relu2 : {true, false})  // linear_relu_square, and linear_rows: the same GEMV without the activation
    for (auto dt : {at::kFloat, at::kBFloat16, at::kHalf})
      for (int64_t rows : {1, 3, 8, 9})  // 9: more rows than the kernel takes (the GEMM and relu²)
        for (auto [N, K] : {std::pair<int64_t, int64_t>{1, 7}, {5, 64}, {97, 1001}, {3072, 768}, {768, 3072}, {40, 24}, {33, 5000}}) {
          // x [rows, 1, K] as the MLP sees it; W scaled so that h is O(1)
          const at::Tensor x = cuda(at::randn({rows, 1, K}), dt), W = cuda(at::randn({N, K}) / std::sqrt(double(K)), dt);
          const at::Tensor got = relu2 ? linear_relu_square(x, W) : linear_rows(x, W);
          ASSERT_EQ(got.sizes(), (at::IntArrayRef{rows, 1, N}));
          ASSERT_EQ(got.scalar_type(), dt);
          const at::Tensor ref64 = at::linear(f64(x), f64(W)), lt64 = at::linear(x, W);
          const at::Tensor ref = relu2 ? at::relu(ref64).square() : ref64, lt = relu2 ? relu_square(lt64) : lt64;
          const std::string where = fmt::format("{} {} rows{} N{} K{}", relu2 ? "relu²" : "plain", c10::toString(dt), rows, N, K);
          const double tol = dt == at::kFloat ? 1e-5 : dt == at::kHalf ? 3e-3 : 2e-2;
          EXPECT_LE(rel_rms(ref, got), tol) << where;
          EXPECT_LE(rel_rms(lt, got), tol) << where << " vs unfused";
          if (!relu2) continue;
          if (got.numel() >= 64)
            EXPECT_GT(f64(got).gt(0).to(at::kDouble).mean().item<double>(), 0.2) << where << ": a non-trivial case";
          EXPECT_EQ(f64(got).lt(0).sum().item<int64_t>(), 0) << where << ": relu² is never negative";
        }
  // a view of x at an odd offset takes the unpacked loads
  const at::Tensor big = at::randn({1, 1, 65}, at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16));
  const at::Tensor W = at::randn({33, 64}, big.options()) / 8.0;
  const at::Tensor xv = big.narrow(2, 1, 64);
  EXPECT_LE(rel_rms(at::relu(at::linear(f64(xv), f64(W))).square(), linear_relu_square(xv, W)), 2e-2);
  EXPECT_LE(rel_rms(at::linear(f64(xv), f64(W)), linear_rows(xv, W)), 2e-2);
}

// gdn's decode step after its GEMM (gdn_static_step: conv step, L2 norms, the value embedding's
// gate, the gated delta step and the gated output norm) against the same function's unfused ops in
// float64 on the GPU, from the same cache: the output, the state, the conv tail and the position.
TEST(DecodeFusedCuda, GdnStepMatchesFp64) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  c10::NoGradGuard ng;
  at::manual_seed(36);
  struct Case {
    int64_t B, H, K, V, W;
    bool ve;
  };
  for (auto dt : {at::kFloat, at::kBFloat16})
    for (const Case& k : {Case{1, 6, 128, 128, 4, true}, Case{3, 4, 64, 32, 4, false}, Case{2, 3, 256, 64, 2, true},
                          Case{2, 2, 16, 48, 3, true}, Case{1, 1, 40, 200, 4, false}}) {
      const int64_t dm = 96, HK = k.H * k.K, HV = k.H * k.V, C = 2 * HK + HV, N = C + 2 * k.H + HV + (k.ve ? k.H : 0);
      const linear::DeltaDims d{dm, k.H, k.K, k.V, k.W, 1e-5};
      const auto opts = at::TensorOptions().device(at::kCUDA).dtype(dt), f32 = opts.dtype(at::kFloat);
      TensorMap in{{"x", at::randn({k.B, 1, dm}, opts)}};
      if (k.ve) in.set("ve", at::randn({k.B, 1, HV}, opts));
      const at::Tensor norm_w = 1.0 + 0.25 * at::randn({k.V}, opts);
      const at::Tensor w_proj = at::randn({N, dm}, opts) / std::sqrt(double(dm)), w_conv = 0.5 * at::randn({C, k.W}, opts);
      const at::Tensor tail = at::randn({k.B, k.W - 1, C}, opts), S0 = 0.1 * at::randn({k.B, k.H, k.K, k.V}, f32);
      const at::Tensor neg_a = -at::rand({k.H}, f32).mul(2.0).exp(), dt_bias = at::randn({k.H}, f32) - 3.0;
      auto make_cache = [&](at::ScalarType t, at::ScalarType state_t) {
        TensorMap c;
        c.set("pos_dev", at::zeros({1}, opts.dtype(at::kLong)));
        c.set("capacity", at::scalar_tensor(int64_t(64), at::TensorOptions().dtype(at::kLong)));
        c.set("state", S0.to(state_t).clone());
        c.set("w.in", w_proj.to(t));
        c.set("w.conv", w_conv.to(t));
        c.set("qkv_tail", tail.to(t).clone());
        c.set("w.neg_a", neg_a.to(state_t));
        c.set("w.dt_bias", dt_bias.to(state_t));
        set_cache_pos(c, 5);
        return c;
      };
      TensorMap cache = make_cache(dt, at::kFloat);
      const at::Tensor o = linear::gdn_static_step(in, d, cache, norm_w, d.eps, Backend::CUDA);
      TensorMap in64;
      for (const auto& [n, t] : in) in64.set(n, t.to(at::kDouble));
      TensorMap ref = make_cache(at::kDouble, at::kDouble);
      const at::Tensor o_ref = linear::gdn_static_step(in64, d, ref, norm_w.to(at::kDouble), d.eps, Backend::CUDA);
      const std::string where = fmt::format("{} B{} H{} K{} V{} W{} ve={}", c10::toString(dt), k.B, k.H, k.K, k.V, k.W, k.ve);
      ASSERT_EQ(o.sizes(), (at::IntArrayRef{k.B, 1, k.H, k.V})) << where;
      ASSERT_EQ(o.scalar_type(), dt) << where;
      const double tol = dt == at::kFloat ? 1e-5 : 2e-2;
      EXPECT_LE(rel_rms(o_ref, o), tol) << where << " o";
      EXPECT_LE(rel_rms(ref.at("state"), cache.at("state")), dt == at::kFloat ? 1e-6 : 1e-2) << where << " state";
      EXPECT_LE(rel_rms(ref.at("qkv_tail"), cache.at("qkv_tail")), dt == at::kFloat ? 1e-6 : 1e-2) << where << " tail";
      EXPECT_EQ(cache_pos(cache), 6) << where;
      EXPECT_GT(rel_rms(d64(S0), ref.at("state")), 1e-3) << where << ": the state moved";
    }
}

// The split-KV decode attention merges its splits in its one launch (the last block of each row and
// head group): many splits, GQA groups, repeated launches on the same arrival counters (each launch
// must leave them zero), contexts shorter than the cache (fewer splits filled than launched), against
// the masked reference; one kernel node when captured.
TEST(DecodeFusedCuda, SplitKvAttentionMergesInItsOneLaunch) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  c10::NoGradGuard ng;
  at::manual_seed(37);
  for (auto dt : {at::kFloat, at::kBFloat16})
    for (auto [B, H, Hkv, D, cap] : {std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>{1, 6, 6, 128, 4096},
                                     {2, 8, 2, 64, 1000}, {3, 12, 1, 256, 300}, {1, 16, 2, 128, 70}}) {
      const auto opts = at::TensorOptions().device(at::kCUDA).dtype(dt);
      const at::Tensor q = at::randn({B, H, D}, opts), K = at::randn({B, cap, Hkv, D}, opts), V = at::randn({B, cap, Hkv, D}, opts);
      // short contexts after full ones: the merge reads only the partials of the splits the live
      // context fills (the others still hold the longer launches')
      for (int64_t pos : {int64_t(0), cap / 3, cap - 1, cap + 5, int64_t(1), cap / 7, int64_t(40)}) {
        const at::Tensor pd = at::full({1}, pos, opts.dtype(at::kLong));
        const double scale = 1.0 / std::sqrt(double(D));
        const at::Tensor ref = attention_decode_static_reference(d64(q), d64(K), d64(V), pd, scale, 0.0);
        const at::Tensor first = attention_decode_static(q, K, V, pd, scale, 0.0);
        const std::string where = fmt::format("{} B{} H{} Hkv{} D{} cap{} pos{}", c10::toString(dt), B, H, Hkv, D, cap, pos);
        EXPECT_LE(rel_rms(ref, first), dt == at::kFloat ? 1e-5 : 1e-2) << where;
        for (int rep = 0; rep < 3; ++rep)  // the same counters again: the same merge, bit for bit
          EXPECT_TRUE(at::equal(first, attention_decode_static(q, K, V, pd, scale, 0.0))) << where << " rep " << rep;
      }
    }
  // captured: one kernel
  const auto opts = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  const at::Tensor q = at::randn({1, 6, 128}, opts), K = at::randn({1, 1024, 6, 128}, opts), V = at::randn_like(K);
  const at::Tensor pd = at::full({1}, 700, opts.dtype(at::kLong));
  at::Tensor out;
  CapturedWork w(-1);
  auto work = [&] { out = attention_decode_static(q, K, V, pd, 0.088, 0.0); };
  w.run(work);
  const at::Tensor eager = out.clone();
  w.capture(work);
  EXPECT_EQ(w.nodes().kernels, 1);
  w.replay();
  EXPECT_TRUE(at::equal(eager, out));
}

// The captured decode step of the gpu-d12 model (bf16, batch 1 and 8, a short prompt): its kernels per
// token, printed by name and held to bounds, and its logits against the eager (unfused) step's.
// Per step dense_full runs no cuBLAS GEMM and 77 other launches, all kernels (the embedding; per layer
// the mixer's residual norm with its q|k|v GEMV in one launch, the q/k/v step, the split-KV
// attention, the output projection's GEMV, the MLP's residual norm with c_fc and relu² in one launch
// and c_proj's GEMV; the final norm, the head's GEMV, the softcap and the greedy token, which the
// kernel stores into the step's input itself); gdn as many (its joint projection's GEMV with the norm, the conv step
// and the gdn step in place of the q|k|v GEMV, the q/k/v step and the attention; o_proj's GEMV). A
// GEMM may take a second kernel (a split-K reduction): the bound on all kernels allows one per GEMM.
TEST(DecodeFusedCuda, CapturedD12StepLaunchesFewKernels) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  c10::NoGradGuard ng;
  struct Expect {
    std::string method;
    int64_t gemms, others;
  };
  // the step with every product through the GEMV kernels (cuBLAS is the default)
  mixbench_test::EnvGuard gemv("MIXBENCH_DECODE_GEMV_ROWS", "8");
  for (const Expect& e : {Expect{"dense_full", 0, 77}, Expect{"gdn", 0, 77}})
    for (const int64_t B : {1, 8}) {  // up to 8 rows take the same GEMV kernels: the same launches
      const std::string name = fmt::format("{} B{}", e.method, B);
      at::Generator gen;
      const Model model = bf16_cuda_model(e.method, "n_layer=12,seq_len=2048", 4, gen);
      const int64_t V = model.dims.vocab, Tp = 16, T = 24;
      const at::Tensor idx = at::randint(V, {B, T}, gen, at::TensorOptions().dtype(at::kLong)).to(at::kCUDA);
      ModelCache eager;
      model_prefill(model, idx.slice(1, 0, Tp), Backend::CUDA, &eager);
      std::vector<at::Tensor> want;
      for (int64_t t = Tp; t < T; ++t) want.push_back(model_decode_step(model, idx.slice(1, t, t + 1), eager, Backend::CUDA));
      ModelCache cache;
      model_prefill(model, idx.slice(1, 0, Tp), Backend::CUDA, &cache, 1024);
      DecodeGraph g(model, cache, idx.slice(1, Tp, Tp + 1).contiguous());
      const GraphNodes n = g.nodes();
      std::map<std::string, int> by_name;
      int64_t unnamed = 0, gemm_like = 0;
      for (const std::string& k : n.kernel_names) {
        ++by_name[k.empty() ? "(unnamed)" : k];
        std::string low = k;
        for (char& c : low) c = char(std::tolower(static_cast<unsigned char>(c)));
        if (k.empty()) ++unnamed;
        else if (low.find("gemm") != std::string::npos || low.find("gemv") != std::string::npos ||
                 low.find("cutlass") != std::string::npos || low.find("xmma") != std::string::npos ||
                 low.find("splitk") != std::string::npos || low.find("cublas") != std::string::npos)
          ++gemm_like;
      }
      std::cout << fmt::format("{} d12 bf16: captured step of {} kernels ({} GEMM-like, {} unnamed), {} memsets, {} memcpys, "
                               "{} other nodes; expected {} GEMMs + {} others\n",
                               name, n.kernels, gemm_like, unnamed, n.memsets, n.memcpys, n.other, e.gemms, e.others);
      for (const auto& [k, c] : by_name) std::cout << fmt::format("  {:>4} × {}\n", c, k.substr(0, 160));
      EXPECT_GT(n.kernels, 12) << name << ": at least one kernel per layer";
      EXPECT_LE(n.launches(), e.gemms * 2 + e.others) << name;
      if (unnamed == 0) EXPECT_LE(n.kernels - gemm_like, e.others) << name << ": kernels other than the GEMMs";
      EXPECT_LE(gemm_like + unnamed, 2 * e.gemms) << name << ": GEMM launches (cuBLAS kernels are unnamed)";
      // twelve bf16 layers of roundings that differ between the fused and unfused steps (the four-layer
      // check in DecodeCuda.CapturedStepsMatchEagerSteps holds 3e-2)
      const double tol = 5e-2;
      EXPECT_LE(rel_rms(want[0], g.logits()), tol) << name << " warm-up step";
      for (int64_t t = Tp + 1; t < T; ++t) {
        g.input().copy_(idx.slice(1, t, t + 1));
        g.step();
        EXPECT_LE(rel_rms(want[size_t(t - Tp)], g.logits()), tol) << name << " t=" << t;
      }
      EXPECT_EQ(cache.pos_dev.item<int64_t>(), T) << name << ": the softcap's launch advances the position once per step";
      EXPECT_EQ(n.memcpys, 0) << name << ": the greedy token is stored by its kernel, not copied";
    }
}

// Rows of logits with ties, NaN and -inf in their awkward places, of lengths that do and do not fill
// the kernel's blocks: the greedy tokens of the one-launch kernel are at::argmax's, for every dtype,
// again and again on the same counters, and captured in a graph; the switch to at::argmax gives the same.
TEST(DecodeFusedCuda, GreedyTokensAreTheArgmax) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  c10::NoGradGuard ng;
  at::manual_seed(41);
  for (auto dt : {at::kFloat, at::kBFloat16, at::kHalf})
    for (auto [B, V] : {std::pair<int64_t, int64_t>{1, 1}, {1, 37}, {3, 2048}, {8, 65536}, {2, 50257}, {5, 300000}}) {
      const auto opts = at::TensorOptions().device(at::kCUDA).dtype(dt);
      at::Tensor l = at::randn({B, 1, V}, opts);
      if (V > 100) {
        // row 0: a new maximum twice (at 5 and near the end, in another block); row 1: a NaN in the
        // middle; the last row only -inf
        const at::Tensor mx = l[0].max();
        l.index_put_({0, 0, V - 3}, mx + 1);
        l.index_put_({0, 0, 5}, mx + 1);
        if (B > 1) l.index_put_({1, 0, V / 2}, NAN);
        if (B > 2) l[B - 1].fill_(-INFINITY);
      }
      const at::Tensor want = l.argmax(-1);
      at::Tensor got = at::full({B, 1}, -7, opts.dtype(at::kLong));
      GreedyScratch scratch;
      const std::string where = fmt::format("{} B{} V{}", c10::toString(dt), B, V);
      for (int rep = 0; rep < 3; ++rep) {
        greedy_tokens_into(l, got, scratch);
        EXPECT_TRUE(at::equal(want, got)) << where << " rep " << rep << ": " << want.flatten().slice(0, 0, 4) << " vs "
                                          << got.flatten().slice(0, 0, 4);
      }
      if (V > 100) {
        EXPECT_EQ(got[0].item<int64_t>(), 5) << where << ": the first of the equal maxima";
        if (B > 1) EXPECT_EQ(got[1].item<int64_t>(), V / 2) << where << ": NaN above every number";
        if (B > 2) EXPECT_EQ(got[B - 1].item<int64_t>(), 0) << where << ": a row of -inf";
      }
      EXPECT_EQ(scratch.counters.cpu().abs().sum().item<int64_t>(), 0) << where << ": the launches leave the counters zero";
      mixbench_test::EnvGuard off("MIXBENCH_DECODE_ARGMAX_KERNEL", "0");
      at::Tensor aten = at::full({B, 1}, -7, opts.dtype(at::kLong));
      GreedyScratch unused;
      greedy_tokens_into(l, aten, unused);
      EXPECT_TRUE(at::equal(want, aten)) << where << " through at::argmax";
      EXPECT_FALSE(unused.counters.defined()) << where;
    }
  // captured: one kernel node and no copy
  const at::Tensor l = at::randn({4, 1, 65536}, at::TensorOptions().device(at::kCUDA));
  at::Tensor out = at::zeros({4, 1}, l.options().dtype(at::kLong));
  GreedyScratch scratch;
  CapturedWork w(-1);
  auto work = [&] { greedy_tokens_into(l, out, scratch); };
  w.run(work);
  out.zero_();
  w.capture(work);
  EXPECT_EQ(w.nodes().kernels, 1);
  EXPECT_EQ(w.nodes().memcpys, 0);
  w.replay();
  EXPECT_TRUE(at::equal(out, l.argmax(-1)));
}

// The greedy tokens on the CPU (at::argmax and a copy) and what they refuse: an out of another
// dtype, size or layout is an InputError naming what it takes.
TEST(DecodeFused, GreedyTokensIntoTakeArgmaxAndRefuseABadOut) {
  const at::Tensor l = at::tensor({0.5f, 2.f, 2.f, -1.f, NAN, 3.f}).view({2, 1, 3});
  at::Tensor out = at::full({2, 1}, -1, at::kLong);
  GreedyScratch scratch;
  greedy_tokens_into(l, out, scratch);
  EXPECT_EQ(out[0].item<int64_t>(), 1);
  EXPECT_EQ(out[1].item<int64_t>(), 1);
  EXPECT_THROW(greedy_tokens_into(l, at::zeros({2, 1}, at::kInt), scratch), InputError);
  EXPECT_THROW(greedy_tokens_into(l, at::zeros({3}, at::kLong), scratch), InputError);
  EXPECT_THROW(greedy_tokens_into(l, at::zeros({2, 2}, at::kLong).slice(1, 0, 1), scratch), InputError);
  EXPECT_THROW(greedy_tokens_into(at::zeros({2, 0}), at::zeros({2}, at::kLong), scratch), InputError);
}

// Models of other depths through the fused step on the CPU: one layer (the backout is the last
// sublayer's sum, added at the finish), three layers (the backout inside), against the forward.
TEST(DecodeFused, StaticStepsMatchTheForwardAtAnyDepth) {
  c10::NoGradGuard ng;
  for (const std::string name : {"dense_full", "gdn"})
    for (int64_t L : {1, 2, 3}) {
      const MethodSpec& m = Registry::get().method(name);
      const Config cfg = m.config.parse(fmt::format("n_layer={},d_model=64,head_dim=16,seq_len=24,vocab=50", L));
      at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(12);
      const Model model = build_model(m, cfg, gen, at::TensorOptions().dtype(at::kDouble), true);
      const int64_t T = 12, Tp = 5;
      const at::Tensor idx = at::randint(50, {2, T}, gen, at::TensorOptions().dtype(at::kLong));
      const at::Tensor full = model_forward(model, idx, Backend::CPU);
      ModelCache cache;
      model_prefill(model, idx.slice(1, 0, Tp), Backend::CPU, &cache, T);
      for (int64_t t = Tp; t < T; ++t) {
        const at::Tensor lt = model_decode_step(model, idx.slice(1, t, t + 1), cache, Backend::CPU);
        EXPECT_LT(rel_rms(full.slice(1, t, t + 1), lt), 1e-10) << name << " L" << L << " t=" << t;
      }
      EXPECT_EQ(cache.pos_dev.item<int64_t>(), T) << name << " L" << L;
    }
}

}  // namespace
}  // namespace mixbench
