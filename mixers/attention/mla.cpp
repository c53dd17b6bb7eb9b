// Multi-head latent attention (DeepSeek-V2, arXiv 2405.04434; V3.2-Exp inference/model.py `MLA`),
// method-details.md "MLA", at layer level in the nanochat backbone:
//   c_Q = RMSNorm(W_DQ x), q_C = W_UQ c_Q, q_R = RoPE(W_QR c_Q)        (per head: dh + dr dims)
//   c_KV = RMSNorm(W_DKV x), k_C = W_UK c_KV, v = W_UV c_KV, k_R = RoPE(W_KR x) (one, shared by heads)
//   logits (q_C·k_C + q_R·k_R) / √(dh + dr), causal softmax, y = c_proj(o).
// mla_rope_dim = dr = 0 drops the rotary part (the `nope` variant kda_hybrid uses). RMSNorms without
// weights (as the backbone's), no value embeddings, c_proj zero-initialised as nanochat's.
// Decode caches the KV latent and the rotary key per token (kv_latent + dr numbers) and attends
// in the absorbed form: the query is mapped into the latent space (W_UKᵀ q_C per head), scores
// against the cached latents, the latent mix goes through W_UV — the cache never expands to K, V.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include "harness/backbone.h"
#include "harness/errors.h"
#include "harness/registry.h"
#include "mixers/common/layers.h"
#include "reference/reference.h"

namespace mixbench {
namespace {

struct MlaDims {
  int64_t D, H, dh, dr, ql, kvl;
};

MlaDims mla_dims(const Config& c) {
  ModelDims m = model_dims(c);
  const int64_t ql = c.i("mla_q_latent") > 0 ? c.i("mla_q_latent") : m.d_model;
  const int64_t kvl = c.i("mla_kv_latent") > 0 ? c.i("mla_kv_latent") : std::max<int64_t>(16, (m.d_model / 3 + 15) / 16 * 16);
  return {m.d_model, m.n_head, m.head_dim, c.i("mla_rope_dim"), ql, kvl};
}

std::vector<ParamDef> params(const Config& c, const LayerCtx&) {
  const MlaDims d = mla_dims(c);
  auto u = [](int64_t fan_in) { return std::sqrt(3.0) / std::sqrt(double(fan_in)); };
  std::vector<ParamDef> p = {
      {"w_dq", {d.ql, d.D}, ParamGroup::TransformerMatrix, true, "uniform", -u(d.D), u(d.D)},
      {"w_uq", {d.H * d.dh, d.ql}, ParamGroup::TransformerMatrix, true, "uniform", -u(d.ql), u(d.ql)},
      {"w_dkv", {d.kvl, d.D}, ParamGroup::TransformerMatrix, true, "uniform", -u(d.D), u(d.D)},
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
  return {{"x", at::randn({B, T, mla_dims(c).D}, gen, at::TensorOptions().dtype(at::kDouble))}};
}

TensorMap reference_fn(const TensorMap& in, const Config& c, const LayerCtx&) {
  const MlaDims d = mla_dims(c);
  reference::MlaWeights w{in.at("w_dq"), in.at("w_uq"), in.get_or("w_qr", at::Tensor()), in.at("w_dkv"),
                          in.at("w_uk"), in.at("w_uv"), in.get_or("w_kr", at::Tensor()), in.at("c_proj")};
  return {{"y", reference::mla_layer(in.at("x"), w, d.H, d.dh, d.dr, c.f("rope_base"))}};
}

// Latents and the rotary parts of one chunk of tokens starting at position `offset`.
struct Latents {
  at::Tensor cq, ckv, kr;  // [B,T,ql], [B,T,kvl], [B,T,1,dr] (after RoPE) or undefined
};

Latents latents(const TensorMap& in, const Config& c, const MlaDims& d, int64_t offset) {
  const at::Tensor& x = in.at("x");
  Latents l;
  l.cq = layers::rms_norm(at::linear(x, in.at("w_dq")));
  l.ckv = layers::rms_norm(at::linear(x, in.at("w_dkv")));
  if (d.dr > 0)
    l.kr = layers::rope(at::linear(x, in.at("w_kr")).view({x.size(0), x.size(1), 1, d.dr}), c.f("rope_base"), offset);
  return l;
}

// Query heads [B,T,H,dh] and their rotary parts [B,T,H,dr] (undefined without RoPE).
std::pair<at::Tensor, at::Tensor> queries(const Latents& l, const TensorMap& in, const Config& c, const MlaDims& d,
                                          int64_t offset) {
  const int64_t B = l.cq.size(0), T = l.cq.size(1);
  at::Tensor qc = at::linear(l.cq, in.at("w_uq")).view({B, T, d.H, d.dh}), qr;
  if (d.dr > 0) qr = layers::rope(at::linear(l.cq, in.at("w_qr")).view({B, T, d.H, d.dr}), c.f("rope_base"), offset);
  return {qc, qr};
}

double scale_of(const MlaDims& d) { return 1.0 / std::sqrt(double(d.dh + d.dr)); }

// The layer's output over a whole sequence from its latents.
at::Tensor attend(const TensorMap& in, const Config& c, const MlaDims& d, const Latents& l, Backend backend) {
  const at::Tensor& x = in.at("x");
  const int64_t B = x.size(0), T = x.size(1);
  auto [q, qr] = queries(l, in, c, d, 0);
  at::Tensor k = at::linear(l.ckv, in.at("w_uk")).view({B, T, d.H, d.dh});
  at::Tensor v = at::linear(l.ckv, in.at("w_uv")).view({B, T, d.H, d.dh});
  if (d.dr > 0) {
    q = at::cat({q, qr}, -1);
    k = at::cat({k, l.kr.expand({B, T, d.H, d.dr})}, -1);
  }
  Config op;
  op.set("scale", scale_of(d));
  op.set("window", int64_t(0));
  op.set("logit_scale_a", 0.0);
  at::Tensor o = call_op("attention", backend, {{"q", q}, {"k", k}, {"v", v}}, op).at("o");
  return at::linear(o.reshape({B, T, d.H * d.dh}), in.at("c_proj"));
}

TensorMap forward(const TensorMap& in, const Config& c, const LayerCtx&, Backend backend) {
  const MlaDims d = mla_dims(c);
  return {{"y", attend(in, c, d, latents(in, c, d, 0), backend)}};
}

// Decode cache: "pos", "ckv" [B,Tc,kvl] and, with RoPE, "kr" [B,Tc,dr].
TensorMap prefill(const TensorMap& in, TensorMap& cache, const Config& c, const LayerCtx&, Backend backend) {
  const MlaDims d = mla_dims(c);
  const Latents l = latents(in, c, d, 0);
  cache = TensorMap();
  set_cache_pos(cache, in.at("x").size(1));
  cache.set("ckv", l.ckv.contiguous());
  if (d.dr > 0) cache.set("kr", l.kr.squeeze(2).contiguous());
  return {{"y", attend(in, c, d, l, backend)}};
}

// One token in the absorbed form (fp32 for half-precision inputs):
//   s_j = (W_UK,hᵀ q_C,h)·c_KV,j + q_R,h·k_R,j,  o_h = W_UV,h Σ_j softmax(s·scale)_j c_KV,j.
TensorMap decode(const TensorMap& in, TensorMap& cache, const Config& c, const LayerCtx&, Backend) {
  const MlaDims d = mla_dims(c);
  const at::Tensor& x = in.at("x");
  if (x.dim() != 3 || x.size(1) != 1) throw InputError("mla decode takes x [B,1,d]");
  const int64_t B = x.size(0), pos = cache_pos(cache);
  Latents l = latents(in, c, d, pos);
  auto [qc, qr] = queries(l, in, c, d, pos);
  at::Tensor ckv = cache.has("ckv") ? at::cat({cache.at("ckv"), l.ckv}, 1) : l.ckv;
  cache.set("ckv", ckv);
  at::Tensor kr;
  if (d.dr > 0) {
    kr = cache.has("kr") ? at::cat({cache.at("kr"), l.kr.squeeze(2)}, 1) : l.kr.squeeze(2);
    cache.set("kr", kr);
  }
  set_cache_pos(cache, pos + 1);
  const bool half = layers::is_half(x);
  auto f = [&](const at::Tensor& t) { return half ? layers::f32(t) : t; };
  at::Tensor wuk = f(in.at("w_uk")).view({d.H, d.dh, d.kvl}), wuv = f(in.at("w_uv")).view({d.H, d.dh, d.kvl});
  at::Tensor qa = at::einsum("bhd,hdl->bhl", {f(qc).view({B, d.H, d.dh}), wuk});              // [B,H,kvl]
  at::Tensor s = at::matmul(qa, f(ckv).transpose(1, 2));                                   // [B,H,Tc]
  if (d.dr > 0) s = s + at::matmul(f(qr).view({B, d.H, d.dr}), f(kr).transpose(1, 2));
  at::Tensor mix = at::matmul(at::softmax(s * scale_of(d), -1), f(ckv));                    // [B,H,kvl]
  at::Tensor o = at::einsum("bhl,hdl->bhd", {mix, wuv}).reshape({B, 1, d.H * d.dh}).to(x.scalar_type());
  return {{"y", at::linear(o, in.at("c_proj"))}};
}

// Per-token cost (see LayerCost): matmul params N_l = ql·d + H·dh·ql + H·dr·ql + kvl·d + dr·d +
// 2·H·dh·kvl + d·H·dh; forward 2·N_l + 2·H·(2·dh + dr)·v̄ (scores over dh + dr, values over dh);
// nanochat's training core 6·H·(2·dh + dr)·T; decode (absorbed) 2·N_l + 2·H·dh·kvl (the query into
// the latent space; W_UV then counts in N_l as in the forward) + c·H·(4·kvl + 2·dr); cache
// (kvl + dr) numbers per token.
LayerCost account(const Config& c, const LayerCtx&, const CostQuery& q) {
  const MlaDims d = mla_dims(c);
  LayerCost lc;
  const int64_t n = d.ql * d.D + d.H * d.dh * d.ql + d.H * d.dr * d.ql + d.kvl * d.D + d.dr * d.D +
                    2 * d.H * d.dh * d.kvl + d.D * d.H * d.dh;
  lc.params.transformer_matrices = n;
  lc.params.matmul = n;
  const double core = 2.0 * double(d.H * (2 * d.dh + d.dr));
  lc.fwd_flops = 2.0 * double(n) + core * layers::mean_visible(q.T, 0);
  lc.nanochat_core_flops = 3.0 * core * double(q.T);
  lc.decode_flops = 2.0 * double(n) + 2.0 * double(d.H * d.dh * d.kvl) +
                    double(q.context) * double(d.H) * double(4 * d.kvl + 2 * d.dr);
  lc.cache_bytes_per_token = double(d.kvl + d.dr) * double(q.dtype_bytes);
  // saved for backward: x, the two latents, q, k (with rope parts), v, o, softmax stats
  lc.act_bytes = double(q.dtype_bytes) * double(d.D + d.ql + d.kvl + 2 * d.H * (d.dh + d.dr) + 2 * d.H * d.dh) +
                 4.0 * double(d.H);
  lc.formula = fmt::format("MLA q latent {}, kv latent {}, rope {}: fwd 2N + 2·H·(2·dh+dr)·(T+1)/2; cache {} per token",
                           d.ql, d.kvl, d.dr, d.kvl + d.dr);
  return lc;
}

MethodSpec mla_method() {
  MethodSpec m;
  m.name = "mla";
  m.family = "attention";
  m.summary = "multi-head latent attention: low-rank q and KV latents, decoupled RoPE key shared by heads";
  m.citation = "DeepSeek-V2 (arXiv 2405.04434); deepseek-ai/DeepSeek-V3.2-Exp inference/model.py (MLA)";
  m.config = backbone_config();
  m.config.i("mla_q_latent", 0, "query latent width; 0 = d_model", 0)
      .i("mla_kv_latent", 0, "KV latent width; 0 = d_model/3 rounded up to 16", 0)
      .i("mla_rope_dim", 64, "decoupled RoPE dims per head (one rotary key shared by the heads); 0 = NoPE", 0)
      .f("rope_base", 100000.0, "RoPE base", 1.0)
      .rule([](const Config& c) {
        if (c.i("mla_rope_dim") % 2 != 0) throw InputError(fmt::format("mla_rope_dim {} must be even", c.i("mla_rope_dim")));
      });
  m.ops = {"attention"};
  m.params = params;
  m.make_inputs = make_inputs;
  m.reference = reference_fn;
  m.forward = forward;
  m.prefill = prefill;
  m.decode = decode;
#if defined(MIXBENCH_WITH_CUDA)
  m.has_cuda = true;
#endif
  ConfigSpec spec = m.config;
  m.cases = [spec]() {
    Config base = spec.parse("n_layer=4,d_model=64,head_dim=16,seq_len=64,vocab=64,mla_q_latent=48,mla_kv_latent=24,mla_rope_dim=8");
    return std::vector<CaseDef>{
        {"T1", base, 1, 1, 0},
        {"B2_T37", base, 2, 37, 1},
        {"T70_default_latents", base.with("mla_q_latent", int64_t(0)).with("mla_kv_latent", int64_t(0)), 1, 70, 2},
        {"nope_B2_T29", base.with("mla_rope_dim", int64_t(0)), 2, 29, 3},
    };
  };
  m.account = account;
  m.ve_dim = [](const Config&, const LayerCtx&) -> int64_t { return 0; };
  return m;
}

MIXBENCH_REGISTER(mla_method());

}  // namespace
}  // namespace mixbench
