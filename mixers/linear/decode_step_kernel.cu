// Fused decode steps of the delta-rule layers (mixers/linear/decode_step_kernel.h).
#include "mixers/linear/decode_step_kernel.h"

#include "harness/cuda_dtype.cuh"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace mixbench::linear::decode_cuda {

namespace {

using layers::from_f32;
using layers::load_f32;

template <class T>
__global__ void conv_step_kernel(const T* __restrict__ x, T* __restrict__ tail, const T* __restrict__ w, T* __restrict__ y,
                                 int64_t B, int64_t C, int W) {
  const int64_t n = B * C;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = i / C, c = i % C;
    T* t = tail + b * (W - 1) * C + c;
    const float xv = load_f32(x + i);
    float acc = load_f32(w + c * W + (W - 1)) * xv;
    for (int j = 0; j < W - 1; ++j) acc += load_f32(w + c * W + j) * load_f32(t + j * C);
    for (int j = 0; j + 1 < W - 1; ++j) t[j * C] = t[(j + 1) * C];
    if (W > 1) t[(W - 2) * C] = x[i];
    y[i] = from_f32<T>(acc / (1.f + __expf(-acc)));
  }
}

// One block per (b, h); thread j owns columns j, j + blockDim, ... of S.
template <class T>
__global__ void delta_step_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                                  const float* __restrict__ beta, const float* __restrict__ g, Decay decay, float scale,
                                  float* __restrict__ S, T* __restrict__ o, int K, int V, RawGates raw, int H) {
  extern __shared__ float sm[];  // q[K], k[K], decay[K]
  float* qs = sm;
  float* ks = sm + K;
  float* ds = sm + 2 * K;
  const int64_t bh = blockIdx.x;
  float b, gh = 0.f;  // β and the per-head decay's log
  if (raw.b_raw) {
    const int64_t row = bh / H, h = bh % H;
    b = 1.f / (1.f + expf(-load_f32(static_cast<const T*>(raw.b_raw) + row * raw.stride + h)));
    const float z = load_f32(static_cast<const T*>(raw.a_raw) + row * raw.stride + h) + raw.dt_bias[h];
    gh = raw.neg_a[h] * (z > 20.f ? z : log1pf(expf(z)));
  } else {
    b = beta[bh];
    if (decay == Decay::PerHead) gh = g[bh];
  }
  for (int i = threadIdx.x; i < K; i += blockDim.x) {
    qs[i] = load_f32(q + bh * K + i) * scale;
    ks[i] = load_f32(k + bh * K + i);
    ds[i] = decay == Decay::None      ? 1.f
            : decay == Decay::PerHead ? __expf(gh)
                                      : __expf(g[bh * K + i]);
  }
  __syncthreads();
  float* s = S + bh * int64_t(K) * V;
  for (int j = threadIdx.x; j < V; j += blockDim.x) {
    float pred = 0.f;
    for (int i = 0; i < K; ++i) pred += ks[i] * (ds[i] * s[int64_t(i) * V + j]);
    const float u = b * (load_f32(v + bh * V + j) - pred);
    float acc = 0.f;
    for (int i = 0; i < K; ++i) {
      const float sn = ds[i] * s[int64_t(i) * V + j] + ks[i] * u;
      s[int64_t(i) * V + j] = sn;
      acc += qs[i] * sn;
    }
    o[bh * V + j] = from_f32<T>(acc);
  }
}

template <class T>
void conv_launch(const void* x, void* tail, const void* w, void* y, int64_t B, int64_t C, int W, cudaStream_t stream) {
  const int64_t n = B * C;
  if (n == 0) return;
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((n + threads - 1) / threads, 65535);
  conv_step_kernel<T><<<unsigned(blocks), threads, 0, stream>>>(static_cast<const T*>(x), static_cast<T*>(tail),
                                                               static_cast<const T*>(w), static_cast<T*>(y), B, C, W);
}

template <class T>
void delta_launch(const void* q, const void* k, const void* v, const float* beta, const float* g, Decay decay, float scale,
                  float* S, void* o, int64_t B, int64_t H, int64_t K, int64_t V, cudaStream_t stream,
                  const RawGates& raw = {}) {
  if (B * H == 0) return;
  const int threads = int(std::min<int64_t>(256, ((V + 31) / 32) * 32));
  delta_step_kernel<T><<<unsigned(B * H), threads, size_t(3 * K) * sizeof(float), stream>>>(
      static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), beta, g, decay, scale, S,
      static_cast<T*>(o), int(K), int(V), raw, int(H));
}

void check(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

}  // namespace

void conv_step(Dtype dt, const void* x, void* tail, const void* w, void* y, int64_t B, int64_t C, int W, cudaStream_t stream) {
  if (W < 1 || W > 8) throw std::invalid_argument("conv_step: the width must be 1..8");
  switch (dt) {
    case Dtype::F32: conv_launch<float>(x, tail, w, y, B, C, W, stream); break;
    case Dtype::BF16: conv_launch<__nv_bfloat16>(x, tail, w, y, B, C, W, stream); break;
    case Dtype::F16: conv_launch<__half>(x, tail, w, y, B, C, W, stream); break;
  }
  check("conv_step kernel");
}

void delta_step(Dtype dt, const void* q, const void* k, const void* v, const float* beta, const float* g, Decay decay,
                float scale, float* S, void* o, int64_t B, int64_t H, int64_t K, int64_t V, cudaStream_t stream) {
  if (K > 256) throw std::invalid_argument("delta_step kernel: K must be <= 256");
  switch (dt) {
    case Dtype::F32: delta_launch<float>(q, k, v, beta, g, decay, scale, S, o, B, H, K, V, stream); break;
    case Dtype::BF16: delta_launch<__nv_bfloat16>(q, k, v, beta, g, decay, scale, S, o, B, H, K, V, stream); break;
    case Dtype::F16: delta_launch<__half>(q, k, v, beta, g, decay, scale, S, o, B, H, K, V, stream); break;
  }
  check("delta_step kernel");
}

void gated_delta_step(Dtype dt, const void* q, const void* k, const void* v, const RawGates& gates, float scale, float* S,
                      void* o, int64_t B, int64_t H, int64_t K, int64_t V, cudaStream_t stream) {
  if (K > 256) throw std::invalid_argument("delta_step kernel: K must be <= 256");
  if (!gates.b_raw || !gates.a_raw || !gates.neg_a || !gates.dt_bias)
    throw std::invalid_argument("gated_delta_step: every gate input is needed");
  const Decay d = Decay::PerHead;
  switch (dt) {
    case Dtype::F32: delta_launch<float>(q, k, v, nullptr, nullptr, d, scale, S, o, B, H, K, V, stream, gates); break;
    case Dtype::BF16: delta_launch<__nv_bfloat16>(q, k, v, nullptr, nullptr, d, scale, S, o, B, H, K, V, stream, gates); break;
    case Dtype::F16: delta_launch<__half>(q, k, v, nullptr, nullptr, d, scale, S, o, B, H, K, V, stream, gates); break;
  }
  check("delta_step kernel");
}

}  // namespace mixbench::linear::decode_cuda
