// The generic gated-linear-attention layer behind retnet, gla, elu_norm, elu_qknorm and lightning.
//   q = x W_qᵀ, k = x W_kᵀ, v = x W_vᵀ [+ 3·sigmoid(x[..,:12] W_vegᵀ)·ve]      (H heads, K = V = head_dim)
//   [q,k ← τ·RMSNorm(q), τ·RMSNorm(k)]  [φ = elu+1]  [RoPE]  [k ← k/√K]
//   o = op(q, k, v, g) with g from the method's decay rule
//   y = W_o( RMSNorm_head(o) [· gain] [⊙ act(x W_gᵀ)] )
#include "mixers/linear/gla_family.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "harness/backbone.h"
#include "harness/errors.h"
#include "harness/fused_ops.h"
#include "mixers/common/layers.h"
#include "mixers/linear/gla_ops.h"
#include "reference/gla.h"

namespace mixbench::linear {
namespace {

using reference::GlaDecay;
using reference::GlaFeature;
using reference::GlaOutGate;

// The descriptor with its text knobs parsed once, by make_gla_family_method.
struct Layer : GlaFamilyDesc {
  explicit Layer(const GlaFamilyDesc& d)
      : GlaFamilyDesc(d),
        decay_kind(reference::parse_gla_decay(d.decay)),
        feature_map(reference::parse_gla_feature(d.feature)),
        gate_kind(reference::parse_gla_out_gate(d.out_gate)),
        per_key_decay(d.op == "gla") {}
  GlaDecay decay_kind;
  GlaFeature feature_map;
  GlaOutGate gate_kind;
  bool per_key_decay;  // op gla: g [B,T,H,K] (else simple_gla: g [B,T,H])
};

struct Dims {
  int64_t d, H, K, V, rank;
};
Dims dims(const Config& c, const Layer& ds) {
  ModelDims m = model_dims(c);
  return {m.d_model, m.n_head, m.head_dim, m.head_dim, ds.decay_kind == GlaDecay::LowRank ? c.i("gate_low_rank") : 0};
}

// Per-head fixed log decays (FP64): retnet log(1 − 2^(−5−h)), h = 0..H−1 (RetNet / FLA
// MultiScaleRetention); lightning −2^(−8h/H), h = 1..H (HypeNet Eq. 19); zero for the ELU variants.
std::vector<double> fixed_decays(const Layer& ds, int64_t H) {
  std::vector<double> g(size_t(H), 0.0);
  for (int64_t h = 0; h < H; ++h) {
    if (ds.decay_kind == GlaDecay::Retnet) g[size_t(h)] = std::log1p(-std::pow(2.0, -5.0 - double(h)));
    else if (ds.decay_kind == GlaDecay::Lightning) g[size_t(h)] = -std::pow(2.0, -8.0 * double(h + 1) / double(H));
  }
  return g;
}

std::vector<ParamDef> params(const Config& c, const LayerCtx& ctx, const Layer& ds) {
  Dims m = dims(c, ds);
  const double s = std::sqrt(3.0) / std::sqrt(double(m.d));
  std::vector<ParamDef> p = {
      {"w_q", {m.H * m.K, m.d}, ParamGroup::TransformerMatrix, true, "uniform", -s, s},
      {"w_k", {m.H * m.K, m.d}, ParamGroup::TransformerMatrix, true, "uniform", -s, s},
      {"w_v", {m.H * m.V, m.d}, ParamGroup::TransformerMatrix, true, "uniform", -s, s},
  };
  if (ds.gate_kind != GlaOutGate::None) p.push_back({"w_g", {m.H * m.V, m.d}, ParamGroup::TransformerMatrix, true, "uniform", -s, s});
  if (ds.decay_kind == GlaDecay::LowRank) {
    const double sr = std::sqrt(3.0) / std::sqrt(double(m.rank));
    p.push_back({"w_gk1", {m.rank, m.d}, ParamGroup::TransformerMatrix, true, "uniform", -s, s});
    p.push_back({"w_gk2", {m.H * m.K, m.rank}, ParamGroup::TransformerMatrix, true, "uniform", -sr, sr});
    p.push_back({"b_gk", {m.H * m.K}, ParamGroup::Scalar, false, "const", 0.0, 0});
  }
  if (ds.out_gain) p.push_back({"o_norm", {m.V}, ParamGroup::Scalar, false, "const", 1.0, 0});
  p.push_back({"w_o", {m.d, m.H * m.V}, ParamGroup::TransformerMatrix, true, "const", 0.0, 0});
  layers::add_ve_gate_param(p, ctx, m.H);
  return p;
}

TensorMap make_inputs(const Config& c, const LayerCtx& ctx, int64_t B, int64_t T, at::Generator& gen,
                      const Layer& ds) {
  Dims m = dims(c, ds);
  return layers::layer_inputs(ctx, B, T, m.d, m.H, m.V, gen);
}

double resolved_scale(const Layer& ds, int64_t K) { return ds.scale > 0 ? ds.scale : 1.0 / std::sqrt(double(K)); }

TensorMap reference_fn(const TensorMap& in, const Config& c, const LayerCtx& ctx, const Layer& ds) {
  Dims m = dims(c, ds);
  reference::GlaLayerRefSpec s;
  s.H = m.H;
  s.K = m.K;
  s.V = m.V;
  s.qk_norm = ds.qk_norm;
  s.qk_tau = ds.qk_tau;
  s.feature = ds.feature_map;
  s.rope = ds.rope;
  s.rope_base = ds.rope ? c.f("rope_base") : 10000.0;
  s.k_inv_sqrt = ds.k_inv_sqrt;
  s.scale = resolved_scale(ds, m.K);
  s.decay = ds.decay_kind;
  s.gate_normalizer = ds.decay_kind == GlaDecay::LowRank ? c.f("gate_logit_normalizer") : 1.0;
  s.out_gate = ds.gate_kind;
  at::Tensor none;
  reference::GlaLayerRefWeights w{in.at("w_q"),           in.at("w_k"),           in.at("w_v"),
                                  in.at("w_o"),           in.get_or("w_g", none), in.get_or("o_norm", none),
                                  in.get_or("ve_gate", none), in.get_or("w_gk1", none), in.get_or("w_gk2", none),
                                  in.get_or("b_gk", none)};
  return {{"y", reference::gla_family_layer(in.at("x"), in.get_or("ve", none), w, s)}};
}

at::Tensor qk_normalize(const at::Tensor& x, const Layer& ds) {
  if (ds.qk_norm_fp32 && at::elementSize(x.scalar_type()) < 4)
    return (layers::rms_norm(x.to(at::kFloat)) * ds.qk_tau).to(x.scalar_type());
  return layers::rms_norm(x) * ds.qk_tau;
}

struct Prepared {
  at::Tensor q, k, v, g;  // op inputs [B,T,H,K], [B,T,H,K], [B,T,H,V], [B,T,H] or [B,T,H,K]
};

// Projections, norms, feature map, RoPE from position `offset`, decays: everything before the op.
// A decoded token over a static cache: `pos_dev` (int64 [1] on the device) in place of `offset`.
Prepared prepare(const TensorMap& in, const Config& c, const Layer& ds, int64_t offset, const at::Tensor& pos_dev = {}) {
  Dims m = dims(c, ds);
  const at::Tensor& x = in.at("x");
  const int64_t B = x.size(0), T = x.size(1), H = m.H, K = m.K, V = m.V;
  at::Tensor q = at::linear(x, in.at("w_q")).view({B, T, H, K});
  at::Tensor k = at::linear(x, in.at("w_k")).view({B, T, H, K});
  at::Tensor v = layers::add_value_embed(at::linear(x, in.at("w_v")).view({B, T, H, V}), in);
  if (ds.qk_norm) {
    q = qk_normalize(q, ds);
    k = qk_normalize(k, ds);
  }
  if (ds.feature_map == GlaFeature::Elu1) {
    q = at::elu(q) + 1.0;
    k = at::elu(k) + 1.0;
  }
  if (ds.rope && pos_dev.defined()) {
    q = layers::rope_pos_dev(q, c.f("rope_base"), pos_dev);
    k = layers::rope_pos_dev(k, c.f("rope_base"), pos_dev);
  } else if (ds.rope) {
    q = layers::rope(q, c.f("rope_base"), offset);
    k = layers::rope(k, c.f("rope_base"), offset);
  }
  if (ds.k_inv_sqrt) k = k * (1.0 / std::sqrt(double(K)));
  at::Tensor g;
  if (ds.decay_kind == GlaDecay::LowRank) {
    at::Tensor gk = at::linear(at::linear(x, in.at("w_gk1")), in.at("w_gk2"), in.at("b_gk"));
    g = (at::log_sigmoid(gk) / c.f("gate_logit_normalizer")).view({B, T, H, K});
  } else {
    const std::vector<double> decays = fixed_decays(ds, H);
    std::string key = "fixed_decays";
    for (double v : decays) key += fmt::format(":{:.17g}", v);
    g = layers::device_constant(key, x.options(),
                                [&] { return at::tensor(decays, at::TensorOptions().dtype(at::kDouble)); })
            .view({1, 1, H})
            .expand({B, T, H});
  }
  return {q, k, v, g};
}

// Output side: per-head RMSNorm [· gain] [⊙ gate], then W_o. o [B,T,H,V].
at::Tensor finish(at::Tensor o, const TensorMap& in, const Config& c, const Layer& ds) {
  Dims m = dims(c, ds);
  const at::Tensor& x = in.at("x");
  const int64_t B = x.size(0), T = x.size(1), H = m.H, V = m.V;
  if (o.is_cuda() && (!ds.out_gain || in.at("o_norm").scalar_type() == o.scalar_type())) {
    // on a GPU: RMSNorm · gain · gate in one pass each way (harness/fused_ops.h)
    const NormGate act = ds.gate_kind == GlaOutGate::Silu      ? NormGate::Silu
                         : ds.gate_kind == GlaOutGate::Sigmoid ? NormGate::Sigmoid
                                                               : NormGate::None;
    const at::Tensor gate = act != NormGate::None ? at::linear(x, in.at("w_g")).view({B, T, H, V}) : at::Tensor();
    // eps: layers::rms_norm's, float32 epsilon
    o = rms_norm_gated(o, ds.out_gain ? in.at("o_norm") : at::Tensor(), 1.1920928955078125e-07, gate, act);
    return at::linear(o.reshape({B, T, H * V}), in.at("w_o"));
  }
  o = layers::rms_norm(o);
  if (ds.out_gain) o = o * in.at("o_norm");
  if (ds.gate_kind == GlaOutGate::Silu) o = o * at::silu(at::linear(x, in.at("w_g"))).view({B, T, H, V});
  else if (ds.gate_kind == GlaOutGate::Sigmoid) o = o * at::sigmoid(at::linear(x, in.at("w_g"))).view({B, T, H, V});
  return at::linear(o.reshape({B, T, H * V}), in.at("w_o"));
}

TensorMap run_op(const Prepared& p, const Config& c, Backend backend, const Layer& ds) {
  Config op;
  op.set("scale", resolved_scale(ds, dims(c, ds).K));
  return call_op(ds.op, backend, {{"q", p.q}, {"k", p.k}, {"v", p.v}, {"g", p.g}}, op);
}

TensorMap forward(const TensorMap& in, const Config& c, const LayerCtx& ctx, Backend backend, const Layer& ds) {
  at::Tensor o = run_op(prepare(in, c, ds, 0), c, backend, ds).at("o");
  return {{"y", finish(o, in, c, ds)}};
}

// Decode cache: "pos" and "state" [B,H,K,V] (the op's final state; FP32 for half inputs).
TensorMap prefill(const TensorMap& in, TensorMap& cache, const Config& c, const LayerCtx&, Backend backend,
                  const Layer& ds) {
  TensorMap out = run_op(prepare(in, c, ds, 0), c, backend, ds);
  reset_cache(cache);
  set_cache_pos(cache, in.at("x").size(1));
  cache_store(cache, "state", out.at("ht"));
  return {{"y", finish(out.at("o"), in, c, ds)}};
}

TensorMap decode(const TensorMap& in, TensorMap& cache, const Config& c, const LayerCtx&, Backend,
                 const Layer& ds) {
  const at::Tensor& x = in.at("x");
  if (x.dim() != 3 || x.size(1) != 1) throw InputError(ds.name + " decode takes x [B,1,d]");
  Dims m = dims(c, ds);
  const int64_t pos = cache_pos(cache);
  Prepared p = cache_is_static(cache) ? prepare(in, c, ds, 0, cache_pos_dev(cache)) : prepare(in, c, ds, pos);
  at::Tensor S = cache.has("state") ? cache.at("state")
                                    : at::zeros({x.size(0), m.H, m.K, m.V}, x.options().dtype(layers::is_half(x) ? at::kFloat : x.scalar_type()));
  const double scale = resolved_scale(ds, m.K);
  auto step = ds.per_key_decay ? gla_step : simple_gla_step;
  auto [o, S2] = step(p.q.select(1, 0), p.k.select(1, 0), p.v.select(1, 0), p.g.select(1, 0), scale, S);
  cache_store(cache, "state", S2);  // in place in a static cache
  set_cache_pos(cache, pos + 1);
  return {{"y", finish(o.unsqueeze(1).to(x.scalar_type()), in, c, ds)}};
}

// Per-token cost of one layer at length T (see LayerCost). C = 64, Tp = ceil(T/64)·64.
//   N_matmul = d·H·K (q) + d·H·K (k) + d·H·V (v) [+ d·H·V (gate)] + H·V·d (out)
//              [+ 12·H (VE gate)] [+ r·d + H·K·r (gla low-rank forget gate)]
//   fwd = 2·N_matmul + H·F_chunk·(Tp/C)/T, F_chunk = the op's matmul FLOPs per padded chunk and head
//         (linear::simple_gla_chunk_flops / gla_chunk_flops: 2C²K + 2C²V + 4CKV, the same for gla).
//         Element-wise terms (norms, gates, decays, the chunk-state recursion) are not counted, as
//         FlopCounter does not count them either.
//   nanochat core (training) = 3 × the op term of fwd.
//   decode = 2·N_matmul + 5·H·K·V (decay, outer product, add, readout 2KV)
//   state = H·K·V FP32 words (no conv cache); KV cache growth 0.
//   act = dtype·(d + 2HK + 2HV [+ HV gate] [+ HK gate logits]) + 4·H·K·V/C (FP32 chunk-boundary states)
LayerCost account(const Config& c, const LayerCtx& ctx, const CostQuery& q, const Layer& ds) {
  Dims m = dims(c, ds);
  LayerCost lc;
  int64_t n = 2 * m.d * m.H * m.K + m.d * m.H * m.V + m.H * m.V * m.d;
  if (ds.gate_kind != GlaOutGate::None) n += m.d * m.H * m.V;
  n += layers::ve_gate_params(ctx, m.H);
  int64_t scalars = 0;
  if (ds.decay_kind == GlaDecay::LowRank) {
    n += m.rank * m.d + m.H * m.K * m.rank;
    scalars += m.H * m.K;
  }
  if (ds.out_gain) scalars += m.V;
  lc.params.transformer_matrices = n;
  lc.params.matmul = n;
  lc.params.scalars = scalars;
  const double fchunk = ds.per_key_decay ? gla_chunk_flops(m.K, m.V) : simple_gla_chunk_flops(m.K, m.V);
  const double T = double(std::max<int64_t>(q.T, 1));
  const double core = double(m.H) * fchunk * double(gla_padded_len(q.T) / kGlaChunk) / T;
  lc.fwd_flops = 2.0 * double(n) + core;
  lc.nanochat_core_flops = 3.0 * core;
  lc.decode_flops = 2.0 * double(n) + 5.0 * double(m.H * m.K * m.V);
  lc.state_bytes = 4.0 * double(m.H * m.K * m.V);
  lc.cache_bytes_per_token = 0;
  double act = double(m.d + 2 * m.H * m.K + 2 * m.H * m.V);
  if (ds.gate_kind != GlaOutGate::None) act += double(m.H * m.V);
  if (ds.decay_kind == GlaDecay::LowRank) act += double(m.H * m.K);
  lc.act_bytes = double(q.dtype_bytes) * act + 4.0 * double(m.H * m.K * m.V) / double(kGlaChunk);
  lc.formula = fmt::format("{}: fwd 2N + H·F_chunk·ceil(T/64)/T, F_chunk = {} FLOPs; nanochat 3× core; decode 2N + 5HKV",
                           ds.op, fchunk);
  return lc;
}

std::vector<CaseDef> cases_for(const ConfigSpec& spec) {
  // A 4-layer model, d=64, 4 heads of 16; layers 1 and 3 carry value embeddings.
  // No T = 1 layer case: with one token o_1 = (q·k)·v per head and the readout RMSNorm removes the
  // scalar q·k, so y depends on W_q, W_k only through the norm's eps and their gradients are pure
  // round-off (the op-level T = 1 cases cover the single-token path). T = 2 is the shortest case.
  Config base = spec.parse("n_layer=4,d_model=64,head_dim=16,seq_len=64,vocab=64");
  return {
      {"layer0_T2", base, 1, 2, 0},
      {"layer0_B2_T37", base, 2, 37, 0},
      {"layer1_ve_B2_T37", base, 2, 37, 1},
      {"layer3_ve_T70", base, 1, 70, 3},
      {"layer2_T70", base, 1, 70, 2},
  };
}

}  // namespace

MethodSpec make_gla_family_method(const GlaFamilyDesc& desc) {
  const Layer ds(desc);
  MethodSpec m;
#if defined(MIXBENCH_WITH_CUDA)
  m.has_cuda = true;  // the layer and its op are device-agnostic LibTorch
#endif
  m.name = ds.name;
  m.family = "linear";
  m.summary = ds.summary;
  m.citation = ds.citation;
  m.config = backbone_config();
  if (ds.rope) m.config.f("rope_base", 10000.0, "RoPE base (FLA RotaryEmbedding default)", 1.0);
  if (ds.decay_kind == GlaDecay::LowRank) {
    m.config.i("gate_low_rank", 16, "rank of the forget-gate projection d → r → H·K", 1)
        .f("gate_logit_normalizer", 16.0, "g = logsigmoid(·)/normalizer", 1e-6);
  }
  m.config.rule(layers::require_ve_gate_width);
  m.ops = {ds.op};
  m.params = [ds](const Config& c, const LayerCtx& ctx) { return params(c, ctx, ds); };
  m.make_inputs = [ds](const Config& c, const LayerCtx& ctx, int64_t B, int64_t T, at::Generator& gen) {
    return make_inputs(c, ctx, B, T, gen, ds);
  };
  m.reference = [ds](const TensorMap& in, const Config& c, const LayerCtx& ctx) { return reference_fn(in, c, ctx, ds); };
  m.forward = [ds](const TensorMap& in, const Config& c, const LayerCtx& ctx, Backend b) {
    return forward(in, c, ctx, b, ds);
  };
  m.prefill = [ds](const TensorMap& in, TensorMap& cache, const Config& c, const LayerCtx& ctx, Backend b) {
    return prefill(in, cache, c, ctx, b, ds);
  };
  m.decode = [ds](const TensorMap& in, TensorMap& cache, const Config& c, const LayerCtx& ctx, Backend b) {
    return decode(in, cache, c, ctx, b, ds);
  };
  m.static_decode = true;  // a fixed-size state stored in place, RoPE at the device position
  ConfigSpec spec = m.config;
  m.cases = [spec]() { return cases_for(spec); };
  m.account = [ds](const Config& c, const LayerCtx& ctx, const CostQuery& q) { return account(c, ctx, q, ds); };
  m.ve_dim = [ds](const Config& c, const LayerCtx& ctx) {
    Dims m = dims(c, ds);
    return layers::ve_width(ctx, m.H, m.V);
  };
  return m;
}

}  // namespace mixbench::linear
