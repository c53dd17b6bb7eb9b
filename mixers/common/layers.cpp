#include "mixers/common/layers.h"

#include <ATen/ATen.h>

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

}  // namespace mixbench::layers
