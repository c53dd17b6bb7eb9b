#include "mixers/common/layers.h"

#include <ATen/ATen.h>

#include "harness/backbone.h"
#include "harness/errors.h"

namespace mixbench::layers {

bool is_half(const at::Tensor& t) {
  return t.defined() && (t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf);
}

at::Tensor f32(const at::Tensor& t) { return t.defined() ? t.to(at::kFloat) : t; }

at::Tensor rms_norm(const at::Tensor& x) {
  if (is_half(x)) return rms_norm(f32(x)).to(x.scalar_type());  // statistics in fp32, as under autocast
  return x * at::rsqrt(x.pow(2).mean(-1, true) + 1.1920928955078125e-07);
}

at::Tensor rope(const at::Tensor& x, double base, int64_t offset) {
  if (is_half(x)) return rope(f32(x), base, offset).to(x.scalar_type());  // one rounding, not three
  const int64_t T = x.size(1), D = x.size(3), half = D / 2;
  auto opts = at::TensorOptions().dtype(at::kDouble);
  at::Tensor pos = at::arange(offset, offset + T, opts);
  at::Tensor inv = at::pow(base, -at::arange(0, half, opts) * (2.0 / double(D)));
  at::Tensor ang = at::outer(pos, inv);  // [T, half]
  at::Tensor cos = ang.cos().to(x.options()).view({1, T, 1, half});
  at::Tensor sin = ang.sin().to(x.options()).view({1, T, 1, half});
  at::Tensor x1 = x.slice(-1, 0, half), x2 = x.slice(-1, half);
  return at::cat({x1 * cos + x2 * sin, x2 * cos - x1 * sin}, -1);
}

at::Tensor logit_scale(int64_t T, double a, int64_t offset) {
  auto opts = at::TensorOptions().dtype(at::kDouble);
  return at::log(at::arange(offset, offset + T, opts) + a) / std::log(a);
}

double mean_visible(int64_t T, int64_t w) {
  if (T <= 0) return 0;
  if (w <= 0 || w >= T) return double(T + 1) / 2.0;
  // t < w: t+1 keys; t >= w: w keys
  double ramp = double(w) * double(w + 1) / 2.0;
  double flat = double(T - w) * double(w);
  return (ramp + flat) / double(T);
}

int64_t ve_width(const LayerCtx& ctx, int64_t heads, int64_t head_v) {
  return layer_has_ve(ctx) ? heads * head_v : 0;
}

void add_ve_gate_param(std::vector<ParamDef>& p, const LayerCtx& ctx, int64_t heads) {
  if (layer_has_ve(ctx))
    p.push_back({"ve_gate", {heads, kVeGateChannels}, ParamGroup::TransformerMatrix, true, "uniform", 0.0, 0.02});
}

int64_t ve_gate_params(const LayerCtx& ctx, int64_t heads) { return layer_has_ve(ctx) ? kVeGateChannels * heads : 0; }

at::Tensor add_value_embed(const at::Tensor& v, const TensorMap& in) {
  if (!in.has("ve")) return v;
  const at::Tensor& x = in.at("x");
  at::Tensor gate = 3.0 * at::sigmoid(at::linear(x.slice(-1, 0, kVeGateChannels), in.at("ve_gate")));
  return v + gate.unsqueeze(-1) * in.at("ve").view(v.sizes());
}

TensorMap layer_inputs(const LayerCtx& ctx, int64_t B, int64_t T, int64_t d, int64_t heads, int64_t head_v,
                       at::Generator& gen) {
  auto o = at::TensorOptions().dtype(at::kDouble);
  TensorMap in{{"x", at::randn({B, T, d}, gen, o)}};
  if (layer_has_ve(ctx)) in.set("ve", at::randn({B, T, heads * head_v}, gen, o));
  return in;
}

void require_ve_gate_width(const Config& c) {
  if (model_dims(c).d_model < kVeGateChannels) throw InputError("d_model must be at least 12 (VE gate channels)");
}

}  // namespace mixbench::layers
