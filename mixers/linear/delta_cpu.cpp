// CPU forward of the chunked delta rule for the None and Head gates (delta_rule, gated_delta_rule)
// on raw contiguous buffers, in the input dtype (fp32 or fp64), one task per (batch, head).
//
// Per chunk of C = min(64, T) tokens (the last one zero-padded, as in delta_chunked, so that the
// work and the matrix-product shapes are those of delta_chunked and of its FLOP accounting; G the
// inclusive cumulative log gate within the chunk, 0 without a gate; S the state entering the chunk;
// L = C below):
//   M = [s·Q; K] Kᵀ                                   one product [2L,K]×[K,L]
//   Γ_ij = exp(G_i − G_j) (j ≤ i, else 0)              one vectorized exp over [L,L]
//   A_ij = β_i (k_i·k_j) Γ_ij (j < i),  P_ij = s (q_i·k_j) Γ_ij (j ≤ i)
//   (I + A) [W U] = [β e^G K | β V]                    unit lower-triangular solve
//   v_new = U − W S                                    one product
//   o = [s e^G Q | P] [S; v_new]                       one product (S and v_new adjacent in memory)
//   S ← e^{G_L} S + (K ⊙ e^{G_L − G})ᵀ v_new           one product, in place
// When the range of G within the chunk is moderate (half of it ≤ 60 in fp32, ≤ 600 in fp64: no
// overflow, no denormals), Γ is not formed: with c the midpoint of G's range,
// Γ_ij = e^{G_i − c} e^{c − G_j} is folded into the rows of the product,
// M = [s e^{G−c} Q; e^{G−c} K](e^{c−G} K)ᵀ, and K_r = e^{G_L − c}·(e^{c−G} K). A per-row scaling
// of a dot product does not change its relative rounding error. Otherwise Γ is formed as above.
// The matrix products, the exp and the solve run as ATen ops on views of the per-task buffers
// (BLAS, vectorized math); the element-wise parts are plain loops. The result equals delta_chunked's
// (the same algorithm) up to rounding; the backward recomputes delta_chunked under grad mode and
// differentiates it, so the gradients are exactly the chunked path's.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <type_traits>
#include <limits>
#include <vector>

#include "mixers/common/layers.h"
#include "mixers/linear/delta_chunk.h"
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
void delta_fwd_kernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& beta,
                      const at::Tensor& g, double scale_d, const at::Tensor& h0, int64_t C, at::Tensor& o,
                      at::Tensor& ht) {
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), K = q.size(3), V = v.size(3);
  const scalar_t* qp = q.data_ptr<scalar_t>();
  const scalar_t* kp = k.data_ptr<scalar_t>();
  const scalar_t* vp = v.data_ptr<scalar_t>();
  const scalar_t* bp = beta.data_ptr<scalar_t>();
  const scalar_t* gp = g.defined() ? g.data_ptr<scalar_t>() : nullptr;
  const scalar_t* h0p = h0.defined() ? h0.data_ptr<scalar_t>() : nullptr;
  scalar_t* op = o.data_ptr<scalar_t>();
  scalar_t* hp = ht.data_ptr<scalar_t>();
  const scalar_t scale = scalar_t(scale_d);
  const auto opts = q.options();
  const int64_t KV = K + V, KC = K + C;
  // Largest |cumulative gate| within a chunk for the product form of the decays.
  const scalar_t kMaxG = std::is_same<scalar_t, float>::value ? scalar_t(60) : scalar_t(600);

  auto body = [&](int64_t begin, int64_t end) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    // Per-task buffers.
    std::vector<scalar_t> QK(static_cast<size_t>(2 * C * K)),  // rows 0..L-1: s·q, rows L..2L-1: k (then K_r)
        M(static_cast<size_t>(2 * C * C)),                     // [s·Q; K] Kᵀ
        Gam(static_cast<size_t>(C * C)),                       // Γ
        A(static_cast<size_t>(C * C)),                         // strictly lower β (k·k) Γ
        R(static_cast<size_t>(C * KV)), WU(static_cast<size_t>(C * KV)),    // right-hand side, solution [W U]
        X(static_cast<size_t>(C * KC)),                        // [s e^G Q | P], row stride K + C
        Y(static_cast<size_t>((K + C) * V)),                   // [S; v_new]
        KI(static_cast<size_t>(C * K)),                        // e^{c−G} k (direct form)
        O(static_cast<size_t>(C * V)),                         // output rows of a tail chunk
        G(static_cast<size_t>(C)), Bt(static_cast<size_t>(C));
    auto view = [&](scalar_t* p, at::IntArrayRef sizes, at::IntArrayRef strides) {
      return at::from_blob(p, sizes, strides, opts);
    };
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      scalar_t* S = Y.data();
      if (h0p)
        std::copy(h0p + bh * K * V, h0p + (bh + 1) * K * V, S);
      else
        std::fill(S, S + K * V, scalar_t(0));
      at::Tensor Sv = view(S, {K, V}, {V, 1});
      for (int64_t t0 = 0; t0 < T; t0 += C) {
        // Lr real rows; a tail chunk is zero-padded to C rows (k = 0, β = 0, g = 0: they write
        // nothing and decay nothing), so every chunk does the same work as in delta_chunked.
        const int64_t Lr = std::min(C, T - t0), L = C;
        // cumulative gates; the product form e^{G_i}·e^{−G_j} replaces Γ_ij = e^{G_i − G_j} when
        // max |G| ≤ kMaxG (no overflow, no denormals; the scaling does not change relative errors)
        const int64_t row0 = (b * T + t0) * H + h;
        scalar_t acc = 0, gmax = 0, gmin = 0;
        for (int64_t i = 0; i < L; ++i) {
          if (gp && i < Lr) acc += gp[row0 + i * H];
          G[i] = acc;
          gmax = std::max(gmax, acc);
          gmin = std::min(gmin, acc);
        }
        const scalar_t c = (gmax + gmin) / 2;  // e^{G−c}, e^{c−G} lie within e^{±kMaxG}
        const bool direct = !gp || (gmax - gmin) / 2 <= kMaxG;
        for (int64_t i = 0; i < L; ++i) {
          if (i >= Lr) {
            Bt[i] = 0;
            std::fill(QK.data() + i * K, QK.data() + (i + 1) * K, scalar_t(0));
            std::fill(QK.data() + (L + i) * K, QK.data() + (L + i + 1) * K, scalar_t(0));
            std::fill(KI.data() + i * K, KI.data() + (i + 1) * K, scalar_t(0));
            std::fill(X.data() + i * KC, X.data() + i * KC + K, scalar_t(0));
            std::fill(R.data() + i * KV, R.data() + (i + 1) * KV, scalar_t(0));
            continue;
          }
          const int64_t row = row0 + i * H;
          const scalar_t* qi = qp + row * K;
          const scalar_t* ki = kp + row * K;
          const scalar_t* vi = vp + row * V;
          const scalar_t bi = bp[row];
          Bt[i] = bi;
          const scalar_t e = gp ? std::exp(G[i]) : scalar_t(1);
          scalar_t* qd = QK.data() + i * K;
          scalar_t* kd = QK.data() + (L + i) * K;
          scalar_t* kn = KI.data() + i * K;  // e^{c−G} k (direct form)
          scalar_t* ri = R.data() + i * KV;
          scalar_t* xi = X.data() + i * KC;
          const scalar_t be = bi * e, se = scale * e;
          if (direct) {
            const scalar_t ec = gp ? std::exp(G[i] - c) : scalar_t(1), en = gp ? std::exp(c - G[i]) : scalar_t(1);
            scale_row(qd, qi, scale * ec, K);
            scale_row(kd, ki, ec, K);
            scale_row(kn, ki, en, K);
          } else {
            scale_row(qd, qi, scale, K);
            std::copy(ki, ki + K, kd);
          }
          scale_row(xi, qi, se, K);
          scale_row(ri, ki, be, K);
          scale_row(ri + K, vi, bi, V);
        }
        prefetch_rows<scalar_t>({{qp, K}, {kp, K}, {vp, V}}, row0, H, Lr, std::min(C, T - t0 - Lr));  // next chunk
        // M = [Q'; K'] K''ᵀ: direct [s e^{G−c} Q; e^{G−c} K](e^{c−G} K)ᵀ, else [s Q; K] Kᵀ (Γ below)
        at::Tensor QKv = view(QK.data(), {2 * L, K}, {K, 1});
        at::Tensor Kc = QKv.narrow(0, L, L);
        at::Tensor KIv = view(KI.data(), {L, K}, {K, 1});
        at::Tensor Mv = view(M.data(), {2 * L, L}, {L, 1});
        at::mm_out(Mv, QKv, (direct ? KIv : Kc).t());
        if (!direct) {
          for (int64_t i = 0; i < L; ++i) {
            scalar_t* gi = Gam.data() + i * L;
            for (int64_t j = 0; j <= i; ++j) gi[j] = G[i] - G[j];
            for (int64_t j = i + 1; j < L; ++j) gi[j] = 0;  // masked below
          }
          at::Tensor Gv = view(Gam.data(), {L * L}, {1});
          at::exp_(Gv);
        }
        for (int64_t i = 0; i < L; ++i) {
          const scalar_t bi = Bt[i];
          const scalar_t* mq = M.data() + i * L;
          const scalar_t* mk = M.data() + (L + i) * L;
          scalar_t* ai = A.data() + i * L;
          scalar_t* pi = X.data() + i * KC + K;
          if (direct) {
            for (int64_t j = 0; j < i; ++j) ai[j] = bi * mk[j];
            for (int64_t j = 0; j <= i; ++j) pi[j] = mq[j];
          } else {
            const scalar_t* gi = Gam.data() + i * L;
            for (int64_t j = 0; j < i; ++j) ai[j] = bi * mk[j] * gi[j];
            for (int64_t j = 0; j <= i; ++j) pi[j] = mq[j] * gi[j];
          }
          for (int64_t j = i; j < L; ++j) ai[j] = 0;
          for (int64_t j = i + 1; j < L; ++j) pi[j] = 0;
        }
        at::Tensor Av = view(A.data(), {L, L}, {L, 1});
        at::Tensor Rv = view(R.data(), {L, KV}, {KV, 1});
        at::Tensor WUv = view(WU.data(), {L, KV}, {KV, 1});
        at::linalg_solve_triangular_out(WUv, Av, Rv, /*upper=*/false, /*left=*/true, /*unitriangular=*/true);
        // v_new = U − W S, stored under S
        at::Tensor Vn = view(Y.data() + K * V, {L, V}, {V, 1});
        at::addmm_out(Vn, WUv.narrow(1, K, V), WUv.narrow(1, 0, K), Sv, /*beta=*/1, /*alpha=*/-1);
        // o = [s e^G Q | P] [S; v_new], written in place into o[b, t0:t0+L, h, :]
        at::Tensor Ov = Lr == L ? view(op + row0 * V, {L, V}, {H * V, 1}) : view(O.data(), {L, V}, {V, 1});
        at::mm_out(Ov, view(X.data(), {L, K + L}, {KC, 1}), view(Y.data(), {K + L, V}, {V, 1}));
        if (Lr < L)
          for (int64_t i = 0; i < Lr; ++i) std::copy(O.data() + i * V, O.data() + (i + 1) * V, op + (row0 + i * H) * V);
        // S ← e^{G_L} S + K_rᵀ v_new,  K_r = k ⊙ e^{G_L − G} (= e^{G_L − c} · e^{c − G} k in the direct form)
        const scalar_t GL = G[L - 1], eGL = gp ? std::exp(GL) : scalar_t(1);
        if (direct) {
          at::addmm_out(Sv, Sv, KIv.t(), Vn, /*beta=*/eGL, /*alpha=*/gp ? std::exp(GL - c) : scalar_t(1));
        } else {
          for (int64_t i = 0; i < L; ++i) {
            const scalar_t r = std::exp(GL - G[i]);
            scalar_t* kd = QK.data() + (L + i) * K;
            for (int64_t d = 0; d < K; ++d) kd[d] *= r;
          }
          at::addmm_out(Sv, Sv, Kc.t(), Vn, /*beta=*/eGL, /*alpha=*/1);
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

// Per-key-dim gates (kda with β, gla without): the same chunk structure with G [L,K] and
// Γ_ij[d] = exp(G_id − G_jd). With c_d the midpoint of channel d's range within the chunk, when
// the gates are non-positive and every half-range is ≤ kMaxG, Γ_ij[d] = e^{G_id − c_d} e^{c_d − G_jd}
// is folded into the operands (per element instead of per row) and
// M = [s e^{G−c} ⊙ Q; e^{G−c} ⊙ K](e^{c−G} ⊙ K)ᵀ is one product; otherwise M is formed pair by
// pair with the explicit exponent G_i − G_j (never positive for decays), as the LibTorch path
// does. The other decays, e^{G} (readout) and e^{G_L − G} (state update), are products of factors
// within e^{±kMaxG} in the first case and explicit exponentials in the second.
// Without β (gla) there is no solve: v_new = V, and only the query rows of M are formed.
template <typename scalar_t>
void keygate_fwd_kernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& beta,
                        const at::Tensor& g, double scale_d, const at::Tensor& h0, int64_t C, at::Tensor& o,
                        at::Tensor& ht) {
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), K = q.size(3), V = v.size(3);
  const scalar_t* qp = q.data_ptr<scalar_t>();
  const scalar_t* kp = k.data_ptr<scalar_t>();
  const scalar_t* vp = v.data_ptr<scalar_t>();
  const scalar_t* bp = beta.defined() ? beta.data_ptr<scalar_t>() : nullptr;  // null: gla
  const scalar_t* gp = g.data_ptr<scalar_t>();
  const scalar_t* h0p = h0.defined() ? h0.data_ptr<scalar_t>() : nullptr;
  scalar_t* op = o.data_ptr<scalar_t>();
  scalar_t* hp = ht.data_ptr<scalar_t>();
  const scalar_t scale = scalar_t(scale_d);
  const auto opts = q.options();
  const bool delta = bp != nullptr;
  const int64_t KV = K + V, KC = K + C, MR = delta ? 2 * C : C;  // rows of M
  const scalar_t kMaxG = std::is_same<scalar_t, float>::value ? scalar_t(60) : scalar_t(600);

  auto body = [&](int64_t begin, int64_t end) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    std::vector<scalar_t> GR(static_cast<size_t>(C * K)),  // cumulative gates G
        E(static_cast<size_t>(C * K)),                     // e^{G−c}
        EN(static_cast<size_t>(C * K)),                    // e^{c−G}
        QK(static_cast<size_t>(MR * K)),                   // [s e^{G−c} q; e^{G−c} k] (or [s q; k])
        KI(static_cast<size_t>(C * K)),                    // e^{c−G} k (or k), then K_r
        M(static_cast<size_t>(MR * C)), A(static_cast<size_t>(C * C)),
        R(static_cast<size_t>(C * KV)), WU(static_cast<size_t>(C * KV)),
        X(static_cast<size_t>(C * KC)),       // [s e^G Q | P]
        Y(static_cast<size_t>((K + C) * V)),  // [S; v_new]
        O(static_cast<size_t>(C * V)), gmax(static_cast<size_t>(K)), gmin(static_cast<size_t>(K)),
        ec(static_cast<size_t>(K)), eL(static_cast<size_t>(K)), Bt(static_cast<size_t>(C));
    auto view = [&](scalar_t* p, at::IntArrayRef sizes, at::IntArrayRef strides) {
      return at::from_blob(p, sizes, strides, opts);
    };
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      scalar_t* S = Y.data();
      scalar_t* Vn = Y.data() + K * V;
      if (h0p)
        std::copy(h0p + bh * K * V, h0p + (bh + 1) * K * V, S);
      else
        std::fill(S, S + K * V, scalar_t(0));
      at::Tensor Sv = view(S, {K, V}, {V, 1});
      for (int64_t t0 = 0; t0 < T; t0 += C) {
        // Lr real rows; a tail chunk is zero-padded to C rows (k = 0, β = 0, g = 0)
        const int64_t Lr = std::min(C, T - t0), L = C;
        const int64_t row0 = (b * T + t0) * H + h;
        std::fill(gmax.begin(), gmax.end(), scalar_t(0));
        std::fill(gmin.begin(), gmin.end(), scalar_t(0));
        for (int64_t i = 0; i < L; ++i) {
          scalar_t* gi = GR.data() + i * K;
          const scalar_t* src = gp + (row0 + i * H) * K;
          for (int64_t d = 0; d < K; ++d) {
            const scalar_t x = (i ? gi[d - K] : scalar_t(0)) + (i < Lr ? src[d] : scalar_t(0));
            gi[d] = x;
            gmax[d] = std::max(gmax[d], x);
            gmin[d] = std::min(gmin[d], x);
          }
        }
        bool direct = true;
        for (int64_t d = 0; d < K; ++d) {
          direct = direct && gmax[d] <= scalar_t(0) && (gmax[d] - gmin[d]) / 2 <= kMaxG;
          ec[d] = (gmax[d] + gmin[d]) / 2;           // c
          eL[d] = std::exp(GR[(L - 1) * K + d]);     // e^{G_L}
        }
        if (direct) {
          for (int64_t i = 0; i < L; ++i)
            for (int64_t d = 0; d < K; ++d) E[size_t(i * K + d)] = GR[size_t(i * K + d)] - ec[d];
          at::Tensor Ev = view(E.data(), {L * K}, {1});
          at::exp_(Ev);  // vectorized
          for (int64_t i = 0; i < L * K; ++i) EN[size_t(i)] = scalar_t(1) / E[size_t(i)];
          for (int64_t d = 0; d < K; ++d) ec[d] = std::exp(ec[d]);  // e^{c} ≥ e^{−kMaxG}
        }
        for (int64_t i = 0; i < L; ++i) {
          scalar_t* xi = X.data() + i * KC;
          scalar_t* ri = R.data() + i * KV;
          scalar_t* qd = QK.data() + i * K;
          scalar_t* kd = delta ? QK.data() + (L + i) * K : nullptr;
          scalar_t* kn = KI.data() + i * K;
          if (i >= Lr) {
            std::fill(xi, xi + K, scalar_t(0));
            std::fill(qd, qd + K, scalar_t(0));
            if (kd) std::fill(kd, kd + K, scalar_t(0));
            std::fill(kn, kn + K, scalar_t(0));
            std::fill(ri, ri + KV, scalar_t(0));
            if (!delta) std::fill(Vn + i * V, Vn + (i + 1) * V, scalar_t(0));
            Bt[size_t(i)] = 0;
            continue;
          }
          const int64_t row = row0 + i * H;
          const scalar_t* qi = qp + row * K;
          const scalar_t* ki = kp + row * K;
          const scalar_t* vi = vp + row * V;
          const scalar_t bi = delta ? bp[row] : scalar_t(1);
          Bt[size_t(i)] = bi;
          if (direct) {
            const scalar_t* e = E.data() + i * K;
            const scalar_t* en = EN.data() + i * K;
            for (int64_t d = 0; d < K; ++d) {
              const scalar_t eg = ec[d] * e[d];  // e^{G}
              xi[d] = scale * eg * qi[d];
              qd[d] = scale * e[d] * qi[d];
              kn[d] = en[d] * ki[d];
              ri[d] = bi * eg * ki[d];
            }
            if (kd)
              for (int64_t d = 0; d < K; ++d) kd[d] = e[d] * ki[d];
          } else {
            const scalar_t* gi = GR.data() + i * K;
            for (int64_t d = 0; d < K; ++d) {
              const scalar_t eg = std::exp(gi[d]);
              xi[d] = scale * eg * qi[d];
              ri[d] = bi * eg * ki[d];
            }
          }
          if (delta)
            scale_row(ri + K, vi, bi, V);
          else
            std::copy(vi, vi + V, Vn + i * V);  // v_new = v
        }
        prefetch_rows<scalar_t>({{qp, K}, {kp, K}, {gp, K}, {vp, V}}, row0, H, Lr, std::min(C, T - t0 - Lr));
        if (direct) {
          at::Tensor Mv = view(M.data(), {MR, L}, {L, 1});
          at::mm_out(Mv, view(QK.data(), {MR, K}, {K, 1}), view(KI.data(), {L, K}, {K, 1}).t());
        } else {
          for (int64_t i = 0; i < Lr; ++i) {
            const scalar_t* qi = qp + (row0 + i * H) * K;
            const scalar_t* ki = kp + (row0 + i * H) * K;
            const scalar_t* gi = GR.data() + i * K;
            for (int64_t j = 0; j <= i; ++j) {
              const scalar_t* kj = kp + (row0 + j * H) * K;
              const scalar_t* gj = GR.data() + j * K;
              scalar_t mq = 0, mk = 0;
              for (int64_t d = 0; d < K; ++d) {
                const scalar_t w = std::exp(gi[d] - gj[d]) * kj[d];
                mq += qi[d] * w;
                mk += ki[d] * w;
              }
              M[size_t(i * L + j)] = scale * mq;
              if (delta) M[size_t((L + i) * L + j)] = mk;
            }
          }
        }
        // P (query rows, j ≤ i) beside s e^G Q; A (key rows, j < i) scaled by β_i
        for (int64_t i = 0; i < L; ++i) {
          const scalar_t* mq = M.data() + i * L;
          scalar_t* pi = X.data() + i * KC + K;
          for (int64_t j = 0; j <= i; ++j) pi[j] = i < Lr ? mq[j] : scalar_t(0);
          for (int64_t j = i + 1; j < L; ++j) pi[j] = 0;
          if (delta) {
            const scalar_t* mk = M.data() + (L + i) * L;
            scalar_t* ai = A.data() + i * L;
            for (int64_t j = 0; j < i; ++j) ai[j] = i < Lr ? Bt[size_t(i)] * mk[j] : scalar_t(0);
            for (int64_t j = i; j < L; ++j) ai[j] = 0;
          }
        }
        at::Tensor Vnv = view(Vn, {L, V}, {V, 1});
        if (delta) {
          at::Tensor WUv = view(WU.data(), {L, KV}, {KV, 1});
          at::linalg_solve_triangular_out(WUv, view(A.data(), {L, L}, {L, 1}), view(R.data(), {L, KV}, {KV, 1}),
                                          /*upper=*/false, /*left=*/true, /*unitriangular=*/true);
          at::addmm_out(Vnv, WUv.narrow(1, K, V), WUv.narrow(1, 0, K), Sv, /*beta=*/1, /*alpha=*/-1);
        }
        // o = [s e^G Q | P] [S; v_new]
        at::Tensor Ov = Lr == L ? view(op + row0 * V, {L, V}, {H * V, 1}) : view(O.data(), {L, V}, {V, 1});
        at::mm_out(Ov, view(X.data(), {L, K + L}, {KC, 1}), view(Y.data(), {K + L, V}, {V, 1}));
        if (Lr < L)
          for (int64_t i = 0; i < Lr; ++i) std::copy(O.data() + i * V, O.data() + (i + 1) * V, op + (row0 + i * H) * V);
        // S ← diag(e^{G_L}) S + K_rᵀ v_new,  K_r = e^{G_L − G} ⊙ k (= e^{G_L − c}·e^{c−G} k when direct)
        for (int64_t d = 0; d < K; ++d) {
          scalar_t* sd = S + d * V;
          const scalar_t a = eL[d];
          for (int64_t j = 0; j < V; ++j) sd[j] *= a;
        }
        const scalar_t* eLc = E.data() + (L - 1) * K;  // e^{G_L − c}
        const scalar_t* gL = GR.data() + (L - 1) * K;
        for (int64_t i = 0; i < Lr; ++i) {
          scalar_t* kn = KI.data() + i * K;
          const scalar_t* ki = kp + (row0 + i * H) * K;
          if (direct) {
            const scalar_t* en = EN.data() + i * K;
            for (int64_t d = 0; d < K; ++d) kn[d] = eLc[d] * en[d] * ki[d];
          } else {
            const scalar_t* gi = GR.data() + i * K;
            for (int64_t d = 0; d < K; ++d) kn[d] = std::exp(gL[d] - gi[d]) * ki[d];
          }
        }
        at::addmm_out(Sv, Sv, view(KI.data(), {L, K}, {K, 1}).t(), Vnv, /*beta=*/1, /*alpha=*/1);
      }
      std::copy(S, S + K * V, hp + bh * K * V);
    }
  };
  if (at::hasThreadLocalCallbacks())
    body(0, B * H);
  else
    at::parallel_for(0, B * H, 1, body);
}

// chunk: 0 = the delta rule's min(kDeltaChunk, T); gla passes kGlaChunk (always 64 rows, the
// last chunk zero-padded, as gla_chunked and simple_gla's accounting)
DeltaResult delta_fwd_cpu(const at::Tensor& q0, const at::Tensor& k0, const at::Tensor& v0, const at::Tensor& beta0,
                          const at::Tensor& g0, double scale, const at::Tensor& h00, int64_t chunk = 0) {
  auto c = [](const at::Tensor& x) { return x.defined() ? x.contiguous() : x; };
  const at::Tensor q = c(q0), k = c(k0), v = c(v0), beta = c(beta0), g = c(g0), h0 = c(h00);
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), K = q.size(3), V = v.size(3);
  at::Tensor o = at::empty({B, T, H, V}, q.options());
  at::Tensor ht = at::empty({B, H, K, V}, q.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "delta_fwd_cpu", [&] {
    if (g.defined() && g.dim() == 4)
      keygate_fwd_kernel<scalar_t>(q, k, v, beta, g, scale, h0, chunk ? chunk : std::min(kDeltaChunk, T), o, ht);
    else
      delta_fwd_kernel<scalar_t>(q, k, v, beta, g, scale, h0, std::min(kDeltaChunk, T), o, ht);
  });
  return {o, ht};
}

struct DeltaCpuFn : public torch::autograd::Function<DeltaCpuFn> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q,
                                                const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                                                const at::Tensor& beta, const at::Tensor& h0, double scale) {
    ctx->saved_data["scale"] = scale;
    ctx->save_for_backward({q, k, v, g, beta, h0});
    DeltaResult r = delta_fwd_cpu(q, k, v, beta, present(g), scale, present(h0));
    return {r.o, r.ht};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const double scale = ctx->saved_data["scale"].toDouble();
    auto s = ctx->get_saved_variables();
    if (present(s[3]).defined() && s[3].dim() == 3) {
      // gated_delta_rule: the explicit backward (no autograd graph of the recomputed forward)
      const at::Tensor h0 = present(s[5]);
      DeltaGrads r = gated_delta_backward(s[0], s[1], s[2], s[4], s[3], scale, h0, grads[0], grads[1]);
      return {r.dq, r.dk, r.dv, r.dg, r.dbeta, r.dh0, at::Tensor()};
    }
    return recompute_backward(ctx, grads, 7, [scale](const std::vector<at::Tensor>& in) {
      DeltaResult r = delta_chunked(in[0], in[1], in[2], in[4], in[3], scale, in[5]);
      return std::make_pair(r.o, r.ht);
    });
  }
};

}  // namespace

DeltaResult delta_chunked_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& beta,
                              const at::Tensor& g, double scale, const at::Tensor& h0) {
  if (layers::is_half(q)) {
    DeltaResult r = delta_chunked_cpu(layers::f32(q), layers::f32(k), layers::f32(v), layers::f32(beta),
                                      layers::f32(g), scale, layers::f32(h0));
    return {r.o.to(q.scalar_type()), r.ht};
  }
  if (!raw_cpu_inputs({&q, &k, &v, &beta, &g, &h0})) return delta_chunked(q, k, v, beta, g, scale, h0);
  if (!grad_needed({&q, &k, &v, &beta, &g, &h0})) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return delta_fwd_cpu(q, k, v, beta, g, scale, h0);
  }
  // The autograd function takes defined tensors only: an absent g / h0 travels as an empty tensor.
  const at::Tensor none = at::empty({0}, q.options());
  auto r = DeltaCpuFn::apply(q, k, v, g.defined() ? g : none, beta, h0.defined() ? h0 : none, scale);
  return {r[0], r[1]};
}

namespace {
// The per-key-gate chunk kernel without the delta rule, as a GatedFwd.
std::pair<at::Tensor, at::Tensor> gla_fwd_raw(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                              const at::Tensor& g, double scale, const at::Tensor& h0) {
  DeltaResult r = delta_fwd_cpu(q, k, v, at::Tensor(), g, scale, h0, kGlaChunk);
  return {r.o, r.ht};
}
}  // namespace

std::pair<at::Tensor, at::Tensor> gla_chunked_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                  const at::Tensor& g, double scale, const at::Tensor& h0) {
  if (layers::is_half(q)) {
    auto [o, ht] = gla_chunked_cpu(layers::f32(q), layers::f32(k), layers::f32(v), layers::f32(g), scale,
                                   layers::f32(h0));
    return {o.to(q.scalar_type()), ht};
  }
  if (!(g.dim() == 4 && raw_cpu_inputs({&q, &k, &v, &g, &h0}))) return gla_chunked(q, k, v, g, scale, h0);
  return raw_forward_chunked_backward(q, k, v, g, scale, h0, gla_fwd_raw, gla_chunked);
}

}  // namespace mixbench::linear
