// CUDA paths of `simple_gla` and `gated_delta_rule` built on the tensor-core chunk kernels
// (chunk_kernels.h), with autograd. Eligible inputs: q, k, v bf16 or fp16 on one CUDA device,
// [B,T,H,K] / [B,T,H,V] with K, V ∈ {64, 128}, g [B,T,H] (and beta [B,T,H]) of any floating dtype,
// h0 undefined or [B,H,K,V]. Everything else goes to the other paths (chunk_tc_eligible is false,
// and always false in a build without CUDA).
#pragma once
#include <ATen/core/Tensor.h>

#include <utility>

namespace mixbench::linear {

bool chunk_tc_eligible(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                       const at::Tensor& beta, const at::Tensor& h0);

// simple_gla: forward and backward on the kernels (o in the input dtype, ht fp32).
std::pair<at::Tensor, at::Tensor> simple_gla_tc(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                const at::Tensor& g, double scale, const at::Tensor& h0);

// gated_delta_rule: forward on the kernels; the backward runs the explicit chunked backward
// (gated_delta_backward's algebra) with its two walks on the kernels.
std::pair<at::Tensor, at::Tensor> gated_delta_rule_tc(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                      const at::Tensor& g, const at::Tensor& beta, double scale,
                                                      const at::Tensor& h0);

}  // namespace mixbench::linear
