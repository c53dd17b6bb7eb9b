// Training of the sparse methods with an indexer / gate KL (dsa, qsa, seer): the backbone adds the
// layers' auxiliary losses (weight 1, summed) to the training loss, the indexer learns from them
// without changing the main parameters' gradient, the full-attention warm-up runs dense causal
// attention while the KL still trains the indexer, and `mixbench train` logs the auxiliary loss.
#include <gtest/gtest.h>
#include <fmt/format.h>

#include <fmt/format.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <filesystem>
#include <sstream>
#include <unistd.h>

#include "harness/backbone.h"
#include "harness/cli/cli.h"
#include "harness/io.h"
#include "harness/registry.h"
#include "harness/report.h"

namespace fs = std::filesystem;
using namespace mixbench;
using Json = nlohmann::json;

namespace {

double rel(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor x = a.to(at::kDouble), y = b.to(at::kDouble);
  return (x - y).pow(2).mean().sqrt().item<double>() / (x.pow(2).mean().sqrt().item<double>() + 1e-12);
}

const std::string kShape = "n_layer=4,d_model=64,head_dim=16,seq_len=64,vocab=64";
const std::string kDsa = kShape + ",dsa_topk=8,idx_heads=3,idx_dim=8,idx_rope_dim=4";

// A dsa model in fp64 with random non-zero parameters, every one a leaf requiring grad.
Model dsa_model(const std::string& cfg_text) {
  const MethodSpec& m = Registry::get().method("dsa");
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(5);
  Model model = build_model(m, m.config.parse(cfg_text), gen, at::TensorOptions().dtype(at::kDouble), true);
  for (const auto& [n, t] : model.params) t.requires_grad_(true);
  return model;
}

at::Tensor tokens(int64_t B, int64_t T, int64_t vocab, uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randint(vocab, {B, T}, gen, at::TensorOptions().dtype(at::kLong));
}

bool is_indexer(const std::string& name) { return name.find(".mixer.idx_") != std::string::npos; }

TensorMap layer_inputs(const MethodSpec& m, const Config& cfg, int64_t layer, int64_t B, int64_t T, uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  LayerCtx ctx{layer, model_dims(cfg).n_layer};
  TensorMap in = m.make_inputs(cfg, ctx, B, T, gen);
  for (const auto& d : m.params(cfg, ctx)) in.set(d.name, random_param(d, gen, at::TensorOptions().dtype(at::kDouble)));
  return in;
}

}  // namespace

// Training loss = LM cross-entropy + Σ layers' aux_loss; the LM part equals the cross-entropy of
// model_forward's logits; a method without aux_loss trains on the cross-entropy alone.
TEST(SparseTrain, ModelLossAddsTheLayersAuxLosses) {
  for (int64_t step : {int64_t(-1), int64_t(0)}) {  // selection active; full-attention warm-up
    Model model = dsa_model(kDsa + ",full_attention_warmup_steps=512");
    model.step = step;
    at::Tensor idx = tokens(2, 29, 64, 3), tgt = tokens(2, 29, 64, 4);
    at::Tensor lm;
    ModelAux aux;
    at::Tensor loss = model_loss(model, idx, tgt, Backend::CPU, &lm, &aux);
    at::Tensor logits = model_forward(model, idx, Backend::CPU);
    at::Tensor ce = at::cross_entropy_loss(logits.reshape({-1, 64}), tgt.reshape({-1}), {}, at::Reduction::Mean, -1);
    EXPECT_NEAR(lm.item<double>(), ce.item<double>(), 1e-12);
    ASSERT_EQ(aux.layer_aux.size(), 4u);
    double sum = 0;
    for (const auto& a : aux.layer_aux) {
      ASSERT_TRUE(a.defined());
      EXPECT_GT(a.item<double>(), 0.0);
      sum += a.item<double>();
    }
    EXPECT_NEAR(aux.aux_loss.item<double>(), sum, 1e-12);
    EXPECT_NEAR(loss.item<double>() - ce.item<double>(), sum, 1e-12) << "step " << step;
    EXPECT_GT(sum, 1e-6);
  }
  const MethodSpec& dense = Registry::get().method("dense_full");
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(5);
  Model dm = build_model(dense, dense.config.parse(kShape), gen, at::TensorOptions().dtype(at::kDouble), true);
  at::Tensor idx = tokens(1, 17, 64, 3), tgt = tokens(1, 17, 64, 4);
  at::Tensor lm;
  ModelAux aux;
  at::Tensor loss = model_loss(dm, idx, tgt, Backend::CPU, &lm, &aux);
  EXPECT_FALSE(aux.aux_loss.defined());
  EXPECT_EQ(loss.item<double>(), lm.item<double>());
}

// The indexer learns only from the aux term (non-zero gradient from the training loss, none from
// the LM loss); every other parameter's gradient is the LM loss's, unchanged by the aux term.
TEST(SparseTrain, IndexerGetsGradientMainGradientUnchanged) {
  for (int64_t step : {int64_t(-1), int64_t(0)}) {
    Model model = dsa_model(kDsa + ",full_attention_warmup_steps=512");
    model.step = step;
    std::vector<std::string> names;
    std::vector<at::Tensor> leaves;
    for (const auto& [n, t] : model.params) {
      names.push_back(n);
      leaves.push_back(t);
    }
    at::Tensor idx = tokens(2, 29, 64, 8), tgt = tokens(2, 29, 64, 9);
    at::Tensor lm;
    at::Tensor loss = model_loss(model, idx, tgt, Backend::CPU, &lm);
    auto g_total = torch::autograd::grad({loss}, leaves, {}, true, false, /*allow_unused=*/true);
    auto g_lm = torch::autograd::grad({lm}, leaves, {}, false, false, /*allow_unused=*/true);
    int n_indexer = 0;
    for (size_t i = 0; i < names.size(); ++i) {
      const double total = g_total[i].defined() ? g_total[i].abs().max().item<double>() : 0.0;
      const double from_lm = g_lm[i].defined() ? g_lm[i].abs().max().item<double>() : 0.0;
      if (is_indexer(names[i])) {
        ++n_indexer;
        EXPECT_EQ(from_lm, 0.0) << names[i];
        EXPECT_GT(total, 0.0) << names[i] << " step " << step;
      } else if (g_lm[i].defined()) {
        ASSERT_TRUE(g_total[i].defined()) << names[i];
        EXPECT_LE((g_total[i] - g_lm[i]).abs().max().item<double>(), 1e-14 * (1.0 + from_lm)) << names[i];
      } else {
        EXPECT_EQ(total, 0.0) << names[i];
      }
    }
    EXPECT_EQ(n_indexer, 4 * 5);  // idx_wq, idx_wk, idx_w, idx_k_norm_w, idx_k_norm_b per layer
  }
}

// Warm-up (training step < full_attention_warmup_steps): the layer equals dense causal attention
// (dense_full on the same weights) beyond the selection budget, its aux_loss is the KL with every
// candidate selected (the reference at a budget covering the whole history) and reaches only the
// indexer / gate parameters; from step N on the selection is active again.
TEST(SparseTrain, WarmupIsDenseCausalAttentionAndTrainsTheIndexer) {
  const MethodSpec& dense = Registry::get().method("dense_full");
  struct C {
    std::string method, cfg, prefix, all_key;
    int64_t all_value, layer;
  };
  const int64_t T = 37;
  for (const C& c : {C{"dsa", kShape + ",dsa_topk=8,idx_heads=3,idx_dim=8,idx_rope_dim=4", "idx_", "dsa_topk", T, 1},
                     C{"dsa", kShape + ",dsa_topk=6,idx_heads=2,idx_dim=8,idx_rope_dim=4,kv_ratio=2", "idx_", "dsa_topk", T, 0},
                     C{"qsa", kShape + ",qsa_block=4,qsa_topk=2,qsa_heads=4,qsa_dim=8,qsa_group=2,qsa_rope_dim=4", "qsa_",
                       "qsa_topk", T / 4, 1},
                     C{"seer", kShape + ",seer_block=4,seer_topk=2,seer_gate_dim=8,kv_ratio=2", "seer_", "seer_topk", T / 4, 3}}) {
    const MethodSpec& m = Registry::get().method(c.method);
    ASSERT_EQ(m.config.parse(c.cfg).i("full_attention_warmup_steps"), -1);  // the trainer resolves the fraction
    Config cfg = m.config.parse(c.cfg + ",full_attention_warmup_steps=512");
    TensorMap in = layer_inputs(m, cfg, c.layer, 2, T, 31);
    std::vector<std::string> names;
    std::vector<at::Tensor> leaves;
    for (const auto& [n, t] : in) {
      t.requires_grad_(true);
      names.push_back(n);
      leaves.push_back(t);
    }
    Config dcfg = dense.config.parse(kShape + ",kv_ratio=" + std::to_string(cfg.i("kv_ratio")));
    const LayerCtx inactive{c.layer, 4};
    at::Tensor yd = dense.forward(in, dcfg, inactive, Backend::CPU).at("y");
    const std::string what = c.method + " " + c.cfg;

    for (int64_t step : {int64_t(0), int64_t(511)}) {
      const LayerCtx warm{c.layer, 4, step};
      TensorMap out = m.forward(in, cfg, warm, Backend::CPU);
      EXPECT_LT(rel(yd, out.at("y")), 1e-12) << what;
      ASSERT_TRUE(out.has("aux_loss"));
      at::Tensor want = m.reference(in, cfg.with(c.all_key, c.all_value), inactive).at("aux_loss");
      EXPECT_LT(std::abs(out.at("aux_loss").item<double>() - want.item<double>()), 1e-10 * (1.0 + want.abs().item<double>()))
          << what;
      EXPECT_GT(out.at("aux_loss").item<double>(), 0.0) << what;
      auto ga = torch::autograd::grad({out.at("aux_loss")}, leaves, {}, true, false, /*allow_unused=*/true);
      auto gy = torch::autograd::grad({out.at("y").sum()}, leaves, {}, false, false, /*allow_unused=*/true);
      for (size_t i = 0; i < names.size(); ++i) {
        const bool selector = names[i].rfind(c.prefix, 0) == 0;
        const bool aux_nonzero = ga[i].defined() && ga[i].abs().max().item<double>() > 0;
        const bool y_nonzero = gy[i].defined() && gy[i].abs().max().item<double>() > 0;
        if (names[i] == "x" || names[i] == "ve") {
          EXPECT_FALSE(aux_nonzero) << what << " " << names[i];
          continue;
        }
        EXPECT_EQ(aux_nonzero, selector) << what << " " << names[i];
        EXPECT_EQ(y_nonzero, !selector) << what << " " << names[i];
      }
    }
    // Selection active: from step N on, outside training, and with the warm-up switched off.
    for (const auto& [ctx, c2] : {std::pair{LayerCtx{c.layer, 4, 512}, cfg}, std::pair{inactive, cfg},
                                  std::pair{LayerCtx{c.layer, 4, 0}, cfg.with("full_attention_warmup_steps", int64_t(0))}}) {
      TensorMap out = m.forward(in, c2, ctx, Backend::CPU);
      EXPECT_GT(rel(yd, out.at("y")), 1e-6) << what << " step " << ctx.step;
      EXPECT_LT(rel(m.reference(in, c2, ctx).at("y"), out.at("y")), 1e-10) << what;
    }
  }
}

// A few CPU steps of `mixbench train --method dsa`: every progress line and the report carry the
// auxiliary loss; the loss curve is the LM loss.
TEST(SparseTrain, TrainCommandLogsAuxLoss) {
  fs::path dir = fs::temp_directory_path() / fmt::format("mixbench_sparse_train_{}", ::getpid());
  fs::remove_all(dir);
  testing::internal::CaptureStdout();
  const int rc = run_cli({"train", "--method", "dsa", "--config",
                          "n_layer=2,d_model=64,head_dim=32,seq_len=32,dsa_topk=8,idx_heads=2,idx_dim=8,idx_rope_dim=4,"
                          "full_attention_warmup_steps=2",
                          "--steps", "4", "--batch", "2", "--eval-batches", "1", "--out", dir.string()});
  const std::string out = testing::internal::GetCapturedStdout();
  ASSERT_EQ(rc, 0) << out;
  std::istringstream lines(out);
  std::string line;
  int n = 0;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] != '{') continue;
    Json j = Json::parse(line);
    if (!j.contains("step")) continue;
    ASSERT_TRUE(j.contains("aux_loss")) << line;
    EXPECT_TRUE(std::isfinite(j["aux_loss"].get<double>()));
    EXPECT_GT(j["aux_loss"].get<double>(), 0.0);
    ++n;
  }
  EXPECT_EQ(n, 4) << out;
  Json r = Json::parse(read_file((dir / "train.json").string()));
  EXPECT_TRUE(validate_json(r, report_schema()).empty());
  const Json& res = r["results"][0];
  ASSERT_EQ(res["aux_loss_curve"].size(), 4u);
  ASSERT_EQ(res["loss_curve"].size(), 4u);
  for (const auto& a : res["aux_loss_curve"]) EXPECT_GT(a.get<double>(), 0.0);
  EXPECT_EQ(res["config"]["full_attention_warmup_steps"], 2);
}
