// The decoded token's attention inputs in one launch (mixers/attention/decode_qkv_kernel.cu): from
// the token's q|k|v(|z) projection row, q and k through RoPE at the device position, RMSNorm and
// ×1.2, v plus the value-embedding gate, k and v stored in the static cache. The LibTorch wrapper
// is attention_decode_qkv (mixers/attention/decode_attention.cpp).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "mixers/common/rope_kernel.h"

namespace mixbench::attn_decode_cuda {

struct QkvStep {
  int B, H, Hkv, D, cap;
  int64_t p_stride;   // elements between rows of p
  float eps, qk_gain; // RMSNorm eps (fp32 machine epsilon) and the gain after it (1.2)
};
// p [B, ≥ (H + 2·Hkv)·D (+ Hkv with ve)] rows: q heads, k heads, v heads, then the gates' z (with ve).
// For each q/k head: rotated by pos·inv_freq (angle in fp64, cos/sin rounded to fp32; inv_freq null
// = no rotation) and rounded to dt, then y = round(round(x·rsqrt(mean(x²) + eps))·qk_gain), the
// eager layer's roundings. q heads go to q_out [B,H,D]; k heads to K[b, *pos mod cap]; v heads,
// v + 3·σ(z)·ve (ve [B,Hkv·D], null = none) rounded once, to V[b, *pos mod cap]. K, V [B,cap,Hkv,D].
// Every buffer of type dt, contiguous; D even, D ≤ 1024.
void qkv_step(layers::rope_cuda::Dtype dt, const QkvStep& s, const void* p, const void* ve, const double* inv_freq,
              const int64_t* pos, void* q_out, void* K, void* V, cudaStream_t stream);

}  // namespace mixbench::attn_decode_cuda
