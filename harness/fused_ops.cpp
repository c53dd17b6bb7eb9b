#include "harness/fused_ops.h"

#include <ATen/ATen.h>

#if defined(MIXBENCH_WITH_CUDA)
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/custom_function.h>

#include "harness/fused_ops_kernel.h"
#endif

namespace mixbench {

#if defined(MIXBENCH_WITH_CUDA)
namespace {
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool fusable(const at::Tensor& x) {
  const auto st = x.scalar_type();
  return x.is_cuda() && (st == at::kFloat || st == at::kBFloat16 || st == at::kHalf);
}
fused_cuda::Dtype kernel_dtype(const at::Tensor& x) {
  return x.scalar_type() == at::kFloat      ? fused_cuda::Dtype::F32
         : x.scalar_type() == at::kBFloat16 ? fused_cuda::Dtype::BF16
                                            : fused_cuda::Dtype::F16;
}
cudaStream_t stream_of(const at::Tensor& x) { return c10::cuda::getCurrentCUDAStream(x.device().index()).stream(); }

// Saves the pre-activation h (the unfused graph saves relu(h), the same size).
struct ReluSquareFn : public torch::autograd::Function<ReluSquareFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& h) {
    ctx->save_for_backward({h});
    at::Tensor y = at::empty_like(h);
    fused_cuda::relu_square_forward(kernel_dtype(h), h.data_ptr(), y.data_ptr(), h.numel(), stream_of(h));
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    const at::Tensor h = ctx->get_saved_variables()[0];
    const at::Tensor dy = g[0].to(h.scalar_type()).contiguous();
    at::Tensor dh = at::empty_like(h);
    fused_cuda::relu_square_backward(kernel_dtype(h), h.data_ptr(), dy.data_ptr(), dh.data_ptr(), h.numel(), stream_of(h));
    return {dh};
  }
};

// a, b: one element each, in x's dtype.
struct ScaledSumFn : public torch::autograd::Function<ScaledSumFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& x, const at::Tensor& b,
                            const at::Tensor& x0) {
    ctx->save_for_backward({a, x, b, x0});
    at::Tensor y = at::empty_like(x);
    fused_cuda::scaled_sum_forward(kernel_dtype(x), a.data_ptr(), x.data_ptr(), b.data_ptr(), x0.data_ptr(), y.data_ptr(),
                                   x.numel(), stream_of(x));
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    auto s = ctx->get_saved_variables();
    const at::Tensor &a = s[0], &x = s[1], &b = s[2], &x0 = s[3];
    const at::Tensor dy = g[0].to(x.scalar_type()).contiguous();
    at::Tensor dx = at::empty_like(x), dx0 = at::empty_like(x0);
    at::Tensor sums = at::zeros({2}, x.options().dtype(at::kFloat));
    fused_cuda::scaled_sum_backward(kernel_dtype(x), a.data_ptr(), x.data_ptr(), b.data_ptr(), x0.data_ptr(), dy.data_ptr(),
                                    dx.data_ptr(), dx0.data_ptr(), sums.data_ptr<float>(), x.numel(), stream_of(x));
    return {sums[0].to(a.scalar_type()).reshape(a.sizes()), dx, sums[1].to(b.scalar_type()).reshape(b.sizes()), dx0};
  }
};
}  // namespace
#endif

at::Tensor relu_square(const at::Tensor& h) {
#if defined(MIXBENCH_WITH_CUDA)
  if (fusable(h)) return ReluSquareFn::apply(h.contiguous());
#endif
  return at::relu(h).square();
}

at::Tensor scaled_sum(const at::Tensor& a, const at::Tensor& x, const at::Tensor& b, const at::Tensor& x0) {
#if defined(MIXBENCH_WITH_CUDA)
  if (fusable(x) && x0.scalar_type() == x.scalar_type() && x0.sizes() == x.sizes() && a.numel() == 1 && b.numel() == 1 &&
      a.is_cuda() && b.is_cuda())
    return ScaledSumFn::apply(a.to(x.scalar_type()), x.contiguous(), b.to(x.scalar_type()), x0.contiguous());
#endif
  return a * x + b * x0;
}

}  // namespace mixbench
