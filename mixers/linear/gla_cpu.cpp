// CPU forward of the chunked simple_gla (one log decay per head and token) on raw contiguous
// buffers, in the input dtype (fp32 or fp64), one task per (batch, head).
//
// Per chunk of C = 64 tokens (the last one zero-padded with k = v = q = 0 and g = 0, as in
// simple_gla_chunked, so that the work and the matrix-product shapes are those of
// simple_gla_chunked and of its FLOP accounting; b the inclusive cumulative log decay within the
// chunk; S the state entering the chunk):
//   A_ij = s (q_i·k_j) e^{b_i − b_j}  (j ≤ i, else 0)
//   o = [s e^b Q | A] [S; V]                           one product (S and the chunk's v adjacent)
//   S ← e^{b_L} S + (K ⊙ e^{b_L − b})ᵀ V               one product, in place
// When the range of b within the chunk is moderate (half of it ≤ 60 in fp32, ≤ 600 in fp64: no
// overflow, no denormals), the decay matrix is not formed: with c the midpoint of b's range,
// e^{b_i − b_j} = e^{b_i − c} e^{c − b_j} is folded into the rows of the product,
// A = (s e^{b−c} Q)(e^{c−b} K)ᵀ masked, and K ⊙ e^{b_L − b} = e^{b_L − c}·(e^{c−b} K). A per-row
// scaling of a dot product does not change its relative rounding error. Otherwise the decays are
// formed explicitly (one vectorized exp over [C,C], exponents masked to 0 above the diagonal).
// The matrix products and the exp run as ATen ops on views of the per-task buffers (BLAS,
// vectorized math); the element-wise parts are plain loops. The result equals simple_gla_chunked's
// (the same algorithm) up to rounding; the backward recomputes simple_gla_chunked under grad mode
// and differentiates it, so the gradients are exactly the chunked path's.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/record_function.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "mixers/common/layers.h"
#include "mixers/linear/gla_ops.h"
#include "mixers/linear/recompute.h"

namespace mixbench::linear {

namespace {

// dst[d] = a · src[d] (non-overlapping rows: vectorizable)
template <typename scalar_t>
inline void scale_row(scalar_t* __restrict__ dst, const scalar_t* __restrict__ src, scalar_t a, int64_t n) {
  for (int64_t d = 0; d < n; ++d) dst[d] = a * src[d];
}

template <typename scalar_t>
void simple_gla_fwd_kernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                           double scale_d, const at::Tensor& h0, at::Tensor& o, at::Tensor& ht) {
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), K = q.size(3), V = v.size(3);
  const int64_t C = kGlaChunk;
  const scalar_t* qp = q.data_ptr<scalar_t>();
  const scalar_t* kp = k.data_ptr<scalar_t>();
  const scalar_t* vp = v.data_ptr<scalar_t>();
  const scalar_t* gp = g.data_ptr<scalar_t>();
  const scalar_t* h0p = h0.defined() ? h0.data_ptr<scalar_t>() : nullptr;
  scalar_t* op = o.data_ptr<scalar_t>();
  scalar_t* hp = ht.data_ptr<scalar_t>();
  const scalar_t scale = scalar_t(scale_d);
  const auto opts = q.options();
  const int64_t KC = K + C;
  // Largest half-range of the cumulative decay within a chunk for the product form.
  const scalar_t kMaxG = std::is_same<scalar_t, float>::value ? scalar_t(60) : scalar_t(600);

  auto body = [&](int64_t begin, int64_t end) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    std::vector<scalar_t> QS(static_cast<size_t>(C * K)),  // s e^{b−c} q (direct) or s q
        KI(static_cast<size_t>(C * K)),                    // e^{c−b} k (direct) or k ⊙ e^{b_L − b}
        M(static_cast<size_t>(C * C)),                     // QS KIᵀ
        Gam(static_cast<size_t>(C * C)),                   // explicit decays
        X(static_cast<size_t>(C * KC)),                    // [s e^b Q | A], row stride K + C
        Y(static_cast<size_t>((K + C) * V)),               // [S; V]
        O(static_cast<size_t>(C * V)),                     // output rows of a tail chunk
        G(static_cast<size_t>(C));
    auto view = [&](scalar_t* p, at::IntArrayRef sizes, at::IntArrayRef strides) {
      return at::from_blob(p, sizes, strides, opts);
    };
    at::Tensor Sv = view(Y.data(), {K, V}, {V, 1});
    at::Tensor Vv = view(Y.data() + K * V, {C, V}, {V, 1});
    at::Tensor QSv = view(QS.data(), {C, K}, {K, 1});
    at::Tensor KIv = view(KI.data(), {C, K}, {K, 1});
    at::Tensor Mv = view(M.data(), {C, C}, {C, 1});
    at::Tensor Xv = view(X.data(), {C, K + C}, {KC, 1});
    at::Tensor Yv = view(Y.data(), {K + C, V}, {V, 1});
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      scalar_t* S = Y.data();
      if (h0p)
        std::copy(h0p + bh * K * V, h0p + (bh + 1) * K * V, S);
      else
        std::fill(S, S + K * V, scalar_t(0));
      for (int64_t t0 = 0; t0 < T; t0 += C) {
        const int64_t Lr = std::min(C, T - t0);  // real rows; the rest are zero padding
        const int64_t row0 = (b * T + t0) * H + h;
        scalar_t acc = 0, gmax = -std::numeric_limits<scalar_t>::infinity(),
                 gmin = std::numeric_limits<scalar_t>::infinity();
        for (int64_t i = 0; i < C; ++i) {
          if (i < Lr) acc += gp[row0 + i * H];
          G[i] = acc;
          gmax = std::max(gmax, acc);
          gmin = std::min(gmin, acc);
        }
        const scalar_t c = (gmax + gmin) / 2;
        const bool direct = (gmax - gmin) / 2 <= kMaxG;
        const scalar_t GL = G[C - 1];
        for (int64_t i = 0; i < C; ++i) {
          scalar_t* qd = QS.data() + i * K;
          scalar_t* kd = KI.data() + i * K;
          scalar_t* xi = X.data() + i * KC;
          scalar_t* vd = Y.data() + (K + i) * V;
          if (i >= Lr) {
            std::fill(qd, qd + K, scalar_t(0));
            std::fill(kd, kd + K, scalar_t(0));
            std::fill(xi, xi + K, scalar_t(0));
            std::fill(vd, vd + V, scalar_t(0));
            continue;
          }
          const int64_t row = row0 + i * H;
          const scalar_t* qi = qp + row * K;
          const scalar_t* ki = kp + row * K;
          std::copy(vp + row * V, vp + (row + 1) * V, vd);
          scale_row(xi, qi, scale * std::exp(G[i]), K);
          if (direct) {
            scale_row(qd, qi, scale * std::exp(G[i] - c), K);
            scale_row(kd, ki, std::exp(c - G[i]), K);
          } else {
            scale_row(qd, qi, scale, K);
            std::copy(ki, ki + K, kd);
          }
        }
        prefetch_rows<scalar_t>({{qp, K}, {kp, K}, {vp, V}}, row0, H, Lr, std::min(C, T - t0 - Lr));  // next chunk
        at::mm_out(Mv, QSv, KIv.t());
        if (!direct) {
          for (int64_t i = 0; i < C; ++i) {
            scalar_t* gi = Gam.data() + i * C;
            for (int64_t j = 0; j <= i; ++j) gi[j] = G[i] - G[j];
            for (int64_t j = i + 1; j < C; ++j) gi[j] = 0;  // masked below
          }
          at::Tensor Gv = view(Gam.data(), {C * C}, {1});
          at::exp_(Gv);
        }
        for (int64_t i = 0; i < C; ++i) {
          const scalar_t* mi = M.data() + i * C;
          scalar_t* ai = X.data() + i * KC + K;
          if (direct) {
            for (int64_t j = 0; j <= i; ++j) ai[j] = mi[j];
          } else {
            const scalar_t* gi = Gam.data() + i * C;
            for (int64_t j = 0; j <= i; ++j) ai[j] = mi[j] * gi[j];
          }
          for (int64_t j = i + 1; j < C; ++j) ai[j] = 0;
        }
        // o = [s e^b Q | A] [S; V], written in place into o[b, t0:t0+C, h, :]
        at::Tensor Ov = Lr == C ? view(op + row0 * V, {C, V}, {H * V, 1}) : view(O.data(), {C, V}, {V, 1});
        at::mm_out(Ov, Xv, Yv);
        if (Lr < C)
          for (int64_t i = 0; i < Lr; ++i) std::copy(O.data() + i * V, O.data() + (i + 1) * V, op + (row0 + i * H) * V);
        // S ← e^{b_L} S + (K ⊙ e^{b_L − b})ᵀ V  (= e^{b_L − c}·(e^{c−b} K)ᵀ V in the direct form)
        if (direct) {
          at::addmm_out(Sv, Sv, KIv.t(), Vv, /*beta=*/std::exp(GL), /*alpha=*/std::exp(GL - c));
        } else {
          for (int64_t i = 0; i < C; ++i) {
            const scalar_t r = std::exp(GL - G[i]);
            scalar_t* kd = KI.data() + i * K;
            for (int64_t d = 0; d < K; ++d) kd[d] *= r;
          }
          at::addmm_out(Sv, Sv, KIv.t(), Vv, /*beta=*/std::exp(GL), /*alpha=*/1);
        }
      }
      std::copy(S, S + K * V, hp + bh * K * V);
    }
  };
  // With RecordFunction observers on this thread (profilers, FLOP counters) the tasks run on it, so
  // that every recorded op is seen by them; otherwise one task per (batch, head) in parallel.
  if (at::hasThreadLocalCallbacks())
    body(0, B * H);
  else
    at::parallel_for(0, B * H, 1, body);
}

std::pair<at::Tensor, at::Tensor> simple_gla_fwd_cpu(const at::Tensor& q0, const at::Tensor& k0, const at::Tensor& v0,
                                                     const at::Tensor& g0, double scale, const at::Tensor& h00) {
  auto c = [](const at::Tensor& x) { return x.defined() ? x.contiguous() : x; };
  const at::Tensor q = c(q0), k = c(k0), v = c(v0), g = c(g0), h0 = c(h00);
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), K = q.size(3), V = v.size(3);
  at::Tensor o = at::empty({B, T, H, V}, q.options());
  at::Tensor ht = at::empty({B, H, K, V}, q.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "simple_gla_fwd_cpu", [&] {
    simple_gla_fwd_kernel<scalar_t>(q, k, v, g, scale, h0, o, ht);
  });
  return {o, ht};
}


}  // namespace

std::pair<at::Tensor, at::Tensor> simple_gla_chunked_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                         const at::Tensor& g, double scale, const at::Tensor& h0) {
  if (layers::is_half(q)) {
    auto [o, ht] = simple_gla_chunked_cpu(layers::f32(q), layers::f32(k), layers::f32(v), layers::f32(g), scale,
                                          layers::f32(h0));
    return {o.to(q.scalar_type()), ht};
  }
  if (!(q.dim() == 4 && g.dim() == 3 && raw_cpu_inputs({&q, &k, &v, &g, &h0})))
    return simple_gla_chunked(q, k, v, g, scale, h0);
  return raw_forward_chunked_backward(q, k, v, g, scale, h0, simple_gla_fwd_cpu, simple_gla_chunked);
}

}  // namespace mixbench::linear
