#include "harness/relu_square.h"

#include <ATen/ATen.h>

#if defined(MIXBENCH_WITH_CUDA)
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/custom_function.h>

#include "harness/relu_square_kernel.h"
#endif

namespace mixbench {

#if defined(MIXBENCH_WITH_CUDA)
namespace {
relu_square_cuda::Dtype kernel_dtype(const at::Tensor& x) {
  return x.scalar_type() == at::kFloat      ? relu_square_cuda::Dtype::F32
         : x.scalar_type() == at::kBFloat16 ? relu_square_cuda::Dtype::BF16
                                            : relu_square_cuda::Dtype::F16;
}
cudaStream_t stream_of(const at::Tensor& x) { return c10::cuda::getCurrentCUDAStream(x.device().index()).stream(); }

// Saves the pre-activation h (the unfused graph saves relu(h), the same size).
struct ReluSquareFn : public torch::autograd::Function<ReluSquareFn> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& h) {
    ctx->save_for_backward({h});
    at::Tensor y = at::empty_like(h);
    relu_square_cuda::forward(kernel_dtype(h), h.data_ptr(), y.data_ptr(), h.numel(), stream_of(h));
    return y;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list g) {
    const at::Tensor h = ctx->get_saved_variables()[0];
    const at::Tensor dy = g[0].to(h.scalar_type()).contiguous();
    at::Tensor dh = at::empty_like(h);
    relu_square_cuda::backward(kernel_dtype(h), h.data_ptr(), dy.data_ptr(), dh.data_ptr(), h.numel(), stream_of(h));
    return {dh};
  }
};
}  // namespace
#endif

at::Tensor relu_square(const at::Tensor& h) {
#if defined(MIXBENCH_WITH_CUDA)
  const auto st = h.scalar_type();
  if (h.is_cuda() && (st == at::kFloat || st == at::kBFloat16 || st == at::kHalf)) return ReluSquareFn::apply(h.contiguous());
#endif
  return at::relu(h).square();
}

}  // namespace mixbench
