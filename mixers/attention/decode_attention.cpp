// attention_decode_static: one query token over a static (preallocated) KV cache, its length read on
// the device (mixers/attention/attention.h).
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "harness/decode_knobs.h"
#include "harness/errors.h"
#include "harness/fused_ops.h"
#include "harness/op_scope.h"
#include "mixers/attention/attention.h"
#include "mixers/common/layers.h"

#if defined(MIXBENCH_WITH_CUDA)
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAStream.h>

#include "mixers/attention/decode_attention_kernel.h"
#include "mixers/attention/decode_qkv_kernel.h"
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

#if defined(MIXBENCH_WITH_CUDA)
namespace {
// What a split-KV launch over `slots` slots (the cache's capacity, or a key list's length) needs
// beside its inputs: the split count, its fp32 workspace, the arrival counters of its in-launch merge
// (one zeroed buffer per device and size, kept: each launch leaves it zero; made at the first, eager,
// step, before any capture), the kernel's dtype and the stream.
struct SplitKvLaunch {
  int splits = 1, min_slots = 16;
  at::Tensor ws, counters;
  attn_decode_cuda::Dtype dt = attn_decode_cuda::Dtype::F32;
  cudaStream_t stream = nullptr;
  unsigned* counter_ptr() const { return reinterpret_cast<unsigned*>(counters.data_ptr<int32_t>()); }
};
SplitKvLaunch split_kv_launch(const at::Tensor& q, int B, int H, int Hkv, int D, int slots) {
  SplitKvLaunch l;
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  l.min_slots = int(decode_split_min_slots());
  l.splits = attn_decode_cuda::choose_splits(int(decode_split_rows(B, H, Hkv)), 1, slots, sms, l.min_slots);
  l.ws = at::empty({attn_decode_cuda::workspace_floats(B, H, D, l.splits)}, q.options().dtype(at::kFloat));
  l.dt = q.scalar_type() == at::kFloat      ? attn_decode_cuda::Dtype::F32
         : q.scalar_type() == at::kBFloat16 ? attn_decode_cuda::Dtype::BF16
                                            : attn_decode_cuda::Dtype::F16;
  const int64_t n = attn_decode_cuda::counter_slots(B, H);
  l.counters = layers::device_constant(fmt::format("attn_decode_counters/{}", n), q.options().dtype(at::kInt),
                                       [&] { return at::zeros({n}, at::kInt); });
  l.stream = c10::cuda::getCurrentCUDAStream(q.device().index()).stream();
  return l;
}
}  // namespace
#endif

at::Tensor attention_decode_static(const at::Tensor& q, const at::Tensor& K, const at::Tensor& V, const at::Tensor& pos_dev,
                                   double scale, double logit_scale_a) {
  OpScope scope("mixbench::attention_decode_static");  // split-KV: one launch on a GPU (the splits merge in it)
#if defined(MIXBENCH_WITH_CUDA)
  if (q.is_cuda() && attn_decode_cuda::supported_head_dim(int(q.size(-1))) &&
      (q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kHalf)) {
    check_shapes(q, K, V, pos_dev);
    if (K.scalar_type() != q.scalar_type() || V.scalar_type() != q.scalar_type() || !K.is_contiguous() || !V.is_contiguous())
      throw InputError("attention decode over a static cache: K and V must be contiguous and of q's dtype");
    const int B = int(q.size(0)), H = int(q.size(1)), D = int(q.size(2)), cap = int(K.size(1)), Hkv = int(K.size(2));
    const at::Tensor qc = q.contiguous();
    at::Tensor o = at::empty_like(qc);
    const SplitKvLaunch l = split_kv_launch(q, B, H, Hkv, D, cap);
    attn_decode_cuda::decode(l.dt, qc.data_ptr(), K.data_ptr(), V.data_ptr(), o.data_ptr(), pos_dev.data_ptr<int64_t>(), B, H,
                             Hkv, D, cap, float(scale), logit_scale_a, l.ws.data_ptr<float>(), l.splits, l.min_slots,
                             l.counter_ptr(), l.stream);
    return o;
  }
#endif
  return attention_decode_static_reference(q, K, V, pos_dev, scale, logit_scale_a);
}

at::Tensor attention_decode_listed(const at::Tensor& q, const at::Tensor& K, const at::Tensor& V, const at::Tensor& keys,
                                   const at::Tensor& valid, double scale) {
#if defined(MIXBENCH_WITH_CUDA)
  const auto st = q.scalar_type();
  if (!(q.is_cuda() && q.dim() == 3 && K.dim() == 4 && V.sizes() == K.sizes() && keys.dim() == 3 &&
        attn_decode_cuda::supported_head_dim(int(q.size(-1))) && (st == at::kFloat || st == at::kBFloat16 || st == at::kHalf) &&
        K.scalar_type() == st && V.scalar_type() == st && K.is_contiguous() && V.is_contiguous() && K.device() == q.device() &&
        keys.scalar_type() == at::kLong && keys.device() == q.device() && valid.sizes() == keys.sizes() &&
        K.size(0) == q.size(0) && K.size(3) == q.size(2) && K.size(2) >= 1 && q.size(1) % K.size(2) == 0 &&
        keys.size(0) == q.size(0) && (keys.size(1) == 1 || keys.size(1) == K.size(2)) && keys.size(2) >= 1 &&
        keys.size(2) <= std::numeric_limits<int>::max()))
    return at::Tensor();
  OpScope scope("mixbench::attention_decode_listed");  // one launch on a GPU
  const int B = int(q.size(0)), H = int(q.size(1)), D = int(q.size(2)), cap = int(K.size(1)), Hkv = int(K.size(2));
  const int n = int(keys.size(2)), rows = int(keys.size(1));
  const at::Tensor listed = keys.masked_fill(valid.logical_not(), -1).contiguous();
  const at::Tensor qc = q.contiguous();
  at::Tensor o = at::empty_like(qc);
  const SplitKvLaunch l = split_kv_launch(q, B, H, Hkv, D, n);
  attn_decode_cuda::decode_listed(l.dt, qc.data_ptr(), K.data_ptr(), V.data_ptr(), o.data_ptr(), nullptr,
                                  listed.data_ptr<int64_t>(), n, rows, B, H, Hkv, D, cap, float(scale), 0.0,
                                  l.ws.data_ptr<float>(), l.splits, l.min_slots, l.counter_ptr(), l.stream);
  return o;
#else
  (void)q, (void)K, (void)V, (void)keys, (void)valid, (void)scale;
  return at::Tensor();
#endif
}

namespace {
void check_qkv(const at::Tensor& p, const at::Tensor& ve, const at::Tensor& pos_dev, const at::Tensor& K, const at::Tensor& V,
               int64_t H) {
  if (K.dim() != 4 || V.sizes() != K.sizes() || H < 1 || H % K.size(2) != 0 || p.dim() != 2 || p.size(0) != K.size(0))
    throw InputError(fmt::format("attention decode q/k/v takes p [B,N] and K, V [B,cap,Hkv,D] with H a multiple of Hkv "
                                 "(got p {}, K {}, V {}, H {})",
                                 c10::str(p.sizes()), c10::str(K.sizes()), c10::str(V.sizes()), H));
  const int64_t Hkv = K.size(2), D = K.size(3), N = (H + 2 * Hkv) * D + (ve.defined() ? Hkv : 0);
  if (p.size(1) != N)
    throw InputError(fmt::format("attention decode q/k/v: p has {} columns, {} expected", p.size(1), N));
  if (ve.defined() && (ve.dim() != 2 || ve.size(0) != p.size(0) || ve.size(1) != Hkv * D))
    throw InputError(fmt::format("attention decode q/k/v: ve must be [B, {}] (got {})", Hkv * D, c10::str(ve.sizes())));
  if (pos_dev.numel() != 1 || pos_dev.scalar_type() != at::kLong || pos_dev.device() != p.device())
    throw InputError("attention decode q/k/v takes its position as an int64 [1] tensor on p's device");
}
}  // namespace

at::Tensor attention_decode_qkv_reference(const at::Tensor& p, const at::Tensor& ve, const at::Tensor& pos_dev,
                                          const at::Tensor& K, const at::Tensor& V, int64_t H, double rope_base) {
  check_qkv(p, ve, pos_dev, K, V, H);
  const int64_t B = p.size(0), Hkv = K.size(2), D = K.size(3);
  at::Tensor q = p.narrow(1, 0, H * D).view({B, 1, H, D});
  at::Tensor k = p.narrow(1, H * D, Hkv * D).view({B, 1, Hkv, D});
  at::Tensor v = p.narrow(1, (H + Hkv) * D, Hkv * D).view({B, 1, Hkv, D});
  if (rope_base > 0) {
    q = layers::rope_pos_dev(q, rope_base, pos_dev);
    k = layers::rope_pos_dev(k, rope_base, pos_dev);
  }
  q = layers::rms_norm(q) * 1.2;
  k = layers::rms_norm(k) * 1.2;
  if (ve.defined()) v = gated_add(v, p.narrow(1, (H + 2 * Hkv) * D, Hkv).view({B, 1, Hkv}), 3.0, ve.view({B, 1, Hkv, D}));
  const at::Tensor slot = pos_dev.remainder(K.size(1));
  K.index_copy_(1, slot, k);
  V.index_copy_(1, slot, v);
  return q.reshape({B, H, D});
}

at::Tensor attention_decode_qkv(const at::Tensor& p, const at::Tensor& ve, const at::Tensor& pos_dev, const at::Tensor& K,
                                const at::Tensor& V, int64_t H, double rope_base) {
  OpScope scope("mixbench::attention_decode_qkv");  // one launch on a GPU
#if defined(MIXBENCH_WITH_CUDA)
  const auto st = p.scalar_type();
  if (p.is_cuda() && (st == at::kFloat || st == at::kBFloat16 || st == at::kHalf) && K.dim() == 4 &&
      K.size(3) % 2 == 0 && K.size(3) <= 1024 && K.scalar_type() == st && V.scalar_type() == st && K.is_contiguous() &&
      V.is_contiguous() && p.stride(1) == 1 && (!ve.defined() || (ve.scalar_type() == st && ve.is_contiguous()))) {
    check_qkv(p, ve, pos_dev, K, V, H);
    const int64_t B = p.size(0), Hkv = K.size(2), D = K.size(3);
    const auto dt = st == at::kFloat ? attn_decode_cuda::Dtype::F32
                    : st == at::kBFloat16 ? attn_decode_cuda::Dtype::BF16 : attn_decode_cuda::Dtype::F16;
    at::Tensor inv;
    if (rope_base > 0) {
      auto opts = at::TensorOptions().dtype(at::kDouble).device(p.device());
      inv = layers::device_constant(fmt::format("rope_inv_freq/{}/{}", rope_base, D), opts, [&] {
        return at::pow(rope_base, -at::arange(0, D / 2, opts) * (2.0 / double(D)));
      });
    }
    at::Tensor q = at::empty({B, H, D}, p.options());
    const attn_decode_cuda::QkvStep s{int(B), int(H), int(Hkv), int(D), int(K.size(1)), p.stride(0),
                                      1.1920928955078125e-07f, 1.2f};
    attn_decode_cuda::qkv_step(dt, s, p.data_ptr(), ve.defined() ? ve.data_ptr() : nullptr,
                               inv.defined() ? inv.data_ptr<double>() : nullptr, pos_dev.data_ptr<int64_t>(), q.data_ptr(),
                               K.data_ptr(), V.data_ptr(), c10::cuda::getCurrentCUDAStream(p.device().index()).stream());
    return q;
  }
#endif
  return attention_decode_qkv_reference(p, ve, pos_dev, K, V, H, rope_base);
}

}  // namespace mixbench
