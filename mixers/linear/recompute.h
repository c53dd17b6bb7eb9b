// Pieces shared by the raw-buffer CPU forwards and the kernel wrappers, among them the backward of
// the autograd functions whose forward runs a kernel without recording a graph (the CPU raw-buffer
// forwards, the CUDA kernels): recompute through the LibTorch chunked path and differentiate that,
// so the gradients are exactly the chunked path's.
#pragma once
#include <ATen/core/Tensor.h>

#include <functional>
#include <cstdint>
#include <initializer_list>
#include <utility>
#include <vector>

namespace torch::autograd {
struct AutogradContext;
}

namespace mixbench::linear {

// An absent optional input travels through Function::apply as an empty tensor (apply records every
// tensor argument's device, so it cannot be undefined); this maps it back to undefined.
inline at::Tensor present(const at::Tensor& x) { return x.defined() && x.numel() > 0 ? x : at::Tensor(); }

// The raw-buffer CPU forwards take fp32 / fp64 CPU tensors of one dtype (absent ones undefined).
inline bool raw_cpu_inputs(std::initializer_list<const at::Tensor*> ts) {
  const at::ScalarType dt = (*ts.begin())->scalar_type();
  if (dt != at::kFloat && dt != at::kDouble) return false;
  for (const at::Tensor* t : ts)
    if (t->defined() && (t->scalar_type() != dt || !t->device().is_cpu())) return false;
  return true;
}

// Whether autograd will record a graph through these inputs.
bool grad_needed(std::initializer_list<const at::Tensor*> ts);

// (o, ht) from the inputs in forward-argument order (absent ones undefined), under grad mode.
using ChunkedFn = std::function<std::pair<at::Tensor, at::Tensor>(const std::vector<at::Tensor>&)>;

// The saved tensors (forward-argument order) are detached; those whose gradient is needed require
// one; `chunked` recomputes (o, ht); (o, ht) are differentiated against the incoming gradients.
// Returns one gradient per forward argument, `n_args` of them (trailing non-tensor arguments and
// inputs that need none get undefined).
std::vector<at::Tensor> recompute_backward(torch::autograd::AutogradContext* ctx, const std::vector<at::Tensor>& grads,
                                           size_t n_args, const ChunkedFn& chunked);

// A gated linear-attention forward (q, k, v, g, scale, h0) -> (o, ht); h0 may be undefined.
using GatedFwd = std::pair<at::Tensor, at::Tensor> (*)(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                       const at::Tensor& g, double scale, const at::Tensor& h0);

// Runs `raw` (a kernel that records no graph); when autograd records through the inputs, inside an
// autograd function whose backward recomputes `chunked` and differentiates it (recompute_backward).
std::pair<at::Tensor, at::Tensor> raw_forward_chunked_backward(const at::Tensor& q, const at::Tensor& k,
                                                               const at::Tensor& v, const at::Tensor& g, double scale,
                                                               const at::Tensor& h0, GatedFwd raw, GatedFwd chunked);

// Prefetch the rows [first, first + n) of a chunk (row i at row0 + i·H of each [rows, D] input):
// the rows are strided by H·D, and the hardware prefetcher does not cross pages.
template <typename scalar_t>
inline void prefetch_rows(std::initializer_list<std::pair<const scalar_t*, int64_t>> inputs, int64_t row0, int64_t H,
                          int64_t first, int64_t n) {
  constexpr int64_t kLine = 64 / sizeof(scalar_t);  // elements per cache line
  for (int64_t i = first; i < first + n; ++i)
    for (const auto& [p, D] : inputs)
      for (int64_t d = 0; d < D; d += kLine) __builtin_prefetch(p + (row0 + i * H) * D + d);
}

}  // namespace mixbench::linear
