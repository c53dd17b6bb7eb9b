// ouro (looped LM read out after every loop): the exit distribution and the evaluation exit rule
// on hand-made values, the model's exits (reference vs fast path, decoding, the selected logits),
// the two training objectives, the accountant, the two-stage training schedule with exact resume,
// and bad input.
#include <gtest/gtest.h>
#include <fmt/format.h>

#include <fmt/format.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <unistd.h>

#include <filesystem>

#include "harness/backbone.h"
#include "harness/cli/cli.h"
#include "harness/errors.h"
#include "harness/registry.h"
#include "mixers/loop/ouro.h"
#include "suites/conformance.h"
#include "suites/conformance_subject.h"
#include "tests/model_conformance.h"
#include "suites/leaderboard.h"
#include "suites/train.h"

namespace mixbench {
namespace {

namespace fs = std::filesystem;
const at::TensorOptions kF64 = at::TensorOptions().dtype(at::kDouble);
at::Generator gen_of(uint64_t s) { return at::make_generator<at::CPUGeneratorImpl>(s); }
double max_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

// prelude, one core block, coda at d 32; three loops
const char* kCfg = "n_layer=3,d_model=32,head_dim=16,seq_len=32,vocab=32,mlp_hidden=32,short_window=4,n_loops=3";

Model ouro_model(const std::string& extra, uint64_t seed) {
  const MethodSpec& m = Registry::get().method("ouro");
  at::Generator g = gen_of(seed);
  Model mm = build_model(m, m.config.parse(std::string(kCfg) + (extra.empty() ? "" : "," + extra)), g, kF64,
                         /*random_nonzero=*/true);
  // gates spread over (0, 1) rather than saturated by the random values
  mm.params.set("ouro_gate_w", mm.params.at("ouro_gate_w") * 0.1);
  mm.params.set("ouro_gate_b", at::full({1}, 0.0, kF64));
  return mm;
}

// Whether p [B,T,K] is the exit distribution of the gates λ [B,T,K]: p(k) = λ_k·Π_{j<k}(1 − λ_j)
// for k < K−1, the last the remaining mass, and Σ_k p(k) = 1 (within 1e-14), position by position.
bool is_exit_distribution(const at::Tensor& p, const at::Tensor& gates) {
  const auto P = p.accessor<double, 3>();
  const auto L = gates.accessor<double, 3>();
  const int64_t K = p.size(2);
  for (int64_t b = 0; b < p.size(0); ++b)
    for (int64_t t = 0; t < p.size(1); ++t) {
      double survive = 1, sum = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double want = k + 1 < K ? L[b][t][k] * survive : survive;
        if (std::abs(P[b][t][k] - want) > 1e-14) return false;
        survive *= 1 - L[b][t][k];
        sum += P[b][t][k];
      }
      if (std::abs(sum - 1.0) > 1e-14) return false;
    }
  return true;
}

TEST(OuroExit, DistributionHasSurvivalAndSumsToOne) {
  at::Generator g = gen_of(3);
  const at::Tensor gates = at::rand({2, 5, 4}, g, kF64) * 0.98 + 0.01;
  const at::Tensor p = ouro::exit_distribution(gates);
  EXPECT_TRUE(is_exit_distribution(p, gates));
  EXPECT_LT(max_diff(ouro::ref_exit_distribution(gates), p), 1e-15);
  EXPECT_LT(max_diff(p.sum(-1), at::ones({2, 5}, kF64)), 1e-15);
  // hand values: λ = ½ at every loop gives ½, ¼, ⅛ and the remaining ⅛ (the last gate unused)
  const at::Tensor half = at::tensor({0.5, 0.5, 0.5, 0.9}, kF64).view({1, 1, 4});
  EXPECT_LT(max_diff(ouro::exit_distribution(half), at::tensor({0.5, 0.25, 0.125, 0.125}, kF64).view({1, 1, 4})), 1e-16);
  // the check catches broken survival: without the survival product, or the last exit taking its own gate
  std::vector<at::Tensor> no_survival, own_gate;
  at::Tensor survive = at::ones({2, 5}, kF64);
  for (int64_t k = 0; k < 4; ++k) {
    no_survival.push_back(k < 3 ? gates.select(-1, k) : 1 - gates.slice(-1, 0, 3).sum(-1));
    own_gate.push_back(gates.select(-1, k) * survive);
    survive = survive * (1 - gates.select(-1, k));
  }
  EXPECT_FALSE(is_exit_distribution(at::stack(no_survival, -1), gates));
  EXPECT_FALSE(is_exit_distribution(at::stack(own_gate, -1), gates));
}

// The first loop whose cumulative exit probability reaches ½; the last when none does.
TEST(OuroExit, EvaluationExitsWhereTheCumulativeProbabilityReachesOneHalf) {
  const at::Tensor p = at::tensor({0.1, 0.2, 0.3, 0.4,      // cumulative 0.1 0.3 0.6: loop 2
                                   0.5, 0.1, 0.2, 0.2,      // exactly ½ at loop 0
                                   0.49, 0.0, 0.0, 0.51,    // loop 3
                                   0.2, 0.29, 0.3, 0.21,    // 0.49 then 0.79: loop 2
                                   0.05, 0.5, 0.25, 0.2,    // 0.55: loop 1
                                   0.1, 0.1, 0.1, 0.1},     // never reaches ½ (not normalised): the last
                                  kF64)
                           .view({2, 3, 4});
  const std::vector<int64_t> want = {2, 0, 3, 2, 1, 3};
  for (const at::Tensor& c : {ouro::exit_choice(p), ouro::ref_exit_choice(p)}) {
    ASSERT_EQ(c.scalar_type(), at::kLong);
    for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(c.view({-1})[i].item<int64_t>(), want[size_t(i)]) << "position " << i;
  }
}

// Both objectives against hand formulas on hand-made cross-entropies and gates.
TEST(OuroExit, ObjectivesMatchTheirFormulas) {
  at::Generator g = gen_of(5);
  const int64_t K = 3;
  const at::Tensor ce = at::rand({K, 2, 4}, g, kF64) * 3.0;
  const at::Tensor gates = at::rand({2, 4, K}, g, kF64) * 0.9 + 0.05;
  at::Tensor valid = at::ones({2, 4}, at::TensorOptions().dtype(at::kBool));
  valid[1][2].fill_(false);  // a masked target
  const at::Tensor p = ouro::exit_distribution(gates);
  double lm = 0, H = 0, bce = 0;
  int64_t n = 0;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t t = 0; t < 4; ++t) {
      if (!valid[b][t].item<bool>()) continue;
      ++n;
      for (int64_t k = 0; k < K; ++k) {
        const double pk = p[b][t][k].item<double>();
        lm += pk * ce[k][b][t].item<double>();
        H -= pk * std::log(pk);
        if (k + 1 < K) {
          const double gain = std::max(0.0, ce[k][b][t].item<double>() - ce[k + 1][b][t].item<double>());
          const double w = 1 / (1 + std::exp(-50 * (gain - 0.005)));  // continue
          const double lam = gates[b][t][k].item<double>();
          bce -= w * std::log(1 - lam) + (1 - w) * std::log(lam);
        }
      }
    }
  for (const ouro::Stage1& s : {ouro::stage1_loss(ce, p, valid), ouro::ref_stage1_loss(ce, p, valid)}) {
    EXPECT_NEAR(s.lm.item<double>(), lm / double(n), 1e-14);
    EXPECT_NEAR(s.aux.item<double>(), -0.1 * H / double(n), 1e-14);
  }
  for (const at::Tensor& s : {ouro::stage2_loss(ce, gates, valid), ouro::ref_stage2_loss(ce, gates, valid)})
    EXPECT_NEAR(s.item<double>(), bce / double(n * (K - 1)), 1e-13);
  // the stage-2 target is detached: no gradient reaches the cross-entropies
  const at::Tensor ce_g = ce.clone().requires_grad_(true), gates_g = gates.clone().requires_grad_(true);
  ouro::stage2_loss(ce_g, gates_g, valid).backward();
  EXPECT_FALSE(ce_g.grad().defined());
  EXPECT_GT(gates_g.grad().abs().sum().item<double>(), 0.0);
}

// Every loop is read out; the reference (explicit loops) matches the fast path; the forward's
// logits are each token's chosen exit's; prefill + decode equals the forward.
TEST(Ouro, ExitsReferenceAndDecode) {
  Model m = ouro_model("", 11);
  ASSERT_EQ(m.plan.n_steps(), 7) << "prelude + 3 × (core + coda)";
  ASSERT_EQ(m.plan.n_slots, 7);
  at::Generator g = gen_of(12);
  const at::Tensor idx = at::randint(32, {2, 10}, g, at::TensorOptions().dtype(at::kLong));
  ModelAux ar, ac;
  const at::Tensor ref = model_forward(m, idx, Backend::Reference, &ar), cpu = model_forward(m, idx, Backend::CPU, &ac);
  ASSERT_TRUE(ac.exit_logits.defined());
  ASSERT_EQ(ac.exit_logits.size(0), 3);
  EXPECT_LT(max_diff(ref, cpu), 1e-10);
  EXPECT_LT(max_diff(ar.exit_logits, ac.exit_logits), 1e-10);
  EXPECT_LT(max_diff(ar.exits.probs, ac.exits.probs), 1e-12);
  EXPECT_TRUE(at::equal(ar.exits.choice, ac.exits.choice));
  EXPECT_TRUE(is_exit_distribution(ac.exits.probs, ac.exits.gates));
  EXPECT_GT(max_diff(ac.exit_logits[0], ac.exit_logits[1]), 1e-3) << "each loop has its own read-out";
  EXPECT_GT(max_diff(ac.exit_logits[1], ac.exit_logits[2]), 1e-3);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t t = 0; t < 10; ++t) {
      const int64_t k = ac.exits.choice[b][t].item<int64_t>();
      EXPECT_TRUE(at::equal(cpu[b][t], ac.exit_logits[k][b][t])) << b << "," << t;
    }
  EXPECT_GT(ac.exits.choice.max().item<int64_t>(), ac.exits.choice.min().item<int64_t>())
      << "the tokens take different exits at these gates";
  // prefill of 7 tokens, then the other 3 one by one: the forward's last 4 positions
  ModelCache cache;
  std::vector<at::Tensor> last = {model_prefill(m, idx.slice(1, 0, 7), Backend::CPU, &cache)};
  ASSERT_EQ(cache.layers.size(), 7u) << "one cache slot per unrolled step";
  while (cache.pos < 10) last.push_back(model_decode_step(m, idx.slice(1, cache.pos, cache.pos + 1), cache, Backend::CPU));
  EXPECT_LT(max_diff(at::cat(last, 1), cpu.slice(1, 6, 10)), 1e-10);
  // a gate that always exits takes the first loop's read-out, one that never exits the last
  for (double bias : {60.0, -60.0}) {
    m.params.set("ouro_gate_b", at::full({1}, bias, kF64));
    ModelAux a;
    const at::Tensor y = model_forward(m, idx, Backend::CPU, &a);
    EXPECT_TRUE(at::equal(y, a.exit_logits[bias > 0 ? 0 : 2])) << bias;
  }
}

// model_loss: stage 1 is Σ p·CE − 0.1·H over every exit's cross-entropy; stage 2 the gate's loss,
// whose gradient reaches only the gate when the other parameters are frozen.
TEST(Ouro, ModelLossStages) {
  Model m = ouro_model("", 21);
  at::Generator g = gen_of(22);
  const at::Tensor idx = at::randint(32, {2, 8}, g, at::TensorOptions().dtype(at::kLong));
  at::Tensor tgt = at::randint(32, {2, 8}, g, at::TensorOptions().dtype(at::kLong));
  tgt[0][3].fill_(-1);
  for (Backend b : {Backend::CPU, Backend::Reference}) {
    at::Tensor lm;
    ModelAux a;
    const at::Tensor loss = model_loss(m, idx, tgt, b, &lm, &a);
    const at::Tensor logp = at::log_softmax(a.exit_logits, -1);  // [K,B,T,V]
    const at::Tensor valid = tgt != -1;
    const at::Tensor ce = -logp.gather(-1, tgt.clamp_min(0).unsqueeze(0).unsqueeze(-1).expand({3, -1, -1, 1})).squeeze(-1);
    const ouro::Stage1 s = ouro::ref_stage1_loss(ce, a.exits.probs, valid);
    EXPECT_NEAR(lm.item<double>(), s.lm.item<double>(), 1e-12) << backend_name(b);
    EXPECT_NEAR(loss.item<double>(), (s.lm + s.aux).item<double>(), 1e-12) << backend_name(b);
    EXPECT_NEAR(a.aux_loss.item<double>(), s.aux.item<double>(), 1e-12);
    m.exit_gate_only = true;
    at::Tensor lm2;
    const at::Tensor gate_loss = model_loss(m, idx, tgt, b, &lm2);
    m.exit_gate_only = false;
    EXPECT_NEAR(gate_loss.item<double>(), ouro::ref_stage2_loss(ce, a.exits.gates, valid).item<double>(), 1e-12);
    EXPECT_NEAR(lm2.item<double>(), s.lm.item<double>(), 1e-12) << "the logged loss stays the expected cross-entropy";
  }
  // the gate-only stage with the other parameters frozen: gradients for the gate alone
  for (auto& [n, t] : m.params) t.requires_grad_(n == "ouro_gate_w" || n == "ouro_gate_b");
  m.exit_gate_only = true;
  model_loss(m, idx, tgt, Backend::CPU).backward();
  for (const auto& [n, t] : m.params) {
    if (n == "ouro_gate_w" || n == "ouro_gate_b") EXPECT_GT(t.grad().abs().sum().item<double>(), 0.0) << n;
    else EXPECT_FALSE(t.grad().defined()) << n;
  }
}

// The coda, head and gate of every loop are billed; parameters per block.
TEST(Ouro, AccountantBillsEveryLoopsReadOut) {
  const MethodSpec& m = Registry::get().method("ouro");
  const Config c3 = m.config.parse(std::string(kCfg) + ",window_pattern=L"), c2 = c3.with("n_loops", int64_t(2));
  CostQuery q;
  q.T = 32;
  q.context = 32;
  const ModelCost a3 = account_model(m, c3, q), a2 = account_model(m, c2, q);
  const ModelDims d = model_dims(c3);
  ASSERT_EQ(a3.layers.size(), 7u);
  ASSERT_EQ(a2.layers.size(), 5u);
  // the core and the coda steps (mixer + MLP; the coda block has a value embedding, the core not)
  const double mlp = 4.0 * double(d.d_model * d.mlp_hidden);
  const double loop = a2.layers[1].fwd_flops + a2.layers[2].fwd_flops + 2.0 * mlp;
  const double head = 2.0 * double(d.vocab * d.d_model), gate = 2.0 * double(d.d_model);
  EXPECT_NEAR(a3.fwd_flops - a2.fwd_flops, loop + head + gate, 1e-9 * a3.fwd_flops)
      << "one more loop: a core and a coda application, a head and a gate";
  EXPECT_EQ(a3.params.total(), a2.params.total() + 4) << "parameters per block; two more resid and x0 scales";
  at::Generator g = gen_of(1);
  EXPECT_EQ(a3.params.total(), count_params(build_model(m, c3, g, kF64)).total());
}

// Model-level conformance of the whole small models (every exit's logits, the exit distribution,
// the chosen logits; gradients; finite differences at fp64; prefill + decode) at fp64 and fp32
// on the CPU, and an injected fault in the optimized outputs or gradients fails it.
ConformanceSummary conformance(const std::string& dtype, const std::string& fault) {
  return test_support::model_conformance(Registry::get().method("ouro"), dtype, fault);
}

TEST(OuroConformance, ModelLevelAtFp64AndFp32) {
  for (const char* dtype : {"fp64", "fp32"}) {
    const ConformanceSummary s = conformance(dtype, "");
    EXPECT_EQ(s.failed, 0) << dtype;
    EXPECT_EQ(s.errors, 0) << dtype;
    // three cases, each with its decode check and, at fp64, its finite differences
    EXPECT_EQ(s.passed, std::string(dtype) == "fp64" ? 9 : 6) << dtype;
  }
  for (const char* fault : {"output", "gradient"}) EXPECT_GT(conformance("fp64", fault).failed, 0) << fault;
}

fs::path tmp_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / fmt::format("mixbench_ouro_test_{}", ::getpid()) / name;
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

// 8 steps, the last 3 (steps 5, 6, 7) training only the gate.
TrainOptions ouro_run() {
  TrainOptions o;
  o.method = "ouro";
  o.config = "n_layer=3,d_model=64,head_dim=32,seq_len=32,n_loops=2,gate_stage_steps=3";
  o.steps = 8, o.batch = 2, o.seed = 7;
  o.eval_every = 3, o.eval_batches = 1, o.probe_sequences = 0;  // evaluations after steps 3, 6 and 8
  return o;
}

RunSnapshot snapshot_at(TrainOptions o, int64_t step) {
  RunSnapshot s;
  o.snapshot_at = step;
  o.snapshot_out = &s;
  run_train(o);
  return s;
}

// The switch to the gate-only stage: the other parameters and their optimizer state stop; the
// gate's Adam moments and the update count carry on; the data cursor advances as before.
TEST(OuroTrain, StageSwitchKeepsTheGatesAdamStateAndTheDataCursor) {
  const RunSnapshot s4 = snapshot_at(ouro_run(), 4), s5 = snapshot_at(ouro_run(), 5), s6 = snapshot_at(ouro_run(), 6);
  const int64_t stride = 2 * (32 + 1);
  EXPECT_EQ(std::stoll(s5.metadata.at("data_pos")), std::stoll(s4.metadata.at("data_pos")) + stride);
  EXPECT_EQ(std::stoll(s6.metadata.at("data_pos")), std::stoll(s5.metadata.at("data_pos")) + stride);
  EXPECT_EQ(s6.tensors.at("opt.adam_step").item<int64_t>(), 6);
  int64_t frozen = 0;
  for (const auto& [n, t] : s6.tensors) {
    if (n.rfind("param.", 0) == 0 || n.rfind("opt.m1.", 0) == 0 || n.rfind("opt.m2.", 0) == 0) {
      const bool gate = n.find("ouro_gate") != std::string::npos;
      if (gate) {
        EXPECT_FALSE(at::equal(t, s5.tensors.at(n))) << n << " trains in the gate stage";
      } else {
        EXPECT_TRUE(at::equal(t, s5.tensors.at(n))) << n << " is frozen in the gate stage";
        ++frozen;
      }
      if (n.rfind("param.", 0) == 0 && !gate) {
        EXPECT_FALSE(at::equal(t, s4.tensors.at(n))) << n << " trained in stage 1";
      }
    }
  }
  EXPECT_GT(frozen, 10);
  // the gate's moments continue: m1₆ = β1·m1₅ + (1 − β1)·g and m2₆ = β2·m2₅ + (1 − β2)·g² with the same g
  for (const char* n : {"ouro_gate_w", "ouro_gate_b"}) {
    const at::Tensor m1a = s5.tensors.at(std::string("opt.m1.") + n).to(at::kDouble),
                     m1b = s6.tensors.at(std::string("opt.m1.") + n).to(at::kDouble),
                     m2a = s5.tensors.at(std::string("opt.m2.") + n).to(at::kDouble),
                     m2b = s6.tensors.at(std::string("opt.m2.") + n).to(at::kDouble);
    ASSERT_GT(m2a.abs().max().item<double>(), 0.0) << n << ": moments from stage 1";
    const at::Tensor grad = (m1b - 0.8 * m1a) / 0.2;
    EXPECT_LT(max_diff(m2b, 0.95 * m2a + 0.05 * grad * grad), 1e-5 * m2b.abs().max().item<double>()) << n;
  }
}

// Killed and resumed in the middle of each stage: the same run, bit for bit.
TEST(OuroTrain, ResumeInsideEitherStageIsExact) {
  const RunSnapshot straight = snapshot_at(ouro_run(), 8);
  TrainOptions o = ouro_run();
  o.out = tmp_dir("resume").string();
  o.stop_after = 3;  // inside stage 1
  EXPECT_EQ(run_train(o).steps_done, 3);
  o.resume = true;
  o.stop_after = 6;  // inside the gate-only stage
  EXPECT_EQ(run_train(o).steps_done, 6);
  o.stop_after = 0;
  const RunSnapshot resumed = snapshot_at(o, 8);
  for (const char* k : {"losses", "aux_losses", "val_curve", "data_pos"})
    EXPECT_EQ(resumed.metadata.at(k), straight.metadata.at(k)) << k;
  for (const auto& [n, t] : straight.tensors) EXPECT_TRUE(at::equal(t, resumed.tensors.at(n))) << n;
}

// The gate-only stage's length: the preset's share of the run unless the method's config gives it.
TEST(OuroTrain, GateStageLength) {
  const TrainPreset P = train_preset("tiny");
  EXPECT_DOUBLE_EQ(P.gate_stage_frac, 1024.0 / 46875.0);
  const MethodSpec& m = Registry::get().method("ouro");
  const Config c = m.config.parse(P.config);
  EXPECT_EQ(gate_stage_start(m, c, P, 160), 157) << "llround(0.0218 × 160) = 3 steps";
  EXPECT_EQ(gate_stage_start(m, c, P, 46875), 46875 - 1024);
  EXPECT_EQ(gate_stage_start(m, c, P, 10), 10) << "a short run rounds the stage to nothing";
  EXPECT_EQ(gate_stage_start(m, c.with("gate_stage_steps", int64_t(7)), P, 160), 153);
  EXPECT_THROW(gate_stage_start(m, c.with("gate_stage_steps", int64_t(160)), P, 160), UsageError);
  const MethodSpec& dense = Registry::get().method("dense");
  EXPECT_EQ(gate_stage_start(dense, dense.config.parse(P.config), P, 160), 160) << "no exit gate, no stage";
  nlohmann::ordered_json j = train_presets_table().at("tiny");
  j["gate_stage_frac"] = 1.0;
  EXPECT_THROW(train_preset_from_json("bad", j), std::logic_error);
}

// Iso-FLOP calibration bills every loop (a training pass runs them all) and lands within ±2% of
// the anchor at every preset; the CPU preset runs two loops, where one exists.
TEST(OuroTrain, CalibratesAtEveryPreset) {
  for (const char* preset : {"tiny", "small", "gpu-d12"}) {
    const Calibration c = calibrate("ouro", preset);
    EXPECT_TRUE(c.within) << preset << " residual " << c.residual;
    const TrainPreset P = train_preset(preset);
    const Config cfg = Registry::get().method("ouro").config.parse(P.config_for("ouro") + "," + c.config);
    EXPECT_EQ(cfg.i("n_loops"), std::string(preset) == "tiny" ? 2 : 4) << preset;
  }
}

TEST(OuroTrain, BadInputExitsTwo) {
  auto train = [](const std::string& cfg, const std::string& steps) {
    return run_cli({"train", "--method", "ouro", "--config", "n_layer=3,d_model=64,head_dim=32,seq_len=32," + cfg,
                    "--steps", steps, "--batch", "2", "--eval-batches", "1", "--quiet"});
  };
  EXPECT_EQ(train("n_loops=0", "2"), 2);
  EXPECT_EQ(train("n_loops=-1", "2"), 2);
  EXPECT_EQ(train("n_layer=2", "2"), 2) << "prelude 1 + coda 1 leave no core block";
  EXPECT_EQ(train("prelude=2,coda=1", "2"), 2);
  EXPECT_EQ(train("gate_stage_steps=5", "4"), 2) << "a gate stage longer than the run";
  EXPECT_EQ(train("gate_stage_steps=4", "4"), 2) << "a gate stage as long as the run";
  EXPECT_EQ(train("n_loops=2,gate_stage_steps=1", "2"), 0);
}

}  // namespace
}  // namespace mixbench
