#include "mixers/sparse/sparse_method.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "harness/backbone.h"
#include "harness/errors.h"
#include "harness/method_selection.h"
#include "harness/nvtx.h"
#include "mixers/common/layers.h"
#include "mixers/sparse/sparse.h"

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

std::string op_range(const std::string& op) { return nvtx_name({ScopedMethod::current(), op, "forward"}); }

at::Tensor select_blocks(const at::Tensor& scores, int64_t block, int64_t topk, bool own_counted) {
  NvtxRange r(op_range("block_topk"));
  return block_topk_fast(scores.detach(), block, topk, own_counted);
}

int64_t chunk_rows(double bytes_per_row) {
  return std::max<int64_t>(1, int64_t(double(kChunkBytes) / std::max(bytes_per_row, 1.0)));
}

at::Tensor dense_logits_rows(const at::Tensor& q, const at::Tensor& k, double scale, int64_t q0, int64_t n, int64_t Tk) {
  const int64_t B = q.size(0), H = q.size(2), Hkv = k.size(2), G = H / Hkv, dh = q.size(3);
  at::Tensor qh = q.detach().narrow(1, q0, n).reshape({B, n, Hkv, G, dh}).permute({0, 2, 3, 1, 4}).reshape({B, Hkv, G * n, dh});
  at::Tensor lg = at::matmul(qh, k.detach().narrow(1, 0, Tk).permute({0, 2, 3, 1})) * scale;  // [B,Hkv,G·n,Tk]
  lg = lg.view({B, H, n, Tk});
  return layers::is_half(lg) ? lg.to(at::kFloat) : lg;
}

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
// Mask [n,Tk]: key s > query q0 + r.
at::Tensor future_mask(int64_t q0, int64_t n, int64_t Tk, const at::Device& dev) {
  auto lo = at::TensorOptions().dtype(at::kLong).device(dev);
  return at::arange(Tk, lo).view({1, Tk}) > (at::arange(n, lo) + q0).view({n, 1});
}
}  // namespace

at::Tensor seer_teacher(const at::Tensor& q, const at::Tensor& k, int64_t bs, double scale, int64_t chunk) {
  c10::NoGradGuard ng;
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), NC = T / bs;
  // per query row and head, over at most T keys: the logits (half-precision product and its
  // scaling, the fp32 copy), the masked copy and the softmax, fp32: at most 16 bytes
  if (chunk <= 0) chunk = chunk_rows(16.0 * double(B * H * T));
  auto lo = at::TensorOptions().dtype(at::kLong).device(q.device());
  std::vector<at::Tensor> parts;
  for (int64_t q0 = 0; q0 < T; q0 += chunk) {
    const int64_t n = std::min(chunk, T - q0), Tk = q0 + n, NCk = std::min(NC, Tk / bs);
    at::Tensor A = at::softmax(dense_logits_rows(q, k, scale, q0, n, Tk).masked_fill(future_mask(q0, n, Tk, q.device()), -kInf), -1);
    at::Tensor gt = std::get<0>(A.narrow(3, 0, NCk * bs).view({B, H, n, NCk, bs}).max(-1));  // [B,H,n,NCk]
    gt = at::constant_pad_nd(gt, {0, NC - NCk}, 0.0);
    // candidates: complete blocks i < t / bs
    at::Tensor valid = at::arange(NC, lo).view({1, NC}) < at::div(at::arange(n, lo) + q0, bs, "floor").view({n, 1});
    gt = gt.masked_fill(valid.logical_not().view({1, 1, n, NC}), 0.0);
    parts.push_back(gt / gt.sum(-1, true).clamp_min(1e-30));
  }
  return parts.size() == 1 ? parts[0] : at::cat(parts, 2);
}

at::Tensor qsa_teacher(const at::Tensor& q, const at::Tensor& k, const at::Tensor& sel, int64_t bs, double scale,
                       int64_t chunk) {
  c10::NoGradGuard ng;
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), NC = T / bs, NB = (T + bs - 1) / bs, n = sel.size(2) - 1;
  // per query row: as seer_teacher's per head (16 bytes per key), the head mean (4) and the
  // attended-key masks (bytes), and the chosen-block mask over NB + 1 blocks
  if (chunk <= 0) chunk = chunk_rows((16.0 * double(H) + 8.0) * double(B * T) + double(B * (NB + 1)));
  auto lo = at::TensorOptions().dtype(at::kLong).device(q.device());
  const at::Tensor key_blk = at::div(at::arange(T, lo), bs, "floor");
  at::Tensor hist = sel.narrow(2, 0, n), valid = hist >= 0;
  std::vector<at::Tensor> parts;
  for (int64_t q0 = 0; q0 < T; q0 += chunk) {
    const int64_t m = std::min(chunk, T - q0), Tk = q0 + m, NCk = std::min(NC, Tk / bs);
    // attended keys [B,m,Tk]: key s in a selected block, s ≤ t
    at::Tensor sc = sel.narrow(1, q0, m);
    at::Tensor chosen = at::zeros({B, m, NB + 1}, lo.dtype(at::kBool));
    chosen.scatter_(2, sc.masked_fill(sc < 0, NB), true);
    at::Tensor att = chosen.index_select(2, key_blk.narrow(0, 0, Tk))
                         .logical_and(future_mask(q0, m, Tk, q.device()).logical_not().unsqueeze(0));
    at::Tensor lg = dense_logits_rows(q, k, scale, q0, m, Tk).masked_fill(att.unsqueeze(1).logical_not(), -kInf);
    at::Tensor P = at::softmax(lg, -1).mean(1);                                                   // [B,m,Tk]
    at::Tensor Pb = std::get<0>(P.narrow(2, 0, NCk * bs).view({B, m, NCk, bs}).max(-1));          // [B,m,NCk]
    Pb = at::constant_pad_nd(Pb, {0, NC - NCk}, 0.0);                                             // [B,m,NC]
    at::Tensor hc = hist.narrow(1, q0, m);
    at::Tensor pt = at::gather(Pb, 2, hc.clamp_min(0)).masked_fill(valid.narrow(1, q0, m).logical_not(), 0.0);
    parts.push_back(pt / pt.sum(-1, true).clamp_min(1e-30));
  }
  return parts.size() == 1 ? parts[0] : at::cat(parts, 1);
}

at::Tensor indexer_precision(const at::Tensor& t, const at::Tensor& x) {
  return layers::is_half(x) && t.defined() ? t.to(at::kFloat) : t;
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
  const auto ref = desc.reference;
  if (ref) {  // the reference with the selection in and out; the selection registered
    m.reference = [ref](const TensorMap& in, const Config& c, const LayerCtx& ctx) {
      reference::LayerSelection sel;
      sel.forced = in.get_or("selection", at::Tensor());
      TensorMap out = ref(in, c, ctx, sel);
      out.set("selection", sel.chosen);
      return out;
    };
    MethodSelection ms;
    ms.outputs = {"selection"};
    ms.scores = [ref](const TensorMap& in, const Config& c, const LayerCtx& ctx) {
      c10::NoGradGuard ng;
      reference::LayerSelection sel;
      ref(in, c, ctx, sel);
      return TensorMap{{"selection", sel.scores}};
    };
    register_method_selection(desc.name, std::move(ms));
  }
  m.forward = desc.forward;
  m.has_cuda = true;
  const ConfigSpec spec = m.config;
  const auto cases = desc.cases;
  m.cases = [spec, cases]() { return cases(spec); };
  m.account = desc.account;
  m.ve_dim = sparse_layer::ve_dim;
  m.prefill = desc.prefill;
  m.decode = desc.decode;
  m.static_decode = m.has_decode();
  return m;
}

}  // namespace mixbench
