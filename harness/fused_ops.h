// Element-wise steps of the backbone fused into one CUDA pass each way on a GPU (fp32 / bf16 /
// fp16, with their own backward; harness/fused_ops_kernel.cu); elsewhere the same arithmetic in
// LibTorch ops, bit for bit as before.
#pragma once
#include <ATen/core/Tensor.h>

namespace mixbench {

// The MLP's activation relu(h)².
at::Tensor relu_square(const at::Tensor& h);
// a·x + b·x0 with a, b one-element tensors (nanochat's resid / x0 mix before each block).
at::Tensor scaled_sum(const at::Tensor& a, const at::Tensor& x, const at::Tensor& b, const at::Tensor& x0);

}  // namespace mixbench
