// Hybrid methods: a named per-layer layout over registered methods (methods.md §6). A hybrid has
// no layer of its own: layer i of an n_layer model runs layout(cfg)[i].method with that choice's
// config overrides, and every MethodSpec function of the hybrid dispatches to it. The backbone
// (harness/backbone.cpp, layer_methods) builds, runs, accounts and checkpoints each layer with its
// own method; a model's `layer_mixers` is the layout.
//
// Config: the union of the backbone fields, the hybrid's own knobs and every component's fields.
// Two components declaring the same field with a different type or default is a registration
// error unless the hybrid declares that field itself (then its default holds for every layer);
// unknown keys are refused as for any method; each component's own rules run on its layers' configs.
//
// Layouts (layer i 1-based, N = n_layer):
//   gdn_hybrid       full attention (dense_full) iff i % 4 == 0, else GDN: 3 GDN then 1 full,
//                    Qwen3-Next's interval 4 exactly (N not a multiple of 4 ends on GDN layers)
//   deltanet_hybrid  full attention at i = 2 and i = N/2 + 1 (integer division), else DeltaNet
//   qsa_hybrid       QSA iff i % 4 == 0, else GDN
//   moba_hybrid      full attention for the last three layers (i > N − 3), else MoBA
//   gdn_hybrid_swa   GDN at odd i, sliding-window attention (dense_full's layer with
//                    window_pattern=S, short_window = swa_window − 1) at even i; swa_window = 2048
//                    visible keys including the query. The attention method keeps nanochat's
//                    rule that the model's last layer attends fully, so at even N the last layer
//                    is full attention.
//   hypenet          HypeNet (HyPE): Lightning layers with RoPE, and at i % 4 == 0 full attention
//                    with NoPE, QK-norm (nanochat's), an output gate and the inference-time logit
//                    scale s_t = log_a(t + a), a = hype_logit_a (300: the from-scratch setting). RoPE
//                    base 10000 for the Lightning layers (the attention layers use none).
//   kda_hybrid       MLA without RoPE (mla_rope_dim=0) iff i % 4 == 0, else KDA (Kimi Linear's 3:1).
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <set>
#include <stdexcept>

#include "harness/args.h"
#include "harness/backbone.h"
#include "harness/errors.h"
#include "harness/registry.h"
#include "mixers/hybrid/hybrid.h"

namespace mixbench {
namespace {

// The method and config of layer ctx.layer.
LayerMethod at_layer(const LayoutFn& layout, const Config& c, const LayerCtx& ctx) {
  std::vector<LayerChoice> lay = layout(c);
  if (ctx.layer < 0 || ctx.layer >= int64_t(lay.size()))
    throw InputError(fmt::format("layer {} is outside the hybrid's {} layers", ctx.layer, lay.size()));
  const LayerChoice& ch = lay[size_t(ctx.layer)];
  const MethodSpec& m = Registry::get().method(ch.method);
  return {&m, ch.overrides.empty() ? c : m.config.parse(ch.overrides, &c)};
}

void add_field(ConfigSpec& spec, const FieldDef& f) {
  switch (f.def.index()) {
    case 0: spec.i(f.name, std::get<int64_t>(f.def), f.help, f.min, f.max); break;
    case 1: spec.f(f.name, std::get<double>(f.def), f.help, f.min, f.max); break;
    case 2: spec.b(f.name, std::get<bool>(f.def), f.help); break;
    default: spec.s(f.name, std::get<std::string>(f.def), f.help, f.choices); break;
  }
}

// "gdn×3, dense_full" run-length text of a layout; a layout that repeats a shorter block is
// written "(block)×k".
std::string layout_text(const std::vector<LayerChoice>& lay) {
  auto same = [](const LayerChoice& a, const LayerChoice& b) { return a.method == b.method && a.overrides == b.overrides; };
  for (size_t p = 1; p < lay.size(); ++p) {
    if (lay.size() % p != 0) continue;
    bool periodic = true;
    for (size_t i = p; i < lay.size() && periodic; ++i) periodic = same(lay[i], lay[i % p]);
    if (periodic && p > 1)
      return fmt::format("({})×{}", layout_text(std::vector<LayerChoice>(lay.begin(), lay.begin() + long(p))), lay.size() / p);
    if (periodic) break;  // one method throughout: plain run-length text
  }
  std::string out;
  for (size_t i = 0; i < lay.size();) {
    size_t j = i;
    while (j < lay.size() && lay[j].method == lay[i].method && lay[j].overrides == lay[i].overrides) ++j;
    std::string item = lay[i].method + (lay[i].overrides.empty() ? "" : "[" + lay[i].overrides + "]");
    if (j - i > 1) item += fmt::format("×{}", j - i);
    out += (out.empty() ? "" : ", ") + item;
    i = j;
  }
  return out;
}

// Builds the union config, ops, CUDA flag, decode hooks, cases and summary once every method is
// registered.
void complete(MethodSpec& m, const HybridDesc& desc) {
  // Components: the methods of the layout at a few depths (a layout is a function of n_layer).
  ConfigSpec spec = backbone_config();
  for (const auto& f : desc.own.fields()) add_field(spec, f);
  std::vector<std::string> comps;
  for (int64_t L : std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 12}) {
    Config probe = spec.defaults().with("n_layer", L);
    for (const auto& ch : desc.layout(probe))
      if (std::find(comps.begin(), comps.end(), ch.method) == comps.end()) comps.push_back(ch.method);
  }
  std::map<std::string, std::string> owner;  // field -> first method declaring it
  for (const auto& f : spec.fields()) owner[f.name] = m.name;
  bool has_cuda = true, decode = true, static_decode = true;
  std::set<std::string> ops;
  for (const auto& cname : comps) {
    const MethodSpec& c = Registry::get().method(cname);
    if (c.is_hybrid()) throw std::logic_error(fmt::format("hybrid {}: component {} is itself a hybrid", m.name, cname));
    for (const auto& f : c.config.fields()) {
      const FieldDef* have = spec.find(f.name);
      if (!have) {
        add_field(spec, f);
        owner[f.name] = cname;
      } else if (have->def != f.def && !(owner[f.name] == m.name && have->def.index() == f.def.index())) {
        throw std::logic_error(fmt::format("hybrid {}: {} and {} disagree on config field '{}' (type or default)", m.name,
                                           owner[f.name], cname, f.name));
      }
    }
    for (const auto& o : c.ops) ops.insert(o);
    // the components' training-preset config overrides, each "k=v" item once, in component order
    for (const auto& [preset, po] : c.presets) {
      std::string& mine = m.presets[preset].config;
      for (const auto& item : split(po.config, ','))
        if (!item.empty() && ("," + mine + ",").find("," + item + ",") == std::string::npos)
          mine += (mine.empty() ? "" : ",") + item;
    }
    has_cuda = has_cuda && c.has_cuda;
    decode = decode && c.has_decode();
    static_decode = static_decode && c.static_decode;
  }
  // Every layer's method validates its own config (its rules included).
  LayoutFn layout = desc.layout;
  const std::string name = m.name;
  spec.rule([layout, name](const Config& c) {
    std::set<std::string> seen;
    for (const auto& ch : layout(c)) {
      if (!seen.insert(ch.method + "|" + ch.overrides).second) continue;
      try {
        Registry::get().method(ch.method).config.parse(ch.overrides, &c);
      } catch (const InputError& e) {
        throw InputError(fmt::format("{} (in {}'s {} layers)", e.what(), name, ch.method));
      }
    }
  });
  m.config = spec;
  m.ops.assign(ops.begin(), ops.end());
  m.has_cuda = has_cuda;
  m.static_decode = decode && static_decode;
  if (decode) {
    m.prefill = [layout](const TensorMap& in, TensorMap& cache, const Config& c, const LayerCtx& ctx, Backend b) {
      LayerMethod l = at_layer(layout, c, ctx);
      return l.method->prefill(in, cache, l.cfg, ctx, b);
    };
    m.decode = [layout](const TensorMap& in, TensorMap& cache, const Config& c, const LayerCtx& ctx, Backend b) {
      LayerMethod l = at_layer(layout, c, ctx);
      return l.method->decode(in, cache, l.cfg, ctx, b);
    };
  }
  // Model-level conformance cases (the suite runs a hybrid as a whole model).
  const std::string extra = desc.case_config;
  const int64_t t0 = desc.case_min_T;
  m.cases = [spec, extra, t0]() {
    Config base = spec.parse("n_layer=4,d_model=64,head_dim=16,seq_len=64,vocab=64" + (extra.empty() ? "" : "," + extra));
    return std::vector<CaseDef>{
        {fmt::format("model_n4_T{}", t0), base, 1, t0, 0},
        {"model_n4_B2_T21", base, 2, 21, 0},
        {"model_n5_T37", base.with("n_layer", int64_t(5)), 1, 37, 0},
    };
  };
  Config d12 = spec.defaults().with("n_layer", int64_t(12));
  m.summary = fmt::format("{}; at 12 layers: {}", desc.summary, layout_text(desc.layout(d12)));
}

}  // namespace

MethodSpec make_hybrid(HybridDesc desc) {
  MethodSpec m;
  m.name = desc.name;
  m.family = "hybrid";
  m.summary = desc.summary;
  m.citation = desc.citation;
  m.config = backbone_config();
  m.layout = desc.layout;
  LayoutFn layout = desc.layout;
  m.params = [layout](const Config& c, const LayerCtx& ctx) {
    LayerMethod l = at_layer(layout, c, ctx);
    return l.method->params(l.cfg, ctx);
  };
  m.make_inputs = [layout](const Config& c, const LayerCtx& ctx, int64_t B, int64_t T, at::Generator& gen) {
    LayerMethod l = at_layer(layout, c, ctx);
    return l.method->make_inputs(l.cfg, ctx, B, T, gen);
  };
  m.reference = [layout](const TensorMap& in, const Config& c, const LayerCtx& ctx) {
    LayerMethod l = at_layer(layout, c, ctx);
    return l.method->reference(in, l.cfg, ctx);
  };
  m.forward = [layout](const TensorMap& in, const Config& c, const LayerCtx& ctx, Backend b) {
    LayerMethod l = at_layer(layout, c, ctx);
    return l.method->forward(in, l.cfg, ctx, b);
  };
  m.account = [layout](const Config& c, const LayerCtx& ctx, const CostQuery& q) {
    LayerMethod l = at_layer(layout, c, ctx);
    LayerCost lc = l.method->account(l.cfg, ctx, q);
    lc.formula = l.method->name + ": " + lc.formula;
    return lc;
  };
  m.ve_dim = [layout](const Config& c, const LayerCtx& ctx) -> int64_t {
    LayerMethod l = at_layer(layout, c, ctx);
    return l.method->ve_dim ? l.method->ve_dim(l.cfg, ctx) : 0;
  };
  m.cases = []() { return std::vector<CaseDef>{}; };  // replaced in complete()
  m.complete = [desc](MethodSpec& self) { complete(self, desc); };
  return m;
}

namespace {

// Layout helper: layer i (1-based) of N runs `a` when pick(i, N), else `b`.
LayoutFn two_way(std::string a, std::string a_over, std::string b, std::function<bool(int64_t, int64_t)> pick) {
  return [a, a_over, b, pick](const Config& c) {
    const int64_t N = c.i("n_layer");
    std::vector<LayerChoice> out;
    for (int64_t i = 1; i <= N; ++i) out.push_back(pick(i, N) ? LayerChoice{a, a_over} : LayerChoice{b, ""});
    return out;
  };
}

// The hybrids whose layout picks one of two methods per layer (`a` with the overrides a_over).
HybridDesc two_way_hybrid(std::string name, std::string summary, std::string citation, std::string a, std::string b,
                          std::function<bool(int64_t, int64_t)> pick, std::string case_config,
                          std::string a_over = "") {
  HybridDesc d;
  d.name = std::move(name);
  d.summary = std::move(summary);
  d.citation = std::move(citation);
  d.layout = two_way(std::move(a), std::move(a_over), std::move(b), std::move(pick));
  d.case_config = std::move(case_config);
  return d;
}

HybridDesc gdn_hybrid() {
  return two_way_hybrid("gdn_hybrid",
                        "3 GDN then 1 full attention, repeating (Qwen3-Next, interval 4: layer i full iff i % 4 == 0)",
                        "Qwen3-Next (full-attention interval 4); methods.md §6", "dense_full", "gdn",
                        [](int64_t i, int64_t) { return i % 4 == 0; }, "gate_bias_offset=-5");
}

HybridDesc deltanet_hybrid() {
  return two_way_hybrid("deltanet_hybrid", "DeltaNet with full attention at layers 2 and N/2+1 (1-based)",
                        "Yang et al. 2024 (DeltaNet hybrid with two global attention layers); methods.md §6",
                        "dense_full", "deltanet", [](int64_t i, int64_t N) { return i == 2 || i == N / 2 + 1; }, "");
}

HybridDesc qsa_hybrid() {
  return two_way_hybrid("qsa_hybrid", "GDN, GDN, GDN, QSA repeating (layer i QSA iff i % 4 == 0)",
                        "methods.md §6 (seed 001)", "qsa", "gdn", [](int64_t i, int64_t) { return i % 4 == 0; },
                        "gate_bias_offset=-5,qsa_block=4,qsa_topk=3,qsa_heads=4,qsa_dim=8,qsa_group=2,qsa_rope_dim=4");
}

HybridDesc moba_hybrid() {
  return two_way_hybrid("moba_hybrid", "MoBA with the last three layers full attention",
                        "Lu et al. 2025 (MoBA: last three layers full attention); methods.md §6", "dense_full",
                        "moba", [](int64_t i, int64_t N) { return i > N - 3; }, "moba_block=8,moba_topk=2");
}

HybridDesc gdn_hybrid_swa() {
  HybridDesc d;
  d.name = "gdn_hybrid_swa";
  d.summary = "alternating GDN and sliding-window attention (swa_window keys; the last layer full by nanochat's rule)";
  d.citation = "Yang, Kautz, Hatamizadeh 2025 (Gated DeltaNet-H1: GDN + SWA); methods.md §6";
  d.own.i("swa_window", 2048, "keys visible to the sliding-window layers, the query included", 2);
  d.layout = [](const Config& c) {
    const int64_t N = c.i("n_layer");
    const std::string swa = fmt::format("window_pattern=S,short_window={}", c.i("swa_window") - 1);
    std::vector<LayerChoice> out;
    for (int64_t i = 1; i <= N; ++i) out.push_back(i % 2 == 0 ? LayerChoice{"dense_full", swa} : LayerChoice{"gdn", ""});
    return out;
  };
  d.case_config = "gate_bias_offset=-5,swa_window=9";
  return d;
}

HybridDesc kda_hybrid() {
  return two_way_hybrid("kda_hybrid", "3 KDA then 1 MLA without RoPE, repeating (layer i MLA iff i % 4 == 0)",
                        "Kimi Linear (KDA with NoPE MLA, 3:1); methods.md §6", "mla", "kda",
                        [](int64_t i, int64_t) { return i % 4 == 0; }, "gate_bias_offset=-5", "mla_rope_dim=0");
}

HybridDesc hypenet() {
  HybridDesc d;
  d.name = "hypenet";
  d.summary = "HypeNet: Lightning (RoPE) with 1 in 4 layers full attention (NoPE, output gate, inference logit scale)";
  d.citation = "HypeNet / HALO (HyPE, Sec. 5, Eqs. 11, 17-19); methods.md §6 (seed 000)";
  d.own.f("hype_logit_a", 300.0, "base a of the attention layers' inference logit scale s_t = log_a(t + a)", 1.0 + 1e-9)
      .f("rope_base", 10000.0, "RoPE base of the Lightning layers (the attention layers use NoPE)", 1.0);
  d.layout = [](const Config& c) {
    const int64_t N = c.i("n_layer");
    const std::string attn =
        fmt::format("rope=false,out_gate=true,logit_scale_train=false,logit_scale_a={}", c.f("hype_logit_a"));
    std::vector<LayerChoice> out;
    for (int64_t i = 1; i <= N; ++i)
      out.push_back(i % 4 == 0 ? LayerChoice{"dense_full", attn} : LayerChoice{"lightning", ""});
    return out;
  };
  // A single token makes a Lightning layer's output independent of the size of q·k (the output
  // RMSNorm of a multiple of v), so its q/k gradients are rounding noise there: the Lightning
  // layer's own cases start at T = 2, and so do these. The attention options (NoPE, gate, a small
  // logit-scale base) are checked at layer level by dense_full's cases; the model runs a = 300.
  d.case_min_T = 2;
  return d;
}

// A hybrid's micro-batch at a preset is its own (its full-attention layers need less memory than
// its components' own settings assume): at gpu-d12, rows per micro-batch that fit an H200.
MethodSpec with_micro_batch(MethodSpec m, const std::string& preset, int64_t rows) {
  m.presets[preset].micro_batch = rows;
  return m;
}

MIXBENCH_REGISTER(make_hybrid(gdn_hybrid()));
MIXBENCH_REGISTER(with_micro_batch(make_hybrid(deltanet_hybrid()), "gpu-d12", 16));
MIXBENCH_REGISTER(with_micro_batch(make_hybrid(qsa_hybrid()), "gpu-d12", 1));
MIXBENCH_REGISTER(with_micro_batch(make_hybrid(moba_hybrid()), "gpu-d12", 2));
MIXBENCH_REGISTER(make_hybrid(gdn_hybrid_swa()));
MIXBENCH_REGISTER(make_hybrid(hypenet()));
MIXBENCH_REGISTER(with_micro_batch(make_hybrid(kda_hybrid()), "gpu-d12", 4));

}  // namespace
}  // namespace mixbench
