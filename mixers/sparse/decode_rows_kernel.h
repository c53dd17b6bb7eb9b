// Length-aware products of one decoded token against the rows of a sparse layer's decode buffer
// (mixers/sparse/sparse_decode.h: row_scores, row_mix): the C entry points of
// mixers/sparse/decode_rows_kernel.cu. The number of rows the token's position reaches is read on
// the device, n = min(*pos / per + 1, L) (per = 1: per-token buffers; the block size: per-block
// ones), so a captured CUDA graph replays them at any position and the rows past n are never read.
// No host synchronisation, no allocation.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "mixers/common/rope_kernel.h"

namespace mixbench::decode_rows_cuda {

using Dtype = layers::rope_cuda::Dtype;

// Whether the kernels take these element types: q (or p) and the buffer of one type, or q (p) fp32
// over a half-precision buffer.
bool supported(Dtype q, Dtype buf);

// q [B,S,G,D] (type tq), K [B,L,S,D] (type tk), both contiguous. Without w: out [B,S,G,L] (type tq)
// = Σ_d q[b,s,g,d]·K[b,j,s,d] for j < n, 0 past n. With w [B,S,G] (type tq): out [B,S,L] (type tq) =
// Σ_g w[b,s,g]·max(0, Σ_d q[b,s,g,d]·K[b,j,s,d]) for j < n, 0 past n. fp32 accumulation, one
// rounding to tq per stored value (the product before the ReLU too, as the LibTorch path stores it).
void row_scores(Dtype tq, Dtype tk, const void* q, const void* K, const void* w, void* out, const int64_t* pos,
                int64_t per, int B, int S, int G, int D, int L, cudaStream_t stream);

// p [B,S,G,L] (type tp), V [B,L,S,D] (type tv), both contiguous: out [B,S,G,D] (type tv) =
// Σ_{j<n} p[b,s,g,j]·V[b,j,s,d], each p rounded to tv first, fp32 accumulation.
void row_mix(Dtype tp, Dtype tv, const void* p, const void* V, void* out, const int64_t* pos, int64_t per, int B, int S,
             int G, int D, int L, cudaStream_t stream);

}  // namespace mixbench::decode_rows_cuda
