// One decoded token of the delta-rule layers in fused CUDA kernels (mixers/linear/decode_step_kernel.cu):
// the short convolution's step over its cached tail, and the recurrent state's update and readout.
// Used by the static decode caches (a captured decode step); the eager path composes LibTorch ops.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "mixers/common/rope_kernel.h"

namespace mixbench::linear::decode_cuda {

using Dtype = layers::rope_cuda::Dtype;
// y[b,c] = silu(Σ_{i<W−1} w[c,i]·tail[b,i,c] + w[c,W−1]·x[b,c]) in fp32, rounded once; then the tail
// shifts by one in place (tail[b,i] = tail[b,i+1], tail[b,W−2] = x[b]). x, y [B,C]; tail [B,W−1,C];
// w [C,W]; all of type dt; x's rows x_stride (≥ C) elements apart (a slice of a wider projection),
// the rest contiguous; 1 ≤ W ≤ 8.
void conv_step(Dtype dt, const void* x, int64_t x_stride, void* tail, const void* w, void* y, int64_t B, int64_t C, int W,
               cudaStream_t stream);
// The delta rule's step per (b, h), in fp32: S ← S·exp(g) (g: none, [B,H] per head or [B,H,K] per
// key), u = β (v − Sᵀk), S ← S + k uᵀ, o = scale · Sᵀq. q, k [B,H,K], v [B,H,V] of dt; beta [B,H], g fp32;
// S [B,H,K,V] fp32 updated in place; o [B,H,V] of dt. K ≤ 256.
enum class Decay { None, PerHead, PerKey };
// Gated DeltaNet's gates from their raw projections, formed inside the step (fp32): β = σ(b),
// g = neg_a[h]·softplus(a + dt_bias[h]) (softplus as LibTorch's: a value above 20 is its own). b, a
// of dt at b_raw[row·stride + h], a_raw[row·stride + h]; neg_a, dt_bias fp32 [H].
struct RawGates {
  const void* b_raw = nullptr;
  const void* a_raw = nullptr;
  int64_t stride = 0;
  const float* neg_a = nullptr;
  const float* dt_bias = nullptr;
};
// delta_step with Decay::PerHead and β, g from `gates`.
void gated_delta_step(Dtype dt, const void* q, const void* k, const void* v, const RawGates& gates, float scale, float* S,
                      void* o, int64_t B, int64_t H, int64_t K, int64_t V, cudaStream_t stream);
void delta_step(Dtype dt, const void* q, const void* k, const void* v, const float* beta, const float* g, Decay decay,
                float scale, float* S, void* o, int64_t B, int64_t H, int64_t K, int64_t V, cudaStream_t stream);

// Gated DeltaNet's decode step after its short convolution, one block per (b, h): q and k
// L2-normalized (x·rsqrt(Σx² + l2_eps), rounded to dt as the unfused l2 norm stores them), v plus
// the value embedding's gate v + ve_scale·σ(z)·ve (when ve is given; rounded to dt), the gated
// delta rule's step as gated_delta_step (β, g from `gates`, S in place), and the output's gated
// RMSNorm o·rsqrt(mean(o²) + norm_eps)·w·silu(gate) over the head's V channels (o rounded to dt
// first). Row b of each input starts at b·(its stride) elements: qk holds the H q heads then the H
// k heads [2H, K], v, ve and gate [H, V], z [H]. w [V] of dt; o [B, H, V] contiguous. K, V ≤ 256.
struct GdnStep {
  int64_t B = 0, H = 0;
  int K = 0, V = 0;
  const void* qk = nullptr;
  int64_t qk_stride = 0;
  const void* v = nullptr;
  int64_t v_stride = 0;
  const void* ve = nullptr;  // null: no value embedding
  int64_t ve_stride = 0;
  const void* ve_z = nullptr;
  int64_t ve_z_stride = 0;
  float ve_scale = 0.f;
  RawGates gates;
  const void* norm_w = nullptr;
  const void* gate = nullptr;
  int64_t gate_stride = 0;
  float l2_eps = 0.f, norm_eps = 0.f, scale = 0.f;
  float* S = nullptr;
  void* o = nullptr;
};
void gdn_step(Dtype dt, const GdnStep& p, cudaStream_t stream);

}  // namespace mixbench::linear::decode_cuda
