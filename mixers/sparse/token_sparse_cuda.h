// The CUDA kernels of token-sparse attention (mixers/sparse/token_sparse_kernel.cu) as a
// differentiable LibTorch function; sparse_attention_fast calls it where it applies.
#pragma once
#include <ATen/core/Tensor.h>

namespace mixbench {

// Whether the kernels take these inputs: CUDA tensors of one dtype among fp32 / bf16 / fp16,
// D = Dv ∈ {64, 128}, H a multiple of Hkv, int64 indices [B,T,K] on the same device. Shapes only: no
// value is read, nothing synchronises. Always false in a build without CUDA.
bool sparse_attention_kernel_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const at::Tensor& indices);

// sparse_attention_fast's contract (mixers/sparse/sparse.h) through the kernels: o [B,T,H,D] in q's
// dtype, differentiable in q, k, v (dk, dv accumulated in fp32). Indices are not checked: −1 or
// 0 ≤ s ≤ t, distinct within a row. Capturable in a CUDA graph. Requires
// sparse_attention_kernel_applies.
at::Tensor sparse_attention_kernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const at::Tensor& indices, double scale);

}  // namespace mixbench
