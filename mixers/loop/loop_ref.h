// FP64 reference arithmetic shared by the looped methods' residual streams (written out position
// by position, independently of the fast paths).
#pragma once
#include <ATen/core/Tensor.h>

namespace mixbench::loop_ref {

// RMSNorm without weight of x [B,T,d], position by position (eps: nanochat's float32 epsilon).
at::Tensor rms_norm(const at::Tensor& x);

}  // namespace mixbench::loop_ref
