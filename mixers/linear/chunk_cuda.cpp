// Autograd wrappers of the tensor-core chunk kernels (see chunk_cuda.h, chunk_kernels.h).
#include "mixers/linear/chunk_cuda.h"

#include <stdexcept>

#if defined(MIXBENCH_WITH_CUDA)
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/custom_function.h>

#include "harness/alloc.h"
#include "mixers/linear/chunk_kernels.h"
#include "mixers/linear/delta_chunk.h"
#include "mixers/linear/recompute.h"
#endif

namespace mixbench::linear {

#if defined(MIXBENCH_WITH_CUDA)
namespace {

tc::Dtype dtype_of(const at::Tensor& t) {
  return t.scalar_type() == at::kHalf ? tc::Dtype::FP16 : tc::Dtype::BF16;
}
// Contiguous and 16-byte aligned (the kernels copy rows with 16-byte cp.async).
at::Tensor prep(const at::Tensor& t, at::ScalarType dt) {
  at::Tensor x = t.to(dt).contiguous();
  if (reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 != 0) x = x.clone();
  return x;
}
void* stream() { return at::cuda::getCurrentCUDAStream().stream(); }
tc::Dims dims(const at::Tensor& q, const at::Tensor& v) {
  return {int(q.size(0)), int(q.size(1)), int(q.size(2)), int(q.size(3)), int(v.size(3))};
}
// Cumulative sum of g inside each chunk of 64 tokens, fp32 [B, 64·NT, H], g read as 0 past T.
at::Tensor chunk_cumsum(const at::Tensor& g) {
  const int64_t B = g.size(0), T = g.size(1), H = g.size(2), NT = tc::num_chunks(int(T));
  at::Tensor b = at::zeros({B, NT * 64, H}, g.options().dtype(at::kFloat));
  b.narrow(1, 0, T).copy_(g);
  return b.view({B, NT, 64, H}).cumsum(2).view({B, NT * 64, H}).contiguous();
}
const float* fptr(const at::Tensor& t) { return t.defined() && t.numel() > 0 ? t.data_ptr<float>() : nullptr; }
// Function::apply needs every tensor argument defined (it records each input's device): an absent
// h0 travels as an empty tensor and is undefined again inside.
at::Tensor h0_arg(const at::Tensor& h0, const at::Tensor& like) {
  return h0.defined() ? prep(h0, at::kFloat) : at::empty({0}, like.options().dtype(at::kFloat));
}
at::Tensor h0_in(const at::Tensor& h0) { return present(h0); }

struct Fwd {
  at::Tensor o, ht, hs, b;
};
// with_output: o and ht for the forward (fused kernel or walk + output, whichever prefer_fused picks);
// otherwise only the per-chunk states hs (and ht) that the backward needs.
Fwd simple_gla_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                       double scale, const at::Tensor& h0, bool with_output) {
  const tc::Dims d = dims(q, v);
  const int64_t NT = tc::num_chunks(d.T);
  Fwd f;
  f.b = chunk_cumsum(g);
  auto f32 = q.options().dtype(at::kFloat);
  if (with_output) {
    f.o = alloc_output({d.B, d.T, d.H, d.V}, v.options());
    f.ht = alloc_output({d.B, d.H, d.K, d.V}, f32);
    if (tc::prefer_fused(d)) {
      tc::fused_fwd(dtype_of(q), q.data_ptr(), k.data_ptr(), v.data_ptr(), nullptr, f.b.data_ptr<float>(), fptr(h0),
                    f.o.data_ptr(), f.ht.data_ptr<float>(), float(scale), d, stream());
      return f;
    }
  } else {
    f.ht = at::empty({d.B, d.H, d.K, d.V}, f32);
  }
  f.hs = at::empty({d.B, d.H, NT, d.K, d.V}, q.options());
  tc::walk_fwd(dtype_of(q), k.data_ptr(), v.data_ptr(), nullptr, f.b.data_ptr<float>(), fptr(h0), f.hs.data_ptr(),
               nullptr, f.ht.data_ptr<float>(), d, stream());
  if (with_output)
    tc::chunk_output(dtype_of(q), q.data_ptr(), k.data_ptr(), v.data_ptr(), f.b.data_ptr<float>(), f.hs.data_ptr(),
                     f.o.data_ptr(), float(scale), d, stream());
  return f;
}

struct SimpleGlaTcFn : public torch::autograd::Function<SimpleGlaTcFn> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q,
                                                const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                                                const at::Tensor& h0, double scale) {
    ctx->saved_data["scale"] = scale;
    ctx->save_for_backward({q, k, v, g, h0});
    Fwd f = simple_gla_forward(q, k, v, g, scale, h0_in(h0), /*with_output=*/true);
    return {f.o, f.ht};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto s = ctx->get_saved_variables();
    const at::Tensor &q = s[0], &k = s[1], &v = s[2], &g = s[3];
    const at::Tensor h0 = h0_in(s[4]);
    const double scale = ctx->saved_data["scale"].toDouble();
    c10::cuda::CUDAGuard guard(q.device());
    const tc::Dims d = dims(q, v);
    const int64_t NT = tc::num_chunks(d.T);
    at::Tensor d_o = grads[0].defined() ? prep(grads[0], q.scalar_type()) : at::zeros_like(v);
    at::Tensor dht = grads[1].defined() ? prep(grads[1], at::kFloat) : at::Tensor();
    Fwd f = simple_gla_forward(q, k, v, g, scale, h0, /*with_output=*/false);
    at::Tensor dhs = at::empty_like(f.hs);
    at::Tensor dh0 = at::empty({d.B, d.H, d.K, d.V}, q.options().dtype(at::kFloat));
    tc::walk_bwd(dtype_of(q), q.data_ptr(), d_o.data_ptr(), f.b.data_ptr<float>(), fptr(dht), dhs.data_ptr(),
                 dh0.data_ptr<float>(), float(scale), d, stream());
    auto f32 = q.options().dtype(at::kFloat);
    at::Tensor dqf = at::empty({d.B, d.T, d.H, d.K}, f32), dkf = at::empty({d.B, d.T, d.H, d.K}, f32);
    at::Tensor dv = at::empty_like(v), y = at::empty({d.B, d.T, d.H}, f32), z = at::empty({d.B, NT, d.H}, f32);
    tc::chunk_dqkv(dtype_of(q), q.data_ptr(), k.data_ptr(), v.data_ptr(), d_o.data_ptr(), f.b.data_ptr<float>(),
                   f.hs.data_ptr(), dhs.data_ptr(), dqf.data_ptr<float>(), dkf.data_ptr<float>(), dv.data_ptr(),
                   y.data_ptr<float>(), z.data_ptr<float>(), float(scale), d, stream());
    // Decay gradient, per chunk (chunk_kernels.h): dg_t = Σ_{i≥t} x_i + Σ_{j<t} y_j + z_c.
    at::Tensor x = at::zeros({d.B, NT * 64, d.H}, f32), yp = at::zeros({d.B, NT * 64, d.H}, f32);
    x.narrow(1, 0, d.T).copy_((q.to(at::kFloat) * dqf).sum(-1) - (k.to(at::kFloat) * dkf).sum(-1) + y);
    yp.narrow(1, 0, d.T).copy_(y);
    x = x.view({d.B, NT, 64, d.H});
    yp = yp.view({d.B, NT, 64, d.H});
    at::Tensor dg = x.flip(2).cumsum(2).flip(2) + (yp.cumsum(2) - yp) + z.unsqueeze(2);
    dg = dg.view({d.B, NT * 64, d.H}).narrow(1, 0, d.T);
    return {dqf.to(q.scalar_type()), dkf.to(k.scalar_type()), dv, dg.to(g.scalar_type()),
            h0.defined() ? dh0.to(h0.scalar_type()) : at::Tensor(), at::Tensor()};
  }
};

struct GdnTcFn : public torch::autograd::Function<GdnTcFn> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q,
                                                const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                                                const at::Tensor& beta, const at::Tensor& h0, double scale) {
    ctx->saved_data["scale"] = scale;
    ctx->save_for_backward({q, k, v, g, beta, h0});
    const tc::Dims d = dims(q, v);
    const int64_t NT = tc::num_chunks(d.T);
    at::Tensor b = chunk_cumsum(g);
    at::Tensor betaf = beta.to(at::kFloat).contiguous();
    at::Tensor w = at::empty_like(k), u = at::empty_like(v), vn = at::empty_like(v);
    tc::delta_prep(dtype_of(q), k.data_ptr(), v.data_ptr(), betaf.data_ptr<float>(), b.data_ptr<float>(),
                   w.data_ptr(), u.data_ptr(), nullptr, d, stream());
    at::Tensor ht = alloc_output({d.B, d.H, d.K, d.V}, q.options().dtype(at::kFloat));
    at::Tensor o = alloc_output({d.B, d.T, d.H, d.V}, v.options());
    if (tc::prefer_fused(d)) {
      tc::fused_fwd(dtype_of(q), q.data_ptr(), k.data_ptr(), u.data_ptr(), w.data_ptr(), b.data_ptr<float>(),
                    fptr(h0), o.data_ptr(), ht.data_ptr<float>(), float(scale), d, stream());
    } else {
      at::Tensor hs = at::empty({d.B, d.H, NT, d.K, d.V}, q.options());
      tc::walk_fwd(dtype_of(q), k.data_ptr(), u.data_ptr(), w.data_ptr(), b.data_ptr<float>(), fptr(h0),
                   hs.data_ptr(), vn.data_ptr(), ht.data_ptr<float>(), d, stream());
      tc::chunk_output(dtype_of(q), q.data_ptr(), k.data_ptr(), vn.data_ptr(), b.data_ptr<float>(), hs.data_ptr(),
                       o.data_ptr(), float(scale), d, stream());
    }
    return {o, ht};
  }
  // Explicit backward (delta_chunk.h): delta_prep (w, u and X), the forward walk (states and v_new
  // per chunk), the reverse walk (state gradients and du per chunk) on the kernels; the rest as
  // batched products over all chunks (delta_bwd::grads, fp32).
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto s = ctx->get_saved_variables();
    const at::Tensor &q = s[0], &k = s[1], &v = s[2], &g = s[3], &beta = s[4];
    const at::Tensor h0 = h0_in(s[5]);
    const double scale = ctx->saved_data["scale"].toDouble();
    c10::cuda::CUDAGuard guard(q.device());
    const tc::Dims d = dims(q, v);
    const int64_t NT = tc::num_chunks(d.T);
    const auto dt = q.scalar_type();
    auto f32 = q.options().dtype(at::kFloat);
    at::Tensor d_o = grads[0].defined() ? prep(grads[0], dt) : at::zeros_like(v);
    at::Tensor dht = grads[1].defined() ? prep(grads[1], at::kFloat) : at::Tensor();
    at::Tensor b = chunk_cumsum(g);
    at::Tensor betaf = beta.to(at::kFloat).contiguous();
    at::Tensor w = at::empty_like(k), u = at::empty_like(v), X = at::empty({d.B, d.H, NT, 64, 64}, f32);
    tc::delta_prep(dtype_of(q), k.data_ptr(), v.data_ptr(), betaf.data_ptr<float>(), b.data_ptr<float>(),
                   w.data_ptr(), u.data_ptr(), X.data_ptr<float>(), d, stream());
    at::Tensor hs = at::empty({d.B, d.H, NT, d.K, d.V}, q.options()), vn = at::empty_like(v);
    at::Tensor ht = at::empty({d.B, d.H, d.K, d.V}, f32);
    tc::walk_fwd(dtype_of(q), k.data_ptr(), u.data_ptr(), w.data_ptr(), b.data_ptr<float>(), fptr(h0),
                 hs.data_ptr(), vn.data_ptr(), ht.data_ptr<float>(), d, stream());
    const delta_bwd::Chunks c = delta_bwd::make(q, k, v, beta, g, d_o, scale);
    at::Tensor dvl = prep(delta_bwd::from_chunks(delta_bwd::dv_local(c), d.T), dt);
    at::Tensor dhs = at::empty_like(hs), du = at::empty_like(v), dh0 = at::empty({d.B, d.H, d.K, d.V}, f32);
    tc::walk_bwd_delta(dtype_of(q), q.data_ptr(), d_o.data_ptr(), k.data_ptr(), w.data_ptr(), dvl.data_ptr(),
                       b.data_ptr<float>(), fptr(dht), dhs.data_ptr(), du.data_ptr(), dh0.data_ptr<float>(),
                       float(scale), d, stream());
    DeltaGrads r = delta_bwd::grads(c, X, hs.to(at::kFloat), delta_bwd::to_chunks(vn, at::kFloat),
                                    dhs.to(at::kFloat), delta_bwd::to_chunks(du, at::kFloat), dh0);
    return {r.dq.to(q.scalar_type()), r.dk.to(k.scalar_type()), r.dv.to(v.scalar_type()), r.dg.to(g.scalar_type()),
            r.dbeta.to(beta.scalar_type()), h0.defined() ? dh0.to(h0.scalar_type()) : at::Tensor(), at::Tensor()};
  }
};

}  // namespace

bool chunk_tc_eligible(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                       const at::Tensor& beta, const at::Tensor& h0) {
  if (!q.defined() || !k.defined() || !v.defined() || !g.defined() || !q.is_cuda()) return false;
  const auto dt = q.scalar_type();
  if ((dt != at::kBFloat16 && dt != at::kHalf) || k.scalar_type() != dt || v.scalar_type() != dt) return false;
  for (const at::Tensor* t : {&k, &v, &g, &beta, &h0})
    if (t->defined() && t->device() != q.device()) return false;
  if (q.dim() != 4 || k.sizes() != q.sizes() || v.dim() != 4 || g.dim() != 3) return false;
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), K = q.size(3), V = v.size(3);
  if (T < 1 || v.size(0) != B || v.size(1) != T || v.size(2) != H || g.sizes() != at::IntArrayRef{B, T, H}) return false;
  if (!at::isFloatingType(g.scalar_type())) return false;
  if (beta.defined() && (beta.sizes() != at::IntArrayRef{B, T, H} || !at::isFloatingType(beta.scalar_type())))
    return false;
  if (h0.defined() && h0.sizes() != at::IntArrayRef{B, H, K, V}) return false;
  if (B * H > 65535 || (T + 63) / 64 > 65535) return false;
  return tc::supported(int(K), int(V)) && tc::layout_ok();
}

std::pair<at::Tensor, at::Tensor> simple_gla_tc(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                const at::Tensor& g, double scale, const at::Tensor& h0) {
  if (!chunk_tc_eligible(q, k, v, g, at::Tensor(), h0)) throw std::invalid_argument("simple_gla_tc: inputs not eligible");
  c10::cuda::CUDAGuard guard(q.device());
  const auto dt = q.scalar_type();
  auto r = SimpleGlaTcFn::apply(prep(q, dt), prep(k, dt), prep(v, dt), g, h0_arg(h0, q), scale);
  return {r[0], r[1]};
}

std::pair<at::Tensor, at::Tensor> gated_delta_rule_tc(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                      const at::Tensor& g, const at::Tensor& beta, double scale,
                                                      const at::Tensor& h0) {
  if (!chunk_tc_eligible(q, k, v, g, beta, h0) || !beta.defined())
    throw std::invalid_argument("gated_delta_rule_tc: inputs not eligible");
  c10::cuda::CUDAGuard guard(q.device());
  const auto dt = q.scalar_type();
  auto r = GdnTcFn::apply(prep(q, dt), prep(k, dt), prep(v, dt), g, beta, h0_arg(h0, q), scale);
  return {r[0], r[1]};
}

#else

bool chunk_tc_eligible(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                       const at::Tensor&) {
  return false;
}
std::pair<at::Tensor, at::Tensor> simple_gla_tc(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                const at::Tensor&, double, const at::Tensor&) {
  throw std::runtime_error("simple_gla_tc: built without CUDA");
}
std::pair<at::Tensor, at::Tensor> gated_delta_rule_tc(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                      const at::Tensor&, const at::Tensor&, double,
                                                      const at::Tensor&) {
  throw std::runtime_error("gated_delta_rule_tc: built without CUDA");
}

#endif

}  // namespace mixbench::linear
