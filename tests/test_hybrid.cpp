// Tests of the hybrid methods (per-layer layouts over registered methods): layouts at several
// depths, the union config, the per-layer model and accountant, model-level conformance against
// the FP64 reference backbone, training, checkpoints that keep (and check) the layout, decode
// sweeps and `mixbench list`.
#include <gtest/gtest.h>
#include <fmt/format.h>

#include <fmt/format.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>

#include <cmath>
#include <filesystem>
#include <unistd.h>

#include "harness/backbone.h"
#include "harness/cli/cli.h"
#include "harness/errors.h"
#include "harness/io.h"
#include "harness/registry.h"
#include "harness/report.h"
#include "harness/safetensors.h"
#include "suites/conformance.h"
#include "suites/conformance_subject.h"
#include "suites/train.h"

namespace fs = std::filesystem;
using namespace mixbench;
using Json = nlohmann::json;

namespace {

// Every registered hybrid.
std::vector<std::string> hybrids() {
  std::vector<std::string> out;
  for (const auto* m : Registry::get().methods())
    if (m->is_hybrid()) out.push_back(m->name);
  return out;
}

fs::path hybrid_tmp() {
  static fs::path d = [] {
    fs::path p = fs::temp_directory_path() / fmt::format("mixbench_hybrid_test_{}", ::getpid());
    fs::create_directories(p);
    return p;
  }();
  return d;
}

std::vector<std::string> layout_of(const std::string& name, int64_t n_layer) {
  const MethodSpec& m = Registry::get().method(name);
  Config cfg = m.config.parse(fmt::format("n_layer={}", n_layer));
  std::vector<std::string> out;
  for (const auto& l : layer_methods(m, cfg)) out.push_back(l.method->name);
  return out;
}

// "GGGA" style strings: one letter per layer.
std::string letters(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& n : v) {
    if (n == "dense_full") s += 'A';
    else if (n == "gdn") s += 'G';
    else if (n == "deltanet") s += 'D';
    else if (n == "qsa") s += 'Q';
    else if (n == "moba") s += 'M';
    else if (n == "lightning") s += 'L';
    else if (n == "kda") s += 'K';
    else if (n == "mla") s += 'X';
    else s += '?';
  }
  return s;
}

}  // namespace

TEST(Hybrid, LayoutsFollowTheSpec) {
  const std::map<std::string, std::map<int64_t, std::string>> want = {
      {"gdn_hybrid", {{4, "GGGA"}, {6, "GGGAGG"}, {8, "GGGAGGGA"}, {12, "GGGAGGGAGGGA"}}},
      // full attention at layers 2 and N/2+1 (1-based)
      {"deltanet_hybrid", {{4, "DAAD"}, {6, "DADADD"}, {8, "DADDADDD"}, {12, "DADDDDADDDDD"}}},
      {"qsa_hybrid", {{4, "GGGQ"}, {6, "GGGQGG"}, {8, "GGGQGGGQ"}, {12, "GGGQGGGQGGGQ"}}},
      {"moba_hybrid", {{4, "MAAA"}, {6, "MMMAAA"}, {8, "MMMMMAAA"}, {12, "MMMMMMMMMAAA"}}},
      {"gdn_hybrid_swa", {{4, "GAGA"}, {6, "GAGAGA"}, {8, "GAGAGAGA"}, {12, "GAGAGAGAGAGA"}}},
      {"hypenet", {{4, "LLLA"}, {6, "LLLALL"}, {8, "LLLALLLA"}, {12, "LLLALLLALLLA"}}},
      {"kda_hybrid", {{4, "KKKX"}, {6, "KKKXKK"}, {8, "KKKXKKKX"}, {12, "KKKXKKKXKKKX"}}},
  };
  for (const auto& [name, by_n] : want)
    for (const auto& [n, s] : by_n) EXPECT_EQ(letters(layout_of(name, n)), s) << name << " n_layer=" << n;
}

// HypeNet's attention layers: NoPE, output gate, inference-only logit scale with base hype_logit_a;
// the Lightning layers keep RoPE with the hybrid's base (10000, where dense_full's default is 100000).
TEST(Hybrid, HypeNetLayersCarryTheirOptions) {
  const MethodSpec& m = Registry::get().method("hypenet");
  EXPECT_DOUBLE_EQ(m.config.defaults().f("rope_base"), 10000.0);
  for (const char* over : {"n_layer=8", "n_layer=8,hype_logit_a=500"}) {
    Config cfg = m.config.parse(over);
    auto lm = layer_methods(m, cfg);
    ASSERT_EQ(lm.size(), 8u);
    for (size_t i = 0; i < lm.size(); ++i) {
      if (lm[i].method->name == "dense_full") {
        EXPECT_FALSE(lm[i].cfg.b("rope")) << i;
        EXPECT_TRUE(lm[i].cfg.b("out_gate")) << i;
        EXPECT_FALSE(lm[i].cfg.b("logit_scale_train")) << i;
        EXPECT_DOUBLE_EQ(lm[i].cfg.f("logit_scale_a"), cfg.f("hype_logit_a")) << i;
      } else {
        EXPECT_EQ(lm[i].method->name, "lightning") << i;
        EXPECT_DOUBLE_EQ(lm[i].cfg.f("rope_base"), 10000.0) << i;
      }
    }
  }
  EXPECT_THROW(m.config.parse("hype_logit_a=1"), InputError);  // the base must exceed 1
  // the gate's parameters are in the attention layers' count
  const MethodSpec& att = Registry::get().method("dense_full");
  const Config plain = att.config.parse("n_layer=4,d_model=64,head_dim=16,seq_len=64,vocab=64");
  const LayerCtx ctx{0, 4, -1};
  const CostQuery q{64, 64, 2};
  const LayerCost a = att.account(plain, ctx, q), b = att.account(plain.with("out_gate", true), ctx, q);
  EXPECT_EQ(b.params.total() - a.params.total(), 64 * 64);
  EXPECT_DOUBLE_EQ(b.fwd_flops - a.fwd_flops, 2.0 * 64 * 64);
}

// The attention options at layer level against the plain layer: NoPE makes the last query blind
// to the order of the keys before it (RoPE does not); a zero gate halves the output (sigmoid(0));
// the inference-only logit scale is off while training (step ≥ 0) and on otherwise.
TEST(Hybrid, HypeNetAttentionOptions) {
  const MethodSpec& m = Registry::get().method("dense_full");
  const Config base = m.config.parse("n_layer=4,d_model=64,head_dim=16,seq_len=64,vocab=64");
  const LayerCtx ctx{0, 4, -1};
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(uint64_t(5));
  const auto o = at::TensorOptions().dtype(at::kDouble);
  TensorMap in{{"x", at::randn({1, 12, 64}, gen, o)}};
  for (const ParamDef& p : m.params(base.with("out_gate", true), ctx))
    in.set(p.name, at::randn(p.shape, gen, o) * 0.2);
  auto run = [&](const Config& c, const TensorMap& t, int64_t step) {
    return m.forward(t, c, LayerCtx{0, 4, step}, Backend::CPU).at("y");
  };
  auto rel = [](const at::Tensor& a, const at::Tensor& b) {
    return (a - b).norm().item<double>() / b.norm().item<double>();
  };
  TensorMap swapped = in;
  at::Tensor xs = in.at("x").clone();
  xs.select(1, 0).copy_(in.at("x").select(1, 1));
  xs.select(1, 1).copy_(in.at("x").select(1, 0));
  swapped.set("x", xs);
  const Config nope = base.with("rope", false);
  EXPECT_LT(rel(run(nope, swapped, -1).select(1, 11), run(nope, in, -1).select(1, 11)), 1e-12);
  EXPECT_GT(rel(run(base, swapped, -1).select(1, 11), run(base, in, -1).select(1, 11)), 1e-6);
  TensorMap zero_gate = in;
  zero_gate.set("c_gate", at::zeros_like(in.at("c_gate")));
  EXPECT_LT(rel(run(base.with("out_gate", true), zero_gate, -1), 0.5 * run(base, in, -1)), 1e-12);
  EXPECT_GT(rel(run(base.with("out_gate", true), in, -1), 0.5 * run(base, in, -1)), 1e-3);
  const Config inf = base.with("logit_scale_a", 4.0).with("logit_scale_train", false);
  const Config always = base.with("logit_scale_a", 4.0);
  EXPECT_LT(rel(run(inf, in, 3), run(base, in, 3)), 1e-14);
  EXPECT_LT(rel(run(inf, in, -1), run(always, in, -1)), 1e-14);
  EXPECT_GT(rel(run(inf, in, -1), run(base, in, -1)), 1e-6);
  EXPECT_GT(rel(run(always, in, 3), run(base, in, 3)), 1e-6);
}

// MLA: FP64/FP32 conformance (layer, finite differences, absorbed decode against the forward); the
// decode cache holds the KV latent and the rotary key only, as the accountant bills; without RoPE
// the last query is blind to the order of the keys before it; kda_hybrid's MLA layers are NoPE.
TEST(Hybrid, MlaCachesLatentsAndKdaHybridUsesItWithoutRope) {
  for (const char* dtype : {"fp64", "fp32"}) {
    ConformanceOptions opt;
    opt.methods = {"mla"};
    opt.dtype = dtype;
    opt.finite_differences = std::string(dtype) == "fp64";  // of the FP64 reference, once
    opt.fd_directions = 1;
    ConformanceSummary s;
    Json r = run_conformance(opt, s);
    EXPECT_EQ(s.failed, 0) << dtype;
    EXPECT_EQ(s.errors, 0) << dtype;
    EXPECT_GE(s.passed, std::string(dtype) == "fp64" ? 10 : 7) << dtype;  // fp64 adds the finite differences
  }
  const MethodSpec& m = Registry::get().method("mla");
  const Config cfg = m.config.parse("n_layer=4,d_model=64,head_dim=16,seq_len=64,vocab=64,mla_kv_latent=24,mla_rope_dim=8");
  const LayerCtx ctx{1, 4, -1};
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(uint64_t(9));
  const auto o = at::TensorOptions().dtype(at::kDouble);
  TensorMap in{{"x", at::randn({2, 10, 64}, gen, o)}};
  for (const ParamDef& p : m.params(cfg, ctx)) in.set(p.name, at::randn(p.shape, gen, o) * 0.2);
  TensorMap cache;
  m.prefill(in, cache, cfg, ctx, Backend::CPU);
  EXPECT_FALSE(cache.has("k"));
  EXPECT_FALSE(cache.has("v"));
  ASSERT_TRUE(cache.has("ckv"));
  ASSERT_TRUE(cache.has("kr"));
  EXPECT_TRUE(cache.at("ckv").sizes().equals({2, 10, 24}));
  EXPECT_TRUE(cache.at("kr").sizes().equals({2, 10, 8}));
  EXPECT_DOUBLE_EQ(m.account(cfg, ctx, CostQuery{64, 64, 2}).cache_bytes_per_token, (24 + 8) * 2.0);
  auto last = [&](const Config& c, const at::Tensor& x) {
    TensorMap t = in;
    t.set("x", x);
    return m.forward(t, c, ctx, Backend::CPU).at("y").select(1, 9);
  };
  at::Tensor xs = in.at("x").clone();
  xs.select(1, 2).copy_(in.at("x").select(1, 5));
  xs.select(1, 5).copy_(in.at("x").select(1, 2));
  auto rel = [](const at::Tensor& a, const at::Tensor& b) { return (a - b).norm().item<double>() / b.norm().item<double>(); };
  const Config nope = cfg.with("mla_rope_dim", int64_t(0));
  EXPECT_LT(rel(last(nope, xs), last(nope, in.at("x"))), 1e-12);
  EXPECT_GT(rel(last(cfg, xs), last(cfg, in.at("x"))), 1e-6);
  EXPECT_THROW(m.config.parse("mla_rope_dim=3"), InputError);
  const MethodSpec& h = Registry::get().method("kda_hybrid");
  for (const auto& l : layer_methods(h, h.config.parse("n_layer=8")))
    if (l.method->name == "mla") EXPECT_EQ(l.cfg.i("mla_rope_dim"), 0);
  // accountant audit: built parameters and counted forward FLOPs, with and without RoPE, and the
  // HypeNet attention options
  for (const auto& [method, extra] : std::vector<std::pair<std::string, std::string>>{
           {"mla", ""}, {"mla", ",mla_rope_dim=0"}, {"hypenet", ",n_layer=4"}}) {
    fs::path out = hybrid_tmp() / "acct.json";
    ASSERT_EQ(run_cli({"account", "--method", method, "--config",
                       "n_layer=2,d_model=128,head_dim=32,vocab=256,seq_len=64" + extra, "--audit", "--out", out.string()}),
              0);
    Json r = Json::parse(read_file(out.string()));
    EXPECT_TRUE(r["results"][0]["audit"]["params_match"].get<bool>()) << method << extra;
    EXPECT_LT(r["results"][0]["audit"]["fwd_flops_rel_diff"].get<double>(), 1e-6) << method << extra;
  }
}

TEST(Hybrid, SwaLayersHaveTheFixedWindow) {
  const MethodSpec& m = Registry::get().method("gdn_hybrid_swa");
  auto lm = layer_methods(m, m.config.parse("n_layer=6"));
  for (size_t i = 0; i < lm.size(); ++i) {
    if (lm[i].method->name != "dense_full") continue;
    EXPECT_EQ(lm[i].cfg.s("window_pattern"), "S") << i;
    EXPECT_EQ(lm[i].cfg.i("short_window"), 2047) << i;  // 2048 visible keys including the query
  }
  auto lm2 = layer_methods(m, m.config.parse("n_layer=4,swa_window=9"));
  EXPECT_EQ(lm2[1].cfg.i("short_window"), 8);
  // the accountant sees the window (dense_full layers at T = 4096 with 2048 visible keys hold a
  // fixed 2048-key state, except the last layer, which nanochat keeps full)
  ModelCost mc = account_model(m, m.config.parse("n_layer=4,seq_len=4096"), CostQuery{4096, 4096, 2});
  EXPECT_GT(mc.layers[1].state_bytes, 0.0);
  EXPECT_EQ(mc.layers[1].cache_bytes_per_token, 0.0);
  EXPECT_GT(mc.layers[3].cache_bytes_per_token, 0.0);
}

TEST(Hybrid, ConfigIsTheUnionOfItsLayersAndChecksThem) {
  const MethodSpec& m = Registry::get().method("qsa_hybrid");
  EXPECT_EQ(m.family, "hybrid");
  EXPECT_TRUE(m.is_hybrid());
  EXPECT_NE(m.config.find("qsa_topk"), nullptr);
  EXPECT_NE(m.config.find("gate_bias_offset"), nullptr);
  EXPECT_NE(m.config.find("head_v_dim"), nullptr);
  EXPECT_THROW(m.config.parse("no_such_field=1"), InputError);
  // a component's own rule still applies (QSA: rope dims even and ≤ qsa_dim)
  try {
    m.config.parse("qsa_rope_dim=3");
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("qsa"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Registry::get().method("gdn_hybrid_swa").config.parse("swa_window=1"), InputError);
  // the ops are the components' ops
  const MethodSpec& g = Registry::get().method("gdn_hybrid");
  EXPECT_NE(std::find(g.ops.begin(), g.ops.end(), "attention"), g.ops.end());
  EXPECT_NE(std::find(g.ops.begin(), g.ops.end(), "gated_delta_rule"), g.ops.end());
  // decode hooks (and static caches) exist when every layer method has them
  for (const auto& name : {"gdn_hybrid", "deltanet_hybrid", "gdn_hybrid_swa", "qsa_hybrid", "moba_hybrid"}) {
    EXPECT_TRUE(Registry::get().method(name).has_decode()) << name;
    EXPECT_TRUE(Registry::get().method(name).static_decode) << name;
  }
}

TEST(Hybrid, ModelParametersComeFromEachLayersMethod) {
  const MethodSpec& h = Registry::get().method("gdn_hybrid");
  Config cfg = h.config.parse("n_layer=4,d_model=64,head_dim=16,vocab=64,seq_len=32");
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(1);
  Model m = build_model(h, cfg, gen, at::TensorOptions().dtype(at::kFloat));
  EXPECT_EQ(m.layer_mixers, (std::vector<std::string>{"gdn", "gdn", "gdn", "dense_full"}));
  EXPECT_TRUE(m.params.has("layers.0.mixer.A_log"));
  EXPECT_FALSE(m.params.has("layers.0.mixer.c_q"));
  EXPECT_TRUE(m.params.has("layers.3.mixer.c_q"));
  EXPECT_FALSE(m.params.has("layers.3.mixer.A_log"));
  // layer-level dispatch agrees with the component
  const MethodSpec& gdn = Registry::get().method("gdn");
  auto hp = h.params(cfg, LayerCtx{1, 4});
  auto gp = gdn.params(gdn.config.parse("n_layer=4,d_model=64,head_dim=16,vocab=64,seq_len=32"), LayerCtx{1, 4});
  ASSERT_EQ(hp.size(), gp.size());
  for (size_t i = 0; i < hp.size(); ++i) {
    EXPECT_EQ(hp[i].name, gp[i].name);
    EXPECT_EQ(hp[i].shape, gp[i].shape);
  }
}

// The accountant of a hybrid is the backbone plus, per layer, that layer's method's accountant.
TEST(Hybrid, AccountantIsTheSumOfItsLayers) {
  const std::string shape = "n_layer=8,d_model=128,head_dim=32,vocab=257,seq_len=512";
  const CostQuery q{512, 1024, 2};
  const MethodSpec& h = Registry::get().method("gdn_hybrid");
  const MethodSpec& gdn = Registry::get().method("gdn");
  const MethodSpec& att = Registry::get().method("dense_full");
  ModelCost mh = account_model(h, h.config.parse(shape), q);
  ModelCost mg = account_model(gdn, gdn.config.parse(shape), q);
  ModelCost ma = account_model(att, att.config.parse(shape), q);
  ASSERT_EQ(mh.layers.size(), 8u);
  double core = 0, state = 0, cache = 0;
  int64_t params = 0;
  for (int64_t i = 0; i < 8; ++i) {
    const bool full = (i + 1) % 4 == 0;
    const LayerCost& want = full ? ma.layers[size_t(i)] : mg.layers[size_t(i)];
    const LayerCost& got = mh.layers[size_t(i)];
    EXPECT_EQ(got.params.total(), want.params.total()) << i;
    EXPECT_DOUBLE_EQ(got.fwd_flops, want.fwd_flops) << i;
    EXPECT_DOUBLE_EQ(got.decode_flops, want.decode_flops) << i;
    EXPECT_DOUBLE_EQ(got.state_bytes, want.state_bytes) << i;
    EXPECT_NE(got.formula.find(full ? "dense_full" : "gdn"), std::string::npos) << got.formula;
    core += want.nanochat_core_flops;
    state += want.state_bytes;
    cache += want.cache_bytes_per_token;
    params += want.params.total();
  }
  // backbone parts are the same for every method at this shape
  const int64_t backbone = ma.params.total() - [&] {
    int64_t s = 0;
    for (const auto& l : ma.layers) s += l.params.total();
    return s;
  }();
  EXPECT_EQ(mh.params.total(), backbone + params);
  EXPECT_DOUBLE_EQ(mh.state_bytes, state);
  EXPECT_DOUBLE_EQ(mh.cache_bytes_per_token, cache);
  EXPECT_NEAR(mh.train_flops_nanochat, 6.0 * double(mh.params.matmul) + core, 1e-6 * mh.train_flops_nanochat);
  // between the pure methods
  const double lo = std::min(mg.train_flops_nanochat, ma.train_flops_nanochat);
  const double hi = std::max(mg.train_flops_nanochat, ma.train_flops_nanochat);
  EXPECT_GT(mh.train_flops_nanochat, lo);
  EXPECT_LT(mh.train_flops_nanochat, hi);
  EXPECT_GT(mh.decode_flops, std::min(mg.decode_flops, ma.decode_flops));
  EXPECT_LT(mh.decode_flops, std::max(mg.decode_flops, ma.decode_flops));
  // a full-attention layer caches keys and values per token, GDN holds a fixed state
  EXPECT_DOUBLE_EQ(mh.cache_bytes_per_token, 2.0 * ma.cache_bytes_per_token / 8.0);
  EXPECT_GT(mh.state_bytes, 0.0);
}

// Model-level conformance of every hybrid: optimized CPU forward and gradients of every
// parameter against the FP64 reference backbone (every layer's reference), finite differences
// of the reference and the model's prefill + decode path.
class HybridConformance : public ::testing::TestWithParam<std::string> {};
TEST_P(HybridConformance, ModelMatchesTheFp64Reference) {
  // thousands of tiny FP64 ops (finite differences over every parameter): one intra-op thread,
  // as the trainer uses for small CPU models
  struct OneThread {
    int saved = at::get_num_threads();
    OneThread() { at::set_num_threads(1); }
    ~OneThread() { at::set_num_threads(saved); }
  } one_thread;
  ConformanceOptions opt;
  opt.methods = {GetParam()};
  opt.dtype = "fp64";
  opt.fd_directions = 1;
  ConformanceSummary s;
  Json r = run_conformance(opt, s);
  EXPECT_EQ(s.failed, 0);
  EXPECT_EQ(s.errors, 0);
  int model = 0, fd = 0, decode = 0;
  bool saw_mixer_grad = false, saw_backbone_grad = false;
  for (const auto& x : r) {
    if (x["level"] == "model") ++model;
    if (x["level"] == "fd") ++fd;
    if (x["level"] == "invariant") ++decode;
    EXPECT_EQ(x["status"], "pass") << x.dump();
    if (x["level"] == "model")
      for (const auto& c : x["checks"]) {
        const std::string t = c["tensor"];
        saw_mixer_grad = saw_mixer_grad || t.find(".mixer.") != std::string::npos;
        saw_backbone_grad = saw_backbone_grad || t == "grad_wte";
      }
  }
  EXPECT_EQ(model, 3);
  EXPECT_GE(fd, 2);
  // the decode invariant runs on every case of two tokens or more
  const MethodSpec& m = Registry::get().method(GetParam());
  int multi = 0;
  for (const auto& c : m.cases()) multi += c.T >= 2;
  EXPECT_GE(multi, 2);
  EXPECT_EQ(decode, m.has_decode() ? multi : 0);
  EXPECT_TRUE(saw_mixer_grad);
  EXPECT_TRUE(saw_backbone_grad);
}
INSTANTIATE_TEST_SUITE_P(AllHybrids, HybridConformance, ::testing::ValuesIn(hybrids()),
                         [](const auto& info) { return info.param; });

TEST(Hybrid, ConformanceCommandRunsTheModelLevelCheck) {
  // the conformance command on a hybrid reports model-level results
  fs::path out = hybrid_tmp() / "conf.json";
  ASSERT_EQ(run_cli({"conformance", "--methods", "gdn_hybrid", "--no-fd", "--out", out.string(), "--quiet"}), 0);
  Json rep = Json::parse(read_file(out.string()));
  EXPECT_TRUE(validate_json(rep, report_schema()).empty());
  bool saw_model = false;
  for (const auto& x : rep["results"]) saw_model = saw_model || (x["level"] == "model" && x["method"] == "gdn_hybrid");
  EXPECT_TRUE(saw_model);
}

TEST(Hybrid, TrainsDeterministicallyAndCheckpointKeepsTheLayout) {
  TrainOptions o;
  o.method = "gdn_hybrid";
  o.config = "n_layer=4,d_model=64,head_dim=32,seq_len=32";
  o.steps = 6;
  o.batch = 2;
  o.seed = 5;
  o.eval_every = 3;
  o.eval_batches = 1;
  o.probe_sequences = 0;
  TrainResult a = run_train(o);
  ASSERT_EQ(a.losses.size(), 6u);
  for (double l : a.losses) EXPECT_TRUE(std::isfinite(l));
  EXPECT_LT(a.losses.back(), a.losses.front());
  TrainResult again = run_train(o);
  for (size_t i = 0; i < a.losses.size(); ++i) EXPECT_EQ(a.losses[i], again.losses[i]) << i;

  fs::path dir = hybrid_tmp() / "ckpt";
  fs::remove_all(dir);
  TrainOptions first = o;
  first.out = dir.string();
  first.stop_after = 3;
  run_train(first);
  const std::string ck = (dir / "checkpoint.safetensors").string();
  SafetensorsFile f = read_safetensors(ck);
  ASSERT_TRUE(f.metadata.count("layer_mixers"));
  EXPECT_EQ(Json::parse(f.metadata.at("layer_mixers")).get<std::vector<std::string>>(),
            (std::vector<std::string>{"gdn", "gdn", "gdn", "dense_full"}));
  // resuming reproduces the uninterrupted run
  TrainOptions second = o;
  second.out = dir.string();
  second.resume = true;
  TrainResult b = run_train(second);
  ASSERT_EQ(b.losses.size(), a.losses.size());
  for (size_t i = 0; i < a.losses.size(); ++i) EXPECT_EQ(a.losses[i], b.losses[i]) << i;

  // a tampered layout is refused with a message naming both layouts
  fs::path dir2 = hybrid_tmp() / "tampered";
  fs::remove_all(dir2);
  first.out = dir2.string();
  run_train(first);
  const std::string ck2 = (dir2 / "checkpoint.safetensors").string();
  SafetensorsFile g = read_safetensors(ck2);
  g.metadata["layer_mixers"] = Json(std::vector<std::string>{"gdn", "gdn", "dense_full", "dense_full"}).dump();
  write_safetensors(ck2, g.tensors, g.metadata);
  TrainOptions resume2 = second;
  resume2.out = dir2.string();
  try {
    run_train(resume2);
    FAIL() << "no error";
  } catch (const InputError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("layer layout"), std::string::npos) << msg;
    EXPECT_NE(msg.find("gdn, gdn, gdn, dense_full"), std::string::npos) << msg;
  }
  // and so is a missing one
  g.metadata.erase("layer_mixers");
  write_safetensors(ck2, g.tensors, g.metadata);
  EXPECT_THROW(run_train(resume2), InputError);
}

TEST(Hybrid, DecodeSweepAtModelLevel) {
  fs::path out = hybrid_tmp() / "decode.json";
  ASSERT_EQ(run_cli({"sweep", "--mode", "decode", "--methods", "gdn_hybrid,moba_hybrid,mor", "--level", "model",
                     "--lengths", "32,64", "--batch", "1", "--reps", "2", "--warmup", "1", "--config", "n_layer=4", "--out",
                     out.string(), "--quiet"}),
            0);
  Json r = Json::parse(read_file(out.string()));
  EXPECT_TRUE(validate_json(r, report_schema()).empty());
  int ok = 0, skipped = 0;
  for (const auto& x : r["results"]) {
    if (x["method"] == "mor") {  // mor has no decode step: skipped, not failed
      EXPECT_EQ(x["status"], "skipped") << x.dump();
      ++skipped;
      continue;
    }
    EXPECT_EQ(x["status"], "ok") << x.dump();
    if (x["status"] == "ok") {
      ++ok;
      EXPECT_GT(x["tokens_per_s"].get<double>(), 0.0);
      EXPECT_GT(x["accountant"]["decode_flops_per_token"].get<double>(), 0.0);
      EXPECT_GT(x["cache"]["bytes_after_prefill"].get<double>(), 0.0);
    }
  }
  EXPECT_EQ(ok, 4);
  EXPECT_EQ(skipped, 1);
}

TEST(Hybrid, ListAndAccountCommands) {
  fs::path out = hybrid_tmp() / "list.json";
  testing::internal::CaptureStdout();
  ASSERT_EQ(run_cli({"list", "--json"}), 0);
  Json j = Json::parse(testing::internal::GetCapturedStdout());
  std::set<std::string> seen;
  for (const auto& m : j["methods"]) {
    if (!m.contains("layer_mixers")) continue;  // the layout methods (family hybrid, and looped layouts)
    seen.insert(m["name"].get<std::string>());
    EXPECT_NE(m["summary"].get<std::string>().find("at 12 layers"), std::string::npos) << m["name"];
    EXPECT_EQ(m["layer_mixers"].size(), 12u) << m["name"];
  }
  const std::vector<std::string> all = hybrids();
  EXPECT_GE(all.size(), 7u);
  EXPECT_EQ(seen, std::set<std::string>(all.begin(), all.end()));
  fs::path acc = hybrid_tmp() / "account.json";
  ASSERT_EQ(run_cli({"account", "--method", "deltanet_hybrid", "--config", "n_layer=4,d_model=128,head_dim=32,vocab=257",
                     "--seq-len", "64", "--audit", "--out", acc.string()}),
            0);
  Json a = Json::parse(read_file(acc.string()));
  EXPECT_TRUE(validate_json(a, report_schema()).empty());
  const Json& res = a["results"][0];
  EXPECT_TRUE(res["audit"]["params_match"].get<bool>());
  EXPECT_LT(res["audit"]["fwd_flops_rel_diff"].get<double>(), 0.02);
  std::vector<std::string> methods;
  for (const auto& l : res["layers"]) methods.push_back(l["method"]);
  EXPECT_EQ(methods, (std::vector<std::string>{"deltanet", "dense_full", "dense_full", "deltanet"}));
  EXPECT_EQ(run_cli({"account", "--method", "gdn_hybrid", "--config", "qsa_topk=3"}), 2);  // not a gdn_hybrid field
}

// The leaderboard's iso-FLOP calibration searches the same grid for a hybrid, whose layout
// follows each candidate depth; the chosen shape's FLOPs are the hybrid accountant's.
TEST(Hybrid, IsoFlopCalibration) {
  for (const auto& name : hybrids()) {
    Calibration c = calibrate(name, "tiny");
    const MethodSpec& m = Registry::get().method(name);
    Config cfg = m.config.parse(train_preset("tiny").config_for(name) + "," + c.config);
    const double f = account_model(m, cfg, CostQuery{cfg.i("seq_len"), cfg.i("seq_len"), 2}).train_flops_nanochat;
    EXPECT_DOUBLE_EQ(f, c.flops) << name;
    EXPECT_NEAR(c.flops / c.anchor_flops - 1, c.residual, 1e-12) << name;
    EXPECT_EQ(c.within, std::abs(c.residual) <= 0.02) << name;
    std::printf("%s: L=%lld d=%lld residual %+.4f\n", name.c_str(), (long long)c.n_layer, (long long)c.d_model, c.residual);
  }
  // the Qwen3-Next layout calibrates within 2% at the tiny preset
  Calibration g = calibrate("gdn_hybrid", "tiny");
  EXPECT_TRUE(g.within) << g.residual;
  for (const char* pure : {"gdn", "deltanet"}) {
    Calibration c = calibrate(pure, "tiny");
    std::printf("%s: L=%lld d=%lld residual %+.4f\n", pure, (long long)c.n_layer, (long long)c.d_model, c.residual);
  }
}

TEST(Hybrid, DecodeOfAHybridWithoutDecodeNamesTheLayerMethod) {
  // every registered hybrid's layer methods decode: one layer swapped for a method without hooks
  const MethodSpec& h = Registry::get().method("gdn_hybrid");
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(2);
  Model m = build_model(h, h.config.parse("n_layer=4,d_model=64,head_dim=16,vocab=64,seq_len=32"), gen,
                        at::TensorOptions().dtype(at::kFloat));
  MethodSpec no_hooks = *m.layer_specs[1];
  no_hooks.name = "gdn_without_decode";
  no_hooks.prefill = nullptr;
  no_hooks.decode = nullptr;
  m.layer_specs[1] = &no_hooks;
  ModelCache cache;
  at::Tensor idx = at::zeros({1, 4}, at::TensorOptions().dtype(at::kLong));
  try {
    model_prefill(m, idx, Backend::CPU, &cache);
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("layer method(s) gdn_without_decode"), std::string::npos) << e.what();
  }
}

// Below fp64 a hybrid is checked as a whole model at fp32 (against the model thresholds or its
// baseline) and its layer methods at layer level too; in bf16 only its layer methods are checked,
// the model cases skipped with the reason.
TEST(Hybrid, ReducedPrecisionChecksTheModelAtFp32AndTheLayerMethods) {
  ConformanceOptions opt;
  opt.methods = {"gdn_hybrid"};
  opt.dtype = "fp32";
  opt.finite_differences = false;
  ConformanceSummary s;
  Json r = run_conformance(opt, s);
  EXPECT_EQ(s.failed, 0);
  EXPECT_EQ(s.errors, 0);
  std::set<std::string> layer_methods_seen;
  int model = 0;
  for (const auto& x : r) {
    if (x["method"] == "gdn_hybrid" && x["level"] == "model") {
      EXPECT_EQ(x["status"], "pass") << x.dump();
      EXPECT_GE(x["baseline_samples"].get<int>(), 1);
      for (const auto& c : x["checks"]) EXPECT_TRUE(c.contains("criterion")) << c.dump();
      ++model;
    } else if (x["level"] == "layer") {
      layer_methods_seen.insert(x["method"].get<std::string>());
    }
  }
  EXPECT_EQ(model, 3);
  EXPECT_EQ(layer_methods_seen, (std::set<std::string>{"gdn", "dense_full"}));
  opt.dtype = "bf16";
  for (const conformance_detail::Subject& sub : conformance_detail::conformance_subjects(opt)) {
    const conformance_detail::SubjectCase k = sub.make(sub.cases.at(0));
    if (k.base["method"] == "gdn_hybrid") {
      EXPECT_NE(k.skip_reason.find("fp64 and fp32"), std::string::npos) << k.skip_reason;
    } else {
      EXPECT_EQ(k.base["level"], "layer");
      EXPECT_TRUE(k.skip_reason.empty()) << k.skip_reason;
    }
  }
}
