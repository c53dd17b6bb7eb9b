// Shared machinery of the delta-rule ops (delta_rule, gated_delta_rule, kda): the chunked WY/UT
// algorithm, the one-token decode step, and the pieces of their OpSpecs.
#pragma once
#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

#include "harness/registry.h"

namespace mixbench::linear {

// How the state decays before each delta update.
//   None: no decay (delta_rule); Head: S ← exp(g_t)·S, g [B,T,H] (gated_delta_rule);
//   Key: S ← diag(exp g_t)·S, g [B,T,H,K] (kda).
enum class DeltaGate { None, Head, Key };

constexpr int64_t kDeltaChunk = 64;
// Chunks per block of delta_chunked: longer sequences run block by block, the state carried.
constexpr int64_t kDeltaBlockChunks = 16;

// Rows of a sub-block of key_gate_pair_scores (per-key-dim decays formed pair by pair only inside it).
constexpr int64_t kKeyGateSub = 8;

// P_tj = Σ_d a_t[d] k_j[d] Γ_tj[d] for j ≤ t (0 above the diagonal), Γ_tj[d] = exp(G_t[d] − G_j[d]),
// in every chunk: a, kc, G [B,H,N,C,K] (G the inclusive cumulative log decay, non-increasing along
// C) → [B,H,N,C,C]. Inside sub-blocks of `sub` rows (C a multiple of it; else one block of C) Γ is
// formed per key dim from masked differences; below them as the product of a's rows rescaled by
// e^{G_t − G_r} and k's columns by e^{G_r − G_j} (r the sub-block's first row; both factors ≤ 1, so
// no exponential overflows however strong the decay). Memory per chunk: C·K·(C/sub + sub) values
// instead of C²·K. Differentiable.
at::Tensor key_gate_pair_scores(const at::Tensor& a, const at::Tensor& kc, const at::Tensor& G, int64_t sub = kKeyGateSub);

struct DeltaResult {
  at::Tensor o;   // [B,T,H,V]
  at::Tensor ht;  // [B,H,K,V]
};

// Chunked algorithm (chunk C = min(chunk, T), the last chunk zero-padded), differentiable by
// autograd in every input. g undefined for DeltaGate::None; h0 may be undefined (zeros).
DeltaResult delta_chunked(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& beta,
                          const at::Tensor& g, double scale, const at::Tensor& h0, int64_t chunk = kDeltaChunk);

// Explicit backward of the chunked gated delta rule (Head gate; chunks of kDeltaChunk, the last one
// zero-padded), without recording the forward for autograd. The two sequential parts are walks over
// the chunks: forward (state S0 entering each chunk, u = U − W S0) and reverse (gradient dS1 of the
// state at each chunk's end, du = Pᵀ do + K_r dS1, then dS0 = e^{G_C} dS1 + Q_gᵀ do − Wᵀ du); all
// other terms are batched products over every chunk at once. gated_delta_backward runs the walks as
// LibTorch loops; the CUDA path of gated_delta_rule runs the same algebra on kernels (chunk_cuda.cpp).
struct DeltaGrads {
  at::Tensor dq, dk, dv, dbeta, dg, dh0;  // [B,T,H,K], [B,T,H,K], [B,T,H,V], [B,T,H], [B,T,H], [B,H,K,V]
};
// d_o [B,T,H,V] and dht [B,H,K,V] may be undefined (zero); dh0 is undefined when h0 is.
DeltaGrads gated_delta_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& beta,
                                const at::Tensor& g, double scale, const at::Tensor& h0, const at::Tensor& d_o,
                                const at::Tensor& dht);

// CPU forward for the None and Head gates (delta_rule, gated_delta_rule): the same chunked algorithm
// (chunk kDeltaChunk) on raw buffers in the input dtype (fp32 / fp64; half precision runs in fp32),
// one task per (batch, head). Differentiable: gated_delta_rule's backward is
// gated_delta_backward; the others recompute delta_chunked and differentiate it. Other gates, dtypes or devices fall back to delta_chunked.
DeltaResult delta_chunked_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& beta,
                              const at::Tensor& g, double scale, const at::Tensor& h0);

// One decode step: q_t,k_t [B,H,K], v_t [B,H,V], beta_t [B,H], g_t ([B,H] / [B,H,K] / undefined),
// state S [B,H,K,V] -> (o_t [B,H,V], S').
DeltaResult delta_step(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& beta,
                       const at::Tensor& g, double scale, const at::Tensor& S);

// Step-by-step recurrence built from delta_step (whole sequence, [B,T,...] layout).
DeltaResult delta_recurrent_steps(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& beta, const at::Tensor& g, double scale, const at::Tensor& h0);

// Per-token FLOPs of delta_chunked at length T with H heads, split into what FlopCounter sees
// (matrix products) and what it does not (the unit-lower-triangular solve). Per chunk of C rows and
// per head: k·kᵀ 2C²K, q·kᵀ 2C²K (for Key gates as C² batched K-dots: same count), W·S 2CKV,
// Q·S 2CKV, P·u 2C²V, K_rᵀ·u 2CKV; solve C(C−1)(K+V). Times H·ceil(T/C)/T.
struct DeltaFlops {
  double matmul = 0, solve = 0;
  double total() const { return matmul + solve; }
};
DeltaFlops delta_chunk_flops(int64_t T, int64_t H, int64_t K, int64_t V, int64_t chunk = kDeltaChunk);
// Per-token FLOPs of one decode step (per head: decay KV (Head/Key), Sᵀk 2KV, outer update 3KV, Sᵀq 2KV).
double delta_step_flops(int64_t H, int64_t K, int64_t V, DeltaGate gate);

// An OpSpec for the given gate kind: inputs q,k,v,[g],beta,h0 (optional), outputs o, ht; params
// scale (0 = K^-0.5), case shape H,K,V and gate_div; cases, checks, invariants. The caller sets
// name, summary and citation.
OpSpec delta_op_spec(DeltaGate gate);

}  // namespace mixbench::linear
