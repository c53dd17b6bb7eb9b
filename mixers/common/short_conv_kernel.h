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

}  // namespace mixbench::layers::short_conv_cuda
