// Element-wise steps of the backbone and of the layers fused into one CUDA pass each way on a GPU
// (fp32 / bf16 / fp16, with their own backward; harness/fused_ops_kernel.cu,
// harness/row_norm_kernel.cu); elsewhere the same arithmetic in LibTorch ops, bit for bit as before.
#pragma once
#include <ATen/core/Tensor.h>

namespace mixbench {

// The MLP's activation relu(h)².
at::Tensor relu_square(const at::Tensor& h);
// a·x + b·x0 with a, b one-element tensors (nanochat's resid / x0 mix before each block).
at::Tensor scaled_sum(const at::Tensor& a, const at::Tensor& x, const at::Tensor& b, const at::Tensor& x0);

// The activation of a gated RMSNorm's gate.
enum class NormGate { None, Silu, Sigmoid };
// RMSNorm over the last dimension with a gain w (undefined: none) and an optional gate g (x's
// shape, before its activation): x·rsqrt(mean(x²) + eps)·w·act(g) (fla's FusedRMSNormGated).
// Elsewhere than the kernels: at::rms_norm on a GPU, x·rsqrt(mean(x²) + eps)·w otherwise, then
// `· act(g)`. A gate without an activation (or the reverse) throws std::invalid_argument.
at::Tensor rms_norm_gated(const at::Tensor& x, const at::Tensor& w, double eps, const at::Tensor& g = at::Tensor(),
                          NormGate act = NormGate::None);
// v + s·sigmoid(z)·e with one gate per row of the last dimension: v, e [..., D], z [...] (nanochat's
// value-embedding gate). Elsewhere than the kernels: `v + (s·sigmoid(z)).unsqueeze(-1)·e`.
at::Tensor gated_add(const at::Tensor& v, const at::Tensor& z, double s, const at::Tensor& e);
// L2 normalization over the last dimension: x·rsqrt(Σx² + eps) (fla's l2norm). Elsewhere than the
// kernels: rms_norm(x, eps/D)/√D on a GPU, the formula otherwise.
at::Tensor l2_normalize(const at::Tensor& x, double eps);

}  // namespace mixbench
