// One block per (head, row): a q/k head's D/2 rotation pairs, one per thread, normalised with a
// block reduction; a v head's D channels through the value-embedding gate.
#include "mixers/attention/decode_qkv_kernel.h"

#include "harness/cuda_dtype.cuh"
#include "harness/pdl.cuh"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace mixbench::attn_decode_cuda {

namespace {

using layers::from_f32;
using layers::load_f32;

// Σ over the block (blockDim.x a multiple of 32, ≤ 1024).
__device__ float block_sum(float v, float* shared) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : 0.f;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <class T>
__global__ void qkv_step_kernel(QkvStep s, const T* __restrict__ p, const T* __restrict__ ve,
                                const double* __restrict__ inv, const int64_t* __restrict__ pos, T* __restrict__ q_out,
                                T* __restrict__ K, T* __restrict__ V) {
  cuda_launch::pdl_wait();
  __shared__ float shared[32];
  const int head = blockIdx.x, b = blockIdx.y, half = s.D / 2, j = threadIdx.x;
  const int64_t t = *pos, slot = t % s.cap;
  const T* row = p + int64_t(b) * s.p_stride;
  if (head < s.H + s.Hkv) {  // q or k: RoPE, RMSNorm, gain
    const T* x = row + int64_t(head) * s.D;
    float x1 = 0.f, x2 = 0.f;
    if (j < half) {
      x1 = load_f32(x + j);
      x2 = load_f32(x + half + j);
      if (inv) {
        const double a = double(t) * inv[j];
        const float c = float(cos(a)), sn = float(sin(a));
        const float y1 = x1 * c + x2 * sn, y2 = x2 * c - x1 * sn;
        const T r1 = from_f32<T>(y1), r2 = from_f32<T>(y2);  // the rotation's output in dt
        x1 = load_f32(&r1);
        x2 = load_f32(&r2);
      }
    }
    const float r = rsqrtf(block_sum(x1 * x1 + x2 * x2, shared) / float(s.D) + s.eps);
    if (j >= half) return;
    const T n1 = from_f32<T>(x1 * r), n2 = from_f32<T>(x2 * r);  // the norm's output in dt
    T* y = head < s.H ? q_out + (int64_t(b) * s.H + head) * s.D
                      : K + ((int64_t(b) * s.cap + slot) * s.Hkv + (head - s.H)) * s.D;
    y[j] = from_f32<T>(load_f32(&n1) * s.qk_gain);
    y[half + j] = from_f32<T>(load_f32(&n2) * s.qk_gain);
    return;
  }
  const int h = head - s.H - s.Hkv;  // v head: value-embedding gate, store
  const T* v = row + int64_t(s.H + s.Hkv + h) * s.D;
  T* y = V + ((int64_t(b) * s.cap + slot) * s.Hkv + h) * s.D;
  float gate = 0.f;
  if (ve) gate = 3.f * (1.f / (1.f + __expf(-load_f32(row + int64_t(s.H + 2 * s.Hkv) * s.D + h))));
  for (int c = j; c < s.D; c += blockDim.x) {
    float o = load_f32(v + c);
    if (ve) o += gate * load_f32(ve + (int64_t(b) * s.Hkv + h) * s.D + c);
    y[c] = from_f32<T>(o);
  }
}

template <class T>
void launch(const QkvStep& s, const void* p, const void* ve, const double* inv, const int64_t* pos, void* q, void* K, void* V,
            cudaStream_t stream) {
  if (s.B == 0) return;
  const int threads = std::max(32, ((s.D / 2 + 31) / 32) * 32);
  const dim3 grid(unsigned(s.H + 2 * s.Hkv), unsigned(s.B));
  cuda_launch::launch_dependent("qkv step", qkv_step_kernel<T>, grid, threads, 0, stream, s, static_cast<const T*>(p),
                                static_cast<const T*>(ve), inv, pos, static_cast<T*>(q), static_cast<T*>(K),
                                static_cast<T*>(V));
}

}  // namespace

void qkv_step(layers::rope_cuda::Dtype dt, const QkvStep& s, const void* p, const void* ve, const double* inv_freq,
              const int64_t* pos, void* q_out, void* K, void* V, cudaStream_t stream) {
  if (s.D % 2 != 0 || s.D > 1024) throw std::invalid_argument("qkv_step: head dim must be even and at most 1024");
  using layers::rope_cuda::Dtype;
  switch (dt) {
    case Dtype::F32: launch<float>(s, p, ve, inv_freq, pos, q_out, K, V, stream); break;
    case Dtype::BF16: launch<__nv_bfloat16>(s, p, ve, inv_freq, pos, q_out, K, V, stream); break;
    case Dtype::F16: launch<__half>(s, p, ve, inv_freq, pos, q_out, K, V, stream); break;
  }
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw std::runtime_error(std::string("decode qkv kernel: ") + cudaGetErrorString(err));
}

}  // namespace mixbench::attn_decode_cuda
