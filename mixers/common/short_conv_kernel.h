// The causal depthwise short convolution + SiLU of the delta-rule layers in fused CUDA kernels
// (mixers/common/short_conv_kernel.cu); the autograd wrapper is short_conv_silu
// (mixers/linear/delta_layer.cpp). x, y, dy, dx: [B, T, C] contiguous; w: [C, W] (W ≤ 8).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "mixers/common/rope_kernel.h"

namespace mixbench::layers::short_conv_cuda {

using Dtype = rope_cuda::Dtype;
// y[b,t,c] = silu(Σ_i w[c,i]·x[b, t−W+1+i, c]) (zero before the start)
void forward(Dtype dt, const void* x, const void* w, void* y, int64_t B, int64_t T, int64_t C, int W, cudaStream_t stream);
// dx (x's dtype) and dw (fp32 [C, W], zeroed here) from dy.
void backward(Dtype dt, const void* x, const void* w, const void* dy, void* dx, float* dw, int64_t B, int64_t T, int64_t C,
              int W, cudaStream_t stream);

// The same with the output side (forward's y, backward's dy) split along the channels into three
// contiguous buffers: channels [0, c1) in p[0] [B, T, c1], [c1, c2) in p[1] [B, T, c2 − c1] and
// [c2, C) in p[2] [B, T, C − c2] (q, k and v of one projection: one launch, no copies).
struct Split {
  void* p[3];
  int64_t c1, c2;
};
void forward_split(Dtype dt, const void* x, const void* w, const Split& y, int64_t B, int64_t T, int64_t C, int W,
                   cudaStream_t stream);
void backward_split(Dtype dt, const void* x, const void* w, const Split& dy, void* dx, float* dw, int64_t B, int64_t T,
                    int64_t C, int W, cudaStream_t stream);

}  // namespace mixbench::layers::short_conv_cuda
