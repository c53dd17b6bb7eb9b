// Chunked WY/UT algorithm for the delta-rule family, the one-token decode step, and the shared
// parts of the three op specs (delta_rule, gated_delta_rule, kda).
//
// Within a chunk of C tokens (local index t, state S0 entering the chunk), with G_t the inclusive
// cumulative log decay (G_t = Σ_{s≤t} g_s ≤ 0, per head or per key dim) and Γ_{tj} = exp(G_t − G_j)
// for j ≤ t (never the exponential of a positive number):
//   decayed state before token t's update:  S̃_t = exp(G_t) S0 + Σ_{j<t} Γ_{tj} k_j u_jᵀ
//   u_t = β_t (v_t − S̃_tᵀ k_t)  ⇒  (I + A) u = diag(β)(V − K_g S0),  A_tj = β_t Σ_d k_t k_j Γ_tj (j<t)
// so with the unit lower-triangular T = (I + A)⁻¹ (a triangular solve, the UT transform):
//   W = T diag(β) K_g,  U = T diag(β) V,  u = U − W S0          (K_g = k ⊙ exp(G))
//   o = Q_g S0 + P u,   P_tj = scale Σ_d q_t k_j Γ_tj (j≤t),     (Q_g = scale·q ⊙ exp(G))
//   S_C = exp(G_C) S0 + K_rᵀ u,  K_r = k ⊙ exp(G_C − G).
// W and U do not depend on S0, so they are computed for all chunks at once; the chunk loop runs
// only u = U − W S0 and the state update (three batched products per chunk), and the readout
// o = Q_g S0 + P u runs once over all chunks after it. Per-key-dim gates need Γ per pair and per key dim:
// key_gate_pair_scores forms it per key dim only inside sub-blocks of kKeyGateSub rows (masked
// differences, reduced over K by batched dot products) and takes the rest of each chunk's lower
// triangle as matrix products of rows and columns rescaled to the sub-block's first row.
#include "mixers/linear/delta_chunk.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include "mixers/linear/chunk_cuda.h"
#include "mixers/common/layers.h"
#include "harness/errors.h"
#include "reference/delta.h"

namespace mixbench::linear {

namespace {
// [B,T,H,D] → [B,H,N,C,D] and [B,T,H] → [B,H,N,C] in chunks of C, zero-padded at the end.
at::Tensor to_chunks(const at::Tensor& x, int64_t C) {
  const int64_t B = x.size(0), T = x.size(1), H = x.size(2), N = (T + C - 1) / C, pad = N * C - T;
  at::Tensor t = x.transpose(1, 2);
  if (x.dim() == 4) {
    if (pad) t = at::constant_pad_nd(t, {0, 0, 0, pad});
    return t.reshape({B, H, N, C, x.size(3)});
  }
  if (pad) t = at::constant_pad_nd(t, {0, pad});
  return t.reshape({B, H, N, C});
}

}  // namespace

at::Tensor key_gate_pair_scores(const at::Tensor& a, const at::Tensor& kc, const at::Tensor& G, int64_t sub) {
  const int64_t B = a.size(0), H = a.size(1), N = a.size(2), C = a.size(3), K = a.size(4);
  const int64_t S = sub > 0 && sub < C && C % sub == 0 ? sub : C, nS = C / S;
  const auto bool_opts = a.options().dtype(at::kBool);
  // the diagonal sub-blocks, per key dim: Γ from masked differences (j > t: 0)
  const at::Tensor Gs = G.reshape({B, H, N, nS, S, K}), as = a.reshape({B, H, N, nS, S, K}), ks = kc.reshape({B, H, N, nS, S, K});
  const at::Tensor up3 = at::ones({S, S}, bool_opts).triu(1).unsqueeze(-1);
  const at::Tensor E = (Gs.unsqueeze(-2) - Gs.unsqueeze(-3)).masked_fill(up3, 0).exp().masked_fill(up3, 0);  // [..,nS,S_t,S_j,K]
  const at::Tensor diag = at::matmul((as.unsqueeze(-2) * E).unsqueeze(-2), ks.unsqueeze(-3).unsqueeze(-1))
                              .squeeze(-1)
                              .squeeze(-1);  // [B,H,N,nS,S_t,S_j]
  if (nS == 1) return diag.reshape({B, H, N, C, C});
  // the rest of the lower triangle: Γ_tj = e^{G_t − G_r}·e^{G_r − G_j} with r the first row of t's
  // sub-block and j before it, two factors ≤ 1, so one product of [S,K] rows by [K,C] columns per sub-block
  const at::Tensor Gr = Gs.select(-2, 0);                                       // [B,H,N,nS,K]
  const at::Tensor at_ = as * (Gs - Gr.unsqueeze(-2)).exp();                    // [B,H,N,nS,S,K]
  const at::Tensor before = at::arange(C, a.options().dtype(at::kLong)).unsqueeze(0) >=
                            (at::arange(nS, a.options().dtype(at::kLong)) * S).unsqueeze(1);  // [nS,C]: j ≥ r, none
  const at::Tensor kt = kc.unsqueeze(3) *
                        (Gr.unsqueeze(-2) - G.unsqueeze(3)).masked_fill(before.unsqueeze(-1), -INFINITY).exp();  // [B,H,N,nS,C,K]
  const at::Tensor off = at::matmul(at_, kt.transpose(-1, -2));                // [B,H,N,nS,S_t,C]
  // the diagonal sub-blocks in their places: [nS,S_t] × [nS,S_j] block-diagonal
  const at::Tensor dblk = at::diag_embed(diag.permute({0, 1, 2, 4, 5, 3}))       // [B,H,N,S_t,S_j,nS,nS]
                              .permute({0, 1, 2, 5, 3, 6, 4})                   // [B,H,N,nS,S_t,nS,S_j]
                              .reshape({B, H, N, nS, S, C});
  return (off + dblk).reshape({B, H, N, C, C});
}

namespace {
// One block (the whole algorithm above on tokens [B,L,...], fp32 or fp64), state h0 entering it.
DeltaResult delta_chunked_block(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& beta,
                                const at::Tensor& g, double scale, const at::Tensor& h0, int64_t chunk) {
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), K = q.size(3), V = v.size(3);
  const DeltaGate gate = !g.defined() ? DeltaGate::None : (g.dim() == 3 ? DeltaGate::Head : DeltaGate::Key);
  const int64_t C = std::min(chunk, T), N = (T + C - 1) / C, Tp = N * C;
  // Chunk layout, zero-padded at the end. Padded tokens have k = 0, β = 0, g = 0: they write
  // nothing and decay nothing, so the final state is exact.
  auto chunked = [C](const at::Tensor& x) { return to_chunks(x, C); };
  const at::Tensor qc = chunked(q) * scale, kc = chunked(k), vc = chunked(v), bc = chunked(beta).unsqueeze(-1);
  const at::Tensor upper = at::ones({C, C}, q.options().dtype(at::kBool)).triu(1);  // j > t
  const at::Tensor kT = kc.transpose(-1, -2);
  at::Tensor A, P, Kg, Qg, Kr, last;
  switch (gate) {
    case DeltaGate::None:
      A = at::matmul(kc, kT);
      P = at::matmul(qc, kT);
      Kg = kc, Qg = qc, Kr = kc;
      break;
    case DeltaGate::Head: {
      at::Tensor G = chunked(g).cumsum(-1);                           // [B,H,N,C]
      at::Tensor D = G.unsqueeze(-1) - G.unsqueeze(-2);              // G_t − G_j
      at::Tensor Gam = D.masked_fill(upper, -INFINITY).exp();        // exactly 0 above the diagonal
      A = at::matmul(kc, kT) * Gam;
      P = at::matmul(qc, kT) * Gam;
      at::Tensor eG = G.exp().unsqueeze(-1);
      Kg = kc * eG, Qg = qc * eG;
      at::Tensor Gl = G.narrow(-1, C - 1, 1);                        // [B,H,N,1]
      Kr = kc * (Gl - G).exp().unsqueeze(-1);
      last = Gl.exp().unsqueeze(-1);                                 // [B,H,N,1,1]
      break;
    }
    case DeltaGate::Key: {
      at::Tensor G = chunked(g).cumsum(-2);                           // [B,H,N,C,K]
      A = key_gate_pair_scores(kc, kc, G);
      P = key_gate_pair_scores(qc, kc, G);
      at::Tensor eG = G.exp();
      Kg = kc * eG, Qg = qc * eG;
      at::Tensor Gl = G.narrow(-2, C - 1, 1);                        // [B,H,N,1,K]
      Kr = kc * (Gl - G).exp();
      last = Gl.squeeze(-2).exp().unsqueeze(-1);                     // [B,H,N,K,1]
      break;
    }
  }
  // Row t of A scaled by β_t. Only its strictly lower triangle is read: the solve below reads the
  // lower triangle without the (unit) diagonal, and its backward gives A a gradient only there.
  A = A * bc;
  if (gate == DeltaGate::None) P = at::tril(P, 0);  // gated: Γ is already 0 above the diagonal
  // (I + A) [W U] = diag(β) [K_g V]: unit lower-triangular solve.
  at::Tensor WU = at::linalg_solve_triangular(A, at::cat({Kg * bc, vc * bc}, -1), /*upper=*/false,
                                              /*left=*/true, /*unitriangular=*/true);
  at::Tensor W = WU.narrow(-1, 0, K), U = WU.narrow(-1, K, V);
  // The chunk recursion, three batched products per chunk and nothing else:
  //   u = U − W S,   S ← diag(d) S + K_rᵀ u      (d = exp(G_C); no decay without a gate)
  // the readout o = Q_g S + P u is one batched product over all chunks after the loop.
  at::Tensor S = (h0.defined() ? h0 : at::zeros({B, H, K, V}, v.options())).reshape({B * H, K, V});
  // unbind (not select in the loop): its backward is one stack, so the loop stays O(N)
  std::vector<at::Tensor> Ws = W.reshape({B * H, N, C, K}).unbind(1), Us = U.reshape({B * H, N, C, V}).unbind(1),
                          Krs = Kr.reshape({B * H, N, C, K}).unbind(1), ds;
  if (gate != DeltaGate::None) ds = last.reshape({B * H, N, last.size(-2), 1}).unbind(1);
  std::vector<at::Tensor> starts, us;
  starts.reserve(size_t(N));
  us.reserve(size_t(N));
  for (size_t n = 0; n < size_t(N); ++n) {
    starts.push_back(S);
    us.push_back(at::baddbmm(Us[n], Ws[n], S, /*beta=*/1, /*alpha=*/-1));
    S = at::baddbmm(gate == DeltaGate::None ? S : S * ds[n], Krs[n].transpose(-1, -2), us[n]);
  }
  at::Tensor o = at::matmul(Qg, at::stack(starts, 1).view({B, H, N, K, V})) +
                 at::matmul(P, at::stack(us, 1).view({B, H, N, C, V}));     // [B,H,N,C,V]
  o = o.reshape({B, H, Tp, V}).narrow(2, 0, T).transpose(1, 2).contiguous();
  return {o, S.reshape({B, H, K, V})};
}
}  // namespace

// Long sequences are processed in blocks of kDeltaBlockChunks chunks with the state carried from
// block to block, so the [B,H,n,C,C] and [B,H,n,K,K] intermediates are bounded by the block (cache
// resident) and the cost per token does not grow with T.
DeltaResult delta_chunked(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& beta,
                          const at::Tensor& g, double scale, const at::Tensor& h0, int64_t chunk) {
  if (layers::is_half(q)) {
    DeltaResult r = delta_chunked(layers::f32(q), layers::f32(k), layers::f32(v), layers::f32(beta), layers::f32(g),
                                  scale, layers::f32(h0), chunk);
    return {r.o.to(q.scalar_type()), r.ht};
  }
  const int64_t T = q.size(1), blk = chunk * kDeltaBlockChunks;
  if (T <= blk) return delta_chunked_block(q, k, v, beta, g, scale, h0, chunk);
  std::vector<at::Tensor> outs;
  outs.reserve(size_t((T + blk - 1) / blk));
  at::Tensor S = h0;
  for (int64_t t0 = 0; t0 < T; t0 += blk) {
    const int64_t L = std::min(blk, T - t0);
    auto sl = [&](const at::Tensor& x) { return x.defined() ? x.narrow(1, t0, L) : x; };
    DeltaResult r = delta_chunked_block(sl(q), sl(k), sl(v), sl(beta), sl(g), scale, S, chunk);
    outs.push_back(r.o);
    S = r.ht;
  }
  return {at::cat(outs, 1), S};
}

// ------------------------------------------------------------------ explicit backward (Head gate)
// Per chunk (local rows t, j; s = scale), the forward is
//   A = tril(diag(β)(k kᵀ ⊙ Γ), −1), X = (I + A)⁻¹, W = X B_k, U = X B_v  (B_k = β e^{G} ⊙ k, B_v = β ⊙ v)
//   u = U − W S0,  o = Q_g S0 + P u,  S1 = e^{G_C} S0 + K_rᵀ u
//   (Q_g = s e^{G} ⊙ q, P = s (q kᵀ) ⊙ Γ, K_r = e^{G_C − G} ⊙ k).
// Given du and dS1 from the reverse walk, every input gradient follows by the chain rule through
// these products; G receives a gradient from each e^{±G} factor and is turned into dg by a reverse
// cumulative sum inside the chunk (G_t = Σ_{s ≤ t} g_s).
namespace {

// The inputs in chunk layout (chunks of kDeltaChunk), compute dtype (fp64 for fp64 inputs, else
// fp32): q, k [B,H,N,C,K], v, d_o [B,H,N,C,V], beta and G (cumulative log decay inside the chunk)
// [B,H,N,C], with eG = e^{G}, er = e^{G_C − G} [B,H,N,C], eGL = e^{G_C} [B,H,N], Gam = Γ [B,H,N,C,C]
// (0 above the diagonal).
struct Chunks {
  at::Tensor q, k, v, d_o, beta, G, eG, er, eGL, Gam;
  double scale = 1;
  int64_t T = 0;
};

at::Tensor from_chunks(const at::Tensor& x, int64_t T) {
  const int64_t B = x.size(0), H = x.size(1), NC = x.size(2) * x.size(3);
  if (x.dim() == 5) return x.reshape({B, H, NC, x.size(4)}).narrow(2, 0, T).transpose(1, 2).contiguous();
  return x.reshape({B, H, NC}).narrow(2, 0, T).transpose(1, 2).contiguous();
}

Chunks make(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& beta,
            const at::Tensor& g, const at::Tensor& d_o, double scale) {
  const at::ScalarType dt = q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  auto chunked = [dt](const at::Tensor& x) { return to_chunks(x.to(dt), kDeltaChunk); };
  Chunks c;
  c.scale = scale;
  c.T = q.size(1);
  c.q = chunked(q);
  c.k = chunked(k);
  c.v = chunked(v);
  c.d_o = d_o.defined() ? chunked(d_o) : at::zeros_like(c.v);
  c.beta = chunked(beta);
  c.G = chunked(g).cumsum(-1);
  c.eG = c.G.exp();
  at::Tensor GL = c.G.narrow(-1, kDeltaChunk - 1, 1);
  c.er = (GL - c.G).exp();
  c.eGL = GL.squeeze(-1).exp();
  const at::Tensor upper = at::ones({kDeltaChunk, kDeltaChunk}, c.G.options().dtype(at::kBool)).triu(1);
  c.Gam = (c.G.unsqueeze(-1) - c.G.unsqueeze(-2)).masked_fill(upper, -INFINITY).exp();
  return c;
}

at::Tensor mT(const at::Tensor& x) { return x.transpose(-1, -2); }

at::Tensor dv_local(const Chunks& c) {
  at::Tensor P = at::matmul(c.q, mT(c.k)) * c.Gam * c.scale;
  return at::matmul(mT(P), c.d_o);
}

DeltaGrads grads(const Chunks& c, const at::Tensor& X, const at::Tensor& S0, const at::Tensor& u,
                 const at::Tensor& dS1, const at::Tensor& du, const at::Tensor& dh0) {
  const double s = c.scale;
  const at::Tensor eG = c.eG.unsqueeze(-1), er = c.er.unsqueeze(-1), bt = c.beta.unsqueeze(-1);
  // o = Q_g S0 + P u
  at::Tensor dq = at::matmul(c.d_o, mT(S0)) * (eG * s);
  at::Tensor dG = (c.q * dq).sum(-1);
  const at::Tensor QK = at::matmul(c.q, mT(c.k)) * s;
  const at::Tensor dPg = at::matmul(c.d_o, mT(u)) * c.Gam;  // dP ⊙ Γ, zero above the diagonal
  dq = dq + at::matmul(dPg, c.k) * s;
  at::Tensor dk = at::matmul(mT(dPg), c.q) * s;
  const at::Tensor M = dPg * QK;  // dP ⊙ P
  dG = dG + M.sum(-1) - M.sum(-2);
  // S1 = e^{G_C} S0 + K_rᵀ u
  const at::Tensor dKr = at::matmul(u, mT(dS1));
  dk = dk + dKr * er;
  const at::Tensor R = (c.k * er * dKr).sum(-1);
  dG = dG - R;
  const at::Tensor dGL = R.sum(-1) + c.eGL * (dS1 * S0).sum({-1, -2});
  // u = U − W S0 with W = X B_k, U = X B_v
  const at::Tensor dW = -at::matmul(du, mT(S0));
  const at::Tensor Bk = c.k * (eG * bt), Bv = c.v * bt;
  const at::Tensor dX = at::matmul(dW, mT(Bk)) + at::matmul(du, mT(Bv));
  const at::Tensor XT = mT(X);
  const at::Tensor dBk = at::matmul(XT, dW), dBv = at::matmul(XT, du);
  const at::Tensor dv = dBv * bt;
  const at::Tensor kdBk = (c.k * dBk).sum(-1) * c.eG;
  at::Tensor dbeta = (c.v * dBv).sum(-1) + kdBk;
  dk = dk + dBk * (eG * bt);
  dG = dG + c.beta * kdBk;
  // X = (I + A)⁻¹ with A strictly lower: dA = −Xᵀ dX Xᵀ on the strictly lower triangle
  const at::Tensor lower = at::ones({kDeltaChunk, kDeltaChunk}, c.G.options().dtype(at::kBool)).tril(-1);
  const at::Tensor dA = (-at::matmul(at::matmul(XT, dX), XT)).masked_fill(lower.logical_not(), 0);
  const at::Tensor KkG = at::matmul(c.k, mT(c.k)) * c.Gam;
  dbeta = dbeta + (dA * KkG).sum(-1);
  const at::Tensor E = dA * c.Gam * bt;  // gradient of k kᵀ
  dk = dk + at::matmul(E + mT(E), c.k);
  const at::Tensor M2 = dA * KkG * bt;  // dA ⊙ A
  dG = dG + M2.sum(-1) - M2.sum(-2);
  dG.narrow(-1, kDeltaChunk - 1, 1).add_(dGL.unsqueeze(-1));
  const at::Tensor dg = dG.flip(-1).cumsum(-1).flip(-1);
  return {from_chunks(dq, c.T), from_chunks(dk, c.T), from_chunks(dv, c.T), from_chunks(dbeta, c.T),
          from_chunks(dg, c.T), dh0};
}

}  // namespace

DeltaGrads gated_delta_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& beta,
                                const at::Tensor& g, double scale, const at::Tensor& h0, const at::Tensor& d_o,
                                const at::Tensor& dht) {
  c10::NoGradGuard ng;
  const Chunks c = make(q, k, v, beta, g, d_o, scale);
  const int64_t B = q.size(0), H = q.size(2), K = q.size(3), V = v.size(3), N = c.q.size(2);
  const auto opt = c.q.options();
  const at::Tensor eye = at::eye(kDeltaChunk, opt);
  const at::Tensor bt = c.beta.unsqueeze(-1);
  const at::Tensor A = (at::matmul(c.k, c.k.transpose(-1, -2)) * c.Gam * bt).tril(-1);
  const at::Tensor X = at::linalg_solve_triangular(eye + A, eye.expand_as(A), /*upper=*/false, /*left=*/true,
                                                   /*unitriangular=*/true);
  const at::Tensor W = at::matmul(X, c.k * (c.eG.unsqueeze(-1) * bt)), U = at::matmul(X, c.v * bt);
  const at::Tensor Kr = c.k * c.er.unsqueeze(-1), Qg = c.q * (c.eG.unsqueeze(-1) * scale);
  // forward walk: S0 of every chunk and u = U − W S0
  at::Tensor S0 = at::empty({B, H, N, K, V}, opt), u = at::empty_like(U);
  at::Tensor S = h0.defined() ? h0.to(opt.dtype()) : at::zeros({B, H, K, V}, opt);
  for (int64_t n = 0; n < N; ++n) {
    S0.select(2, n).copy_(S);
    at::Tensor un = U.select(2, n) - at::matmul(W.select(2, n), S);
    u.select(2, n).copy_(un);
    S = S * c.eGL.select(2, n).unsqueeze(-1).unsqueeze(-1) + at::matmul(Kr.select(2, n).transpose(-1, -2), un);
  }
  // reverse walk: dS1 of every chunk and du = Pᵀ do + K_r dS1
  const at::Tensor dvl = dv_local(c);
  at::Tensor dS1 = at::empty_like(S0), du = at::empty_like(u);
  at::Tensor dS = dht.defined() ? dht.to(opt.dtype()) : at::zeros({B, H, K, V}, opt);
  for (int64_t n = N - 1; n >= 0; --n) {
    dS1.select(2, n).copy_(dS);
    at::Tensor dun = dvl.select(2, n) + at::matmul(Kr.select(2, n), dS);
    du.select(2, n).copy_(dun);
    dS = dS * c.eGL.select(2, n).unsqueeze(-1).unsqueeze(-1) +
         at::matmul(Qg.select(2, n).transpose(-1, -2), c.d_o.select(2, n)) -
         at::matmul(W.select(2, n).transpose(-1, -2), dun);
  }
  DeltaGrads r = grads(c, X, S0, u, dS1, du, h0.defined() ? dS : at::Tensor());
  auto back = [](const at::Tensor& x, const at::Tensor& like) { return x.defined() ? x.to(like.scalar_type()) : x; };
  return {back(r.dq, q), back(r.dk, k), back(r.dv, v), back(r.dbeta, beta), back(r.dg, g),
          h0.defined() ? back(r.dh0, h0) : at::Tensor()};
}

DeltaResult delta_step(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& beta,
                       const at::Tensor& g, double scale, const at::Tensor& S) {
  if (layers::is_half(q)) {
    DeltaResult r = delta_step(layers::f32(q), layers::f32(k), layers::f32(v), layers::f32(beta), layers::f32(g), scale,
                               layers::f32(S));
    return {r.o.to(q.scalar_type()), r.ht};
  }
  at::Tensor s = S;
  if (g.defined()) s = g.dim() == 2 ? s * g.exp().unsqueeze(-1).unsqueeze(-1) : s * g.exp().unsqueeze(-1);
  at::Tensor pred = at::matmul(k.unsqueeze(-2), s).squeeze(-2);  // Sᵀk [B,H,V]
  at::Tensor u = beta.unsqueeze(-1) * (v - pred);
  s = s + k.unsqueeze(-1) * u.unsqueeze(-2);
  at::Tensor o = at::matmul((q * scale).unsqueeze(-2), s).squeeze(-2);
  return {o, s};
}

DeltaResult delta_recurrent_steps(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& beta, const at::Tensor& g, double scale, const at::Tensor& h0) {
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), K = q.size(3), V = v.size(3);
  at::Tensor S = h0.defined() ? h0 : at::zeros({B, H, K, V}, v.options());
  std::vector<at::Tensor> outs;
  for (int64_t t = 0; t < T; ++t) {
    DeltaResult r = delta_step(q.select(1, t), k.select(1, t), v.select(1, t), beta.select(1, t),
                               g.defined() ? g.select(1, t) : at::Tensor(), scale, S);
    outs.push_back(r.o);
    S = r.ht;
  }
  return {at::stack(outs, 1), S};
}

DeltaFlops delta_chunk_flops(int64_t T, int64_t H, int64_t K, int64_t V, int64_t chunk) {
  const double C = double(std::min(chunk, T)), N = double((T + int64_t(C) - 1) / int64_t(C));
  const double per_chunk_mm = 4 * C * C * K + 2 * C * C * V + 6 * C * K * V;
  const double per_chunk_solve = C * (C - 1) * double(K + V);
  DeltaFlops f;
  f.matmul = double(H) * N * per_chunk_mm / double(T);
  f.solve = double(H) * N * per_chunk_solve / double(T);
  return f;
}

double delta_step_flops(int64_t H, int64_t K, int64_t V, DeltaGate gate) {
  const double kv = double(K * V);
  return double(H) * ((gate == DeltaGate::None ? 0.0 : kv) + 2 * kv + 3 * kv + 2 * kv);
}

// ------------------------------------------------------------------ op spec pieces
namespace {

double resolve_scale(const Config& p, int64_t K) {
  const double s = p.f("scale");
  return s > 0 ? s : 1.0 / std::sqrt(double(K));
}

const char* op_name(DeltaGate gate) {
  switch (gate) {
    case DeltaGate::None: return "delta_rule";
    case DeltaGate::Head: return "gated_delta_rule";
    default: return "kda";
  }
}

void check_inputs(const TensorMap& in, const Config& p, DeltaGate gate) {
  const std::string op = op_name(gate);
  std::vector<std::string> need = {"q", "k", "v", "beta"};
  if (gate != DeltaGate::None) need.push_back("g");
  for (const auto& n : need)
    if (!in.has(n)) throw InputError(fmt::format("{}: missing input '{}'", op, n));
  const auto &q = in.at("q"), &k = in.at("k"), &v = in.at("v"), &beta = in.at("beta");
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4)
    throw InputError(fmt::format("{}: q, k, v must be [B,T,H,D]", op));
  if (!k.sizes().equals(q.sizes())) throw InputError(fmt::format("{}: k must have q's shape [B,T,H,K]", op));
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), K = q.size(3), V = v.size(3);
  if (v.size(0) != B || v.size(1) != T || v.size(2) != H)
    throw InputError(fmt::format("{}: v must be [B,T,H,V] with q's B, T, H", op));
  if (T < 1) throw InputError(fmt::format("{}: empty sequence", op));
  if (!beta.sizes().equals({B, T, H})) throw InputError(fmt::format("{}: beta must be [B,T,H]", op));
  if (gate == DeltaGate::Head && !in.at("g").sizes().equals({B, T, H}))
    throw InputError(fmt::format("{}: g must be [B,T,H]", op));
  if (gate == DeltaGate::Key && !in.at("g").sizes().equals({B, T, H, K}))
    throw InputError(fmt::format("{}: g must be [B,T,H,K]", op));
  if (in.has("h0") && !in.at("h0").sizes().equals({B, H, K, V}))
    throw InputError(fmt::format("{}: h0 must be [B,H,K,V] = [{},{},{},{}]", op, B, H, K, V));
}

at::Tensor gate_of(const TensorMap& in, DeltaGate gate) {
  return gate == DeltaGate::None ? at::Tensor() : in.at("g");
}

TensorMap make_inputs(const Config& c, int64_t B, int64_t T, at::Generator& gen, DeltaGate gate) {
  auto o = at::TensorOptions().dtype(at::kDouble);
  const int64_t H = c.i("H"), K = c.i("K"), V = c.i("V");
  at::Tensor k = at::randn({B, T, H, K}, gen, o);
  k = k / k.norm(2, -1, true);  // the delta rule expects L2-normalized keys (the layers normalize)
  TensorMap in{{"q", at::randn({B, T, H, K}, gen, o)}, {"k", k}, {"v", at::randn({B, T, H, V}, gen, o)}};
  if (gate == DeltaGate::Head) in.set("g", at::log_sigmoid(at::randn({B, T, H}, gen, o)) / c.f("gate_div"));
  if (gate == DeltaGate::Key) in.set("g", at::log_sigmoid(at::randn({B, T, H, K}, gen, o)) / c.f("gate_div"));
  in.set("beta", at::sigmoid(at::randn({B, T, H}, gen, o)));
  in.set("h0", 0.5 * at::randn({B, H, K, V}, gen, o));
  return in;
}

double rel_err(const at::Tensor& a, const at::Tensor& ref) {
  at::Tensor r = ref.to(at::kDouble), x = a.to(at::kDouble);
  const double den = r.pow(2).mean().sqrt().item<double>();
  return (x - r).pow(2).mean().sqrt().item<double>() / (den + 1e-30);
}

std::vector<std::pair<std::string, double>> invariants(const TensorMap& in64, const Config& p, Backend backend,
                                                       at::ScalarType dt, DeltaGate gate) {
  c10::NoGradGuard ng;
  const at::Device dev = backend == Backend::CUDA ? at::Device(at::kCUDA) : at::Device(at::kCPU);
  auto cv = [&](const std::string& n) { return in64.has(n) ? in64.at(n).to(dev, dt) : at::Tensor(); };
  const at::Tensor q = cv("q"), k = cv("k"), v = cv("v"), beta = cv("beta"), h0 = cv("h0");
  const at::Tensor g = gate == DeltaGate::None ? at::Tensor() : cv("g");
  const int64_t T = q.size(1);
  const double scale = resolve_scale(p, q.size(3));
  auto sl = [](const at::Tensor& x, int64_t a, int64_t b) { return x.defined() ? x.narrow(1, a, b - a) : x; };
  std::vector<std::pair<std::string, double>> out;
  DeltaResult full = delta_chunked(q, k, v, beta, g, scale, h0);
  DeltaResult rec = delta_recurrent_steps(q, k, v, beta, g, scale, h0);
  out.emplace_back("chunked_vs_recurrent/o", rel_err(full.o, rec.o));
  out.emplace_back("chunked_vs_recurrent/ht", rel_err(full.ht, rec.ht));
  if (T >= 2) {
    // prefill(T − n) then n decode steps == prefill(T)
    const int64_t n = std::min<int64_t>(3, T - 1), Tp = T - n;
    DeltaResult pre = delta_chunked(sl(q, 0, Tp), sl(k, 0, Tp), sl(v, 0, Tp), sl(beta, 0, Tp), sl(g, 0, Tp), scale, h0);
    std::vector<at::Tensor> os = {pre.o};
    at::Tensor S = pre.ht;
    for (int64_t t = Tp; t < T; ++t) {
      DeltaResult r = delta_step(q.select(1, t), k.select(1, t), v.select(1, t), beta.select(1, t),
                                 g.defined() ? g.select(1, t) : at::Tensor(), scale, S);
      os.push_back(r.o.unsqueeze(1));
      S = r.ht;
    }
    out.emplace_back("prefill_plus_decode/o", rel_err(at::cat(os, 1), full.o));
    out.emplace_back("prefill_plus_decode/ht", rel_err(S, full.ht));
    // split in two with the state carried == one pass
    const int64_t s = T / 2;
    DeltaResult a = delta_chunked(sl(q, 0, s), sl(k, 0, s), sl(v, 0, s), sl(beta, 0, s), sl(g, 0, s), scale, h0);
    DeltaResult b = delta_chunked(sl(q, s, T), sl(k, s, T), sl(v, s, T), sl(beta, s, T), sl(g, s, T), scale, a.ht);
    out.emplace_back("split_state_carried/o", rel_err(at::cat({a.o, b.o}, 1), full.o));
    out.emplace_back("split_state_carried/ht", rel_err(b.ht, full.ht));
  }
  return out;
}

std::vector<CaseDef> cases(const ConfigSpec& s, DeltaGate gate) {
  auto c = [&](const std::string& kv) { return s.parse(kv); };
  std::vector<CaseDef> out = {
      {"T1", c("H=2,K=8,V=8"), 1, 1},
      {"T1_B2_noh0", c("H=2,K=8,V=4"), 2, 1, 0, {"h0"}},
      {"B2_T37_KneV", c("H=2,K=8,V=12,gate_div=1"), 2, 37},
      {"T37_noh0_div4", c("H=2,K=12,V=8,gate_div=4"), 1, 37, 0, {"h0"}},
      {"B2_T70_div16", c("H=2,K=16,V=8,gate_div=16"), 2, 70},
      {"T130_noh0_div4", c("H=1,K=8,V=16,gate_div=4"), 1, 130, 0, {"h0"}},
      {"T130_div1", c("H=2,K=8,V=8,gate_div=1"), 1, 130},
      {"scale03_T20", c("H=2,K=8,V=8,scale=0.3,gate_div=16"), 1, 20},
  };
  if (gate == DeltaGate::Head) {
    // head dims of the CUDA kernels (K, V ∈ {64, 128}), so the CUDA checks run them
    out.push_back({"T130_K64V128_B2_div4", c("H=2,K=64,V=128,gate_div=4"), 2, 130});
    out.push_back({"T77_K128V64_noh0_div16", c("H=1,K=128,V=64,gate_div=16"), 1, 77, 0, {"h0"}});
    out.push_back({"T64_K128V128_div1", c("H=1,K=128,V=128,gate_div=1"), 1, 64});
  }
  return out;
}

}  // namespace

OpSpec delta_op_spec(DeltaGate gate) {
  OpSpec s;
  s.name = op_name(gate);
  s.family = "linear";
  ConfigSpec ps;
  ps.f("scale", 0.0, "scale on q; 0 = K^-0.5", 0.0)
      .i("H", 2, "heads (case shape)", 1)
      .i("K", 8, "key head dim (case shape)", 1)
      .i("V", 8, "value head dim (case shape)", 1)
      .f("gate_div", 1.0, "case gates are logsigmoid(randn)/gate_div (unused by delta_rule)", 1.0);
  s.params = ps;
  s.inputs = {{"q"}, {"k"}, {"v"}};
  if (gate != DeltaGate::None) s.inputs.push_back({"g"});
  s.inputs.push_back({"beta"});
  s.inputs.push_back({"h0", true, /*optional=*/true});
  s.outputs = {"o", "ht"};
  s.make_inputs = [gate](const Config& c, int64_t B, int64_t T, at::Generator& gen) {
    return make_inputs(c, B, T, gen, gate);
  };
  s.reference = [gate](const TensorMap& in, const Config& p) {
    check_inputs(in, p, gate);
    const at::Tensor& q = in.at("q");
    auto [o, ht] = reference::delta_recurrent(q, in.at("k"), in.at("v"), in.at("beta"), gate_of(in, gate),
                                              resolve_scale(p, q.size(3)), in.get_or("h0", at::Tensor()));
    return TensorMap{{"o", o}, {"ht", ht}};
  };
  s.cpu = [gate](const TensorMap& in, const Config& p) {
    check_inputs(in, p, gate);
    const at::Tensor& q = in.at("q");
    const at::Tensor &k = in.at("k"), &v = in.at("v"), &beta = in.at("beta"), g = gate_of(in, gate);
    const at::Tensor h0 = in.get_or("h0", at::Tensor());
    const double scale = resolve_scale(p, q.size(3));
    // the raw-buffer forward (delta_cpu.cpp) for every gate
    DeltaResult r = delta_chunked_cpu(q, k, v, beta, g, scale, h0);
    return TensorMap{{"o", r.o}, {"ht", r.ht}};
  };
  // CUDA: gated_delta_rule with bf16 / fp16 inputs and K, V in {64, 128} runs the tensor-core chunk
  // kernels (forward, and the explicit backward with its walks on kernels). Everything else runs the
  // device-agnostic chunked WY path (cuBLAS on the GPU).
  s.cuda = [gate](const TensorMap& in, const Config& p) {
    check_inputs(in, p, gate);
    const at::Tensor& q = in.at("q");
    const at::Tensor h0 = in.get_or("h0", at::Tensor());
    if (gate == DeltaGate::Head && chunk_tc_eligible(q, in.at("k"), in.at("v"), in.at("g"), in.at("beta"), h0)) {
      note_kernel("gated_delta_rule_tc");
      auto [o, ht] = gated_delta_rule_tc(q, in.at("k"), in.at("v"), in.at("g"), in.at("beta"),
                                         resolve_scale(p, q.size(3)), h0);
      return TensorMap{{"o", o}, {"ht", ht}};
    }
    note_kernel("chunked-libtorch");
    DeltaResult r = delta_chunked(q, in.at("k"), in.at("v"), in.at("beta"), gate_of(in, gate),
                                  resolve_scale(p, q.size(3)), h0);
    return TensorMap{{"o", r.o}, {"ht", r.ht}};
  };
  s.cases = [ps, gate]() { return cases(ps, gate); };
  s.check_inputs = [gate](const TensorMap& in, const Config& p) { check_inputs(in, p, gate); };
  s.invariants = [gate](const TensorMap& in, const Config& p, Backend b, at::ScalarType dt) {
    return invariants(in, p, b, dt, gate);
  };
  return s;
}

}  // namespace mixbench::linear
