// Backward shared by the autograd functions whose forward runs a kernel without recording a graph
// (the CPU raw-buffer forwards, the CUDA kernels): recompute through the LibTorch chunked path and
// differentiate that, so the gradients are exactly the chunked path's.
#pragma once
#include <ATen/core/Tensor.h>

#include <functional>
#include <utility>
#include <vector>

namespace torch::autograd {
struct AutogradContext;
}

namespace mixbench::linear {

// An absent optional input travels through Function::apply as an empty tensor (apply records every
// tensor argument's device, so it cannot be undefined); this maps it back to undefined.
inline at::Tensor present(const at::Tensor& x) { return x.defined() && x.numel() > 0 ? x : at::Tensor(); }

// (o, ht) from the inputs in forward-argument order (absent ones undefined), under grad mode.
using ChunkedFn = std::function<std::pair<at::Tensor, at::Tensor>(const std::vector<at::Tensor>&)>;

// The saved tensors (forward-argument order) are detached; those whose gradient is needed require
// one; `chunked` recomputes (o, ht); (o, ht) are differentiated against the incoming gradients.
// Returns one gradient per forward argument, `n_args` of them (trailing non-tensor arguments and
// inputs that need none get undefined).
std::vector<at::Tensor> recompute_backward(torch::autograd::AutogradContext* ctx, const std::vector<at::Tensor>& grads,
                                           size_t n_args, const ChunkedFn& chunked);

}  // namespace mixbench::linear
