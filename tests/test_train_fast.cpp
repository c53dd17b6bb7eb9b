// Tests of the training step's GPU-facing parts, run on the CPU: the compute dtype (bf16 copies of
// fp32 master weights), deferred loss read-back, the batched Muon update, and MFU in the reports.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <filesystem>
#include <unistd.h>

#include "harness/cli/cli.h"
#include "harness/errors.h"
#include "harness/io.h"
#include "harness/report.h"
#include "harness/safetensors.h"
#include "mixers/common/layers.h"
#include "suites/mfu.h"
#include "suites/step_trace.h"
#include "suites/train.h"

namespace fs = std::filesystem;
using namespace mixbench;
using Json = nlohmann::json;

namespace {
TrainOptions tiny_run(const std::string& method, int64_t steps) {
  TrainOptions o;
  o.method = method;
  o.config = "n_layer=2,d_model=64,head_dim=32,seq_len=32";
  o.steps = steps;
  o.batch = 2;
  o.seed = 3;
  o.eval_every = steps;
  o.eval_batches = 1;
  o.probe_sequences = 0;
  return o;
}
fs::path tmp_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / fmt::format("mixbench_train_fast_{}_{}", ::getpid(), name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}
}  // namespace

// A stack of same-shape matrices updated at once equals each matrix updated alone (the GPU path
// batches Muon's matrices by shape; each keeps its own norms and second-moment buffer).
TEST(TrainFast, BatchedMuonEqualsOneMatrixAtATime) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const auto o = at::TensorOptions().dtype(at::kFloat);
  for (auto shape : {std::vector<int64_t>{24, 40}, std::vector<int64_t>{40, 24}}) {
    const int64_t n = 3;
    std::vector<int64_t> stack_shape = {n, shape[0], shape[1]};
    at::Tensor P = at::randn(stack_shape, gen, o), G = at::randn(stack_shape, gen, o) * at::arange(1, n + 1, o).view({n, 1, 1});
    at::Tensor B1 = at::randn(stack_shape, gen, o) * 0.1;
    at::Tensor B2 = shape[0] >= shape[1] ? at::rand({n, shape[0], 1}, gen, o) : at::rand({n, 1, shape[1]}, gen, o);
    at::Tensor P1 = P.clone(), B11 = B1.clone(), B21 = B2.clone();
    muon_update(P, G, B1, B2, 0.9, 0.02, 0.3, 0.95, false);
    for (int64_t k = 0; k < n; ++k) {
      at::Tensor p = P1[k].clone(), b1 = B11[k].clone(), b2 = B21[k].clone();
      muon_update(p, G[k], b1, b2, 0.9, 0.02, 0.3, 0.95, false);
      EXPECT_TRUE(at::allclose(P[k], p, 1e-5, 1e-6)) << k << " " << (P[k] - p).abs().max().item<double>();
      EXPECT_TRUE(at::allclose(B1[k], b1, 1e-6, 1e-7)) << k;
      EXPECT_TRUE(at::allclose(B2[k], b2, 1e-5, 1e-8)) << k;
    }
    // and the matrices differ from each other (a stack that ignored its batch dimension would not)
    EXPECT_GT((P[0] - P[2]).abs().max().item<double>(), 1e-3);
  }
}

// bf16 compute: the master weights and optimizer state stay fp32, the loss falls, the run differs
// from the fp32 run (it is another computation), and a checkpoint of one does not resume the other.
TEST(TrainFast, Bf16ComputeKeepsFp32MastersAndItsOwnCheckpoints) {
  TrainOptions f = tiny_run("dense", 6);
  TrainOptions b = f;
  b.dtype = "bf16";
  const fs::path dir = tmp_dir("bf16");
  b.out = dir.string();
  TrainResult rb = run_train(b);
  EXPECT_EQ(rb.dtype, "bf16");
  ASSERT_EQ(rb.losses.size(), 6u);
  EXPECT_LT(rb.losses.back(), rb.losses.front());
  SafetensorsFile ck = read_safetensors((dir / "checkpoint.safetensors").string());
  for (const auto& [n, t] : ck.tensors)
    if (n.rfind("param.", 0) == 0 || n.rfind("opt.m", 0) == 0) EXPECT_EQ(t.scalar_type(), at::kFloat) << n;
  TrainResult rf = run_train(f);
  EXPECT_EQ(rf.dtype, "fp32");
  EXPECT_NE(rf.losses.back(), rb.losses.back());
  EXPECT_NEAR(rf.losses.front(), rb.losses.front(), 0.05 * rf.losses.front());  // the same model, rounded
  TrainOptions resume_fp32 = f;
  resume_fp32.out = dir.string();
  resume_fp32.resume = true;
  EXPECT_THROW(run_train(resume_fp32), InputError);
  TrainOptions bad = f;
  bad.dtype = "fp16";
  EXPECT_THROW(run_train(bad), UsageError);
}

// Losses read back every few steps are still every step's loss, the same values as read every step.
TEST(TrainFast, SparseLogReadBackKeepsEveryLoss) {
  TrainOptions a = tiny_run("gdn", 5);
  TrainOptions b = a;
  b.log_every = 4;
  b.progress = 1;
  testing::internal::CaptureStdout();
  TrainResult rb = run_train(b);
  const std::string out = testing::internal::GetCapturedStdout();
  TrainResult ra = run_train(a);
  ASSERT_EQ(rb.losses.size(), 5u);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(ra.losses[i], rb.losses[i]) << i;
  // progress lines at step 4 (log_every) and 5 (the evaluation), none before
  size_t lines = 0;
  for (char c : out) lines += c == '\n';
  EXPECT_EQ(lines, 2u) << out;
  EXPECT_NE(out.find("\"step\":4"), std::string::npos) << out;
  EXPECT_NE(out.find("\"mfu\""), std::string::npos) << out;
}

// MFU: the train report carries the probe (device, dtype, rate) and mfu = FLOPs/token · tok/s ÷ rate.
TEST(TrainFast, ReportsCarryMfuAndTheMatmulProbe) {
  const MatmulPeak& p = matmul_peak("cpu", at::kFloat);
  EXPECT_GT(p.flop_per_s, 1e8);
  EXPECT_EQ(p.dtype, "fp32");
  EXPECT_FALSE(p.device_name.empty());
  EXPECT_EQ(&matmul_peak("cpu", at::kFloat), &p);  // measured once per process
  EXPECT_DOUBLE_EQ(mfu(1e6, 2e3, p), 2e9 / p.flop_per_s);
  EXPECT_EQ(mfu(0, 2e3, p), 0.0);

  const fs::path dir = tmp_dir("cli");
  ASSERT_EQ(run_cli({"train", "--method", "dense_full", "--config", "n_layer=2,d_model=64,head_dim=32,seq_len=32",
                     "--steps", "3", "--batch", "2", "--eval-batches", "1", "--probes", "0", "--out", dir.string(),
                     "--quiet"}),
            0);
  Json r = Json::parse(read_file((dir / "train.json").string()));
  EXPECT_TRUE(validate_json(r, report_schema()).empty()) << validate_json(r, report_schema())[0];
  const Json& res = r["results"][0];
  EXPECT_EQ(res["matmul_peak"]["device"], "cpu");
  EXPECT_EQ(res["dtype"], "fp32");
  EXPECT_EQ(res["master_dtype"], "fp32");
  const double expect = res["train_flops_per_token_nanochat"].get<double>() * res["tokens_per_s"].get<double>() /
                        res["matmul_peak"]["flop_per_s"].get<double>();
  EXPECT_GT(res["mfu"].get<double>(), 0.0);
  EXPECT_NEAR(res["mfu"].get<double>(), expect, 1e-12 * expect);
  EXPECT_EQ(run_cli({"train", "--method", "dense", "--dtype", "fp8"}), 2);
  EXPECT_EQ(run_cli({"train", "--method", "dense", "--log-every", "-1"}), 2);
}

// The trace summary: kernels sorted into kinds by name, summed by name and by launching operator,
// shares of the wall time.
TEST(TrainFast, KernelSummaryByKindNameAndOperator) {
  EXPECT_EQ(kernel_kind("nvjet_sm90_tst_192x192_64x3_1x2_h_bz_coopB_splitK_NTN"), "matmul");
  EXPECT_EQ(kernel_kind("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26"), "attention");
  EXPECT_EQ(kernel_kind("void mixbench::linear::tc::(anonymous namespace)::dqkv_kernel<__nv_bfloat16, 128, 128, true>"),
            "linear_attention");
  EXPECT_EQ(kernel_kind("void mixbench::layers::rope_cuda::(anonymous namespace)::rope_kernel<__nv_bfloat16>"), "elementwise");
  EXPECT_EQ(kernel_kind("void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add<c10::BFloat16>>"),
            "elementwise");
  EXPECT_EQ(kernel_kind("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>"), "reduction");
  EXPECT_EQ(kernel_kind("something_else"), "other");
  Json s = summarize_kernels({{"nvjet_a", "aten::mm", 1, 0.3}, {"nvjet_a", "aten::mm", 1, 0.2},
                              {"vectorized_elementwise_kernel<mul>", "aten::mul", 2, 0.1}, {"odd", "", 1, 0.05}},
                             1.0, 2, 2);
  EXPECT_DOUBLE_EQ(s["kernel_s"].get<double>(), 0.65);
  EXPECT_DOUBLE_EQ(s["busy"].get<double>(), 0.65);
  EXPECT_DOUBLE_EQ(s["kernels_per_step"].get<double>(), 2.5);
  EXPECT_DOUBLE_EQ(s["by_kind"]["matmul"]["seconds"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(s["by_kind"]["elementwise"]["share_of_wall"].get<double>(), 0.1);
  ASSERT_EQ(s["top"].size(), 2u);  // top = 2
  EXPECT_EQ(s["top"][0]["name"], "nvjet_a");
  EXPECT_EQ(s["top"][0]["calls"], 2);
  EXPECT_EQ(s["top_ops"][0]["op"], "aten::mm");
  EXPECT_EQ(s["top_ops"][1]["op"], "aten::mul");
}

// --trace profiles the steps after the first: a Chrome trace file and the summary in train.json.
TEST(TrainFast, TraceWritesTheFileAndItsSummary) {
  const fs::path dir = tmp_dir("trace");
  ASSERT_EQ(run_cli({"train", "--method", "dense", "--config", "n_layer=2,d_model=64,head_dim=32,seq_len=32", "--steps", "4",
                     "--batch", "2", "--eval-batches", "1", "--probes", "0", "--trace", (dir / "t.json").string(),
                     "--trace-steps", "2", "--out", dir.string(), "--quiet"}),
            0);
  ASSERT_TRUE(fs::exists(dir / "t.json"));
  Json trace = Json::parse(read_file((dir / "t.json").string()));
  EXPECT_TRUE(trace.contains("traceEvents"));
  Json r = Json::parse(read_file((dir / "train.json").string()));
  EXPECT_TRUE(validate_json(r, report_schema()).empty());
  const Json& t = r["results"][0]["trace"];
  EXPECT_EQ(t["steps"], 2);
  EXPECT_EQ(t["device"], "cpu");
  EXPECT_GT(t["wall_s"].get<double>(), 0.0);
  EXPECT_GT(t["top_ops"].size(), 0u);
  EXPECT_EQ(run_cli({"train", "--method", "dense", "--trace-steps", "0"}), 2);
}

// Constants a layer computes on the host: on the CPU made on every call; on a GPU made once per key,
// device and dtype (a CUDA-graph capture cannot copy from pageable host memory).
TEST(TrainFast, DeviceConstantsAreMadeOnEveryCallOnTheCpu) {
  int made = 0;
  auto make = [&] {
    ++made;
    return at::arange(4, at::TensorOptions().dtype(at::kDouble));
  };
  const auto cpu = at::TensorOptions().dtype(at::kFloat);
  at::Tensor a = layers::device_constant("test:arange4", cpu, make), b = layers::device_constant("test:arange4", cpu, make);
  EXPECT_EQ(made, 2);
  EXPECT_EQ(a.scalar_type(), at::kFloat);
  EXPECT_TRUE(at::equal(a, b));
  EXPECT_EQ(a[3].item<double>(), 3.0);
}

TEST(TrainFast, DeviceConstantsAreKeptOnTheGpu) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  int made = 0;
  auto make = [&] {
    ++made;
    return at::arange(4, at::TensorOptions().dtype(at::kDouble));
  };
  const auto gpu = at::TensorOptions().dtype(at::kFloat).device(at::kCUDA);
  at::Tensor c = layers::device_constant("test:arange4", gpu, make), d = layers::device_constant("test:arange4", gpu, make);
  EXPECT_EQ(made, 1);
  EXPECT_EQ(c.data_ptr(), d.data_ptr());
  layers::device_constant("test:arange4", gpu.dtype(at::kBFloat16), make);
  EXPECT_EQ(made, 2);  // another dtype, another constant
}
