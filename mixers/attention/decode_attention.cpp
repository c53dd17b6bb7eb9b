// attention_decode_static: one query token over a static (preallocated) KV cache, its length read on
// the device (mixers/attention/attention.h).
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>

#include "harness/errors.h"
#include "mixers/attention/attention.h"
#include "mixers/common/layers.h"

#if defined(MIXBENCH_WITH_CUDA)
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAStream.h>

#include "mixers/attention/decode_attention_kernel.h"
#endif

namespace mixbench {

namespace {
void check_shapes(const at::Tensor& q, const at::Tensor& K, const at::Tensor& V, const at::Tensor& pos_dev) {
  if (q.dim() != 3 || K.dim() != 4 || V.sizes() != K.sizes() || q.size(0) != K.size(0) || q.size(2) != K.size(3) ||
      K.size(2) < 1 || q.size(1) % K.size(2) != 0)
    throw InputError(fmt::format("attention decode over a static cache takes q [B,H,D] and K, V [B,cap,Hkv,D] with H a "
                                 "multiple of Hkv (got q {}, K {}, V {})",
                                 c10::str(q.sizes()), c10::str(K.sizes()), c10::str(V.sizes())));
  if (pos_dev.numel() != 1 || pos_dev.scalar_type() != at::kLong || pos_dev.device() != q.device())
    throw InputError("attention decode over a static cache takes its position as an int64 [1] tensor on q's device");
}
}  // namespace

at::Tensor attention_decode_static_reference(const at::Tensor& q, const at::Tensor& K, const at::Tensor& V,
                                             const at::Tensor& pos_dev, double scale, double logit_scale_a) {
  check_shapes(q, K, V, pos_dev);
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2), cap = K.size(1), Hkv = K.size(2), G = H / Hkv;
  const bool half = layers::is_half(q);
  at::Tensor qf = half ? layers::f32(q) : q;
  if (logit_scale_a > 0)
    qf = qf * (at::log(pos_dev.to(at::kDouble) + logit_scale_a) / std::log(logit_scale_a)).to(qf.scalar_type()).view({1, 1, 1});
  const at::Tensor Kf = half ? layers::f32(K) : K, Vf = half ? layers::f32(V) : V;
  // valid slots: those below min(p + 1, cap), i.e. slot <= p
  const at::Tensor valid = at::arange(cap, pos_dev.options()).le(pos_dev);                     // [cap]
  at::Tensor scores = at::matmul(qf.reshape({B, Hkv, G, D}), Kf.permute({0, 2, 3, 1})) * scale;  // [B,Hkv,G,cap]
  scores = scores.masked_fill(valid.logical_not().view({1, 1, 1, cap}), -INFINITY);
  const at::Tensor o = at::matmul(at::softmax(scores, -1), Vf.transpose(1, 2));  // [B,Hkv,G,D]
  return o.reshape({B, H, D}).to(q.scalar_type());
}

at::Tensor attention_decode_static(const at::Tensor& q, const at::Tensor& K, const at::Tensor& V, const at::Tensor& pos_dev,
                                   double scale, double logit_scale_a) {
#if defined(MIXBENCH_WITH_CUDA)
  if (q.is_cuda() && attn_decode_cuda::supported_head_dim(int(q.size(-1))) &&
      (q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kHalf)) {
    check_shapes(q, K, V, pos_dev);
    if (K.scalar_type() != q.scalar_type() || V.scalar_type() != q.scalar_type() || !K.is_contiguous() || !V.is_contiguous())
      throw InputError("attention decode over a static cache: K and V must be contiguous and of q's dtype");
    const int B = int(q.size(0)), H = int(q.size(1)), D = int(q.size(2)), cap = int(K.size(1)), Hkv = int(K.size(2));
    const at::Tensor qc = q.contiguous();
    at::Tensor o = at::empty_like(qc);
    const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
    const int splits = attn_decode_cuda::choose_splits(B, Hkv, cap, sms);
    at::Tensor ws = at::empty({attn_decode_cuda::workspace_floats(B, H, D, splits)}, q.options().dtype(at::kFloat));
    const auto dt = q.scalar_type() == at::kFloat      ? attn_decode_cuda::Dtype::F32
                    : q.scalar_type() == at::kBFloat16 ? attn_decode_cuda::Dtype::BF16
                                                       : attn_decode_cuda::Dtype::F16;
    attn_decode_cuda::decode(dt, qc.data_ptr(), K.data_ptr(), V.data_ptr(), o.data_ptr(), pos_dev.data_ptr<int64_t>(), B, H,
                             Hkv, D, cap, float(scale), logit_scale_a, ws.data_ptr<float>(), splits,
                             c10::cuda::getCurrentCUDAStream(q.device().index()).stream());
    return o;
  }
#endif
  return attention_decode_static_reference(q, K, V, pos_dev, scale, logit_scale_a);
}

}  // namespace mixbench
