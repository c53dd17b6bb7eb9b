// The attention op's optimized paths (used by every layer that attends).
#pragma once
#include <ATen/core/Tensor.h>

namespace mixbench {

// q [B,T,H,D], k [B,T,Hkv,D], v [B,T,Hkv,Dv] -> o [B,T,H,Dv]
at::Tensor attention_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                         int64_t window, double logit_scale_a);
at::Tensor attention_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                          int64_t window, double logit_scale_a);
// q_t ×= log_a(t + a) (no-op for a <= 0)
at::Tensor apply_logit_scale(const at::Tensor& q, double a);

}  // namespace mixbench
