// Dense attention methods at layer level: nanochat's CausalSelfAttention exactly (projections,
// value-embedding gate on alternate layers, RoPE base 100000 half-split, QK RMSNorm, ×1.2,
// softmax scale dh^-0.5), with the per-layer window from a pattern string.
//   dense_full  every layer full causal MHA            (the leaderboard baseline)
//   dense       SSSL pattern, last layer long           (nanochat's default, the FLOP anchor)
//   mqa         dense_full with one KV head
//   gqa         dense_full with H/2 KV heads
// Options for HypeNet's attention layers (off by default): rope=false (NoPE), out_gate (the
// attention output times sigmoid(x W_gᵀ), W_g [H·dh, d], before c_proj), and the logit scale
// s_t = log_a(t + a) at inference only (logit_scale_train=false: applied when the layer is not
// training, LayerCtx::step < 0). An input "positions" [B,T] (int64) gives each token's RoPE
// position, for a layer run on a subset of the tokens (mor's recursions); causality is by order.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include "harness/decode_ops.h"
#include "harness/backbone.h"
#include "harness/errors.h"
#include "harness/registry.h"
#include "mixers/attention/attention.h"
#include "mixers/common/layers.h"
#include "reference/reference.h"

namespace mixbench {
namespace {

struct AttnDims {
  ModelDims m;
  int64_t n_kv_head;
};

AttnDims attn_dims(const Config& c) {
  AttnDims d{model_dims(c), 0};
  const int64_t ratio = c.i("kv_ratio");
  d.n_kv_head = ratio == 0 ? 1 : d.m.n_head / ratio;
  return d;
}

// nanochat's left window for this layer: L = T (full), S = ceil(T/4/128)·128 unless overridden.
// The pattern follows the unrolled position (a looped model's shared block takes the window of
// each step it runs at; the last unrolled step is long). Returns 0 for full attention, else
// visible keys including self (= left + 1).
int64_t layer_window(const Config& c, const LayerCtx& ctx) {
  const std::string& pat = c.s("window_pattern");
  const int64_t at = ctx.unrolled_index();
  const bool last = at == ctx.unrolled_count() - 1;
  const char ch = pat[size_t(at % int64_t(pat.size()))];
  if (last || ch == 'L') return 0;
  const int64_t T = c.i("seq_len");
  const int64_t left = c.i("short_window") > 0 ? c.i("short_window") : ((T / 4 + 127) / 128) * 128;
  return left + 1;
}

std::vector<ParamDef> params(const Config& c, const LayerCtx& ctx) {
  AttnDims d = attn_dims(c);
  const int64_t D = d.m.d_model, H = d.m.n_head, Hkv = d.n_kv_head, dh = d.m.head_dim;
  const double s = std::sqrt(3.0) / std::sqrt(double(D));
  std::vector<ParamDef> p = {
      {"c_q", {H * dh, D}, ParamGroup::TransformerMatrix, true, "uniform", -s, s},
      {"c_k", {Hkv * dh, D}, ParamGroup::TransformerMatrix, true, "uniform", -s, s},
      {"c_v", {Hkv * dh, D}, ParamGroup::TransformerMatrix, true, "uniform", -s, s},
      {"c_proj", {D, H * dh}, ParamGroup::TransformerMatrix, true, "const", 0.0, 0},
  };
  layers::add_ve_gate_param(p, ctx, Hkv);
  if (c.b("out_gate")) p.push_back({"c_gate", {H * dh, D}, ParamGroup::TransformerMatrix, true, "uniform", -s, s});
  return p;
}

TensorMap make_inputs(const Config& c, const LayerCtx& ctx, int64_t B, int64_t T, at::Generator& gen) {
  AttnDims d = attn_dims(c);
  return layers::layer_inputs(ctx, B, T, d.m.d_model, d.n_kv_head, d.m.head_dim, gen);
}

// The logit scale base in effect: 0 (off) while training when the scale is for inference only.
double logit_scale_in_effect(const Config& c, const LayerCtx& ctx) {
  return (c.b("logit_scale_train") || ctx.step < 0) ? c.f("logit_scale_a") : 0.0;
}

TensorMap reference_fn(const TensorMap& in, const Config& c, const LayerCtx& ctx) {
  AttnDims d = attn_dims(c);
  reference::AttnLayerWeights w{in.at("c_q"), in.at("c_k"), in.at("c_v"), in.at("c_proj"),
                                in.get_or("ve_gate", at::Tensor()), in.get_or("c_gate", at::Tensor())};
  return {{"y", reference::nanochat_attention_layer(in.at("x"), in.get_or("ve", at::Tensor()), w, d.m.n_head,
                                                     d.n_kv_head, d.m.head_dim, layer_window(c, ctx),
                                                     c.f("rope_base"), logit_scale_in_effect(c, ctx), c.b("rope"),
                                                     in.get_or("positions", at::Tensor()))}};
}

struct Qkv {
  at::Tensor q, k, v;  // [B,T,H,dh], [B,T,Hkv,dh] ×2, after RoPE (from position `offset`, or at the
                       // input "positions" [B,T] when given), QK norm and ×1.2
};

Qkv project(const TensorMap& in, const Config& c, const AttnDims& d, int64_t offset, const at::Tensor& pos_dev = {}) {
  const at::Tensor& x = in.at("x");
  const int64_t B = x.size(0), T = x.size(1), H = d.m.n_head, Hkv = d.n_kv_head, dh = d.m.head_dim;
  at::Tensor q = at::linear(x, in.at("c_q")).view({B, T, H, dh});
  at::Tensor k = at::linear(x, in.at("c_k")).view({B, T, Hkv, dh});
  at::Tensor v = layers::add_value_embed(at::linear(x, in.at("c_v")).view({B, T, Hkv, dh}), in);
  if (c.b("rope") && in.has("positions")) {  // a layer run on a subset of the tokens
    q = layers::rope_at(q, c.f("rope_base"), in.at("positions"));
    k = layers::rope_at(k, c.f("rope_base"), in.at("positions"));
  } else if (c.b("rope") && pos_dev.defined()) {  // a decoded token at the position on the device
    q = layers::rope_pos_dev(q, c.f("rope_base"), pos_dev);
    k = layers::rope_pos_dev(k, c.f("rope_base"), pos_dev);
  } else if (c.b("rope")) {
    q = layers::rope(q, c.f("rope_base"), offset);
    k = layers::rope(k, c.f("rope_base"), offset);
  }
  return {layers::rms_norm(q) * 1.2, layers::rms_norm(k) * 1.2, v};
}

// The attention output o [B,T,H,dh] through the optional output gate and c_proj.
at::Tensor out_proj(const at::Tensor& o, const TensorMap& in, const Config& c, const AttnDims& d) {
  const at::Tensor& x = in.at("x");
  at::Tensor y = o.reshape({x.size(0), x.size(1), d.m.n_head * d.m.head_dim});
  if (c.b("out_gate")) y = y * at::sigmoid(at::linear(x, in.at("c_gate")));
  return at::linear(y, in.at("c_proj"));
}

at::Tensor attend(const Qkv& p, const Config& c, const LayerCtx& ctx, const AttnDims& d, Backend backend) {
  Config op;
  op.set("scale", 1.0 / std::sqrt(double(d.m.head_dim)));
  op.set("window", layer_window(c, ctx));
  op.set("logit_scale_a", logit_scale_in_effect(c, ctx));
  return call_op("attention", backend, {{"q", p.q}, {"k", p.k}, {"v", p.v}}, op).at("o");
}

TensorMap forward(const TensorMap& in, const Config& c, const LayerCtx& ctx, Backend backend) {
  AttnDims d = attn_dims(c);
  return {{"y", out_proj(attend(project(in, c, d, 0), c, ctx, d, backend), in, c, d)}};
}

// Keeps the keys a later query can see: all of them (full layers) or the last `window`.
at::Tensor keep_visible(const at::Tensor& kv, int64_t window) {
  if (window <= 0 || kv.size(1) <= window) return kv;
  return kv.slice(1, kv.size(1) - window).clone();
}

// A static cache's keys or values: [B,cap,Hkv,dh] allocated once (zeros), position t in slot t mod cap
// (a full layer's cap exceeds every position; a window's cap is its visible keys, a ring). Writes
// the last min(T, cap) of kv [B,T,Hkv,dh] (positions from 0).
void store_static_kv(TensorMap& cache, const std::string& name, const at::Tensor& kv, int64_t cap) {
  const int64_t T = kv.size(1), n = std::min(T, cap);
  if (!cache.has(name)) cache.set(name, at::zeros({kv.size(0), cap, kv.size(2), kv.size(3)}, kv.options()));
  const at::Tensor slots = at::arange(T - n, T, kv.options().dtype(at::kLong)).remainder(cap);
  cache.at(name).index_copy_(1, slots, kv.slice(1, T - n));
}

// Decode cache: "pos", "k" [B,Tc,Hkv,dh], "v" [B,Tc,Hkv,dh] (post RoPE/norm, as the op sees them).
// A static cache (cache_is_static) holds them in place: [B,cap,Hkv,dh] with cap = the cache's
// capacity on full layers, the window's visible keys (a ring) on windowed ones.
TensorMap prefill(const TensorMap& in, TensorMap& cache, const Config& c, const LayerCtx& ctx, Backend backend) {
  AttnDims d = attn_dims(c);
  const int64_t T = in.at("x").size(1);
  Qkv p = project(in, c, d, 0);
  at::Tensor y = attend(p, c, ctx, d, backend);
  const int64_t w = layer_window(c, ctx);
  reset_cache(cache);
  set_cache_pos(cache, T);
  if (cache_is_static(cache)) {
    const int64_t cap = w > 0 ? std::min(w, cache_capacity(cache)) : cache_capacity(cache);
    store_static_kv(cache, "k", p.k, cap);
    store_static_kv(cache, "v", p.v, cap);
    // the decode step's one projection GEMM: c_q | c_k | c_v, and on value-embedding layers the
    // gate's rows widened to d with zeros (x[..., :12] W_vegᵀ = x [W_veg 0]ᵀ); weights do not change
    // while decoding, so they are joined once here (cache_bytes does not count "w." entries)
    std::vector<at::Tensor> rows = {in.at("c_q"), in.at("c_k"), in.at("c_v")};
    if (in.has("ve")) rows.push_back(at::constant_pad_nd(in.at("ve_gate"), {0, d.m.d_model - in.at("ve_gate").size(1)}));
    cache_store(cache, kStaticInput, at::cat(rows, 0));
  } else {
    cache.set("k", keep_visible(p.k, w).contiguous());
    cache.set("v", keep_visible(p.v, w).contiguous());
  }
  return {{"y", out_proj(y, in, c, d)}};
}

// One decoded token over a static cache: its k, v written at slot pos mod cap, then the split-KV
// decode (attention_decode_static) over the valid slots; the position is read on the device only.
TensorMap decode_static(const TensorMap& in, TensorMap& cache, const Config& c, const LayerCtx& ctx) {
  AttnDims d = attn_dims(c);
  const at::Tensor& x = in.at("x");
  const int64_t B = x.size(0), H = d.m.n_head, dh = d.m.head_dim;
  const at::Tensor& pos = cache_pos_dev(cache);
  const at::Tensor& K = cache.at("k");
  const at::Tensor& V = cache.at("v");
  at::Tensor q;
  if (cache.has(kStaticInput) && !in.has("positions")) {
    // one GEMM for q|k|v (and the value-embedding gate), then one pass: RoPE, QK norm, the gate, k and v stored
    const at::Tensor proj = static_input_projection(in, cache);
    const at::Tensor ve = in.has("ve") ? in.at("ve").view({B, -1}) : at::Tensor();
    q = attention_decode_qkv(proj, ve, pos, K, V, H, c.b("rope") ? c.f("rope_base") : 0.0);
  } else {
    Qkv p = project(in, c, d, 0, pos);
    const at::Tensor slot = pos.remainder(K.size(1));
    K.index_copy_(1, slot, p.k);
    V.index_copy_(1, slot, p.v);
    q = p.q.reshape({B, H, dh});
  }
  at::Tensor o = attention_decode_static(q, K, V, pos, 1.0 / std::sqrt(double(dh)), logit_scale_in_effect(c, ctx));
  if (!c.b("out_gate") && !at::GradMode::is_enabled())  // c_proj for the step's few rows as one GEMV launch
    return {{"y", linear_rows(o.view({B, 1, H * dh}), in.at("c_proj"))}};
  return {{"y", out_proj(o.view({B, 1, H, dh}), in, c, d)}};
}

// One token at position pos: q attends to the cached keys plus its own (the last `window` of them
// on windowed layers); logit scale s_pos = log_a(pos + a). Scores and softmax in FP32 for
// half-precision inputs, as the fused kernels accumulate.
TensorMap decode(const TensorMap& in, TensorMap& cache, const Config& c, const LayerCtx& ctx, Backend) {
  AttnDims d = attn_dims(c);
  const at::Tensor& x = in.at("x");
  if (x.dim() != 3 || x.size(1) != 1) throw InputError("attention decode takes x [B,1,d]");
  if (cache_is_static(cache)) return decode_static(in, cache, c, ctx);
  const int64_t B = x.size(0), H = d.m.n_head, Hkv = d.n_kv_head, dh = d.m.head_dim, G = H / Hkv;
  const int64_t pos = cache_pos(cache);
  Qkv p = project(in, c, d, pos);
  const int64_t w = layer_window(c, ctx);
  at::Tensor K = cache.has("k") ? at::cat({cache.at("k"), p.k}, 1) : p.k;
  at::Tensor V = cache.has("v") ? at::cat({cache.at("v"), p.v}, 1) : p.v;
  K = keep_visible(K, w);
  V = keep_visible(V, w);
  cache.set("k", K);
  cache.set("v", V);
  set_cache_pos(cache, pos + 1);
  const bool half = layers::is_half(x);
  at::Tensor q = half ? layers::f32(p.q) : p.q;
  const double a = logit_scale_in_effect(c, ctx);
  if (a > 0) q = q * layers::logit_scale(1, a, pos).to(q.options()).view({1, 1, 1, 1});
  at::Tensor Kf = half ? layers::f32(K) : K, Vf = half ? layers::f32(V) : V;
  at::Tensor qh = q.reshape({B, Hkv, G, dh});
  at::Tensor scores = at::matmul(qh, Kf.permute({0, 2, 3, 1})) * (1.0 / std::sqrt(double(dh)));  // [B,Hkv,G,Tc]
  at::Tensor o = at::matmul(at::softmax(scores, -1), Vf.transpose(1, 2));                        // [B,Hkv,G,dh]
  return {{"y", out_proj(o.to(x.scalar_type()), in, c, d)}};
}

// Per-token cost of one layer at length T (see LayerCost):
//   matmul params N_l = d·H·dh + 2·d·Hkv·dh + H·dh·d (+ 12·Hkv for the VE gate, + H·dh·d for the
//   output gate)
//   fwd   = 2·N_l + 4·H·dh·v̄(T, w), v̄ = mean visible keys per query (exact causal pairs)
//   nanochat training core term = 12·H·dh·min(left, T), left = w − 1 (T for full): no causal halving
//   decode at context c = 2·N_l + 4·H·dh·min(c, left)
//   KV cache = 2·Hkv·dh bytes-per-element per token (a window bounds it at left+1 tokens)
LayerCost account(const Config& c, const LayerCtx& ctx, const CostQuery& q) {
  AttnDims d = attn_dims(c);
  const int64_t D = d.m.d_model, H = d.m.n_head, Hkv = d.n_kv_head, dh = d.m.head_dim;
  const int64_t w = layer_window(c, ctx);
  LayerCost lc;
  int64_t n = D * H * dh + 2 * D * Hkv * dh + H * dh * D + layers::ve_gate_params(ctx, Hkv) +
              (c.b("out_gate") ? H * dh * D : 0);
  lc.params.transformer_matrices = n;
  lc.params.matmul = n;
  const int64_t left = w > 0 ? w - 1 : q.T;
  lc.fwd_flops = 2.0 * double(n) + 4.0 * double(H * dh) * layers::mean_visible(q.T, w);
  lc.nanochat_core_flops = 12.0 * double(H * dh) * double(std::min(left, q.T));
  lc.decode_flops = 2.0 * double(n) + 4.0 * double(H * dh) * double(std::min(w > 0 ? left : q.context, q.context));
  const double kv = 2.0 * double(Hkv * dh) * double(q.dtype_bytes);
  if (w > 0) lc.state_bytes = kv * double(w);
  else lc.cache_bytes_per_token = kv;
  // saved for backward: x, q, k, v (post-RoPE/norm and pre), o, plus softmax stats (fp32 per head)
  lc.act_bytes = double(q.dtype_bytes) * double(D + 2 * H * dh + 4 * Hkv * dh + H * dh) + 4.0 * double(H);
  lc.formula = w > 0 ? fmt::format("window {} keys: fwd 2N + 4·H·dh·v̄(T,{}); nanochat 12·H·dh·min({},T)", w, w, left)
                     : "full: fwd 2N + 4·H·dh·(T+1)/2; nanochat 12·H·dh·T";
  return lc;
}

std::vector<CaseDef> cases_for(const ConfigSpec& spec, const std::string& pattern_note) {
  // A 4-layer model, d=64, 4 heads of 16; short window 8 left keys (9 visible) so windows bite.
  Config base = spec.parse("n_layer=4,d_model=64,head_dim=16,seq_len=64,vocab=64,short_window=8");
  std::vector<CaseDef> out = {
      {"layer0_T1", base, 1, 1, 0},
      {"layer0_B2_T37", base, 2, 37, 0},
      {"layer1_ve_B2_T45", base, 2, 45, 1},
      {"layer3_last_ve_T29", base, 1, 29, 3},
      {"layer2_T70", base, 1, 70, 2},
      {"layer1_logit_scale", base.with("logit_scale_a", 4.0), 2, 33, 1},
      {"layer0_nope_gate_B2_T33", base.with("rope", false).with("out_gate", true), 2, 33, 0},
      {"layer1_hype_T40", base.with("rope", false).with("out_gate", true).with("logit_scale_a", 4.0)
                              .with("logit_scale_train", false), 1, 40, 1},
  };
  return out;
}

MethodSpec attention_method(const std::string& name, const std::string& summary, const std::string& pattern,
                            int64_t kv_ratio) {
  MethodSpec m;
  m.name = name;
  m.family = "attention";
  m.summary = summary;
  m.citation = "karpathy/nanochat 92d63d4 nanochat/gpt.py (CausalSelfAttention)";
  m.config = backbone_config();
  m.config.s("window_pattern", pattern, "per-layer windows, tiled: S = short, L = full; last layer forced L")
      .i("short_window", 0, "left keys of S layers; 0 = nanochat's ceil(T/4/128)·128", 0)
      .i("kv_ratio", kv_ratio, "query heads per KV head; 0 = one KV head (MQA)", 0)
      .f("rope_base", 100000.0, "RoPE base", 1.0)
      .f("logit_scale_a", 0.0, "HypeNet logit scale base a; 0 = off", 0.0)
      .b("logit_scale_train", true, "apply the logit scale in training too (false: inference only, as HypeNet)")
      .b("rope", true, "RoPE on q and k (false: NoPE, HypeNet's attention layers)")
      .b("out_gate", false, "output gate sigmoid(x W_g) on the attention output before c_proj (HypeNet)")
      .rule([](const Config& c) {
        const std::string& p = c.s("window_pattern");
        if (p.empty() || p.find_first_not_of("SL") != std::string::npos)
          throw InputError(fmt::format("window_pattern '{}' must be a non-empty string of S and L", p));
        ModelDims d = model_dims(c);
        int64_t r = c.i("kv_ratio");
        if (r > 0 && d.n_head % r != 0)
          throw InputError(fmt::format("{} heads are not divisible by kv_ratio {}", d.n_head, r));
        layers::require_ve_gate_width(c);
        double a = c.f("logit_scale_a");
        if (a > 0 && a <= 1) throw InputError("logit_scale_a must be > 1 (or 0 = off)");
      });
  m.ops = {"attention"};
  m.params = params;
  m.make_inputs = make_inputs;
  m.reference = reference_fn;
  m.forward = forward;
  m.prefill = prefill;
  m.decode = decode;
  m.static_decode = true;
#if defined(MIXBENCH_WITH_CUDA)
  m.has_cuda = true;
#endif
  ConfigSpec spec = m.config;
  m.cases = [spec, pattern]() { return cases_for(spec, pattern); };
  m.account = account;
  m.ve_dim = [](const Config& c, const LayerCtx& ctx) {
    AttnDims d = attn_dims(c);
    return layers::ve_width(ctx, d.n_kv_head, d.m.head_dim);
  };
  // nanochat's CausalSelfAttention (transformer.h.<i>.attn. at model level, harness/foreign_names.h)
  m.foreign_names["nanochat"] = [](const Config&) {
    ParamAliases a;
    for (const char* n : {"c_q", "c_k", "c_v", "c_proj", "ve_gate"}) a.aliases.push_back({std::string(n) + ".weight", n});
    a.deviations = {
        "the HypeNet options (out_gate's c_gate, logit_scale_a, rope=false) are not nanochat's: with one of them on, "
        "a nanochat state dict lacks c_gate or computes another function",
        "nanochat's window_pattern, short window and n_kv_head are config fields here (window_pattern, short_window, "
        "kv_ratio = n_head / n_kv_head)"};
    return a;
  };
  return m;
}

MIXBENCH_REGISTER(attention_method("dense_full", "full causal MHA in every layer (leaderboard baseline)", "L", 1));
MIXBENCH_REGISTER(attention_method("dense", "nanochat SSSL: short windows, every 4th and the last layer full", "SSSL", 1));
MIXBENCH_REGISTER(attention_method("mqa", "full causal attention with a single KV head", "L", 0));
MIXBENCH_REGISTER(attention_method("gqa", "full causal attention, 2 query heads per KV head", "L", 2));

}  // namespace
}  // namespace mixbench
