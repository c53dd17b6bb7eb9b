// The attention op's optimized paths (used by every layer that attends).
#pragma once
#include <ATen/core/Tensor.h>

namespace mixbench {

// q [B,T,H,D], k [B,T,Hkv,D], v [B,T,Hkv,Dv] -> o [B,T,H,Dv]
at::Tensor attention_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                         int64_t window, double logit_scale_a);
at::Tensor attention_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                          int64_t window, double logit_scale_a);
// One decode step over a static cache: q [B,H,D] (the token at position p = pos_dev [1], int64 on
// q's device) attends to the first min(p + 1, cap) slots of K, V [B,cap,Hkv,D] (a full layer's cache
// in position order, or a window's ring: slot = position mod cap), with the logit scale
// log_a(p + a) when a > 0. Scores and softmax in FP32 for half inputs. -> o [B,H,D] in q's dtype.
// On CUDA a split-KV kernel (head_dim 64/128/256), elsewhere LibTorch over the masked cache; both
// read the position on the device, so a captured CUDA graph replays the step at any position.
at::Tensor attention_decode_static(const at::Tensor& q, const at::Tensor& K, const at::Tensor& V, const at::Tensor& pos_dev,
                                   double scale, double logit_scale_a);
// The decoded token's attention inputs from its projection p [B, (H + 2·Hkv)·D] (the columns of
// c_q | c_k | c_v; on value-embedding layers Hkv more: the gates' pre-activations z = x[:12] W_vegᵀ):
// q and k rotated at the position pos_dev (RoPE base rope_base; 0 = no RoPE), RMS-normalised and
// ×1.2, v + 3·σ(z)·ve when ve [B, Hkv·D] is defined; k and v written into the static cache K, V
// [B,cap,Hkv,D] at slot pos_dev mod cap. Returns q [B,H,D]. The arithmetic (and roundings) of the
// eager layer; on CUDA one kernel, elsewhere (and for what the kernel does not take) LibTorch ops
// (attention_decode_qkv_reference).
at::Tensor attention_decode_qkv(const at::Tensor& p, const at::Tensor& ve, const at::Tensor& pos_dev, const at::Tensor& K,
                                const at::Tensor& V, int64_t H, double rope_base);
at::Tensor attention_decode_qkv_reference(const at::Tensor& p, const at::Tensor& ve, const at::Tensor& pos_dev,
                                          const at::Tensor& K, const at::Tensor& V, int64_t H, double rope_base);
// The LibTorch path of attention_decode_static (what the kernel is checked against).
at::Tensor attention_decode_static_reference(const at::Tensor& q, const at::Tensor& K, const at::Tensor& V,
                                             const at::Tensor& pos_dev, double scale, double logit_scale_a);
// Attention of one token per row over the listed slots of a cache: q [B,H,D], K, V [B,cap,Hkv,D],
// keys [B,S,n] int64 with S = 1 (one list for the row) or Hkv (one per KV head), valid [B,S,n] bool
// (an invalid or negative entry names no slot). On CUDA, where the split-KV kernel takes the shapes
// and dtypes (head_dim 64/128/256, fp32/bf16/fp16, contiguous caches), one launch (its keys split
// over the grid); returns an undefined tensor where it does not apply (the caller's LibTorch path).
at::Tensor attention_decode_listed(const at::Tensor& q, const at::Tensor& K, const at::Tensor& V, const at::Tensor& keys,
                                   const at::Tensor& valid, double scale);
// q_t ×= log_a(t + a) (no-op for a <= 0)
at::Tensor apply_logit_scale(const at::Tensor& q, double a);

}  // namespace mixbench
