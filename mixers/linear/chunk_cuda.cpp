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
  at::Tensor gf = g.to(at::kFloat).contiguous();
  at::Tensor b = at::empty({B, NT * 64, H}, gf.options());
  tc::chunk_cumsum(gf.data_ptr<float>(), b.data_ptr<float>(), int(B), int(T), int(H), stream());
  return b;
}
const float* fptr(const at::Tensor& t) { return t.defined() && t.numel() > 0 ? t.data_ptr<float>() : nullptr; }
// Function::apply needs every tensor argument defined (it records each input's device): an absent
// h0 travels as an empty tensor and is undefined again inside.
at::Tensor h0_arg(const at::Tensor& h0, const at::Tensor& like) {
  return h0.defined() ? prep(h0, at::kFloat) : at::empty({0}, like.options().dtype(at::kFloat));
}
at::Tensor h0_in(const at::Tensor& h0) { return present(h0); }

// Gradient of the log decay g (fp32 [B,T,H]) on the decay_grad kernel (chunk_kernels.h) from
// chunk_dqkv's row dots xdot = q_i·dq_i − k_i·dk_i, y and z (and x2, the delta rule's direct gradient
// of the cumulative gates), per chunk: x_i = xdot_i + y_i (+ x2_i), dg_t = Σ_{i≥t} x_i + Σ_{j<t} y_j + z_c.
at::Tensor decay_grad(const tc::Dims& d, const at::Tensor& q, const at::Tensor& xdot, const at::Tensor& y,
                      const at::Tensor& z, const at::Tensor& x2) {
  at::Tensor dg = at::empty({d.B, d.T, d.H}, q.options().dtype(at::kFloat));
  tc::decay_grad(dtype_of(q), nullptr, nullptr, nullptr, nullptr, y.data_ptr<float>(), z.data_ptr<float>(), fptr(x2),
                 dg.data_ptr<float>(), nullptr, nullptr, d, stream(), xdot.data_ptr<float>());
  return dg;
}

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
    // dq, dk in the input dtype and the decay gradient's row dots straight from chunk_dqkv
    auto f32 = q.options().dtype(at::kFloat);
    at::Tensor dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
    at::Tensor xdot = at::empty({d.B, d.T, d.H}, f32), y = at::empty({d.B, d.T, d.H}, f32);
    at::Tensor z = at::empty({d.B, NT, d.H}, f32);
    tc::chunk_dqkv(dtype_of(q), q.data_ptr(), k.data_ptr(), v.data_ptr(), d_o.data_ptr(), f.b.data_ptr<float>(),
                   f.hs.data_ptr(), dhs.data_ptr(), nullptr, nullptr, dv.data_ptr(), y.data_ptr<float>(),
                   z.data_ptr<float>(), float(scale), d, stream(), dq.data_ptr(), dk.data_ptr(), xdot.data_ptr<float>());
    at::Tensor dg = decay_grad(d, q, xdot, y, z, at::Tensor());
    return {dq, dk, dv, dg.to(g.scalar_type()),
            h0.defined() ? dh0.to(h0.scalar_type()) : at::Tensor(), at::Tensor()};
  }
};

// The delta rule's WY preparation (delta_prep: w, u and, with_x, the per-chunk inverse X in fp32)
// and its forward walk (per-chunk states hs, v_new, final state ht).
struct DeltaPrep {
  at::Tensor b, betaf, w, u, X;
};
DeltaPrep delta_prepare(const at::Tensor& k, const at::Tensor& v, const at::Tensor& g, const at::Tensor& beta,
                        bool with_x) {
  const tc::Dims d = dims(k, v);
  DeltaPrep p;
  p.b = chunk_cumsum(g);
  p.betaf = beta.to(at::kFloat).contiguous();
  p.w = at::empty_like(k);
  p.u = at::empty_like(v);
  if (with_x) p.X = at::empty({d.B, d.H, tc::num_chunks(d.T), 64, 64}, k.options().dtype(at::kFloat));
  tc::delta_prep(dtype_of(k), k.data_ptr(), v.data_ptr(), p.betaf.data_ptr<float>(), p.b.data_ptr<float>(),
                 p.w.data_ptr(), p.u.data_ptr(), with_x ? p.X.data_ptr<float>() : nullptr, d, stream());
  return p;
}
struct DeltaWalk {
  at::Tensor hs, vn, ht;
};
DeltaWalk delta_walk(const at::Tensor& k, const at::Tensor& v, const DeltaPrep& p, const at::Tensor& h0,
                     const at::Tensor& ht_out) {
  const tc::Dims d = dims(k, v);
  DeltaWalk r{at::empty({d.B, d.H, tc::num_chunks(d.T), d.K, d.V}, k.options()), at::empty_like(v), ht_out};
  if (!r.ht.defined()) r.ht = at::empty({d.B, d.H, d.K, d.V}, k.options().dtype(at::kFloat));
  tc::walk_fwd(dtype_of(k), k.data_ptr(), p.u.data_ptr(), p.w.data_ptr(), p.b.data_ptr<float>(), fptr(h0),
               r.hs.data_ptr(), r.vn.data_ptr(), r.ht.data_ptr<float>(), d, stream());
  return r;
}

struct GdnTcFn : public torch::autograd::Function<GdnTcFn> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q,
                                                const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                                                const at::Tensor& beta, const at::Tensor& h0, double scale) {
    ctx->saved_data["scale"] = scale;
    ctx->save_for_backward({q, k, v, g, beta, h0});
    const tc::Dims d = dims(q, v);
    const DeltaPrep p = delta_prepare(k, v, g, beta, /*with_x=*/false);
    at::Tensor ht = alloc_output({d.B, d.H, d.K, d.V}, q.options().dtype(at::kFloat));
    at::Tensor o = alloc_output({d.B, d.T, d.H, d.V}, v.options());
    if (tc::prefer_fused(d)) {
      tc::fused_fwd(dtype_of(q), q.data_ptr(), k.data_ptr(), p.u.data_ptr(), p.w.data_ptr(), p.b.data_ptr<float>(),
                    fptr(h0), o.data_ptr(), ht.data_ptr<float>(), float(scale), d, stream());
    } else {
      const DeltaWalk f = delta_walk(k, v, p, h0, ht);
      tc::chunk_output(dtype_of(q), q.data_ptr(), k.data_ptr(), f.vn.data_ptr(), p.b.data_ptr<float>(),
                       f.hs.data_ptr(), o.data_ptr(), float(scale), d, stream());
    }
    return {o, ht};
  }
  // Backward on the kernels: delta_prep (w, u and X) and the forward walk (states and v_new per
  // chunk) recomputed; dv_local = Pᵀ do; the reverse walk (state gradients and du per chunk);
  // chunk_dqkv with v_new as the values (dq, and the key gradient of the output and state products);
  // delta_wy_bwd (the rest of dk, dv, dβ and the gates' direct gradient); dg from per-chunk sums.
  // The algebra is gated_delta_backward's (delta_chunk.h), checked against autograd.
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto s = ctx->get_saved_variables();
    const at::Tensor &q = s[0], &k = s[1], &v = s[2], &g = s[3], &beta = s[4];
    const at::Tensor h0 = h0_in(s[5]);
    const double scale = ctx->saved_data["scale"].toDouble();
    c10::cuda::CUDAGuard guard(q.device());
    const tc::Dims d = dims(q, v);
    const int64_t NT = tc::num_chunks(d.T);
    const tc::Dtype dt = dtype_of(q);
    auto f32 = q.options().dtype(at::kFloat);
    at::Tensor d_o = grads[0].defined() ? prep(grads[0], q.scalar_type()) : at::zeros_like(v);
    at::Tensor dht = grads[1].defined() ? prep(grads[1], at::kFloat) : at::Tensor();
    const DeltaPrep p = delta_prepare(k, v, g, beta, /*with_x=*/true);
    const DeltaWalk f = delta_walk(k, v, p, h0, at::Tensor());
    const at::Tensor &b = p.b, &w = p.w, &X = p.X, &betaf = p.betaf, &hs = f.hs, &vn = f.vn;
    at::Tensor dvl = at::empty_like(v);
    tc::delta_dv_local(dt, q.data_ptr(), k.data_ptr(), d_o.data_ptr(), b.data_ptr<float>(), dvl.data_ptr(),
                       float(scale), d, stream());
    at::Tensor dhs = at::empty_like(hs), du = at::empty_like(v), dh0 = at::empty({d.B, d.H, d.K, d.V}, f32);
    tc::walk_bwd_delta(dt, q.data_ptr(), d_o.data_ptr(), k.data_ptr(), w.data_ptr(), dvl.data_ptr(),
                       b.data_ptr<float>(), fptr(dht), dhs.data_ptr(), du.data_ptr(), dh0.data_ptr<float>(),
                       float(scale), d, stream());
    // dq in the input dtype, the key gradient in fp32 (delta_wy_bwd adds its part) and the decay
    // gradient's row dots from chunk_dqkv
    at::Tensor dq = at::empty_like(q), dkf = at::empty({d.B, d.T, d.H, d.K}, f32);
    at::Tensor xdot = at::empty({d.B, d.T, d.H}, f32), y = at::empty({d.B, d.T, d.H}, f32);
    at::Tensor z = at::empty({d.B, NT, d.H}, f32);
    // chunk_dqkv's value gradient would be du again (already known): not formed
    tc::chunk_dqkv(dt, q.data_ptr(), k.data_ptr(), vn.data_ptr(), d_o.data_ptr(), b.data_ptr<float>(), hs.data_ptr(),
                   dhs.data_ptr(), nullptr, dkf.data_ptr<float>(), nullptr, y.data_ptr<float>(),
                   z.data_ptr<float>(), float(scale), d, stream(), dq.data_ptr(), nullptr, xdot.data_ptr<float>());
    at::Tensor dk = at::empty_like(k), dv = at::empty_like(v);
    at::Tensor dbeta = at::empty({d.B, d.T, d.H}, f32), x2 = at::empty({d.B, d.T, d.H}, f32);
    tc::delta_wy_bwd(dt, k.data_ptr(), v.data_ptr(), du.data_ptr(), hs.data_ptr(), X.data_ptr<float>(),
                     betaf.data_ptr<float>(), b.data_ptr<float>(), dkf.data_ptr<float>(), dk.data_ptr(), dv.data_ptr(),
                     dbeta.data_ptr<float>(), x2.data_ptr<float>(), d, stream());
    at::Tensor dg = decay_grad(d, q, xdot, y, z, x2);
    return {dq, dk, dv, dg.to(g.scalar_type()), dbeta.to(beta.scalar_type()),
            h0.defined() ? dh0.to(h0.scalar_type()) : at::Tensor(), at::Tensor()};
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
