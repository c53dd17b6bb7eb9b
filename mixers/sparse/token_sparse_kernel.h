// Token-sparse attention (op `sparse_attention`, DSA's attention over the indexer's keys): the C entry
// points of mixers/sparse/token_sparse_kernel.cu. The LibTorch wrapper (a differentiable function)
// is sparse_attention_fast (mixers/sparse/token_sparse_cuda.cpp).
//
// Shapes (all contiguous, of element type dt unless said otherwise): q [B,T,H,D], k [B,T,Hkv,D],
// v [B,T,Hkv,D] (Dv = D), indices [B,T,K] int64 shared by all heads (−1 = empty slot, anywhere in
// the row; every other entry 0 ≤ s ≤ t and distinct — not checked), o [B,T,H,D], lse [B,T,H] fp32.
// No host synchronisation: every launch can be captured in a CUDA graph.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "mixers/common/rope_kernel.h"

namespace mixbench::token_sparse_cuda {

using Dtype = layers::rope_cuda::Dtype;

// Whether the kernels are built for this shape: D = 64 or 128, H a multiple of Hkv, and a tile of
// at least 4 keys of every KV head fits in shared memory (others take the LibTorch path).
bool supported(int H, int Hkv, int D);

// o[b,t,h] = Σ_j softmax_j(scale · q[b,t,h]·k[b,s_j,h/G]) v[b,s_j,h/G] over the row's valid slots
// s_j = indices[b,t,j] ≥ 0 (G = H / Hkv); lse[b,t,h] = the log-sum-exp of those logits (−inf and
// o = 0 for a row without a valid slot). One block per (b, t), all H heads together.
void forward(Dtype dt, const void* q, const void* k, const void* v, const int64_t* indices, void* o, float* lse, int B,
             int T, int H, int Hkv, int D, int K, float scale, cudaStream_t stream);

// Gradients of the forward: dq [B,T,H,D] of type dt (written); dk, dv [B,T,Hkv,D] fp32, which the
// caller zeroes: each query adds its selected keys' contributions (fp32 atomics, the heads of a KV
// group summed first). o and lse are the forward's outputs, dout = ∂L/∂o.
void backward(Dtype dt, const void* q, const void* k, const void* v, const int64_t* indices, const void* o,
              const float* lse, const void* dout, void* dq, float* dk, float* dv, int B, int T, int H, int Hkv, int D,
              int K, float scale, cudaStream_t stream);

}  // namespace mixbench::token_sparse_cuda
