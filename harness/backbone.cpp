#include "harness/backbone.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>

#include "harness/decode_ops.h"
#include "harness/errors.h"
#include "harness/nvtx.h"
#include "harness/fused_ops.h"
#include "harness/fused_stream.h"
#include "harness/op_scope.h"

namespace mixbench {

ConfigSpec backbone_config() {
  ConfigSpec s;
  s.i("n_layer", 12, "number of layers (nanochat depth)", 1, 1024)
      .i("d_model", 0, "model width; 0 = nanochat's rule ceil(64·n_layer/128)·128", 0, 1 << 16)
      .i("head_dim", 128, "head dimension", 1, 1024)
      .i("seq_len", 2048, "training sequence length T", 1, int64_t(1) << 24)
      .i("vocab", 32768, "vocabulary size", 2, int64_t(1) << 24)
      .i("mlp_hidden", 0, "MLP hidden width; 0 = nanochat's 4·d_model (iso-FLOP calibration may set it)", 0,
         int64_t(1) << 20)
      .rule([](const Config& c) {
        ModelDims d = model_dims(c);
        if (d.d_model % d.head_dim != 0)
          throw InputError(fmt::format("d_model {} is not divisible by head_dim {}", d.d_model, d.head_dim));
        if (d.d_model < 24) throw InputError(fmt::format("d_model {} is below 24 (the smear gate reads 24 channels)", d.d_model));
      });
  return s;
}

ModelDims model_dims(const Config& c) {
  ModelDims d{};
  d.n_layer = c.i("n_layer");
  d.d_model = c.i("d_model");
  if (d.d_model == 0) d.d_model = ((64 * d.n_layer + 127) / 128) * 128;
  d.head_dim = c.i("head_dim");
  d.n_head = d.d_model / d.head_dim;
  d.seq_len = c.i("seq_len");
  d.vocab = c.i("vocab");
  d.mlp_hidden = c.i("mlp_hidden");
  if (d.mlp_hidden == 0) d.mlp_hidden = 4 * d.d_model;
  return d;
}

std::vector<LayerMethod> layer_methods(const MethodSpec& method, const Config& cfg) {
  const int64_t L = cfg.i("n_layer");
  std::vector<LayerMethod> out;
  if (!method.is_hybrid()) {
    out.assign(size_t(L), LayerMethod{&method, cfg});
    return out;
  }
  std::vector<LayerChoice> layout = method.layout(cfg);
  if (int64_t(layout.size()) != L)
    throw std::logic_error(fmt::format("hybrid {}: layout has {} layers for n_layer {}", method.name, layout.size(), L));
  std::map<std::string, Config> parsed;  // one parse per distinct (method, overrides)
  for (const auto& ch : layout) {
    const MethodSpec& m = Registry::get().method(ch.method);
    if (m.is_hybrid()) throw std::logic_error(fmt::format("hybrid {}: layer method {} is itself a hybrid", method.name, m.name));
    if (ch.overrides.empty()) {
      out.push_back({&m, cfg});
      continue;
    }
    const std::string key = ch.method + "|" + ch.overrides;
    auto it = parsed.find(key);
    if (it == parsed.end()) it = parsed.emplace(key, m.config.parse(ch.overrides, &cfg)).first;
    out.push_back({&m, it->second});
  }
  return out;
}

ExecPlan model_plan(const MethodSpec& method, const Config& cfg) {
  const int64_t L = cfg.i("n_layer");
  if (!method.plan) return ExecPlan::stack(L);
  ExecPlan p = method.plan(cfg);
  p.validate();
  if (p.n_blocks != L)
    throw InputError(fmt::format("method {}: its execution plan has {} blocks for n_layer {}", method.name, p.n_blocks, L));
  return p;
}

std::shared_ptr<const ResidualStream> model_stream(const MethodSpec& method, const Config& cfg) {
  if (!method.residual) return nanochat_stream();
  auto s = method.residual(cfg);
  if (!s) throw std::logic_error("method " + method.name + ": its residual stream factory returned none");
  return s;
}

namespace {
std::vector<ParamDef> backbone_defs(const MethodSpec& method, const Config& cfg, std::vector<std::string>* owner) {
  ModelDims d = model_dims(cfg);
  const std::vector<LayerMethod> lm = layer_methods(method, cfg);
  const double s = std::sqrt(3.0) / std::sqrt(double(d.d_model));
  std::vector<ParamDef> defs;
  auto add = [&](ParamDef p, const std::string& own) {
    defs.push_back(std::move(p));
    if (owner) owner->push_back(own);
  };
  // nanochat's AdamW groups: adamw_rule(group, lr, β1, β2, decay, lr × (d/768)^−½, lr × √(B/B_ref))
  const OptimRule smear = adamw_rule("smear", 0.2, 0.8, 0.95, 0.0, false, false);
  add({"wte", {d.vocab, d.d_model}, ParamGroup::Wte, false, "normal", 0.0, 0.8,
       adamw_rule("wte", 0.3, 0.8, 0.995, 0.001, true, true)}, "");
  add({"lm_head", {d.vocab, d.d_model}, ParamGroup::LmHead, true, "normal", 0.0, 0.001,
       adamw_rule("lm_head", 0.008, 0.8, 0.96, 0.01, true, true)}, "");
  add({"smear_gate", {1, 24}, ParamGroup::Scalar, true, "uniform", 0.0, 0.02, smear}, "");
  add({"smear_lambda", {1}, ParamGroup::Scalar, false, "const", 0.0, 0, smear}, "");
  const auto stream = model_stream(method, cfg);
  const ExecPlan plan = model_plan(method, cfg);
  for (auto p : stream->params(d, plan)) add(std::move(p), "");
  for (int64_t i = 0; i < d.n_layer; ++i) {
    LayerCtx ctx{i, d.n_layer};
    const MethodSpec& mixer = *lm[size_t(i)].method;
    const Config& lcfg = lm[size_t(i)].cfg;
    int64_t ve = mixer.ve_dim ? mixer.ve_dim(lcfg, ctx) : 0;
    if (ve > 0)
      add({fmt::format("ve.{}", i), {d.vocab, ve}, ParamGroup::ValueEmbed, false, "uniform", -s, s,
           adamw_rule("value_embeds", 0.15, 0.8, 0.995, 0.01, true, true)}, "");
    for (auto p : mixer.params(lcfg, ctx)) {
      p.name = fmt::format("layers.{}.mixer.{}", i, p.name);
      add(std::move(p), mixer.name);
    }
    add({fmt::format("layers.{}.mlp.c_fc", i), {d.mlp_hidden, d.d_model}, ParamGroup::TransformerMatrix, true,
         "uniform", -0.4 * s, 0.4 * s, muon_rule()}, "");
    add({fmt::format("layers.{}.mlp.c_proj", i), {d.d_model, d.mlp_hidden}, ParamGroup::TransformerMatrix, true,
         "const", 0.0, 0, muon_rule()}, "");
  }
  stream->adjust_init(defs, d, plan);
  return defs;
}

at::Tensor rms_norm(const at::Tensor& x) { return backbone_rms_norm(x); }
}  // namespace

at::Tensor backbone_rms_norm(const at::Tensor& x) {
  OpScope scope("mixbench::rms_norm");  // one launch on a GPU (at::rms_norm)
  // LibTorch's fused kernel on a GPU (one pass, fp32 statistics for half inputs, its own backward)
  if (x.is_cuda() && x.scalar_type() != at::kDouble) return at::rms_norm(x, {x.size(-1)}, std::nullopt, kRmsEps);
  return x * at::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + kRmsEps);
}

void init_param(at::Tensor& t, const ParamDef& def, at::Generator& gen) {
  c10::NoGradGuard ng;
  if (def.init == "uniform") t.uniform_(def.init_a, def.init_b, gen);
  else if (def.init == "normal") t.normal_(def.init_a, def.init_b, gen);
  else if (def.init == "const") t.fill_(def.init_a);
  else if (def.init == "xavier_normal") {
    if (t.dim() != 2) throw std::logic_error("xavier_normal init needs a matrix: " + def.name);
    t.normal_(0.0, def.init_a * std::sqrt(2.0 / double(t.size(0) + t.size(1))), gen);
  }
  else if (def.init == "ramp") {
    int64_t L = t.size(0);
    for (int64_t i = 0; i < L; ++i) {
      double frac = double(i) / double(std::max<int64_t>(L - 1, 1));
      t[i].fill_(def.init_a + def.init_b * frac);
    }
  } else throw std::logic_error("unknown init rule " + def.init);
}

at::Tensor random_param(const ParamDef& def, at::Generator& gen, const at::TensorOptions& opts) {
  at::Tensor t = at::randn(def.shape, gen, opts.dtype(at::kDouble));
  if (def.fan_in > 0) {
    t = t / std::sqrt(double(def.fan_in));
  } else if (def.matmul && def.shape.size() == 2) {
    t = t / std::sqrt(double(def.shape[1]));
  } else if (def.group == ParamGroup::Scalar || def.shape.size() == 1) {
    // scalars and per-channel gains/biases: around 1 but not constant
    t = 1.0 + 0.25 * t;
  } else {
    t = t * 0.5;
  }
  return t.to(opts);
}

Model build_model(const MethodSpec& method, const Config& cfg, at::Generator& gen, const at::TensorOptions& opts,
                  bool random_nonzero) {
  Model m;
  m.method = &method;
  m.cfg = cfg;
  m.dims = model_dims(cfg);
  for (auto& l : layer_methods(method, cfg)) {
    m.layer_mixers.push_back(l.method->name);
    m.layer_specs.push_back(l.method);
    m.layer_cfgs.push_back(std::move(l.cfg));
  }
  m.plan = model_plan(method, cfg);
  m.stream = model_stream(method, cfg);
  for (const auto& def : backbone_defs(method, cfg, nullptr)) {
    at::Tensor t;
    if (random_nonzero) t = random_param(def, gen, opts);
    else {
      t = at::empty(def.shape, opts);
      init_param(t, def, gen);
    }
    m.params.set(def.name, t);
    m.defs[def.name] = def;
  }
  return m;
}

void set_model_config(Model& m, const Config& cfg) {
  std::vector<LayerMethod> layers = layer_methods(*m.method, cfg);
  if (layers.size() != m.layer_specs.size())
    throw std::logic_error("set_model_config: the new config changes the number of layers");
  for (size_t i = 0; i < layers.size(); ++i) {
    if (layers[i].method != m.layer_specs[i]) throw std::logic_error("set_model_config: the new config changes a layer's method");
    m.layer_cfgs[i] = std::move(layers[i].cfg);
  }
  m.cfg = cfg;
}

ParamCount count_params(const Model& m) {
  ParamCount c;
  for (const auto& [name, t] : m.params) {
    const ParamDef& d = m.defs.at(name);
    int64_t n = t.numel();
    switch (d.group) {
      case ParamGroup::Wte: c.wte += n; break;
      case ParamGroup::ValueEmbed: c.value_embeds += n; break;
      case ParamGroup::LmHead: c.lm_head += n; break;
      case ParamGroup::TransformerMatrix: c.transformer_matrices += n; break;
      case ParamGroup::Scalar: c.scalars += n; break;
    }
    if (d.matmul) c.matmul += n;
  }
  return c;
}

namespace {
enum class Pass { Forward, Prefill, Decode };

// The backbone around the mixers, shared by forward, prefill and decode. Forward/prefill: idx
// [B,T] from position 0; decode: idx [B,1] at cache->pos. `last_only`: lm_head on the last
// position only.
at::Tensor run_model(const Model& m, const at::Tensor& idx, Backend backend, Pass pass, ModelCache* cache,
                     bool last_only, ModelAux* aux = nullptr) {
  const ModelDims& d = m.dims;
  const auto& P = m.params;
  if (idx.dim() != 2) throw InputError("model input must be [B, T] token ids");
  const int64_t T = idx.size(1);
  if (pass == Pass::Decode && T != 1) throw InputError("model_decode_step takes idx [B, 1]");
  if (pass != Pass::Forward && T < 1) throw InputError("prefill needs at least one token");
  // Sections of a decode step for RecordFunction observers (harness/op_scope.h): what each part launches
  std::optional<SectionScope> section;
  auto open_section = [&](std::string name) {
    section.reset();
    if (pass == Pass::Decode) section.emplace(std::move(name));
  };
  // A static-cache decode step without gradient fuses the backbone's element-wise work into one
  // launch per step boundary on a GPU (harness/decode_ops.h): the embedding with its smear, each
  // residual update with the next sublayer's norm, the final norm, the softcap with the position's
  // advance. Off the GPU the same ops run unfused, bit for bit as the other decode paths.
  const bool fused = pass == Pass::Decode && cache->capacity > 0 && !at::GradMode::is_enabled();
  open_section("embed");
  at::Tensor x, embed;
  const bool fused_embed = fused && cache->prev_embed.defined() && cache->prev_embed.is_contiguous() &&
                           cache->prev_embed.sizes() == at::IntArrayRef({idx.size(0), 1, d.d_model}) &&
                           cache->prev_embed.scalar_type() == P.at("wte").scalar_type();
  std::map<int64_t, at::Tensor> ve_rows;  // a fused embedding's gathered value embeddings, by block
  if (fused_embed) {
    std::vector<int64_t> blocks;
    std::vector<at::Tensor> tables;
    for (int64_t i = 0; i < d.n_layer; ++i)
      if (const std::string n = fmt::format("ve.{}", i); P.has(n)) {
        blocks.push_back(i);
        tables.push_back(P.at(n));
      }
    EmbedStep e = embed_smear_step(P.at("wte"), idx, P.at("smear_gate"), P.at("smear_lambda"), cache->prev_embed, tables);
    x = e.x;
    for (size_t k = 0; k < blocks.size(); ++k) ve_rows[blocks[k]] = e.gathered[k];
  } else {
    x = rms_norm(at::embedding(P.at("wte"), idx));
    embed = x;
    if (pass == Pass::Decode) {
      if (!cache->prev_embed.defined()) throw InputError("model_decode_step needs a cache filled by model_prefill");
      at::Tensor gate = P.at("smear_lambda") * at::sigmoid(at::linear(x.slice(2, 0, 24), P.at("smear_gate")));
      x = x + gate * cache->prev_embed;
    } else if (T > 1) {
      at::Tensor gate = P.at("smear_lambda") * at::sigmoid(at::linear(x.slice(1, 1).slice(2, 0, 24), P.at("smear_gate")));
      x = at::cat({x.slice(1, 0, 1), x.slice(1, 1) + gate * x.slice(1, 0, T - 1)}, 1);
    }
  }
  if (!m.stream || m.layer_specs.size() != size_t(d.n_layer) || m.layer_cfgs.size() != size_t(d.n_layer))
    throw std::logic_error("run_model needs a model made by build_model");
  const ExecPlan& plan = m.plan;
  const ResidualStream& stream = *m.stream;
  if (pass == Pass::Prefill && !cache->capacity) cache->layers.assign(size_t(plan.n_slots), TensorMap());
  if (aux) *aux = ModelAux();
  TensorMap state = stream.begin(x, P, backend);
  const FusedDecodeStream* fs = fused ? dynamic_cast<const FusedDecodeStream*>(&stream) : nullptr;
  // a decode step over static caches: the token's position on the device, for streams that read it
  if (pass == Pass::Decode && cache->capacity) state.set("pos_dev", cache->pos_dev);
  const char* pass_name = pass == Pass::Forward ? "forward" : pass == Pass::Prefill ? "prefill" : "decode";
  for (int64_t s = 0; s < plan.n_steps(); ++s) {
    const PlanStep& st = plan.steps[size_t(s)];
    // auxiliary routes feed auxiliary losses only: a forward pass that collects them runs them
    if (st.route > 0 && !(pass == Pass::Forward && aux)) continue;
    const int64_t i = st.block;
    const MethodSpec& mixer = *m.layer_specs[size_t(i)];
    const Config& lcfg = m.layer_cfgs[size_t(i)];
    ScopedMethod sm(mixer.name);
    const ExecPlan::RoutePos rp = plan.route_pos(s);  // the step's position in its route
    LayerCtx ctx{i, d.n_layer, m.step, st.iteration, st.n_iterations, rp.index, rp.length};
    const int64_t pos = pass == Pass::Decode ? cache->pos : 0;
    const Sublayer mix{rp.index, rp.length, i, Sublayer::Kind::Mixer, st.iteration, st.n_iterations, backend, pos,
                       m.step, m.seed, m.row0, st.route},
        mlp{rp.index, rp.length, i, Sublayer::Kind::Mlp, st.iteration, st.n_iterations, backend, pos,
            m.step, m.seed, m.row0, st.route};
    if (!stream.runs(mix, state)) continue;
    // truncated backpropagation: the step runs without gradient (its output enters the graph as a constant)
    std::optional<c10::NoGradGuard> no_grad;
    if (stream.truncated(mix, state)) no_grad.emplace();
    const std::string section_name =
        fmt::format("layer{}", i) + (st.route > 0 ? fmt::format("_route{}", st.route) : "") +
        (st.n_iterations > 1 ? fmt::format("_{}", st.iteration) : "");
    open_section(section_name + ".mixer");
    TensorMap in;
    // a fused step whose mixer prepared its input projection: that GEMV in the stream's update's launch
    // (the mixer reads it through static_input_projection), the normed input beside it
    if (fs && cache->layers[size_t(st.slot)].has(kStaticInput)) {
      at::Tensor normed;
      const at::Tensor proj = fs->fused_input_linear(state, mix, P, cache->layers[size_t(st.slot)].at(kStaticInput),
                                                     /*relu_square=*/false, &normed);
      in.set("x", normed);
      in.set(kStaticInputProj, proj);
    } else {
      in.set("x", fs ? fs->fused_input(state, mix, P) : stream.modulate(state, mix, rms_norm(stream.read(state, mix, P)), P));
    }
    std::string ve_name = fmt::format("ve.{}", i);
    if (auto it = ve_rows.find(i); it != ve_rows.end()) in.set("ve", it->second);
    else if (P.has(ve_name)) in.set("ve", at::embedding(P.at(ve_name), idx));
    std::string prefix = fmt::format("layers.{}.mixer.", i);
    for (const auto& [name, t] : P)
      if (name.rfind(prefix, 0) == 0) in.set(name.substr(prefix.size()), t);
    stream.mixer_inputs(state, mix, in);
    TensorMap out;
    {
      std::string where = st.route > 0 ? fmt::format("layer{}_route{}", i, st.route) : fmt::format("layer{}", i);
      if (st.n_iterations > 1) where += fmt::format("_{}", st.iteration);
      NvtxRange r(nvtx_name({mixer.name, where, pass_name}));
      if (pass == Pass::Forward && backend == Backend::Reference) out = mixer.reference(in, lcfg, ctx);
      else if (pass == Pass::Forward) out = mixer.forward(in, lcfg, ctx, backend);
      else if (pass == Pass::Prefill) out = mixer.prefill(in, cache->layers[size_t(st.slot)], lcfg, ctx, backend);
      else out = mixer.decode(in, cache->layers[size_t(st.slot)], lcfg, ctx, backend);
    }
    if (fs) fs->fused_write(state, mix, out.at("y"), P);
    else stream.write(state, mix, out.at("y"), P);
    if (aux) {
      at::Tensor a = out.get_or("aux_loss", at::Tensor());
      aux->layer_aux.push_back(a);
      if (a.defined()) aux->aux_loss = aux->aux_loss.defined() ? aux->aux_loss + a : a;
    }
    open_section(section_name + ".mlp");
    const at::Tensor& c_fc = P.at(fmt::format("layers.{}.mlp.c_fc", i));
    // a fused step: the GEMM and relu² in one kernel for its few rows (with a fused stream, in the
    // kernel of the stream's update and norm)
    at::Tensor h;
    if (fs) {
      h = fs->fused_input_linear(state, mlp, P, c_fc, /*relu_square=*/true);
    } else {
      const at::Tensor mlp_in = stream.modulate(state, mlp, rms_norm(stream.read(state, mlp, P)), P);
      h = fused ? linear_relu_square(mlp_in, c_fc) : relu_square(at::linear(mlp_in, c_fc));
    }
    // and its down projection in one GEMV launch (cuBLAS may split a one-row product this long in two)
    const at::Tensor& c_proj = P.at(fmt::format("layers.{}.mlp.c_proj", i));
    const at::Tensor mlp_out = fused ? linear_rows(h, c_proj) : at::linear(h, c_proj);
    if (fs) fs->fused_write(state, mlp, mlp_out, P);
    else stream.write(state, mlp, mlp_out, P);
  }
  open_section("head");
  at::Tensor final_normed;  // the final norm, when a fused stream formed it with its last update
  x = fs ? fs->fused_finish(state, P, backend, &final_normed) : stream.finish(state, P, backend);
  if (aux && state.has("aux_loss")) {
    const at::Tensor a = state.at("aux_loss");
    aux->aux_loss = aux->aux_loss.defined() ? aux->aux_loss + a : a;
  }
  ResidualStream::Exits ex = stream.exits(state, P, backend);
  // one exit in a fused step: the stream's fused final norm (if it left one) and the softcap
  // advancing the device position in its launch
  const bool fused_head = fused && ex.hidden.empty();
  // `normed`: h's final norm when the stream formed it already
  auto head = [&](at::Tensor h, at::Tensor normed = at::Tensor()) {
    if (!normed.defined()) {
      if (last_only && h.size(1) > 1) h = h.slice(1, h.size(1) - 1);
      normed = rms_norm(h);
    }
    // a fused step's few rows: one GEMV launch (at::linear where the kernel does not take them)
    at::Tensor logits = fused_head ? linear_rows(normed, P.at("lm_head")) : at::linear(normed, P.at("lm_head"));
    if (fused_head) return softcap_logits(logits, 15.0, cache->pos_dev);
    // nanochat upcasts the logits to fp32 (from its bf16 compute dtype); an fp64 model stays fp64
    logits = logits.to(at::promote_types(logits.scalar_type(), at::kFloat));
    return 15.0 * at::tanh(logits / 15.0);
  };
  if (cache) {
    if (!fused_embed) {
      const at::Tensor last = embed.slice(1, embed.size(1) - 1);
      if (cache->capacity && cache->prev_embed.defined() && cache->prev_embed.sizes() == last.sizes()) {
        cache->prev_embed.copy_(last);  // in place: a captured step reads and writes the same buffer
      } else {
        cache->prev_embed = last.contiguous();
      }
    }
    cache->pos = pass == Pass::Decode ? cache->pos + 1 : T;
    if (cache->capacity) {
      if (pass == Pass::Decode && !fused_head) cache->pos_dev.add_(1);
      else if (pass != Pass::Decode) cache->pos_dev.fill_(T);
    }
  }
  if (ex.hidden.empty()) return head(x, final_normed);
  // several exits: every exit's logits, each token its chosen exit's
  std::vector<at::Tensor> all;
  for (const at::Tensor& h : ex.hidden) all.push_back(head(h));
  const at::Tensor logits = at::stack(all);  // [K,B,T',V]
  const int64_t Tl = logits.size(2);
  const at::Tensor choice = ex.choice.slice(1, ex.choice.size(1) - Tl);  // [B,T']
  const at::Tensor picked =
      logits.gather(0, choice.unsqueeze(0).unsqueeze(-1).expand({1, -1, -1, logits.size(3)})).squeeze(0);
  if (aux) {
    aux->exits = std::move(ex);
    aux->exit_logits = logits;
  }
  return picked;
}
}  // namespace

at::Tensor model_forward(const Model& m, const at::Tensor& idx, Backend backend, ModelAux* aux) {
  return run_model(m, idx, backend, Pass::Forward, nullptr, false, aux);
}

int64_t ModelCache::bytes() const {
  int64_t n = 0;
  for (const auto& l : layers) n += cache_bytes(l);
  return n;
}

bool model_has_decode(const Model& m) {
  for (const MethodSpec* s : m.layer_specs)
    if (!s->has_decode()) return false;
  return true;
}

namespace {
std::string no_decode_message(const Model& m) {
  std::string missing;
  std::vector<std::string> seen;
  for (const MethodSpec* s : m.layer_specs)
    if (!s->has_decode() && std::find(seen.begin(), seen.end(), s->name) == seen.end()) {
      seen.push_back(s->name);
      missing += (missing.empty() ? "" : ", ") + s->name;
    }
  if (missing == m.method->name) return fmt::format("method {} registers no decode path", missing);
  return fmt::format("method {}: layer method(s) {} register no decode path", m.method->name, missing);
}
}  // namespace

bool model_has_static_decode(const Model& m) {
  if (!model_has_decode(m) || !m.stream || !m.stream->static_decode()) return false;
  for (const MethodSpec* s : m.layer_specs)
    if (!s->static_decode) return false;
  return true;
}

at::Tensor model_prefill(const Model& m, const at::Tensor& idx, Backend backend, ModelCache* cache, int64_t capacity) {
  if (!cache) return run_model(m, idx, backend, Pass::Forward, nullptr, true);
  if (!model_has_decode(m)) throw UsageError(no_decode_message(m));
  if (capacity < 0) throw UsageError("a static decode cache needs capacity >= 1");
  if (capacity == 0) {
    *cache = ModelCache();
    return run_model(m, idx, backend, Pass::Prefill, cache, true);
  }
  if (!model_has_static_decode(m))
    throw UsageError(fmt::format("method {} cannot decode with static caches (a layer's hooks or its residual stream "
                                 "keep no fixed-size state)",
                                 m.method->name));
  if (idx.dim() != 2 || idx.size(1) >= capacity)
    throw InputError(fmt::format("a static cache of {} tokens cannot take a prefill of {} plus a decoded token", capacity,
                                 idx.dim() == 2 ? idx.size(1) : -1));
  const bool reuse = cache->capacity == capacity && cache->layers.size() == size_t(m.plan.n_slots) &&
                     cache->prev_embed.defined() && cache->prev_embed.size(0) == idx.size(0) &&
                     cache->pos_dev.defined() && cache->pos_dev.device() == idx.device();
  if (!reuse) {
    *cache = ModelCache();
    cache->capacity = capacity;
    cache->pos_dev = at::zeros({1}, idx.options().dtype(at::kLong));
    const at::Tensor cap = at::scalar_tensor(capacity, at::TensorOptions().dtype(at::kLong));
    cache->layers.assign(size_t(m.plan.n_slots), TensorMap());
    for (auto& l : cache->layers) {
      l.set("pos_dev", cache->pos_dev);
      l.set("capacity", cap);
    }
  }
  return run_model(m, idx, backend, Pass::Prefill, cache, true);
}

at::Tensor model_decode_step(const Model& m, const at::Tensor& idx_t, ModelCache& cache, Backend backend) {
  if (!model_has_decode(m)) throw UsageError(no_decode_message(m));
  if (cache.layers.size() != size_t(m.plan.n_slots)) throw InputError("model_decode_step needs a cache filled by model_prefill");
  if (cache.capacity && cache.pos >= cache.capacity)
    throw InputError(fmt::format("the static cache ({} tokens) is full at position {}", cache.capacity, cache.pos));
  return run_model(m, idx_t, backend, Pass::Decode, &cache, true);
}

at::Tensor model_loss(const Model& m, const at::Tensor& idx, const at::Tensor& targets, Backend backend,
                      at::Tensor* lm_loss, ModelAux* aux) {
  ModelAux a;
  at::Tensor logits = model_forward(m, idx, backend, &a);
  at::Tensor lm, loss;
  if (a.exit_logits.defined()) {  // several exits: the stream's loss over every exit's cross-entropy
    const int64_t K = a.exit_logits.size(0);
    const at::Tensor ce = at::cross_entropy_loss(a.exit_logits.reshape({-1, a.exit_logits.size(-1)}),
                                                 targets.reshape({1, -1}).expand({K, -1}).reshape({-1}), {},
                                                 at::Reduction::None, -1)
                              .view({K, targets.size(0), targets.size(1)});
    ResidualStream::ExitLoss el = m.stream->exit_loss(a.exits, ce, targets != -1, m.exit_gate_only, backend);
    lm = el.lm;
    loss = a.aux_loss.defined() ? el.loss + a.aux_loss.to(el.loss.scalar_type()) : el.loss;
    if (el.aux.defined()) a.aux_loss = a.aux_loss.defined() ? a.aux_loss.to(el.aux.scalar_type()) + el.aux : el.aux;
  } else {
    lm = at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}), {},
                                at::Reduction::Mean, -1);
    loss = a.aux_loss.defined() ? lm + a.aux_loss.to(lm.scalar_type()) : lm;
  }
  if (lm_loss) *lm_loss = lm;
  if (aux) *aux = std::move(a);
  return loss;
}

ModelCost account_model(const MethodSpec& method, const Config& cfg, const CostQuery& q) {
  ModelCost mc;
  ModelDims d = model_dims(cfg);
  std::vector<std::string> owner;
  auto defs = backbone_defs(method, cfg, &owner);
  // Backbone parameters (everything the method does not own) are counted from their definitions;
  // the mixer's parameters come from the method's accountant formula, so a wrong formula shows
  // up as a mismatch against the built model.
  for (size_t i = 0; i < defs.size(); ++i) {
    if (!owner[i].empty()) continue;
    int64_t n = 1;
    for (auto s : defs[i].shape) n *= s;
    ParamCount c;
    switch (defs[i].group) {
      case ParamGroup::Wte: c.wte = n; break;
      case ParamGroup::ValueEmbed: c.value_embeds = n; break;
      case ParamGroup::LmHead: c.lm_head = n; break;
      case ParamGroup::TransformerMatrix: c.transformer_matrices = n; break;
      case ParamGroup::Scalar: c.scalars = n; break;
    }
    if (defs[i].matmul) c.matmul = n;
    mc.params += c;
  }
  double mixer_core_train = 0, mixer_fwd = 0, mixer_decode = 0;
  // Matmul parameters applied again by a plan that runs a block more than once: their FLOPs count
  // per application (weighted by its step share), their parameters once.
  double repeated_matmul = 0;
  const std::vector<LayerMethod> lm = layer_methods(method, cfg);
  const ExecPlan plan = model_plan(method, cfg);
  const auto stream = model_stream(method, cfg);
  double backbone_steps = 0;  // Σ step shares: plan steps a pass runs on average
  // Auxiliary routes (training passes only): their matmul applications and mixer FLOPs apart
  double aux_matmul = 0, aux_mixer_fwd = 0, aux_uncounted = 0;
  for (int64_t s = 0; s < plan.n_steps(); ++s) {
    const PlanStep& st = plan.steps[size_t(s)];
    // a step a sampled depth may skip costs its expected share (the parameters count in full)
    const double w = stream->step_share(plan, s);
    backbone_steps += w;
    // each block's own method and config (a hybrid's layers differ)
    const int64_t i = st.block;
    const MethodSpec& mixer = *lm[size_t(i)].method;
    const ExecPlan::RoutePos rp = plan.route_pos(s);
    LayerCost lc = mixer.account(lm[size_t(i)].cfg,
                                 LayerCtx{i, d.n_layer, -1, st.iteration, st.n_iterations, rp.index, rp.length}, q);
    if (method.is_hybrid()) lc.formula = mixer.name + ": " + lc.formula;
    if (w != 1.0) lc.formula += fmt::format("; billed ×{:.6g}, the share of training passes that run this step", w);
    const double block_matmul = double(lc.params.matmul) + 2.0 * double(d.d_model) * double(d.mlp_hidden);
    if (st.route > 0) {
      // billed to training (and to a forward pass collecting auxiliary losses), not to an
      // inference forward or a decode step; no cache slot
      lc.formula += fmt::format("; auxiliary route {} (training passes only)", st.route);
      aux_matmul += w * block_matmul;
      mixer_core_train += w * lc.nanochat_core_flops;
      aux_uncounted += w * lc.uncounted_flops;
      aux_mixer_fwd += w * (lc.fwd_flops - 2.0 * double(lc.params.matmul));
      mc.act_bytes += w * lc.act_bytes;
      mc.layers.push_back(std::move(lc));
      mc.steps.push_back(st);
      continue;
    }
    if (st.iteration == 0) mc.params += lc.params;
    repeated_matmul += (st.iteration == 0 ? w - 1.0 : w) * block_matmul;
    mixer_core_train += w * lc.nanochat_core_flops;
    mc.uncounted_flops += w * lc.uncounted_flops;
    mixer_fwd += w * (lc.fwd_flops - 2.0 * double(lc.params.matmul));
    mixer_decode += w * (lc.decode_flops - 2.0 * double(lc.params.matmul));
    mc.act_bytes += w * lc.act_bytes;
    mc.cache_bytes_per_token += lc.cache_bytes_per_token;
    mc.state_bytes += lc.state_bytes;
    mc.decode_read_bytes += std::isnan(lc.decode_read_bytes)
                                ? lc.cache_bytes_per_token * double(q.context) + lc.state_bytes
                                : lc.decode_read_bytes;
    mc.layers.push_back(std::move(lc));
    mc.steps.push_back(st);
  }
  const double N = double(mc.params.matmul) + repeated_matmul;
  const double stream_fwd = stream->fwd_flops(d, plan);
  ModelDims d1 = d;  // a decode step: one token per row
  d1.seq_len = 1;
  const double stream_decode = stream->fwd_flops(d1, plan);
  mc.uncounted_flops += stream->uncounted_flops(d, plan);
  mc.act_bytes += stream->act_bytes(d, plan, q.dtype_bytes);
  mc.aux_route_fwd_flops = 2.0 * aux_matmul + aux_mixer_fwd + stream->aux_fwd_flops(d, plan);
  mc.aux_route_uncounted_flops = aux_uncounted + stream->aux_uncounted_flops(d, plan);
  mc.train_flops_nanochat = 6.0 * (N + aux_matmul) + mixer_core_train + 3.0 * (stream_fwd + stream->aux_fwd_flops(d, plan));
  mc.fwd_flops = 2.0 * N + mixer_fwd + stream_fwd;
  mc.decode_flops = 2.0 * N + mixer_decode + stream_decode;
  // Backbone activations kept for backward per token: residual stream at each step boundary,
  // both norms' inputs, the MLP hidden (4d) before and after relu², and the fp32 logits.
  mc.act_bytes += backbone_steps * (3.0 * d.d_model + 2.0 * d.mlp_hidden) * double(q.dtype_bytes) + 4.0 * d.vocab;
  return mc;
}

}  // namespace mixbench
