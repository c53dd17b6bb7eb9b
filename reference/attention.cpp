// FP64 reference for causal (windowed, GQA, logit-scaled) attention and nanochat's attention layer.
#include <ATen/ATen.h>

#include "reference/reference.h"

namespace mixbench::reference {

at::Tensor from_doubles(const std::vector<double>& v, const at::TensorOptions& opts) {
  return at::tensor(v, at::TensorOptions().dtype(at::kDouble)).to(opts.requires_grad(false));
}

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                     int64_t window, double logit_scale_a) {
  const int64_t T = q.size(1), H = q.size(2), Hkv = k.size(2);
  const int64_t G = H / Hkv;
  // Expand KV heads so that query head h reads KV head h / G.
  at::Tensor ke = k.repeat_interleave(G, 2);  // [B,T,H,D]
  at::Tensor ve = v.repeat_interleave(G, 2);  // [B,T,H,Dv]
  std::vector<at::Tensor> outs;
  outs.reserve(size_t(T));
  for (int64_t t = 0; t < T; ++t) {
    const int64_t lo = window > 0 ? std::max<int64_t>(0, t - window + 1) : 0;
    double s = scale;
    if (logit_scale_a > 0) s *= std::log(double(t) + logit_scale_a) / std::log(logit_scale_a);
    at::Tensor qt = q.select(1, t);                   // [B,H,D]
    at::Tensor ks = ke.slice(1, lo, t + 1);           // [B,S,H,D]
    at::Tensor vs = ve.slice(1, lo, t + 1);           // [B,S,H,Dv]
    at::Tensor logits = (qt.unsqueeze(1) * ks).sum(-1) * s;  // [B,S,H]
    at::Tensor m = std::get<0>(logits.max(1, true));
    at::Tensor p = (logits - m.detach()).exp();
    p = p / p.sum(1, true);
    outs.push_back((p.unsqueeze(-1) * vs).sum(1));    // [B,H,Dv]
  }
  return at::stack(outs, 1);
}

namespace {
at::Tensor rms(const at::Tensor& x) {
  const double eps = 1.1920928955078125e-07;  // float32 epsilon, as nanochat's F.rms_norm(eps=None)
  return x / (x.pow(2).mean(-1, true) + eps).sqrt();
}

// nanochat's rotation: y1 = x1 cos + x2 sin, y2 = -x1 sin + x2 cos, angle p·base^(-2i/D) at the
// token's position p (t, or positions[b][t] when given).
at::Tensor rope(const at::Tensor& x, double base, const at::Tensor& positions = at::Tensor()) {
  const int64_t B = x.size(0), T = x.size(1), D = x.size(3), half = D / 2;
  const at::Tensor pos = positions.defined() ? positions.to(at::kLong).cpu() : at::Tensor();
  std::vector<at::Tensor> rows;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t nb = pos.defined() ? B : 1;  // one row of angles per batch row, or one for all
    std::vector<double> c(static_cast<size_t>(nb * half)), s(static_cast<size_t>(nb * half));
    for (int64_t b = 0; b < nb; ++b)
      for (int64_t i = 0; i < half; ++i) {
        const double p = pos.defined() ? double(pos[b][t].item<int64_t>()) : double(t);
        const double ang = p * std::pow(base, -double(2 * i) / double(D));
        c[size_t(b * half + i)] = std::cos(ang);
        s[size_t(b * half + i)] = std::sin(ang);
      }
    at::Tensor cos = from_doubles(c, x.options().requires_grad(false)).view({nb, 1, half});
    at::Tensor sin = from_doubles(s, x.options().requires_grad(false)).view({nb, 1, half});
    at::Tensor xt = x.select(1, t);
    at::Tensor x1 = xt.slice(-1, 0, half), x2 = xt.slice(-1, half);
    rows.push_back(at::cat({x1 * cos + x2 * sin, -x1 * sin + x2 * cos}, -1));
  }
  return at::stack(rows, 1);
}

at::Tensor project(const at::Tensor& x, const at::Tensor& w) { return (x.unsqueeze(-2) * w).sum(-1); }
}  // namespace

NanochatQKV nanochat_qkv(const at::Tensor& x, const at::Tensor& ve, const AttnLayerWeights& w, int64_t n_head,
                         int64_t n_kv_head, int64_t head_dim, double rope_base, bool use_rope,
                         const at::Tensor& positions) {
  const int64_t B = x.size(0), T = x.size(1);
  at::Tensor q = project(x, w.c_q).view({B, T, n_head, head_dim});
  at::Tensor k = project(x, w.c_k).view({B, T, n_kv_head, head_dim});
  at::Tensor v = project(x, w.c_v).view({B, T, n_kv_head, head_dim});
  if (ve.defined() && w.ve_gate.defined()) {
    at::Tensor gate = 3.0 * at::sigmoid(project(x.slice(-1, 0, w.ve_gate.size(1)), w.ve_gate));  // [B,T,Hkv]
    v = v + gate.unsqueeze(-1) * ve.view({B, T, n_kv_head, head_dim});
  }
  if (use_rope) {
    q = rope(q, rope_base, positions);
    k = rope(k, rope_base, positions);
  }
  return {rms(q) * 1.2, rms(k) * 1.2, v};
}

at::Tensor nanochat_attention_layer(const at::Tensor& x, const at::Tensor& ve, const AttnLayerWeights& w,
                                    int64_t n_head, int64_t n_kv_head, int64_t head_dim, int64_t window,
                                    double rope_base, double logit_scale_a, bool use_rope,
                                    const at::Tensor& positions) {
  const int64_t B = x.size(0), T = x.size(1);
  NanochatQKV qkv = nanochat_qkv(x, ve, w, n_head, n_kv_head, head_dim, rope_base, use_rope, positions);
  at::Tensor y = attention(qkv.q, qkv.k, qkv.v, 1.0 / std::sqrt(double(head_dim)), window, logit_scale_a)
                     .reshape({B, T, n_head * head_dim});
  if (w.c_gate.defined()) y = y * at::sigmoid(project(x, w.c_gate));
  return project(y, w.c_proj);
}

at::Tensor mla_layer(const at::Tensor& x, const MlaWeights& w, int64_t n_head, int64_t head_dim, int64_t rope_dim,
                     double rope_base, bool qk_norm) {
  const int64_t B = x.size(0), T = x.size(1);
  auto gain = [](const at::Tensor& t, const at::Tensor& g) { return g.defined() ? t * g : t; };
  const at::Tensor cq = gain(rms(project(x, w.w_dq)), w.q_norm), ckv = gain(rms(project(x, w.w_dkv)), w.kv_norm);
  at::Tensor q = project(cq, w.w_uq).view({B, T, n_head, head_dim});
  at::Tensor k = project(ckv, w.w_uk).view({B, T, n_head, head_dim});
  const at::Tensor v = project(ckv, w.w_uv).view({B, T, n_head, head_dim});
  if (rope_dim > 0) {
    const at::Tensor qr = rope(project(cq, w.w_qr).view({B, T, n_head, rope_dim}), rope_base);
    const at::Tensor kr = rope(project(x, w.w_kr).view({B, T, 1, rope_dim}), rope_base);
    q = at::cat({q, qr}, -1);
    k = at::cat({k, kr.expand({B, T, n_head, rope_dim})}, -1);
  }
  if (qk_norm) {
    q = rms(q) * 1.2;
    k = rms(k) * 1.2;
  }
  const at::Tensor o = attention(q, k, v, 1.0 / std::sqrt(double(head_dim + rope_dim)), 0, 0.0);
  return project(o.reshape({B, T, n_head * head_dim}), w.c_proj);
}

}  // namespace mixbench::reference
