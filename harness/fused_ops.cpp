#include "harness/fused_ops.h"

#include <ATen/ATen.h>

#include <cmath>
#include <stdexcept>

#include "harness/op_scope.h"

#if defined(MIXBENCH_WITH_CUDA)
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/custom_function.h>

#include "harness/fused_ops_kernel.h"
#include "harness/row_norm_kernel.h"
#endif

namespace mixbench {

#if defined(MIXBENCH_WITH_CUDA)
namespace {
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool fusable(const at::Tensor& x) {
  const auto st = x.scalar_type();
  return x.is_cuda() && (st == at::kFloat || st == at::kBFloat16 || st == at::kHalf);
}
fused_cuda::Dtype kernel_dtype(const at::Tensor& x) {
  return x.scalar_type() == at::kFloat      ? fused_cuda::Dtype::F32
         : x.scalar_type() == at::kBFloat16 ? fused_cuda::Dtype::BF16
                                            : fused_cuda::Dtype::F16;
}
cudaStream_t stream_of(const at::Tensor& x) { return c10::cuda::getCurrentCUDAStream(x.device().index()).stream(); }

// Saves the pre-activation h (the unfused graph saves relu(h), the same size).
struct ReluSquareFn : public torch::autograd::Function<ReluSquareFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& h) {
    ctx->save_for_backward({h});
    at::Tensor y = at::empty_like(h);
    fused_cuda::relu_square_forward(kernel_dtype(h), h.data_ptr(), y.data_ptr(), h.numel(), stream_of(h));
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    const at::Tensor h = ctx->get_saved_variables()[0];
    const at::Tensor dy = g[0].to(h.scalar_type()).contiguous();
    at::Tensor dh = at::empty_like(h);
    fused_cuda::relu_square_backward(kernel_dtype(h), h.data_ptr(), dy.data_ptr(), dh.data_ptr(), h.numel(), stream_of(h));
    return {dh};
  }
};

// a, b: one element each, in x's dtype.
struct ScaledSumFn : public torch::autograd::Function<ScaledSumFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& x, const at::Tensor& b,
                            const at::Tensor& x0) {
    ctx->save_for_backward({a, x, b, x0});
    at::Tensor y = at::empty_like(x);
    fused_cuda::scaled_sum_forward(kernel_dtype(x), a.data_ptr(), x.data_ptr(), b.data_ptr(), x0.data_ptr(), y.data_ptr(),
                                   x.numel(), stream_of(x));
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    auto s = ctx->get_saved_variables();
    const at::Tensor &a = s[0], &x = s[1], &b = s[2], &x0 = s[3];
    const at::Tensor dy = g[0].to(x.scalar_type()).contiguous();
    at::Tensor dx = at::empty_like(x), dx0 = at::empty_like(x0);
    at::Tensor sums = at::zeros({2}, x.options().dtype(at::kFloat));
    fused_cuda::scaled_sum_backward(kernel_dtype(x), a.data_ptr(), x.data_ptr(), b.data_ptr(), x0.data_ptr(), dy.data_ptr(),
                                    dx.data_ptr(), dx0.data_ptr(), sums.data_ptr<float>(), x.numel(), stream_of(x));
    return {sums[0].to(a.scalar_type()).reshape(a.sizes()), dx, sums[1].to(b.scalar_type()).reshape(b.sizes()), dx0};
  }
};

// Row norms (harness/row_norm_kernel.h) over the last dimension; x, w (or undefined), g (or
// undefined) contiguous in one dtype. Saves the inputs only: the backward recomputes the scale.
struct RowNormFn : public torch::autograd::Function<RowNormFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, const at::Tensor& g,
                            double inv_div, double eps, int64_t act) {
    ctx->save_for_backward({x, w, g});
    ctx->saved_data["inv_div"] = inv_div;
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["act"] = act;
    at::Tensor y = at::empty_like(x);
    fused_cuda::row_norm_forward(kernel_dtype(x), params(x, inv_div, eps, act), x.data_ptr(),
                                 present(w) ? w.data_ptr() : nullptr, present(g) ? g.data_ptr() : nullptr, y.data_ptr(),
                                 stream_of(x));
    return y;
  }
  // An absent gain or gate is an empty tensor: autograd's Function takes defined tensors only.
  static bool present(const at::Tensor& t) { return t.defined() && t.numel() > 0; }
  static at::Tensor absent(const at::Tensor& x) { return at::empty({0}, x.options()); }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto s = ctx->get_saved_variables();
    const at::Tensor &x = s[0], &w = s[1], &g = s[2];
    const fused_cuda::RowNorm p = params(x, ctx->saved_data["inv_div"].toDouble(), ctx->saved_data["eps"].toDouble(),
                                         ctx->saved_data["act"].toInt());
    at::Tensor dy = grads[0].to(x.scalar_type()).contiguous();
    if (!fused_cuda::row_norm_fits(p, {dy.data_ptr()})) dy = dy.clone();  // a view at an odd offset
    const bool has_w = present(w), has_g = present(g);
    at::Tensor dx = at::empty_like(x), dg = has_g ? at::empty_like(g) : at::Tensor();
    at::Tensor dw_part = has_w ? at::empty({fused_cuda::row_norm_backward_parts(p), p.D}, x.options().dtype(at::kFloat))
                               : at::Tensor();
    fused_cuda::row_norm_backward(kernel_dtype(x), p, x.data_ptr(), has_w ? w.data_ptr() : nullptr,
                                  has_g ? g.data_ptr() : nullptr, dy.data_ptr(), dx.data_ptr(),
                                  has_g ? dg.data_ptr() : nullptr, has_w ? dw_part.data_ptr<float>() : nullptr,
                                  stream_of(x));
    at::Tensor dw = has_w ? dw_part.sum(0).to(w.scalar_type()) : at::Tensor();
    return {dx, dw, dg, at::Tensor(), at::Tensor(), at::Tensor()};
  }
  static fused_cuda::RowNorm params(const at::Tensor& x, double inv_div, double eps, int64_t act) {
    fused_cuda::RowNorm p;
    p.D = int(x.size(-1));
    p.rows = x.numel() / p.D;
    p.inv_div = float(inv_div);
    p.eps = float(eps);
    p.act = fused_cuda::GateAct(act);
    return p;
  }
};

// v + s·σ(z)·e (harness/row_norm_kernel.h); v, z, e contiguous in one dtype. dv is dy itself.
struct GatedAddFn : public torch::autograd::Function<GatedAddFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& v, const at::Tensor& z, const at::Tensor& e, double s) {
    ctx->save_for_backward({z, e});
    ctx->saved_data["s"] = s;
    at::Tensor y = at::empty_like(v);
    fused_cuda::gated_add_forward(kernel_dtype(v), z.numel(), int(v.size(-1)), float(s), v.data_ptr(), z.data_ptr(),
                                  e.data_ptr(), y.data_ptr(), stream_of(v));
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor &z = saved[0], &e = saved[1];
    const int D = int(e.size(-1));
    at::Tensor dy = grads[0].to(e.scalar_type()).contiguous();
    if (!fused_cuda::gated_add_fits(D, {dy.data_ptr()})) dy = dy.clone();  // a view at an odd offset
    at::Tensor de = at::empty_like(e), dz = at::empty_like(z);
    fused_cuda::gated_add_backward(kernel_dtype(e), z.numel(), D, float(ctx->saved_data["s"].toDouble()), z.data_ptr(),
                                   e.data_ptr(), dy.data_ptr(), de.data_ptr(), dz.data_ptr(), stream_of(e));
    return {dy, dz, de, at::Tensor()};
  }
};

// The row norm in the kernels when x, w and g allow it (else undefined): g and w in x's dtype
// (w cast to it, as the unfused GPU path does), rows the kernels take.
at::Tensor row_norm_fused(const at::Tensor& x, const at::Tensor& w, const at::Tensor& g, double inv_div, double eps,
                          NormGate act) {
  if (!fusable(x) || x.dim() == 0 || x.numel() == 0 || x.size(-1) > 1024) return at::Tensor();
  if (g.defined() && (g.sizes() != x.sizes() || g.scalar_type() != x.scalar_type() || !g.is_cuda())) return at::Tensor();
  if (w.defined() && (w.dim() != 1 || w.size(0) != x.size(-1) || !w.is_cuda())) return at::Tensor();
  const at::Tensor xc = x.contiguous(), gc = g.defined() ? g.contiguous() : RowNormFn::absent(x),
                   wc = w.defined() ? w.to(x.scalar_type()).contiguous() : RowNormFn::absent(x);
  fused_cuda::RowNorm p = RowNormFn::params(xc, inv_div, eps, int64_t(act));
  if (!fused_cuda::row_norm_fits(p, {xc.data_ptr(), RowNormFn::present(wc) ? wc.data_ptr() : nullptr,
                                     RowNormFn::present(gc) ? gc.data_ptr() : nullptr}))
    return at::Tensor();
  return RowNormFn::apply(xc, wc, gc, inv_div, eps, int64_t(act));
}
}  // namespace
#endif

at::Tensor relu_square(const at::Tensor& h) {
  OpScope scope("mixbench::relu_square");
#if defined(MIXBENCH_WITH_CUDA)
  if (fusable(h)) return ReluSquareFn::apply(h.contiguous());
#endif
  return at::relu(h).square();
}

at::Tensor scaled_sum(const at::Tensor& a, const at::Tensor& x, const at::Tensor& b, const at::Tensor& x0) {
  OpScope scope("mixbench::scaled_sum");
#if defined(MIXBENCH_WITH_CUDA)
  if (fusable(x) && x0.scalar_type() == x.scalar_type() && x0.sizes() == x.sizes() && a.numel() == 1 && b.numel() == 1 &&
      a.is_cuda() && b.is_cuda())
    return ScaledSumFn::apply(a.to(x.scalar_type()), x.contiguous(), b.to(x.scalar_type()), x0.contiguous());
#endif
  return a * x + b * x0;
}

namespace {
at::Tensor gate_activation(const at::Tensor& g, NormGate act) {
  return act == NormGate::Silu ? at::silu(g) : at::sigmoid(g);
}
}  // namespace

at::Tensor rms_norm_gated(const at::Tensor& x, const at::Tensor& w, double eps, const at::Tensor& g, NormGate act) {
  OpScope scope("mixbench::rms_norm_gated");
  if (g.defined() == (act == NormGate::None))
    throw std::invalid_argument("rms_norm_gated: a gate needs an activation and an activation a gate");
#if defined(MIXBENCH_WITH_CUDA)
  if (at::Tensor y = row_norm_fused(x, w, g, 1.0 / double(x.size(-1)), eps, act); y.defined()) return y;
#endif
  at::Tensor y;
  if (x.is_cuda() && x.scalar_type() != at::kDouble) {  // LibTorch's fused RMSNorm, with its gain
    y = at::rms_norm(x, {x.size(-1)}, w.defined() ? std::optional<at::Tensor>(w.to(x.scalar_type())) : std::nullopt, eps);
  } else {
    y = x * at::rsqrt(x.pow(2).mean(-1, true) + eps);
    if (w.defined()) y = y * w;
  }
  return g.defined() ? y * gate_activation(g, act) : y;
}

at::Tensor gated_add(const at::Tensor& v, const at::Tensor& z, double s, const at::Tensor& e) {
  OpScope scope("mixbench::gated_add");
#if defined(MIXBENCH_WITH_CUDA)
  if (fusable(v) && v.dim() >= 1 && v.numel() > 0 && z.is_cuda() && e.is_cuda() && e.sizes() == v.sizes() &&
      z.sizes() == v.sizes().slice(0, v.dim() - 1) && z.scalar_type() == v.scalar_type() &&
      e.scalar_type() == v.scalar_type()) {
    const at::Tensor vc = v.contiguous(), zc = z.contiguous(), ec = e.contiguous();
    if (fused_cuda::gated_add_fits(int(v.size(-1)), {vc.data_ptr(), ec.data_ptr()}) && v.size(-1) <= 1024)
      return GatedAddFn::apply(vc, zc, ec, s);
  }
#endif
  return v + (s * at::sigmoid(z)).unsqueeze(-1) * e;
}

at::Tensor l2_normalize(const at::Tensor& x, double eps) {
  OpScope scope("mixbench::l2_normalize");
#if defined(MIXBENCH_WITH_CUDA)
  if (at::Tensor y = row_norm_fused(x, at::Tensor(), at::Tensor(), 1.0, eps, NormGate::None); y.defined()) return y;
#endif
  // On a GPU LibTorch's fused RMSNorm: x·rsqrt(Σx² + ε) = rms_norm(x, ε/D)/√D (fp32 statistics)
  if (x.is_cuda() && x.scalar_type() != at::kDouble) {
    const double D = double(x.size(-1));
    return at::rms_norm(x, {x.size(-1)}, std::nullopt, eps / D) * (1.0 / std::sqrt(D));
  }
  return x * at::rsqrt(x.pow(2).sum(-1, true) + eps);
}

}  // namespace mixbench
