// The pieces the method families share: the backbone's value-embedding rule and the layers'
// value-embedding gate, the q/k/v op spec of the attention-shaped ops, the sparse method builder
// and the gated linear-attention layer's knob kinds.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <string>
#include <vector>

#include "harness/backbone.h"
#include "harness/errors.h"
#include "harness/registry.h"
#include "mixers/common/layers.h"
#include "mixers/common/qkv_op.h"
#include "mixers/linear/gla_family.h"
#include "mixers/sparse/sparse_method.h"
#include "reference/gla.h"

using namespace mixbench;

namespace {
auto f64 = at::TensorOptions().dtype(at::kDouble);

std::vector<std::string> field_names(const ConfigSpec& s) {
  std::vector<std::string> out;
  for (const auto& f : s.fields()) out.push_back(f.name);
  return out;
}

// The InputError message of fn(), or "" when it does not throw one.
template <typename F>
std::string input_error(F fn) {
  try {
    fn();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

// ------------------------------------------------------------------------------ value embeddings

TEST(FamilyBuilders, LayerHasVeAlternatesAndKeepsTheLastLayer) {
  for (int64_t n : {1, 2, 3, 4, 5, 12}) {
    for (int64_t i = 0; i < n; ++i)
      EXPECT_EQ(layer_has_ve(LayerCtx{i, n}), (n - 1 - i) % 2 == 0) << "layer " << i << " of " << n;
    EXPECT_TRUE(layer_has_ve(LayerCtx{n - 1, n})) << n;
  }
  EXPECT_EQ(kVeGateChannels, 12);
}

// Every single-mixer method follows the backbone's rule: a value-embedding table and a
// ve_gate [heads, kVeGateChannels] exactly on the layers layer_has_ve names, and a "ve" input of
// that table's width in its conformance inputs.
TEST(FamilyBuilders, EveryMethodFollowsTheValueEmbeddingRule) {
  int checked = 0;
  for (const MethodSpec* m : Registry::get().methods()) {
    if (m->is_hybrid() || m->name.rfind("mla", 0) == 0) continue;  // the MLA methods take no value embedding
    const Config cfg = m->config.parse("n_layer=4,d_model=64,head_dim=16,seq_len=64,vocab=64");
    for (int64_t i = 0; i < 4; ++i) {
      const LayerCtx ctx{i, 4};
      const int64_t ve = m->ve_dim(cfg, ctx);
      EXPECT_EQ(ve > 0, layer_has_ve(ctx)) << m->name << " layer " << i;
      std::vector<ParamDef> ps = m->params(cfg, ctx);
      auto gate = std::find_if(ps.begin(), ps.end(), [](const ParamDef& p) { return p.name == "ve_gate"; });
      ASSERT_EQ(gate != ps.end(), layer_has_ve(ctx)) << m->name << " layer " << i;
      if (gate != ps.end()) {
        ASSERT_EQ(gate->shape.size(), 2u);
        EXPECT_EQ(gate->shape[1], kVeGateChannels) << m->name;
        EXPECT_EQ(ve % gate->shape[0], 0) << m->name << ": one gate per value head";
      }
      at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(3);
      TensorMap in = m->make_inputs(cfg, ctx, 2, 5, gen);
      ASSERT_EQ(in.has("ve"), layer_has_ve(ctx)) << m->name << " layer " << i;
      if (in.has("ve")) EXPECT_EQ(in.at("ve").sizes(), at::IntArrayRef({2, 5, ve})) << m->name;
    }
    ++checked;
  }
  EXPECT_GE(checked, 15);
}

TEST(FamilyBuilders, ValueEmbedGateAddsToV) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(11);
  const int64_t B = 2, T = 3, H = 2, V = 4, d = 16;
  at::Tensor x = at::randn({B, T, d}, gen, f64), v = at::randn({B, T, H, V}, gen, f64);
  at::Tensor ve = at::randn({B, T, H * V}, gen, f64), w = at::randn({H, kVeGateChannels}, gen, f64);
  // Without "ve" the values pass through untouched.
  EXPECT_TRUE(layers::add_value_embed(v, TensorMap{{"x", x}}).equal(v));
  // With it: v + 3·sigmoid(x[..., :12] W_vegᵀ)·ve, one gate per head.
  at::Tensor got = layers::add_value_embed(v, TensorMap{{"x", x}, {"ve", ve}, {"ve_gate", w}});
  at::Tensor gate = 3.0 * at::sigmoid(at::matmul(x.slice(-1, 0, kVeGateChannels), w.t()));  // [B,T,H]
  at::Tensor want = v + gate.unsqueeze(-1) * ve.view({B, T, H, V});
  EXPECT_LT((got - want).abs().max().item<double>(), 1e-12);
  EXPECT_GT((got - v).abs().max().item<double>(), 0.1);

  EXPECT_EQ(layers::ve_gate_params(LayerCtx{3, 4}, 5), 5 * kVeGateChannels);
  EXPECT_EQ(layers::ve_gate_params(LayerCtx{2, 4}, 5), 0);
  EXPECT_EQ(layers::ve_width(LayerCtx{1, 4}, 3, 8), 24);
  EXPECT_EQ(layers::ve_width(LayerCtx{0, 4}, 3, 8), 0);
}

TEST(FamilyBuilders, TooNarrowModelForTheGateIsAnInputError) {
  // The rule itself (the backbone's smear-gate rule, 24 channels, refuses such models first).
  const Config base = backbone_config().defaults().with("head_dim", int64_t(4));
  EXPECT_EQ(input_error([&] { layers::require_ve_gate_width(base.with("d_model", int64_t(8))); }),
            "d_model must be at least 12 (VE gate channels)");
  EXPECT_EQ(input_error([&] { layers::require_ve_gate_width(base.with("d_model", int64_t(12))); }), "");
}

// ------------------------------------------------------------------------- the q/k/v op spec

TEST(FamilyBuilders, AttentionShapedOpsShareTheQkvSpec) {
  const std::vector<std::string> shape = {"H", "Hkv", "D", "Dv"};
  for (const char* name : {"attention", "sparse_attention", "block_sparse_attention"}) {
    const OpSpec& op = Registry::get().op(name);
    std::vector<std::string> f = field_names(op.params);
    ASSERT_GE(f.size(), 5u) << name;
    EXPECT_EQ(f.front(), "scale") << name;
    EXPECT_EQ(std::vector<std::string>(f.end() - 4, f.end()), shape) << name;
    ASSERT_GE(op.inputs.size(), 3u);
    EXPECT_EQ(op.inputs[0].name, "q");
    EXPECT_EQ(op.inputs[1].name, "k");
    EXPECT_EQ(op.inputs[2].name, "v");
    EXPECT_EQ(op.outputs, std::vector<std::string>{"o"}) << name;
    // The case shape's rule names the op.
    const std::string rule = input_error([&] { op.params.parse("H=3,Hkv=2"); });
    EXPECT_EQ(rule, std::string(name) + ": H=3 is not divisible by Hkv=2");

    // The same q, k, v draws for the same case shape and seed.
    const Config cfg = op.params.parse("H=4,Hkv=2,D=8,Dv=6");
    at::Generator g1 = at::make_generator<at::CPUGeneratorImpl>(7), g2 = at::make_generator<at::CPUGeneratorImpl>(7);
    TensorMap in = op.make_inputs(cfg, 2, 9, g1), qkv = qkv_op::make_inputs(cfg, 2, 9, g2);
    for (const char* n : {"q", "k", "v"}) EXPECT_TRUE(in.at(n).equal(qkv.at(n))) << name << " " << n;
    EXPECT_EQ(in.at("v").sizes(), at::IntArrayRef({2, 9, 2, 6}));
    op.check_inputs(in, cfg);  // the op's own inputs pass

    // Bad q/k/v: the error names the op and the problem.
    TensorMap missing = in;
    missing.erase("k");
    EXPECT_EQ(input_error([&] { op.check_inputs(missing, cfg); }), std::string(name) + ": missing input 'k'");
    TensorMap heads = in;
    heads.set("k", at::randn({2, 9, 3, 8}, f64));
    heads.set("v", at::randn({2, 9, 3, 6}, f64));
    EXPECT_EQ(input_error([&] { op.check_inputs(heads, cfg); }),
              std::string(name) + ": 4 query heads are not a multiple of 3 KV heads");
    TensorMap dims = in;
    dims.set("q", at::randn({2, 9, 4}, f64));
    EXPECT_EQ(input_error([&] { op.check_inputs(dims, cfg); }), std::string(name) + ": 'q' must be [B,T,H,D], got 3 dims");
  }
  EXPECT_DOUBLE_EQ(qkv_op::resolve_scale(Config().with("scale", 0.0), 16), 0.25);
  EXPECT_DOUBLE_EQ(qkv_op::resolve_scale(Config().with("scale", 0.3), 16), 0.3);
}

// ---------------------------------------------------------------------- the sparse method builder

TEST(FamilyBuilders, SparseMethodBuilderSharesTheAttentionLayer) {
  SparseMethodDesc d;
  d.name = "probe";
  d.summary = "s";
  d.citation = "c";
  d.warmup = true;
  d.knobs = [](ConfigSpec& s) { s.i("probe_k", 3, "a knob", 1); };
  d.ops = {"attention"};
  d.params = sparse_layer::attention_params;
  ConfigSpec seen;
  d.cases = [&seen](const ConfigSpec& s) {
    seen = s;
    return std::vector<CaseDef>{};
  };
  MethodSpec m = sparse_method(d);
  EXPECT_EQ(m.family, "sparse");
  EXPECT_TRUE(m.has_cuda);  // the layers run the *_fast entry points on every backend
  const std::vector<std::string> f = field_names(m.config);
  const std::vector<std::string> tail = {"kv_ratio", "rope_base", "full_attention_warmup_frac", "full_attention_warmup_steps",
                                         "allow_full_warmup", "probe_k"};
  ASSERT_GE(f.size(), tail.size());
  EXPECT_EQ(std::vector<std::string>(f.end() - 6, f.end()), tail);
  m.cases();
  EXPECT_NE(seen.find("probe_k"), nullptr) << "cases see the method's full config";
  const Config cfg = m.config.parse("n_layer=2,d_model=32,head_dim=8,kv_ratio=2");
  EXPECT_EQ(m.ve_dim(cfg, LayerCtx{1, 2}), 2 * 8);
  EXPECT_EQ(m.ve_dim(cfg, LayerCtx{0, 2}), 0);
  EXPECT_NE(input_error([&] { m.config.parse("n_layer=2,d_model=32,head_dim=8,kv_ratio=3"); }).find("kv_ratio 3"),
            std::string::npos);

  d.warmup = false;
  EXPECT_EQ(MethodSpec(sparse_method(d)).config.find("full_attention_warmup_steps"), nullptr);

  // The registered sparse methods are built by it: the shared knobs, the warm-up knob on the
  // methods trained with a KL, the shared layer inputs.
  for (const char* name : {"moba", "dsa", "qsa", "nsa", "seer"}) {
    const MethodSpec& s = Registry::get().method(name);
    EXPECT_EQ(s.family, "sparse");
    EXPECT_NE(s.config.find("kv_ratio"), nullptr) << name;
    const bool kl = std::string(name) == "dsa" || std::string(name) == "qsa" || std::string(name) == "seer";
    EXPECT_EQ(s.config.find("full_attention_warmup_steps") != nullptr, kl) << name;
    const Config c = s.config.defaults();
    at::Generator g1 = at::make_generator<at::CPUGeneratorImpl>(4), g2 = at::make_generator<at::CPUGeneratorImpl>(4);
    TensorMap a = s.make_inputs(c, LayerCtx{11, 12}, 1, 3, g1);
    TensorMap b = sparse_layer::make_layer_inputs(c, LayerCtx{11, 12}, 1, 3, g2);
    EXPECT_TRUE(a.at("x").equal(b.at("x")) && a.at("ve").equal(b.at("ve"))) << name;
  }
}

// --------------------------------------------------------------- gated linear-attention knobs

TEST(FamilyBuilders, GlaKnobsParseToTheirKinds) {
  using namespace reference;
  EXPECT_EQ(parse_gla_decay("zero"), GlaDecay::Zero);
  EXPECT_EQ(parse_gla_decay("retnet"), GlaDecay::Retnet);
  EXPECT_EQ(parse_gla_decay("lightning"), GlaDecay::Lightning);
  EXPECT_EQ(parse_gla_decay("lowrank"), GlaDecay::LowRank);
  EXPECT_EQ(parse_gla_feature("none"), GlaFeature::None);
  EXPECT_EQ(parse_gla_feature("elu1"), GlaFeature::Elu1);
  EXPECT_EQ(parse_gla_out_gate("none"), GlaOutGate::None);
  EXPECT_EQ(parse_gla_out_gate("silu"), GlaOutGate::Silu);
  EXPECT_EQ(parse_gla_out_gate("sigmoid"), GlaOutGate::Sigmoid);
  EXPECT_EQ(input_error([] { parse_gla_decay("fixed"); }), "decay 'fixed' is not one of zero, retnet, lightning, lowrank");
  EXPECT_EQ(input_error([] { parse_gla_feature("relu"); }), "feature map 'relu' is not one of none, elu1");
  EXPECT_EQ(input_error([] { parse_gla_out_gate("tanh"); }), "output gate 'tanh' is not one of none, silu, sigmoid");

  // The layer builder parses its descriptor: a misspelt knob is refused, the kinds shape the layer.
  linear::GlaFamilyDesc d;
  d.name = "probe";
  d.decay = "lowrnk";
  EXPECT_NE(input_error([&] { linear::make_gla_family_method(d); }).find("decay 'lowrnk'"), std::string::npos);
  d.decay = "lowrank";
  d.op = "gla";
  d.out_gate = "sigmoid";
  MethodSpec m = linear::make_gla_family_method(d);
  EXPECT_NE(m.config.find("gate_low_rank"), nullptr);
  const Config cfg = m.config.parse("n_layer=2,d_model=32,head_dim=8");
  std::vector<std::string> names;
  for (const ParamDef& p : m.params(cfg, LayerCtx{0, 2})) names.push_back(p.name);
  for (const char* n : {"w_g", "w_gk1", "w_gk2", "b_gk"})
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
  d.decay = "retnet";
  d.op = "simple_gla";
  d.out_gate = "none";
  MethodSpec r = linear::make_gla_family_method(d);
  EXPECT_EQ(r.config.find("gate_low_rank"), nullptr);
  names.clear();
  for (const ParamDef& p : r.params(cfg, LayerCtx{0, 2})) names.push_back(p.name);
  EXPECT_EQ(std::find(names.begin(), names.end(), "w_g"), names.end());
}
