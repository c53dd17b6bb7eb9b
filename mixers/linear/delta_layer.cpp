#include "mixers/linear/delta_layer.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>

#include "harness/backbone.h"
#include "harness/errors.h"
#include "harness/fused_ops.h"
#include "harness/op_scope.h"
#include "mixers/common/layers.h"

#if defined(MIXBENCH_WITH_CUDA)
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/custom_function.h>

#include "mixers/common/short_conv_kernel.h"
#include "mixers/linear/decode_step_kernel.h"
#endif

namespace mixbench::linear {

DeltaDims delta_dims(const Config& c) {
  ModelDims m = model_dims(c);
  DeltaDims d;
  d.d = m.d_model;
  d.H = m.n_head;
  d.K = m.head_dim;
  d.V = c.i("head_v_dim") > 0 ? c.i("head_v_dim") : m.head_dim;
  d.W = c.i("conv_size");
  d.eps = c.f("norm_eps");
  return d;
}

ConfigSpec delta_method_config() {
  ConfigSpec s = backbone_config();
  s.i("head_v_dim", 0, "value head dim V; 0 = head_dim (K = head_dim, heads = d_model/head_dim)", 0)
      .i("conv_size", 4, "short causal depthwise conv kernel on q, k, v", 1, 64)
      .f("norm_eps", 1e-5, "eps of the output RMSNorm (fla's norm_eps)", 0.0)
      .rule(layers::require_ve_gate_width);
  return s;
}

#if defined(MIXBENCH_WITH_CUDA)
namespace {
layers::short_conv_cuda::Dtype conv_dtype(const at::Tensor& x) {
  return x.scalar_type() == at::kFloat      ? layers::short_conv_cuda::Dtype::F32
         : x.scalar_type() == at::kBFloat16 ? layers::short_conv_cuda::Dtype::BF16
                                            : layers::short_conv_cuda::Dtype::F16;
}
cudaStream_t stream_of(const at::Tensor& x) { return c10::cuda::getCurrentCUDAStream(x.device().index()).stream(); }
// The fused kernels (mixers/common/short_conv_kernel.h) with their own backward.
struct ShortConvSiluFn : public torch::autograd::Function<ShortConvSiluFn> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w) {
    ctx->save_for_backward({x, w});
    at::Tensor y = at::empty_like(x);
    layers::short_conv_cuda::forward(conv_dtype(x), x.data_ptr(), w.data_ptr(), y.data_ptr(), x.size(0), x.size(1),
                                     x.size(2), int(w.size(1)), stream_of(x));
    return y;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list g) {
    auto s = ctx->get_saved_variables();
    const at::Tensor &x = s[0], &w = s[1];
    at::Tensor dy = g[0].to(x.scalar_type()).contiguous();
    at::Tensor dx = at::empty_like(x);
    at::Tensor dw = at::empty(w.sizes(), w.options().dtype(at::kFloat));
    layers::short_conv_cuda::backward(conv_dtype(x), x.data_ptr(), w.data_ptr(), dy.data_ptr(), dx.data_ptr(),
                                      dw.data_ptr<float>(), x.size(0), x.size(1), x.size(2),
                                      int(w.size(1)), stream_of(x));
    return {dx, dw.to(w.scalar_type())};
  }
};

// x [B, T, C] = q|k|v's projections (one GEMM) through one conv launch, written as three
// contiguous tensors [B, T, c1], [B, T, c2 − c1], [B, T, C − c2]; the backward reads their three
// gradients where they lie and returns one dx for the one GEMM's backward (no cat, no split).
struct ShortConvSiluSplitFn : public torch::autograd::Function<ShortConvSiluSplitFn> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                                                const at::Tensor& w, int64_t c1, int64_t c2) {
    ctx->save_for_backward({x, w});
    ctx->saved_data["c1"] = c1;
    ctx->saved_data["c2"] = c2;
    const int64_t B = x.size(0), T = x.size(1), C = x.size(2);
    at::Tensor y0 = at::empty({B, T, c1}, x.options()), y1 = at::empty({B, T, c2 - c1}, x.options()),
               y2 = at::empty({B, T, C - c2}, x.options());
    layers::short_conv_cuda::forward_split(conv_dtype(x), x.data_ptr(), w.data_ptr(),
                                           {{y0.data_ptr(), y1.data_ptr(), y2.data_ptr()}, c1, c2}, B, T, C,
                                           int(w.size(1)), stream_of(x));
    return {y0, y1, y2};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list g) {
    auto s = ctx->get_saved_variables();
    const at::Tensor &x = s[0], &w = s[1];
    const int64_t c1 = ctx->saved_data["c1"].toInt(), c2 = ctx->saved_data["c2"].toInt();
    const int64_t B = x.size(0), T = x.size(1), C = x.size(2);
    const int64_t widths[3] = {c1, c2 - c1, C - c2};
    at::Tensor dy[3];
    for (int i = 0; i < 3; ++i)
      dy[i] = g[i].defined() ? g[i].to(x.scalar_type()).contiguous() : at::zeros({B, T, widths[i]}, x.options());
    at::Tensor dx = at::empty_like(x);
    at::Tensor dw = at::empty(w.sizes(), w.options().dtype(at::kFloat));
    layers::short_conv_cuda::backward_split(conv_dtype(x), x.data_ptr(), w.data_ptr(),
                                            {{dy[0].data_ptr(), dy[1].data_ptr(), dy[2].data_ptr()}, c1, c2},
                                            dx.data_ptr(), dw.data_ptr<float>(), B, T, C, int(w.size(1)), stream_of(x));
    return {dx, dw.to(w.scalar_type()), at::Tensor(), at::Tensor()};
  }
};

bool conv_fusable(const at::Tensor& x, int64_t W) {
  const auto st = x.scalar_type();
  return x.is_cuda() && x.dim() == 3 && W <= 8 && (st == at::kFloat || st == at::kBFloat16 || st == at::kHalf);
}
}  // namespace
#endif

at::Tensor short_conv_silu(const at::Tensor& x, const at::Tensor& w) {
#if defined(MIXBENCH_WITH_CUDA)
  if (conv_fusable(x, w.size(1))) return ShortConvSiluFn::apply(x.contiguous(), w.to(x.scalar_type()).contiguous());
#endif
  const int64_t T = x.size(1), W = w.size(1);
  at::Tensor xp = at::constant_pad_nd(x, {0, 0, W - 1, 0});  // [B,T+W−1,C]
  at::Tensor y = xp.narrow(1, 0, T) * w.select(1, 0);
  for (int64_t i = 1; i < W; ++i) y = y + xp.narrow(1, i, T) * w.select(1, i);
  return at::silu(y);
}

at::Tensor l2norm(const at::Tensor& x) { return l2_normalize(x, kDeltaL2Eps); }

at::Tensor rms_norm_gain(const at::Tensor& x, const at::Tensor& w, double eps) { return rms_norm_gated(x, w, eps); }

DeltaQKV delta_qkv(const TensorMap& in, const DeltaDims& d) {
  const at::Tensor& x = in.at("x");
  const int64_t B = x.size(0), T = x.size(1);
#if defined(MIXBENCH_WITH_CUDA)
  if (conv_fusable(x, d.W)) {
    // On a GPU: one GEMM against the concatenated q|k|v weights (its backward one dx instead of
    // three summed) and one conv launch over the 2HK + HV channels, written as q, k, v.
    const at::Tensor p = at::linear(x, at::cat({in.at("q_proj"), in.at("k_proj"), in.at("v_proj")}, 0)).contiguous();
    const at::Tensor w = at::cat({in.at("q_conv"), in.at("k_conv"), in.at("v_conv")}, 0).to(x.scalar_type()).contiguous();
    const torch::autograd::variable_list y = ShortConvSiluSplitFn::apply(p, w, d.H * d.K, 2 * d.H * d.K);
    return {l2norm(y[0].view({B, T, d.H, d.K})), l2norm(y[1].view({B, T, d.H, d.K})),
            layers::add_value_embed(y[2].view({B, T, d.H, d.V}), in)};
  }
#endif
  at::Tensor q = short_conv_silu(at::linear(x, in.at("q_proj")), in.at("q_conv")).view({B, T, d.H, d.K});
  at::Tensor k = short_conv_silu(at::linear(x, in.at("k_proj")), in.at("k_conv")).view({B, T, d.H, d.K});
  at::Tensor v = short_conv_silu(at::linear(x, in.at("v_proj")), in.at("v_conv")).view({B, T, d.H, d.V});
  return {l2norm(q), l2norm(k), layers::add_value_embed(v, in)};
}

namespace {
#if defined(MIXBENCH_WITH_CUDA)
// The fused decode-step kernels take what the short-conv kernels take: fp32, bf16 and fp16 on a GPU.
bool fused_step_dtype(const at::Tensor& t) {
  const auto s = t.scalar_type();
  return t.is_cuda() && (s == at::kFloat || s == at::kBFloat16 || s == at::kHalf);
}
#endif

at::Tensor conv_cached(const at::Tensor& xp, const at::Tensor& w, TensorMap& cache, const std::string& name, bool decode) {
  const int64_t T = xp.size(1), W = w.size(1);
  if (!decode) {
    cache_store(cache, name, at::constant_pad_nd(xp, {0, 0, W - 1, 0}).slice(1, T));
    return short_conv_silu(xp, w);
  }
  if (T != 1) throw InputError("delta decode takes x [B,1,d]");
#if defined(MIXBENCH_WITH_CUDA)
  // a static cache on a GPU: one kernel for the step and the tail's shift in place
  if (cache_is_static(cache) && cache.has(name) && W <= 8 && fused_step_dtype(xp) && w.scalar_type() == xp.scalar_type() &&
      cache.at(name).scalar_type() == xp.scalar_type()) {
    // x may be a slice of the joint projection (rows apart by its width): read in place, not copied
    const int64_t B = xp.size(0), C = xp.size(2);
    const at::Tensor xc = xp.stride(2) == 1 && (B == 1 || xp.stride(0) >= C) ? xp : xp.contiguous(), wc = w.contiguous();
    const int64_t x_stride = B == 1 ? C : xc.stride(0);  // a single row's stride is immaterial
    at::Tensor y = at::empty({B, 1, C}, xp.options());
    OpScope scope("mixbench::conv_step");
    decode_cuda::conv_step(conv_dtype(xc), xc.data_ptr(), x_stride, cache.at(name).data_ptr(), wc.data_ptr(), y.data_ptr(), B, C,
                           int(W), c10::cuda::getCurrentCUDAStream(xp.device().index()).stream());
    return y;
  }
#endif
  OpScope scope("mixbench::conv_step");  // the fused kernel's arithmetic
  at::Tensor tail = cache.has(name) ? cache.at(name) : at::zeros({xp.size(0), W - 1, xp.size(2)}, xp.options());
  at::Tensor full = at::cat({tail, xp}, 1);  // [B,W,C]
  at::Tensor y = full.narrow(1, 0, 1) * w.select(1, 0);
  for (int64_t i = 1; i < W; ++i) y = y + full.narrow(1, i, 1) * w.select(1, i);
  cache_store(cache, name, full.slice(1, 1));  // in place in a static cache
  return at::silu(y);
}
}  // namespace

namespace {
// The extra projections' weights, joined (undefined for none).
at::Tensor extra_weight(const TensorMap& in, const std::vector<std::string>& extra) {
  if (extra.empty()) return at::Tensor();
  std::vector<at::Tensor> w;
  for (const auto& n : extra) w.push_back(in.at(n));
  return at::cat(w, 0);
}

// A static cache's prefill: the projections, the convs over the whole prompt, one joint tail and
// the decode step's joined weights.
DeltaQKV qkv_static_prefill(const TensorMap& in, const DeltaDims& d, TensorMap& cache, const std::vector<std::string>& extra) {
  const at::Tensor& x = in.at("x");
  const int64_t B = x.size(0), T = x.size(1), W = d.W;
  const at::Tensor xq = at::linear(x, in.at("q_proj")), xk = at::linear(x, in.at("k_proj")), xv = at::linear(x, in.at("v_proj"));
  cache_store(cache, "qkv_tail", at::constant_pad_nd(at::cat({xq, xk, xv}, 2), {0, 0, W - 1, 0}).slice(1, T));
  std::vector<at::Tensor> rows = {in.at("q_proj"), in.at("k_proj"), in.at("v_proj")};
  for (const auto& n : extra) rows.push_back(in.at(n));
  if (in.has("ve")) rows.push_back(at::constant_pad_nd(in.at("ve_gate"), {0, d.d - in.at("ve_gate").size(1)}));
  cache_store(cache, kStaticInput, at::cat(rows, 0));
  cache_store(cache, "w.conv", at::cat({in.at("q_conv"), in.at("k_conv"), in.at("v_conv")}, 0).to(x.scalar_type()));
  DeltaQKV r{l2norm(short_conv_silu(xq, in.at("q_conv")).view({B, T, d.H, d.K})),
             l2norm(short_conv_silu(xk, in.at("k_conv")).view({B, T, d.H, d.K})),
             layers::add_value_embed(short_conv_silu(xv, in.at("v_conv")).view({B, T, d.H, d.V}), in)};
  if (!extra.empty()) r.extra = at::linear(x, extra_weight(in, extra));
  return r;
}

// A static cache's decode step: one GEMM against w.proj, one conv step over q|k|v, one L2 norm over q|k.
DeltaQKV qkv_static_step(const TensorMap& in, const DeltaDims& d, TensorMap& cache, const std::vector<std::string>& extra) {
  const at::Tensor& x = in.at("x");
  if (x.size(1) != 1) throw InputError("delta decode takes x [B,1,d]");
  const int64_t B = x.size(0), HK = d.H * d.K, C = 2 * HK + d.H * d.V;
  const at::Tensor proj = static_input_projection(in, cache);  // [B, C + extra (+ H)]
  const int64_t E = proj.size(1) - C - (in.has("ve") ? d.H : 0);
  const at::Tensor y = conv_cached(proj.narrow(1, 0, C).view({B, 1, C}), cache.at("w.conv"), cache, "qkv_tail", true);
  const at::Tensor qk = l2norm(y.narrow(2, 0, 2 * HK).view({B, 1, 2 * d.H, d.K}));
  at::Tensor v = y.narrow(2, 2 * HK, d.H * d.V).view({B, 1, d.H, d.V});
  if (in.has("ve")) v = gated_add(v, proj.narrow(1, C + E, d.H).view({B, 1, d.H}), 3.0, in.at("ve").view({B, 1, d.H, d.V}));
  DeltaQKV r{qk.narrow(2, 0, d.H), qk.narrow(2, d.H, d.H), v};
  if (!extra.empty()) r.extra = proj.narrow(1, C, E).view({B, 1, E});
  return r;
}
}  // namespace

DeltaQKV delta_qkv_cached(const TensorMap& in, const DeltaDims& d, TensorMap& cache, bool decode,
                          const std::vector<std::string>& extra) {
  if (cache_is_static(cache) && !decode) return qkv_static_prefill(in, d, cache, extra);
  if (cache_is_static(cache) && cache.has(kStaticInput)) return qkv_static_step(in, d, cache, extra);
  const at::Tensor& x = in.at("x");
  const int64_t B = x.size(0), T = x.size(1);
  at::Tensor q = conv_cached(at::linear(x, in.at("q_proj")), in.at("q_conv"), cache, "q_tail", decode).view({B, T, d.H, d.K});
  at::Tensor k = conv_cached(at::linear(x, in.at("k_proj")), in.at("k_conv"), cache, "k_tail", decode).view({B, T, d.H, d.K});
  at::Tensor v = conv_cached(at::linear(x, in.at("v_proj")), in.at("v_conv"), cache, "v_tail", decode).view({B, T, d.H, d.V});
  DeltaQKV r{l2norm(q), l2norm(k), layers::add_value_embed(v, in)};
  if (!extra.empty()) r.extra = at::linear(x, extra_weight(in, extra));
  return r;
}

at::Tensor delta_core_cached(const std::string& op, const DeltaQKV& qkv, const at::Tensor& beta, const at::Tensor& g,
                             Backend backend, TensorMap& cache, bool decode) {
  const int64_t K = qkv.q.size(3);
  if (!decode) {
    Config p;
    p.set("scale", 0.0);
    TensorMap in{{"q", qkv.q}, {"k", qkv.k}, {"v", qkv.v}, {"beta", beta}};
    if (g.defined()) in.set("g", g);
    TensorMap out = call_op(op, backend, in, p);
    cache_store(cache, "state", out.at("ht"));
    set_cache_pos(cache, qkv.q.size(1));
    return out.at("o");
  }
  const int64_t pos = cache_pos(cache);
#if defined(MIXBENCH_WITH_CUDA)
  // a static cache on a GPU: the state's update and readout in one kernel, in place
  if (cache_is_static(cache) && cache.has("state") && cache.at("state").scalar_type() == at::kFloat && K <= 256 &&
      fused_step_dtype(qkv.q)) {
    auto one = [](const at::Tensor& t) { return t.select(1, 0).contiguous(); };
    const at::Tensor q = one(qkv.q), k = one(qkv.k), v = one(qkv.v), b = one(beta.to(at::kFloat));
    const at::Tensor gg = g.defined() ? one(g.to(at::kFloat)) : at::Tensor();
    const auto decay = !g.defined() ? decode_cuda::Decay::None : gg.dim() == 2 ? decode_cuda::Decay::PerHead : decode_cuda::Decay::PerKey;
    const int64_t B = q.size(0), H = q.size(1), V = v.size(2);
    at::Tensor o = at::empty({B, H, V}, v.options());
    OpScope scope("mixbench::delta_step");
    decode_cuda::delta_step(conv_dtype(q), q.data_ptr(), k.data_ptr(), v.data_ptr(), b.data_ptr<float>(), gg.defined() ? gg.data_ptr<float>() : nullptr,
                            decay, float(1.0 / std::sqrt(double(K))), cache.at("state").data_ptr<float>(), o.data_ptr(), B, H,
                            K, V, c10::cuda::getCurrentCUDAStream(q.device().index()).stream());
    set_cache_pos(cache, pos + 1);
    return o.unsqueeze(1);
  }
#endif
  OpScope scope("mixbench::delta_step");  // the fused kernel's arithmetic
  at::Tensor S = cache.has("state")
                     ? cache.at("state")
                     : at::zeros({qkv.q.size(0), qkv.q.size(2), K, qkv.v.size(3)},
                                 qkv.v.options().dtype(layers::is_half(qkv.v) ? at::kFloat : qkv.v.scalar_type()));
  DeltaResult r = delta_step(qkv.q.select(1, 0), qkv.k.select(1, 0), qkv.v.select(1, 0), beta.select(1, 0),
                             g.defined() ? g.select(1, 0) : g, 1.0 / std::sqrt(double(K)), S);
  cache_store(cache, "state", r.ht);
  set_cache_pos(cache, pos + 1);
  return r.o.unsqueeze(1).to(qkv.v.scalar_type());
}

at::Tensor gated_delta_static_step(const DeltaQKV& qkv, const at::Tensor& b_lin, const at::Tensor& a_lin,
                                   const at::Tensor& neg_a, const at::Tensor& dt_bias, Backend backend, TensorMap& cache) {
  OpScope scope("mixbench::gated_delta_step");  // one launch on a GPU
#if defined(MIXBENCH_WITH_CUDA)
  const int64_t K = qkv.q.size(3);
  if (cache_is_static(cache) && cache.has("state") && cache.at("state").scalar_type() == at::kFloat && K <= 256 &&
      fused_step_dtype(qkv.q) && b_lin.scalar_type() == qkv.q.scalar_type() && a_lin.scalar_type() == qkv.q.scalar_type() &&
      b_lin.size(1) == 1 && b_lin.stride(-1) == 1 && a_lin.stride(-1) == 1 && a_lin.stride(0) == b_lin.stride(0) &&
      neg_a.scalar_type() == at::kFloat && dt_bias.scalar_type() == at::kFloat && neg_a.is_cuda() && dt_bias.is_cuda() &&
      neg_a.is_contiguous() && dt_bias.is_contiguous()) {
    auto one = [](const at::Tensor& t) { return t.select(1, 0).contiguous(); };
    const at::Tensor q = one(qkv.q), k = one(qkv.k), v = one(qkv.v);
    const int64_t B = q.size(0), H = q.size(1), V = v.size(2);
    at::Tensor o = at::empty({B, H, V}, v.options());
    const decode_cuda::RawGates gates{b_lin.data_ptr(), a_lin.data_ptr(), b_lin.stride(0), neg_a.data_ptr<float>(),
                                      dt_bias.data_ptr<float>()};
    decode_cuda::gated_delta_step(conv_dtype(q), q.data_ptr(), k.data_ptr(), v.data_ptr(), gates,
                                  float(1.0 / std::sqrt(double(K))), cache.at("state").data_ptr<float>(), o.data_ptr(), B, H,
                                  K, V, c10::cuda::getCurrentCUDAStream(q.device().index()).stream());
    set_cache_pos(cache, cache_pos(cache) + 1);
    return o.unsqueeze(1);
  }
#endif
  const at::Tensor beta = at::sigmoid(b_lin);
  const at::Tensor g = neg_a * at::softplus(a_lin + dt_bias);
  return delta_core_cached("gated_delta_rule", qkv, beta, g, backend, cache, true);
}

at::Tensor gdn_static_step(const TensorMap& in, const DeltaDims& d, TensorMap& cache, const at::Tensor& norm_w,
                           double norm_eps, Backend backend) {
  const at::Tensor& x = in.at("x");
  if (x.dim() != 3 || x.size(1) != 1) throw InputError("delta decode takes x [B,1,d]");
  const int64_t B = x.size(0), H = d.H, HK = d.H * d.K, HV = d.H * d.V, C = 2 * HK + HV;
  const bool ve = in.has("ve");
  const at::Tensor proj = static_input_projection(in, cache);  // [B, C + 2H + HV (+ H)]
  if (proj.size(1) != C + 2 * H + HV + (ve ? H : 0))
    throw InputError(fmt::format("gdn decode: the prepared projection has {} columns, {} expected", proj.size(1),
                                 C + 2 * H + HV + (ve ? H : 0)));
  const at::Tensor y = conv_cached(proj.narrow(1, 0, C).view({B, 1, C}), cache.at("w.conv"), cache, "qkv_tail", true);
  const at::Tensor b_lin = proj.narrow(1, C, H).view({B, 1, H}), a_lin = proj.narrow(1, C + H, H).view({B, 1, H});
  const at::Tensor gate = proj.narrow(1, C + 2 * H, HV).view({B, 1, H, d.V});
  const at::Tensor z = ve ? proj.narrow(1, C + 2 * H + HV, H).view({B, 1, H}) : at::Tensor();
  const at::Tensor &neg_a = cache.at("w.neg_a"), &dt_bias = cache.at("w.dt_bias");
  OpScope scope("mixbench::gdn_step");  // one launch on a GPU
#if defined(MIXBENCH_WITH_CUDA)
  const auto st = x.scalar_type();
  const at::Tensor ve_t = ve ? in.at("ve") : at::Tensor();
  if (fused_step_dtype(y) && y.is_contiguous() && proj.is_contiguous() && proj.scalar_type() == st && y.scalar_type() == st &&
      cache.has("state") && cache.at("state").scalar_type() == at::kFloat && cache.at("state").is_contiguous() &&
      d.K <= 256 && d.V <= 256 && neg_a.scalar_type() == at::kFloat && dt_bias.scalar_type() == at::kFloat &&
      neg_a.is_cuda() && dt_bias.is_cuda() && neg_a.is_contiguous() && dt_bias.is_contiguous() && norm_w.is_cuda() &&
      norm_w.numel() == d.V && (!ve || (ve_t.is_cuda() && ve_t.scalar_type() == st && ve_t.numel() == B * HV))) {
    const at::Tensor w = norm_w.to(st).contiguous(), vec = ve ? ve_t.contiguous() : at::Tensor();
    at::Tensor o = at::empty({B, 1, H, d.V}, y.options());
    decode_cuda::GdnStep p;
    p.B = B;
    p.H = H;
    p.K = int(d.K);
    p.V = int(d.V);
    p.qk = y.data_ptr();
    p.qk_stride = C;
    p.v = static_cast<const char*>(y.data_ptr()) + 2 * HK * y.element_size();
    p.v_stride = C;
    if (ve) {
      p.ve = vec.data_ptr();
      p.ve_stride = HV;
      p.ve_z = z.data_ptr();
      p.ve_z_stride = proj.size(1);
      p.ve_scale = 3.f;
    }
    p.gates = decode_cuda::RawGates{b_lin.data_ptr(), a_lin.data_ptr(), proj.size(1), neg_a.data_ptr<float>(),
                                    dt_bias.data_ptr<float>()};
    p.norm_w = w.data_ptr();
    p.gate = gate.data_ptr();
    p.gate_stride = proj.size(1);
    p.l2_eps = float(kDeltaL2Eps);
    p.norm_eps = float(norm_eps);
    p.scale = float(1.0 / std::sqrt(double(d.K)));
    p.S = cache.at("state").data_ptr<float>();
    p.o = o.data_ptr();
    decode_cuda::gdn_step(conv_dtype(y), p, stream_of(y));
    set_cache_pos(cache, cache_pos(cache) + 1);
    return o;
  }
#endif
  // the unfused ops, as qkv_static_step, gated_delta_static_step and gdn's output norm run them
  const at::Tensor qk = l2norm(y.narrow(2, 0, 2 * HK).view({B, 1, 2 * H, d.K}));
  at::Tensor v = y.narrow(2, 2 * HK, HV).view({B, 1, H, d.V});
  if (ve) v = gated_add(v, z, 3.0, in.at("ve").view({B, 1, H, d.V}));
  const DeltaQKV qkv{qk.narrow(2, 0, H), qk.narrow(2, H, H), v};
  const at::Tensor o = gated_delta_static_step(qkv, b_lin, a_lin, neg_a, dt_bias, backend, cache);
  return rms_norm_gated(o, norm_w, norm_eps, gate, NormGate::Silu);
}

ParamAliases delta_fla_aliases(const DeltaDims& d) {
  ParamAliases a;
  for (const char* n : {"q_proj", "k_proj", "v_proj", "b_proj", "o_proj"}) a.aliases.push_back({std::string(n) + ".weight", n});
  const std::pair<const char*, int64_t> convs[] = {{"q", d.H * d.K}, {"k", d.H * d.K}, {"v", d.H * d.V}};
  for (const auto& [n, C] : convs) {
    ParamAlias c{fmt::format("{}_conv1d.weight", n), fmt::format("{}_conv", n), ParamAlias::Layout::Reshape,
                 "depthwise Conv1d weight [C, 1, W] held as [C, W]"};
    c.their_shape = {C, 1, d.W};
    a.aliases.push_back(std::move(c));
  }
  a.aliases.push_back({"o_norm.weight", "o_norm"});
  a.deviations = {
      "value embeddings (the backbone's ve.<i> table and the layer's ve_gate) are mixbench's additions on "
      "alternate layers, as nanochat's attention: flash-linear-attention's layer has none, so a layer golden from "
      "it is of a layer without one (v += 3·sigmoid(W_veg x[..., :12])·ve after the short conv otherwise)",
      "the value head width is head_v_dim (default head_dim, i.e. fla's expand_v = 1; fla's own defaults differ "
      "per layer): build the fla layer with the same head_dim, num_heads and expand_v",
      "initialisation differs (mixbench: nanochat's uniform ±√3/√d projections, zero o_proj; see the method's "
      "file); a state dict carries its own values"};
  return a;
}

void add_fla_decay_aliases(ParamAliases& a) {
  a.aliases.push_back({"A_log", "A_log"});
  a.aliases.push_back({"dt_bias", "dt_bias"});
  a.deviations.push_back("gate_bias_offset (default 0) adds a constant inside the decay's softplus that fla's "
                         "layer lacks: a golden from fla holds at 0 only");
}

std::vector<ParamDef> delta_common_params(const DeltaDims& d, const LayerCtx& ctx) {
  const double s = std::sqrt(3.0) / std::sqrt(double(d.d));
  const double c = 1.0 / std::sqrt(double(d.W));  // nn.Conv1d's default bound for fan-in W
  // Conv weights are 2-D weight tensors (TransformerMatrix group) that do not multiply the token
  // stream as a matmul (matmul=false); gains are Scalar.
  std::vector<ParamDef> p = {
      {"q_proj", {d.H * d.K, d.d}, ParamGroup::TransformerMatrix, true, "uniform", -s, s},
      {"k_proj", {d.H * d.K, d.d}, ParamGroup::TransformerMatrix, true, "uniform", -s, s},
      {"v_proj", {d.H * d.V, d.d}, ParamGroup::TransformerMatrix, true, "uniform", -s, s},
      {"b_proj", {d.H, d.d}, ParamGroup::TransformerMatrix, true, "uniform", -s, s},
      {"q_conv", {d.H * d.K, d.W}, ParamGroup::TransformerMatrix, false, "uniform", -c, c},
      {"k_conv", {d.H * d.K, d.W}, ParamGroup::TransformerMatrix, false, "uniform", -c, c},
      {"v_conv", {d.H * d.V, d.W}, ParamGroup::TransformerMatrix, false, "uniform", -c, c},
      {"o_norm", {d.V}, ParamGroup::Scalar, false, "const", 1.0, 0},
      {"o_proj", {d.d, d.H * d.V}, ParamGroup::TransformerMatrix, true, "const", 0.0, 0},
  };
  layers::add_ve_gate_param(p, ctx, d.H);
  return p;
}

TensorMap delta_make_inputs(const Config& c, const LayerCtx& ctx, int64_t B, int64_t T, at::Generator& gen) {
  DeltaDims d = delta_dims(c);
  return layers::layer_inputs(ctx, B, T, d.d, d.H, d.V, gen);
}

std::vector<CaseDef> delta_cases(const ConfigSpec& spec, const std::string& extra) {
  // A 4-layer model, d=64, 4 heads of 16 (layers 1 and 3 take a value embedding).
  Config base = spec.parse("n_layer=4,d_model=64,head_dim=16,seq_len=64,vocab=64" + (extra.empty() ? "" : "," + extra));
  return {
      {"layer0_T1", base, 1, 1, 0},
      {"layer0_B2_T37", base, 2, 37, 0},
      {"layer1_ve_B2_T37", base, 2, 37, 1},
      {"layer2_T70", base, 1, 70, 2},
      {"layer3_ve_T70_V8", base.with("head_v_dim", int64_t(8)), 1, 70, 3},
  };
}

void add_gate_offset_knob(ConfigSpec& spec) {
  spec.f("gate_bias_offset", 0.0, "constant added inside the decay gate's softplus (0 = fla's layer)");
}

int64_t delta_ve_dim(const Config& c, const LayerCtx& ctx) {
  DeltaDims d = delta_dims(c);
  return layers::ve_width(ctx, d.H, d.V);
}

MethodSpec delta_method(const DeltaMethodDesc& desc) {
  MethodSpec m;
#if defined(MIXBENCH_WITH_CUDA)
  m.has_cuda = true;  // device-agnostic LibTorch layer over a CUDA-registered op
#endif
  m.name = desc.name;
  m.family = "linear";
  m.summary = desc.summary;
  m.citation = desc.citation;
  m.config = delta_method_config();
  if (desc.gate_offset) add_gate_offset_knob(m.config);
  m.ops = {desc.op};
  m.params = desc.params;
  m.make_inputs = delta_make_inputs;
  m.reference = desc.reference;
  const DeltaRunFn run = desc.run;
  m.forward = [run](const TensorMap& in, const Config& c, const LayerCtx&, Backend b) {
    return run(in, c, b, nullptr, false);
  };
  m.prefill = [run](const TensorMap& in, TensorMap& cache, const Config& c, const LayerCtx&, Backend b) {
    reset_cache(cache);
    return run(in, c, b, &cache, false);
  };
  m.decode = [run](const TensorMap& in, TensorMap& cache, const Config& c, const LayerCtx&, Backend b) {
    return run(in, c, b, &cache, true);
  };
  m.static_decode = true;  // fixed-size state and short-conv tails, stored in place (cache_store)
  ConfigSpec spec = m.config;
  const std::string extra = desc.case_extra;
  m.cases = [spec, extra]() { return delta_cases(spec, extra); };
  m.account = desc.account;
  m.ve_dim = delta_ve_dim;
  return m;
}

double delta_conv_flops(const DeltaDims& d) { return 2.0 * double(d.W) * double(2 * d.H * d.K + d.H * d.V); }

double delta_uncounted_flops(const DeltaDims& d, int64_t T) {
  // The triangular solve is counted by FlopCounter (aten::linalg_solve_triangular); the short
  // convolutions, written as shifted products, are not.
  return delta_conv_flops(d);
}

LayerCost delta_account(const DeltaDims& d, int64_t n_matmul, int64_t n_conv, int64_t n_scalar,
                        int64_t gate_width, DeltaGate gate, const CostQuery& q, const std::string& note) {
  LayerCost lc;
  lc.params.transformer_matrices = n_matmul + n_conv;
  lc.params.matmul = n_matmul;
  lc.params.scalars = n_scalar;
  const DeltaFlops core = delta_chunk_flops(q.T, d.H, d.K, d.V);
  const double conv = delta_conv_flops(d);
  lc.fwd_flops = 2.0 * double(n_matmul) + core.total() + conv;
  lc.uncounted_flops = conv;
  lc.nanochat_core_flops = 3.0 * (core.total() + conv);
  lc.decode_flops = 2.0 * double(n_matmul) + conv + delta_step_flops(d.H, d.K, d.V, gate);
  lc.cache_bytes_per_token = 0;
  lc.state_bytes = 4.0 * double(d.H * d.K * d.V) + double(q.dtype_bytes) * double((d.W - 1) * (2 * d.H * d.K + d.H * d.V));
  const int64_t qkv = 2 * d.H * d.K + d.H * d.V;
  lc.act_bytes = double(q.dtype_bytes) * double(d.d + 2 * qkv + 3 * d.H * d.V + d.H + gate_width);
  lc.formula = fmt::format(
      "{}: fwd 2N + H·ceil(T/C)/T·(4C²K + 2C²V + 6CKV + C(C−1)(K+V)) + 2W(2HK+HV), C=min(64,T); "
      "nanochat 3·(core + conv); decode 2N + 2W(2HK+HV) + ~7·H·K·V",
      note);
  return lc;
}

}  // namespace mixbench::linear
