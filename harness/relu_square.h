// The backbone MLP's activation relu(h)²: on a GPU (fp32 / bf16 / fp16) one fused CUDA pass each
// way with its own backward; elsewhere LibTorch's relu(h).square(), bit for bit as before.
#pragma once
#include <ATen/core/Tensor.h>

namespace mixbench {

at::Tensor relu_square(const at::Tensor& h);

}  // namespace mixbench
