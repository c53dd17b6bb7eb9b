// Multi-head latent attention (DeepSeek-V2, arXiv 2405.04434; V3.2-Exp inference/model.py `MLA`),
// method-details.md "MLA", at layer level in the nanochat backbone:
//   c_Q = RMSNorm(W_DQ x)·g_Q, q_C = W_UQ c_Q, q_R = RoPE(W_QR c_Q)     (per head: dh + dr dims)
//   c_KV = RMSNorm(W_DKV x)·g_KV, k_C = W_UK c_KV, v = W_UV c_KV, k_R = RoPE(W_KR x) (one, shared by heads)
//   logits (q_C·k_C + q_R·k_R) / √(dh + dr), causal softmax, y = c_proj(o).
// The latent RMSNorms carry DeepSeek's learnable weights g_Q (q_norm) and g_KV (kv_norm), init 1.
// Three registered variants (methods.md §1, seed 001):
//   mla              as above; mla_rope_dim = dr = 0 drops the rotary part (the NoPE MLA kda_hybrid uses)
//   mla_qknorm       QK-norm on the reconstructed heads: q ← RMSNorm(q)·1.2, k ← RMSNorm(k)·1.2 per
//                    head over all dh + dr dims (nanochat's QK-norm, as dense.cpp's), no output gate
//   mla_nope_qknorm  mla_qknorm without any rotary part (NoPE: no W_QR, W_KR, rope_base)
// Latent widths (seed 001: query latent 768 and joint KV latent 256 at d_model 1536, i.e. d/2 and
// d/6): mla_q_latent = 0 takes ⌈d/2⌉ and mla_kv_latent = 0 takes ⌈d/6⌉, each rounded up to a
// multiple of 16 and at least 16 (d 768: 384 and 128; d 384: 192 and 64; d 128: 64 and 32).
// No value embeddings, c_proj zero-initialised as nanochat's.
// Decode caches the KV latent and the rotary key per token (kv_latent + dr numbers) and attends
// in the absorbed form: the query is mapped into the latent space (W_UKᵀ q_C per head), scores
// against the cached latents, the latent mix goes through W_UV — the cache never expands to K, V.
// With QK-norm the cache also keeps each key head's normalising factor 1.2/rms(k_h) (H numbers per
// token, from the token's reconstructed key when it enters the cache): a normalised key's score is
// the unnormalised one times that factor.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <limits>

#include "harness/decode_ops.h"
#include "harness/backbone.h"
#include "harness/errors.h"
#include "harness/registry.h"
#include "mixers/attention/attention.h"
#include "mixers/common/layers.h"
#include "reference/reference.h"

namespace mixbench {
namespace {

// What distinguishes the registered variants.
struct MlaVariant {
  bool qk_norm = false;  // QK-norm on the reconstructed heads
  bool nope = false;     // no rotary part at all (no mla_rope_dim / rope_base knobs)
};

struct MlaDims {
  int64_t D, H, dh, dr, ql, kvl;
  bool qk_norm;
};

// ⌈d/div⌉ rounded up to a multiple of 16, at least 16.
int64_t default_latent(int64_t d, int64_t div) { return std::max<int64_t>(16, (d + 16 * div - 1) / (16 * div) * 16); }

MlaDims mla_dims(const Config& c, const MlaVariant& v) {
  ModelDims m = model_dims(c);
  const int64_t ql = c.i("mla_q_latent") > 0 ? c.i("mla_q_latent") : default_latent(m.d_model, 2);
  const int64_t kvl = c.i("mla_kv_latent") > 0 ? c.i("mla_kv_latent") : default_latent(m.d_model, 6);
  return {m.d_model, m.n_head, m.head_dim, v.nope ? 0 : c.i("mla_rope_dim"), ql, kvl, v.qk_norm};
}

double rope_base(const Config& c, const MlaDims& d) { return d.dr > 0 ? c.f("rope_base") : 0.0; }

std::vector<ParamDef> params(const Config& c, const MlaVariant& v) {
  const MlaDims d = mla_dims(c, v);
  auto u = [](int64_t fan_in) { return std::sqrt(3.0) / std::sqrt(double(fan_in)); };
  std::vector<ParamDef> p = {
      {"w_dq", {d.ql, d.D}, ParamGroup::TransformerMatrix, true, "uniform", -u(d.D), u(d.D)},
      {"q_norm", {d.ql}, ParamGroup::Scalar, false, "const", 1.0, 0},
      {"w_uq", {d.H * d.dh, d.ql}, ParamGroup::TransformerMatrix, true, "uniform", -u(d.ql), u(d.ql)},
      {"w_dkv", {d.kvl, d.D}, ParamGroup::TransformerMatrix, true, "uniform", -u(d.D), u(d.D)},
      {"kv_norm", {d.kvl}, ParamGroup::Scalar, false, "const", 1.0, 0},
      {"w_uk", {d.H * d.dh, d.kvl}, ParamGroup::TransformerMatrix, true, "uniform", -u(d.kvl), u(d.kvl)},
      {"w_uv", {d.H * d.dh, d.kvl}, ParamGroup::TransformerMatrix, true, "uniform", -u(d.kvl), u(d.kvl)},
      {"c_proj", {d.D, d.H * d.dh}, ParamGroup::TransformerMatrix, true, "const", 0.0, 0},
  };
  if (d.dr > 0) {
    p.push_back({"w_qr", {d.H * d.dr, d.ql}, ParamGroup::TransformerMatrix, true, "uniform", -u(d.ql), u(d.ql)});
    p.push_back({"w_kr", {d.dr, d.D}, ParamGroup::TransformerMatrix, true, "uniform", -u(d.D), u(d.D)});
  }
  return p;
}

TensorMap make_inputs(const Config& c, const LayerCtx&, int64_t B, int64_t T, at::Generator& gen) {
  return {{"x", at::randn({B, T, model_dims(c).d_model}, gen, at::TensorOptions().dtype(at::kDouble))}};
}

TensorMap reference_fn(const TensorMap& in, const Config& c, const MlaVariant& v) {
  const MlaDims d = mla_dims(c, v);
  reference::MlaWeights w{in.at("w_dq"),  in.at("w_uq"), in.get_or("w_qr", at::Tensor()), in.at("w_dkv"),
                          in.at("w_uk"),  in.at("w_uv"), in.get_or("w_kr", at::Tensor()), in.at("c_proj"),
                          in.at("q_norm"), in.at("kv_norm")};
  return {{"y", reference::mla_layer(in.at("x"), w, d.H, d.dh, d.dr, rope_base(c, d), d.qk_norm)}};
}

// RMSNorm (no weight) times a learnable gain, in the input's dtype.
at::Tensor rms_gain(const at::Tensor& x, const at::Tensor& g) { return layers::rms_norm(x) * g.to(x.scalar_type()); }

// nanochat's QK-norm of a head (dense.cpp's): RMSNorm over its dims, times 1.2.
constexpr double kQkGain = 1.2;
at::Tensor qk_normed(const at::Tensor& t) { return layers::rms_norm(t) * kQkGain; }

// Latents and the rotary parts of one chunk of tokens starting at position `offset`.
struct Latents {
  at::Tensor cq, ckv, kr;  // [B,T,ql], [B,T,kvl], [B,T,1,dr] (after RoPE) or undefined
};

// `pos_dev` (a static cache's device position, int64 [1]): RoPE at it in place of `offset`.
Latents latents(const TensorMap& in, const Config& c, const MlaDims& d, int64_t offset, const at::Tensor& pos_dev = {}) {
  const at::Tensor& x = in.at("x");
  Latents l;
  l.cq = rms_gain(at::linear(x, in.at("w_dq")), in.at("q_norm"));
  l.ckv = rms_gain(at::linear(x, in.at("w_dkv")), in.at("kv_norm"));
  if (d.dr > 0) {
    const at::Tensor kr = at::linear(x, in.at("w_kr")).view({x.size(0), x.size(1), 1, d.dr});
    l.kr = pos_dev.defined() ? layers::rope_pos_dev(kr, rope_base(c, d), pos_dev) : layers::rope(kr, rope_base(c, d), offset);
  }
  return l;
}

// Query heads [B,T,H,dh] and their rotary parts [B,T,H,dr] (undefined without RoPE).
std::pair<at::Tensor, at::Tensor> queries(const Latents& l, const TensorMap& in, const Config& c, const MlaDims& d,
                                          int64_t offset, const at::Tensor& pos_dev = {}) {
  const int64_t B = l.cq.size(0), T = l.cq.size(1);
  at::Tensor qc = at::linear(l.cq, in.at("w_uq")).view({B, T, d.H, d.dh}), qr;
  if (d.dr > 0) {
    const at::Tensor q = at::linear(l.cq, in.at("w_qr")).view({B, T, d.H, d.dr});
    qr = pos_dev.defined() ? layers::rope_pos_dev(q, rope_base(c, d), pos_dev) : layers::rope(q, rope_base(c, d), offset);
  }
  return {qc, qr};
}

// Reconstructed key heads [B,T,H,dh+dr] (the shared rotary key appended to every head).
at::Tensor keys(const TensorMap& in, const MlaDims& d, const Latents& l) {
  const int64_t B = l.ckv.size(0), T = l.ckv.size(1);
  at::Tensor k = at::linear(l.ckv, in.at("w_uk")).view({B, T, d.H, d.dh});
  return d.dr > 0 ? at::cat({k, l.kr.expand({B, T, d.H, d.dr})}, -1) : k;
}

// QK-norm's factor per key head, [B,T,H]: 1.2/rms(k_h) with layers::rms_norm's eps (float32 epsilon),
// in fp32 for half-precision keys.
at::Tensor key_factor(const at::Tensor& k) {
  const at::Tensor k32 = layers::is_half(k) ? layers::f32(k) : k;
  const double eps = double(std::numeric_limits<float>::epsilon());
  return (kQkGain * at::rsqrt(k32.pow(2).mean(-1) + eps)).to(k.scalar_type());
}

double scale_of(const MlaDims& d) { return 1.0 / std::sqrt(double(d.dh + d.dr)); }

// The layer's output over a whole sequence from its latents; `k_out` receives the reconstructed
// keys before QK-norm when given.
at::Tensor attend(const TensorMap& in, const Config& c, const MlaDims& d, const Latents& l, Backend backend,
                  at::Tensor* k_out = nullptr) {
  const at::Tensor& x = in.at("x");
  const int64_t B = x.size(0), T = x.size(1);
  auto [q, qr] = queries(l, in, c, d, 0);
  at::Tensor k = keys(in, d, l);
  if (k_out) *k_out = k;
  at::Tensor v = at::linear(l.ckv, in.at("w_uv")).view({B, T, d.H, d.dh});
  if (d.dr > 0) q = at::cat({q, qr}, -1);
  if (d.qk_norm) {
    q = qk_normed(q);
    k = qk_normed(k);
  }
  Config op;
  op.set("scale", scale_of(d));
  op.set("window", int64_t(0));
  op.set("logit_scale_a", 0.0);
  at::Tensor o = call_op("attention", backend, {{"q", q}, {"k", k}, {"v", v}}, op).at("o");
  return at::linear(o.reshape({B, T, d.H * d.dh}), in.at("c_proj"));
}

TensorMap forward(const TensorMap& in, const Config& c, const MlaVariant& v, Backend backend) {
  const MlaDims d = mla_dims(c, v);
  return {{"y", attend(in, c, d, latents(in, c, d, 0), backend)}};
}

// Stores the prefill's per-token tensor t [B,T,X] under `name`: as it is, or in a static cache into
// a buffer [B,capacity,X] (zeros past T) allocated once.
void store(TensorMap& cache, const std::string& name, const at::Tensor& t) {
  if (!cache_is_static(cache)) {
    cache.set(name, t.contiguous());
    return;
  }
  if (!cache.has(name)) cache.set(name, at::zeros({t.size(0), cache_capacity(cache), t.size(2)}, t.options()));
  cache.at(name).slice(1, 0, t.size(1)).copy_(t);
}

// A static cache without QK-norm keeps each token's latent and rotary key side by side in one buffer
// "ckr" [B,capacity,1,P]: [c_KV | k_R | 0], P = kvl + dr rounded up to a width the split-KV decode
// kernel takes (64, 128 or 256; kvl + dr itself past 256). The absorbed step is then multi-query
// attention of the H absorbed queries [W_UKᵀ q_C | q_R | 0] over those rows, keys and values alike
// (the first kvl dims of the output are the latent mix): attention_decode_static, one split-KV launch
// on a GPU that reads the latent cache once for all heads. With QK-norm each score also takes its
// key's per-head factor, which that kernel has no place for: separate buffers and the masked step.
int64_t joint_width(const MlaDims& d) {
  const int64_t n = d.kvl + d.dr;
  for (int64_t P : {int64_t(64), int64_t(128), int64_t(256)})
    if (n <= P) return P;
  return n;
}
bool joint_cache(const TensorMap& cache, const MlaDims& d) { return cache_is_static(cache) && !d.qk_norm; }

// A chunk's rows [c_KV | k_R | 0] [B,T,1,P] in the latents' dtype.
at::Tensor joint_rows(const MlaDims& d, const Latents& l) {
  const int64_t B = l.ckv.size(0), T = l.ckv.size(1), P = joint_width(d);
  std::vector<at::Tensor> parts = {l.ckv};
  if (d.dr > 0) parts.push_back(l.kr.squeeze(2).to(l.ckv.scalar_type()));
  if (P > d.kvl + d.dr) parts.push_back(at::zeros({B, T, P - d.kvl - d.dr}, l.ckv.options()));
  return at::cat(parts, -1).view({B, T, 1, P});
}

// The joint step's weights, formed once at prefill (weights do not change while decoding; cache_bytes
// does not count "w." entries), so that a decoded token takes three GEMMs:
//   "w.in" [ql + kvl + dr, D]: W_DQ | W_DKV | W_KR, the token's three projections in one;
//   "w.q" [H·P, ql]: per head the absorbed query W_UK,hᵀ W_UQ,h [kvl, ql], W_QR,h [dr, ql] and
//         P − kvl − dr zero rows, so that c_Q·w.qᵀ is the attention's query [H, P] as it stands;
//   "w.o" [D, H·P]: per head c_proj,h W_UV,h [D, kvl] and zero columns for the rest of the head's
//         output, so that the attention's output [H, P] maps to y in one product.
// The products are formed in fp32 (fp64 for fp64 weights) and stored in the weights' dtype: one
// rounding of the folded weight where the unfolded step rounds the query and the head outputs.
void prepare_joint_step(const TensorMap& in, TensorMap& cache, const MlaDims& d) {
  const int64_t P = joint_width(d), pad = P - d.kvl - d.dr;
  const at::ScalarType dt = in.at("w_dq").scalar_type(), acc = dt == at::kDouble ? at::kDouble : at::kFloat;
  std::vector<at::Tensor> xr = {in.at("w_dq"), in.at("w_dkv")};
  if (d.dr > 0) xr.push_back(in.at("w_kr"));
  cache_store(cache, kStaticInput, at::cat(xr, 0).contiguous());
  const at::Tensor wuq = in.at("w_uq").to(acc).view({d.H, d.dh, d.ql}), wuk = in.at("w_uk").to(acc).view({d.H, d.dh, d.kvl}),
                   wuv = in.at("w_uv").to(acc).view({d.H, d.dh, d.kvl}), wo = in.at("c_proj").to(acc).view({d.D, d.H, d.dh});
  std::vector<at::Tensor> qr = {at::einsum("hdl,hdq->hlq", {wuk, wuq})};  // [H, kvl, ql]
  if (d.dr > 0) qr.push_back(in.at("w_qr").to(acc).view({d.H, d.dr, d.ql}));
  if (pad > 0) qr.push_back(at::zeros({d.H, pad, d.ql}, wuq.options()));
  cache_store(cache, "w.q", at::cat(qr, 1).reshape({d.H * P, d.ql}).to(dt).contiguous());
  at::Tensor wol = at::einsum("ohd,hdl->ohl", {wo, wuv});  // [D, H, kvl]
  if (P > d.kvl) wol = at::constant_pad_nd(wol, {0, P - d.kvl});
  cache_store(cache, "w.o", wol.reshape({d.D, d.H * P}).to(dt).contiguous());
}

// Decode cache: "pos", "ckv" [B,Tc,kvl], with RoPE "kr" [B,Tc,dr], with QK-norm "kf" [B,Tc,H] (key
// factors); a static cache holds them in buffers of the cache's capacity, token t in slot t (without
// QK-norm: "ckr", the two side by side, above).
TensorMap prefill(const TensorMap& in, TensorMap& cache, const Config& c, const MlaVariant& v, Backend backend) {
  const MlaDims d = mla_dims(c, v);
  const Latents l = latents(in, c, d, 0);
  reset_cache(cache);
  set_cache_pos(cache, in.at("x").size(1));
  if (joint_cache(cache, d)) {
    const at::Tensor rows = joint_rows(d, l);
    if (!cache.has("ckr")) cache.set("ckr", at::zeros({rows.size(0), cache_capacity(cache), 1, rows.size(3)}, rows.options()));
    cache.at("ckr").slice(1, 0, rows.size(1)).copy_(rows);
    prepare_joint_step(in, cache, d);
  } else {
    store(cache, "ckv", l.ckv);
    if (d.dr > 0) store(cache, "kr", l.kr.squeeze(2));
  }
  at::Tensor k;
  at::Tensor y = attend(in, c, d, l, backend, &k);
  if (d.qk_norm) store(cache, "kf", key_factor(k));
  return {{"y", y}};
}

// Appends `t` along the tokens to cache[name] (or starts it) and returns the whole; a static cache
// writes it into its slot (the device position) and returns the whole buffer.
at::Tensor append(TensorMap& cache, const std::string& name, const at::Tensor& t) {
  if (cache_is_static(cache)) {
    const at::Tensor& buf = cache.at(name);
    buf.index_copy_(1, cache_pos_dev(cache), t);
    return buf;
  }
  at::Tensor all = cache.has(name) ? at::cat({cache.at(name), t}, 1) : t;
  cache.set(name, all);
  return all;
}

// One token in the absorbed form (fp32 for half-precision inputs):
//   s_j = (W_UK,hᵀ q_C,h)·c_KV,j + q_R,h·k_R,j,  o_h = W_UV,h Σ_j softmax(s·scale)_j c_KV,j;
// with QK-norm q_h is normalised first and s_j,h multiplied by key j's cached factor.
TensorMap decode(const TensorMap& in, TensorMap& cache, const Config& c, const MlaVariant& v, Backend) {
  const MlaDims d = mla_dims(c, v);
  const at::Tensor& x = in.at("x");
  if (x.dim() != 3 || x.size(1) != 1) throw InputError("mla decode takes x [B,1,d]");
  const int64_t B = x.size(0), pos = cache_pos(cache);
  const bool is_static = cache_is_static(cache);
  const at::Tensor pos_dev = is_static ? cache_pos_dev(cache) : at::Tensor();
  if (joint_cache(cache, d) && cache.has(kStaticInput)) {
    // the token's latents and rotary key from one GEMM, its cache row [c_KV | k_R | 0] in its slot
    const at::Tensor proj = static_input_projection(in, cache);  // [B, ql + kvl + dr]
    Latents l;
    l.ckv = rms_gain(proj.narrow(1, d.ql, d.kvl), in.at("kv_norm")).view({B, 1, d.kvl});
    if (d.dr > 0)
      l.kr = layers::rope_pos_dev(proj.narrow(1, d.ql + d.kvl, d.dr).reshape({B, 1, 1, d.dr}), rope_base(c, d), pos_dev);
    const at::Tensor& buf = cache.at("ckr");
    buf.index_copy_(1, pos_dev, joint_rows(d, l));
    set_cache_pos(cache, pos + 1);
    // the H absorbed queries [W_UKᵀ q_C | q_R | 0] from one GEMM, RoPE on their rotary parts
    const int64_t P = buf.size(3);
    const at::Tensor cq = rms_gain(proj.narrow(1, 0, d.ql), in.at("q_norm"));
    // the step's few rows: GEMV launches where no gradient is taken
    const bool gemv = !at::GradMode::is_enabled();
    const at::Tensor q = (gemv ? linear_rows(cq, cache.at("w.q")) : at::linear(cq, cache.at("w.q"))).view({B, d.H, P});
    if (d.dr > 0) {
      at::Tensor q_r = q.narrow(2, d.kvl, d.dr);
      q_r.copy_(layers::rope_pos_dev(q_r.reshape({B, 1, d.H, d.dr}), rope_base(c, d), pos_dev).view({B, d.H, d.dr}));
    }
    const at::Tensor mix = attention_decode_static(q, buf, buf, pos_dev, scale_of(d), 0.0);  // [B, H, P]
    const at::Tensor mo = mix.reshape({B, 1, d.H * P}).to(x.scalar_type());
    return {{"y", gemv ? linear_rows(mo, cache.at("w.o")) : at::linear(mo, cache.at("w.o"))}};
  }
  Latents l = latents(in, c, d, pos, pos_dev);
  auto [qc, qr] = queries(l, in, c, d, pos, pos_dev);
  const bool half = layers::is_half(x);
  auto f = [&](const at::Tensor& t) { return half ? layers::f32(t) : t; };
  at::Tensor wuk = f(in.at("w_uk")).view({d.H, d.dh, d.kvl}), wuv = f(in.at("w_uv")).view({d.H, d.dh, d.kvl});
  if (joint_cache(cache, d)) {  // without the prepared weights: the same attention, the projections unfolded
    const at::Tensor& buf = cache.at("ckr");
    buf.index_copy_(1, pos_dev, joint_rows(d, l));
    set_cache_pos(cache, pos + 1);
    std::vector<at::Tensor> qs = {at::einsum("bhd,hdl->bhl", {f(qc).reshape({B, d.H, d.dh}), wuk})};  // [B,H,kvl]
    if (d.dr > 0) qs.push_back(f(qr).reshape({B, d.H, d.dr}));
    const int64_t P = buf.size(3);
    if (P > d.kvl + d.dr) qs.push_back(at::zeros({B, d.H, P - d.kvl - d.dr}, qs[0].options()));
    const at::Tensor q = at::cat(qs, -1).to(buf.scalar_type());  // [B,H,P]
    const at::Tensor mix = attention_decode_static(q, buf, buf, pos_dev, scale_of(d), 0.0).narrow(-1, 0, d.kvl);
    at::Tensor o = at::einsum("bhl,hdl->bhd", {f(mix), wuv}).reshape({B, 1, d.H * d.dh}).to(x.scalar_type());
    return {{"y", at::linear(o, in.at("c_proj"))}};
  }
  at::Tensor ckv = append(cache, "ckv", l.ckv), kr, kf;
  if (d.dr > 0) kr = append(cache, "kr", l.kr.squeeze(2));
  if (d.qk_norm) {
    kf = append(cache, "kf", key_factor(keys(in, d, l)));
    at::Tensor q = qk_normed(d.dr > 0 ? at::cat({qc, qr}, -1) : qc);
    qc = q.narrow(-1, 0, d.dh);
    if (d.dr > 0) qr = q.narrow(-1, d.dh, d.dr);
  }
  set_cache_pos(cache, pos + 1);
  at::Tensor qa = at::einsum("bhd,hdl->bhl", {f(qc).reshape({B, d.H, d.dh}), wuk});           // [B,H,kvl]
  at::Tensor s = at::matmul(qa, f(ckv).transpose(1, 2));                                   // [B,H,Tc]
  if (d.dr > 0) s = s + at::matmul(f(qr).reshape({B, d.H, d.dr}), f(kr).transpose(1, 2));
  if (d.qk_norm) s = s * f(kf).transpose(1, 2);
  // a static cache: only the slots up to the position count (the buffers hold zeros past it)
  if (is_static) s = s.masked_fill(at::arange(s.size(2), pos_dev.options()).gt(pos_dev).view({1, 1, -1}), -INFINITY);
  at::Tensor mix = at::matmul(at::softmax(s * scale_of(d), -1), f(ckv));                    // [B,H,kvl]
  at::Tensor o = at::einsum("bhl,hdl->bhd", {mix, wuv}).reshape({B, 1, d.H * d.dh}).to(x.scalar_type());
  return {{"y", at::linear(o, in.at("c_proj"))}};
}

// Per-token cost (see LayerCost): matmul params N_l = ql·d + H·dh·ql + H·dr·ql + kvl·d + dr·d +
// 2·H·dh·kvl + d·H·dh, scalars ql + kvl (the latent norms' weights); forward 2·N_l + 2·H·(2·dh + dr)·v̄
// (scores over dh + dr, values over dh); nanochat's training core 6·H·(2·dh + dr)·T; decode
// (absorbed) 2·N_l + 2·H·dh·kvl (the query into the latent space; W_UV then counts in N_l as in the
// forward) + c·H·(4·kvl + 2·dr), with QK-norm + 2·H·dh·kvl (the new token's key, for its factor);
// cache (kvl + dr) numbers per token, with QK-norm + H (the key factors).
LayerCost account(const Config& c, const MlaVariant& v, const CostQuery& q) {
  const MlaDims d = mla_dims(c, v);
  LayerCost lc;
  const int64_t n = d.ql * d.D + d.H * d.dh * d.ql + d.H * d.dr * d.ql + d.kvl * d.D + d.dr * d.D +
                    2 * d.H * d.dh * d.kvl + d.D * d.H * d.dh;
  lc.params.transformer_matrices = n;
  lc.params.matmul = n;
  lc.params.scalars = d.ql + d.kvl;
  const double core = 2.0 * double(d.H * (2 * d.dh + d.dr));
  lc.fwd_flops = 2.0 * double(n) + core * layers::mean_visible(q.T, 0);
  lc.nanochat_core_flops = 3.0 * core * double(q.T);
  const double key_rebuild = d.qk_norm ? 2.0 * double(d.H * d.dh * d.kvl) : 0.0;
  lc.decode_flops = 2.0 * double(n) + 2.0 * double(d.H * d.dh * d.kvl) + key_rebuild +
                    double(q.context) * double(d.H) * double(4 * d.kvl + 2 * d.dr);
  const int64_t cached = d.kvl + d.dr + (d.qk_norm ? d.H : 0);
  lc.cache_bytes_per_token = double(cached) * double(q.dtype_bytes);
  // saved for backward: x, the two latents (before and after their norms), q, k (with rope parts;
  // with QK-norm also before it), v, o, softmax stats
  const int64_t qk = 2 * d.H * (d.dh + d.dr) * (d.qk_norm ? 2 : 1);
  lc.act_bytes = double(q.dtype_bytes) * double(d.D + 2 * (d.ql + d.kvl) + qk + 2 * d.H * d.dh) + 4.0 * double(d.H);
  lc.formula = fmt::format(
      "MLA{} q latent {}, kv latent {}, rope {}: fwd 2N + 2·H·(2·dh+dr)·(T+1)/2; cache {} per token",
      d.qk_norm ? " with QK-norm" : "", d.ql, d.kvl, d.dr, cached);
  return lc;
}

MethodSpec mla_method(const std::string& name, const MlaVariant& v, const std::string& summary) {
  MethodSpec m;
  m.name = name;
  m.family = "attention";
  m.summary = summary;
  m.citation = "DeepSeek-V2 (arXiv 2405.04434); deepseek-ai/DeepSeek-V3.2-Exp inference/model.py (MLA); methods.md §1";
  m.config = backbone_config();
  m.config.i("mla_q_latent", 0, "query latent width; 0 = d_model/2 rounded up to a multiple of 16, at least 16", 0)
      .i("mla_kv_latent", 0, "KV latent width; 0 = d_model/6 rounded up to a multiple of 16, at least 16", 0);
  if (!v.nope)
    m.config.i("mla_rope_dim", 64, "decoupled RoPE dims per head (one rotary key shared by the heads); 0 = NoPE", 0)
        .f("rope_base", 100000.0, "RoPE base", 1.0)
        .rule([](const Config& c) {
          if (c.i("mla_rope_dim") % 2 != 0)
            throw InputError(fmt::format("mla_rope_dim {} must be even", c.i("mla_rope_dim")));
        });
  m.ops = {"attention"};
  m.params = [v](const Config& c, const LayerCtx&) { return params(c, v); };
  m.make_inputs = make_inputs;
  m.reference = [v](const TensorMap& in, const Config& c, const LayerCtx&) { return reference_fn(in, c, v); };
  m.forward = [v](const TensorMap& in, const Config& c, const LayerCtx&, Backend b) { return forward(in, c, v, b); };
  m.prefill = [v](const TensorMap& in, TensorMap& cache, const Config& c, const LayerCtx&, Backend b) {
    return prefill(in, cache, c, v, b);
  };
  m.decode = [v](const TensorMap& in, TensorMap& cache, const Config& c, const LayerCtx&, Backend b) {
    return decode(in, cache, c, v, b);
  };
  m.static_decode = true;  // latent buffers of the cache's capacity: split-KV over [c_KV | k_R], or the masked step
#if defined(MIXBENCH_WITH_CUDA)
  m.has_cuda = true;
#endif
  ConfigSpec spec = m.config;
  m.cases = [spec, v]() {
    const std::string rope = v.nope ? "" : ",mla_rope_dim=8";
    Config base = spec.parse("n_layer=4,d_model=64,head_dim=16,seq_len=64,vocab=64,mla_q_latent=48,mla_kv_latent=24" + rope);
    std::vector<CaseDef> cases = {
        {"T1", base, 1, 1, 0},
        {"B2_T37", base, 2, 37, 1},
        {"T70_default_latents", base.with("mla_q_latent", int64_t(0)).with("mla_kv_latent", int64_t(0)), 1, 70, 2},
    };
    if (!v.nope) cases.push_back({"nope_B2_T29", base.with("mla_rope_dim", int64_t(0)), 2, 29, 3});
    return cases;
  };
  m.account = [v](const Config& c, const LayerCtx&, const CostQuery& q) { return account(c, v, q); };
  m.ve_dim = [](const Config&, const LayerCtx&) -> int64_t { return 0; };
  return m;
}

MIXBENCH_REGISTER(mla_method("mla", {},
                             "multi-head latent attention: q and KV latents (d/2, d/6), decoupled RoPE key shared by heads"));
MIXBENCH_REGISTER(mla_method("mla_qknorm", {true, false},
                             "MLA with QK-norm on the reconstructed heads (rotary dims included), no output gate"));
MIXBENCH_REGISTER(mla_method("mla_nope_qknorm", {true, true},
                             "MLA without RoPE, QK-norm on the reconstructed heads, no output gate"));

}  // namespace
}  // namespace mixbench
