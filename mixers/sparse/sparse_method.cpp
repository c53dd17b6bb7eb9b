#include "mixers/sparse/sparse_method.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "harness/backbone.h"
#include "harness/errors.h"
#include "mixers/common/layers.h"

namespace mixbench {

namespace sparse_layer {

Dims dims(const Config& c) {
  ModelDims m = model_dims(c);
  const int64_t r = c.i("kv_ratio");
  return {m.d_model, m.n_head, r == 0 ? 1 : m.n_head / r, m.head_dim};
}

int64_t ve_dim(const Config& c, const LayerCtx& ctx) {
  const Dims d = dims(c);
  return layers::ve_width(ctx, d.Hkv, d.dh);
}

std::vector<ParamDef> attention_params(const Config& c, const LayerCtx& ctx) {
  Dims d = dims(c);
  const double s = std::sqrt(3.0) / std::sqrt(double(d.D));
  std::vector<ParamDef> p = {
      {"c_q", {d.H * d.dh, d.D}, ParamGroup::TransformerMatrix, true, "uniform", -s, s},
      {"c_k", {d.Hkv * d.dh, d.D}, ParamGroup::TransformerMatrix, true, "uniform", -s, s},
      {"c_v", {d.Hkv * d.dh, d.D}, ParamGroup::TransformerMatrix, true, "uniform", -s, s},
      {"c_proj", {d.D, d.H * d.dh}, ParamGroup::TransformerMatrix, true, "const", 0.0, 0},
  };
  layers::add_ve_gate_param(p, ctx, d.Hkv);
  return p;
}

int64_t attention_matmul_params(const Config& c, const LayerCtx& ctx) {
  Dims d = dims(c);
  return d.D * d.H * d.dh + 2 * d.D * d.Hkv * d.dh + d.H * d.dh * d.D + layers::ve_gate_params(ctx, d.Hkv);
}

reference::SparseLayerWeights attention_weights(const TensorMap& in) {
  reference::SparseLayerWeights w;
  w.c_q = in.at("c_q");
  w.c_k = in.at("c_k");
  w.c_v = in.at("c_v");
  w.c_proj = in.at("c_proj");
  w.ve_gate = in.get_or("ve_gate", at::Tensor());
  return w;
}

TensorMap make_layer_inputs(const Config& c, const LayerCtx& ctx, int64_t B, int64_t T, at::Generator& gen) {
  Dims d = dims(c);
  return layers::layer_inputs(ctx, B, T, d.D, d.Hkv, d.dh, gen);
}

QKV qkv(const TensorMap& in, const Config& c) {
  Dims d = dims(c);
  const at::Tensor& x = in.at("x");
  const int64_t B = x.size(0), T = x.size(1);
  at::Tensor q = at::linear(x, in.at("c_q")).view({B, T, d.H, d.dh});
  at::Tensor k_raw = at::linear(x, in.at("c_k")).view({B, T, d.Hkv, d.dh});
  at::Tensor v = layers::add_value_embed(at::linear(x, in.at("c_v")).view({B, T, d.Hkv, d.dh}), in);
  q = layers::rms_norm(layers::rope(q, c.f("rope_base"))) * 1.2;
  at::Tensor k = layers::rms_norm(layers::rope(k_raw, c.f("rope_base"))) * 1.2;
  return {q, k, v, k_raw};
}

at::Tensor select_blocks(const at::Tensor& scores, int64_t block, int64_t topk, bool own_counted, Backend backend) {
  Config op = Registry::get().op("block_topk").params.defaults();
  op = op.with("block_size", block).with("topk", topk).with("own", std::string(own_counted ? "counted" : "appended"));
  return call_op("block_topk", backend, {{"scores", scores.detach()}}, op).at("block_indices");
}

ConfigSpec layer_config() {
  ConfigSpec s = backbone_config();
  s.i("kv_ratio", 1, "query heads per KV head; 0 = one KV head (MQA)", 0)
      .f("rope_base", 100000.0, "RoPE base", 1.0)
      .rule([](const Config& c) {
        ModelDims d = model_dims(c);
        const int64_t r = c.i("kv_ratio");
        if (r > 0 && d.n_head % r != 0)
          throw InputError(fmt::format("{} heads are not divisible by kv_ratio {}", d.n_head, r));
        layers::require_ve_gate_width(c);
      });
  return s;
}

ConfigSpec& add_warmup_knob(ConfigSpec& s) {
  return s
      .f("full_attention_warmup_frac", 512.0 / 46875.0,
         "fraction of the run's training steps at the start run as dense causal attention (only the indexer / gate "
         "KL trains the selector); seed 001: 512 of 46,875 updates",
         0.0, 1.0)
      .i("full_attention_warmup_steps", -1,
         "warm-up in training steps, overriding full_attention_warmup_frac; -1 = the fraction of the run's steps",
         -1)
      .b("allow_full_warmup", false, "let the warm-up cover every training step (the run then trains dense attention)");
}

bool full_attention_warmup(const Config& c, const LayerCtx& ctx) {
  if (ctx.step < 0) return false;
  const int64_t n = c.i("full_attention_warmup_steps");
  if (n < 0)
    throw UsageError("full_attention_warmup_steps is -1 (the fraction of the run) at a training step: the trainer "
                     "resolves it from full_attention_warmup_frac, or set it explicitly");
  return ctx.step < n;
}

}  // namespace sparse_layer

MethodSpec sparse_method(const SparseMethodDesc& desc) {
  MethodSpec m;
  m.name = desc.name;
  m.family = "sparse";
  m.summary = desc.summary;
  m.citation = desc.citation;
  m.config = sparse_layer::layer_config();
  if (desc.warmup) sparse_layer::add_warmup_knob(m.config);
  if (desc.knobs) desc.knobs(m.config);
  m.ops = desc.ops;
  m.params = desc.params;
  m.make_inputs = sparse_layer::make_layer_inputs;
  m.reference = desc.reference;
  m.forward = desc.forward;
  const ConfigSpec spec = m.config;
  const auto cases = desc.cases;
  m.cases = [spec, cases]() { return cases(spec); };
  m.account = desc.account;
  m.ve_dim = sparse_layer::ve_dim;
  return m;
}

}  // namespace mixbench
