// sparse_attention_kernel: the token-sparse attention kernels (token_sparse_kernel.cu) behind a
// torch::autograd::Function. The forward saves o and the row log-sum-exp [B,T,H] fp32; the backward
// recomputes the probabilities from them, writes dq in the inputs' dtype and accumulates dk, dv in
// zeroed fp32 buffers (cast to the dtype on the way out). Everything runs on the current stream with
// no host synchronisation.
#include "mixers/sparse/token_sparse_cuda.h"

#include <ATen/ATen.h>

#if defined(MIXBENCH_WITH_CUDA)
#include <ATen/cuda/CUDAContext.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cstdint>

#include "mixers/sparse/token_sparse_kernel.h"
#endif

#include "harness/errors.h"
#include "harness/registry.h"

namespace mixbench {

#if defined(MIXBENCH_WITH_CUDA)
namespace {

namespace ts = token_sparse_cuda;

ts::Dtype dtype_of(const at::Tensor& t) {
  return t.scalar_type() == at::kFloat ? ts::Dtype::F32 : t.scalar_type() == at::kBFloat16 ? ts::Dtype::BF16 : ts::Dtype::F16;
}

// Contiguous, its data 16-byte aligned (the kernels' vector loads): a copy where a view's offset is not.
at::Tensor dense(const at::Tensor& x) {
  at::Tensor c = x.contiguous();
  return reinterpret_cast<std::uintptr_t>(c.data_ptr()) % 16 == 0 ? c : c.clone();
}

struct TokenSparseFn : public torch::autograd::Function<TokenSparseFn> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q_in,
                                                const at::Tensor& k_in, const at::Tensor& v_in,
                                                const at::Tensor& idx_in, double scale) {
    const at::Tensor q = dense(q_in), k = dense(k_in), v = dense(v_in), idx = idx_in.contiguous();
    const int64_t B = q.size(0), T = q.size(1), H = q.size(2), D = q.size(3), Hkv = k.size(2), K = idx.size(2);
    at::Tensor o = at::empty_like(q);
    at::Tensor lse = at::empty({B, T, H}, q.options().dtype(at::kFloat));
    ts::forward(dtype_of(q), q.data_ptr(), k.data_ptr(), v.data_ptr(), idx.data_ptr<int64_t>(), o.data_ptr(),
                lse.data_ptr<float>(), int(B), int(T), int(H), int(Hkv), int(D), int(K), float(scale),
                at::cuda::getCurrentCUDAStream());
    ctx->saved_data["scale"] = scale;
    ctx->save_for_backward({q, k, v, idx, o, lse});
    return {o};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &idx = saved[3], &o = saved[4], &lse = saved[5];
    const double scale = ctx->saved_data["scale"].toDouble();
    const at::Tensor dout = dense(grads[0].to(q.scalar_type()));
    const int64_t B = q.size(0), T = q.size(1), H = q.size(2), D = q.size(3), Hkv = k.size(2), K = idx.size(2);
    at::Tensor dq = at::empty_like(q);
    at::Tensor dk = at::zeros(k.sizes(), k.options().dtype(at::kFloat));
    at::Tensor dv = at::zeros(v.sizes(), v.options().dtype(at::kFloat));
    ts::backward(dtype_of(q), q.data_ptr(), k.data_ptr(), v.data_ptr(), idx.data_ptr<int64_t>(), o.data_ptr(),
                 lse.data_ptr<float>(), dout.data_ptr(), dq.data_ptr(), dk.data_ptr<float>(), dv.data_ptr<float>(),
                 int(B), int(T), int(H), int(Hkv), int(D), int(K), float(scale), at::cuda::getCurrentCUDAStream());
    return {dq, dk.to(k.scalar_type()), dv.to(v.scalar_type()), at::Tensor(), at::Tensor()};
  }
};

}  // namespace
#endif

bool sparse_attention_kernel_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const at::Tensor& indices) {
#if defined(MIXBENCH_WITH_CUDA)
  const at::ScalarType dt = q.scalar_type();
  if (!q.is_cuda() || (dt != at::kFloat && dt != at::kBFloat16 && dt != at::kHalf)) return false;
  if (k.scalar_type() != dt || v.scalar_type() != dt || !k.is_cuda() || !v.is_cuda()) return false;
  if (indices.scalar_type() != at::kLong || indices.device() != q.device()) return false;
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4 || indices.dim() != 3) return false;
  const int64_t D = q.size(3);
  if (v.size(3) != D || k.size(3) != D) return false;
  // grid (T, B); int offsets within a row, int64 beyond
  if (q.size(1) >= (int64_t(1) << 31) || q.size(0) > 65535 || indices.size(2) >= (int64_t(1) << 31)) return false;
  return token_sparse_cuda::supported(int(q.size(2)), int(k.size(2)), int(D));
#else
  (void)q, (void)k, (void)v, (void)indices;
  return false;
#endif
}

at::Tensor sparse_attention_kernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const at::Tensor& indices, double scale) {
#if defined(MIXBENCH_WITH_CUDA)
  if (!sparse_attention_kernel_applies(q, k, v, indices))
    throw InputError("sparse_attention_kernel: inputs the token-sparse kernels are not built for");
  note_kernel("token_sparse_attention");
  return TokenSparseFn::apply(q, k, v, indices, scale)[0];
#else
  (void)q, (void)k, (void)v, (void)indices, (void)scale;
  throw InputError("sparse_attention_kernel: this build has no CUDA");
#endif
}

}  // namespace mixbench
