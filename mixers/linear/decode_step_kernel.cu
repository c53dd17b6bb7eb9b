// Fused decode steps of the delta-rule layers (mixers/linear/decode_step_kernel.h).
#include "mixers/linear/decode_step_kernel.h"

#include "harness/cuda_dtype.cuh"
#include "harness/pdl.cuh"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace mixbench::linear::decode_cuda {

namespace {

using layers::from_f32;
using layers::load_f32;

template <class T>
__global__ void conv_step_kernel(const T* __restrict__ x, int64_t x_stride, T* __restrict__ tail, const T* __restrict__ w,
                                 T* __restrict__ y, int64_t B, int64_t C, int W) {
  cuda_launch::pdl_wait();
  const int64_t n = B * C;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = i / C, c = i % C;
    T* t = tail + b * (W - 1) * C + c;
    const T* xi = x + b * x_stride + c;
    const float xv = load_f32(xi);
    float acc = load_f32(w + c * W + (W - 1)) * xv;
    for (int j = 0; j < W - 1; ++j) acc += load_f32(w + c * W + j) * load_f32(t + j * C);
    for (int j = 0; j + 1 < W - 1; ++j) t[j * C] = t[(j + 1) * C];
    if (W > 1) t[(W - 2) * C] = *xi;
    y[i] = from_f32<T>(acc / (1.f + __expf(-acc)));
  }
}

// One block per (b, h); thread j owns columns j, j + blockDim, ... of S.
template <class T>
__global__ void delta_step_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                                  const float* __restrict__ beta, const float* __restrict__ g, Decay decay, float scale,
                                  float* __restrict__ S, T* __restrict__ o, int K, int V, RawGates raw, int H) {
  cuda_launch::pdl_wait();
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

// Σ over the block of every thread's v (blockDim a multiple of 32); red: 32 floats, free on entry
// and again on return. Every thread gets the sum.
__device__ __forceinline__ float block_sum(float v, float* red) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float s = 0.f;
  for (int w = 0; w < warps; ++w) s += red[w];
  __syncthreads();  // red is free again
  return s;
}

template <class T>
__device__ __forceinline__ float round_to(float v) {
  const T t = from_f32<T>(v);
  return load_f32(&t);
}

// One block per (b, h); thread j owns columns j, j + blockDim, ... of S (as delta_step_kernel).
template <class T>
__global__ void gdn_step_kernel(GdnStep p) {
  cuda_launch::pdl_wait();
  extern __shared__ float sm[];  // q[K], k[K], o[V], 32 partial sums
  float* qs = sm;
  float* ks = sm + p.K;
  float* os = sm + 2 * p.K;
  float* red = os + p.V;
  const int64_t bh = blockIdx.x, row = bh / p.H, h = bh % p.H;
  const int K = p.K, V = p.V;
  // the gates, as gated_delta_step forms them
  const RawGates& raw = p.gates;
  const float b = 1.f / (1.f + expf(-load_f32(static_cast<const T*>(raw.b_raw) + row * raw.stride + h)));
  const float z = load_f32(static_cast<const T*>(raw.a_raw) + row * raw.stride + h) + raw.dt_bias[h];
  const float decay = __expf(raw.neg_a[h] * (z > 20.f ? z : log1pf(expf(z))));
  // q, k L2-normalized and rounded as stored; q scaled
  const T* qr = static_cast<const T*>(p.qk) + row * p.qk_stride + h * K;
  const T* kr = static_cast<const T*>(p.qk) + row * p.qk_stride + (p.H + h) * K;
  float sq = 0.f, sk = 0.f;
  for (int i = threadIdx.x; i < K; i += blockDim.x) {
    const float qv = load_f32(qr + i), kv = load_f32(kr + i);
    qs[i] = qv;
    ks[i] = kv;
    sq += qv * qv;
    sk += kv * kv;
  }
  const float rq = rsqrtf(block_sum(sq, red) + p.l2_eps), rk = rsqrtf(block_sum(sk, red) + p.l2_eps);
  for (int i = threadIdx.x; i < K; i += blockDim.x) {
    qs[i] = round_to<T>(qs[i] * rq) * p.scale;
    ks[i] = round_to<T>(ks[i] * rk);
  }
  __syncthreads();
  // the value embedding's gate (the gated add's arithmetic)
  const T* vr = static_cast<const T*>(p.v) + row * p.v_stride + h * V;
  const T* ver = p.ve ? static_cast<const T*>(p.ve) + row * p.ve_stride + h * V : nullptr;
  const float veg =
      p.ve ? p.ve_scale / (1.f + __expf(-load_f32(static_cast<const T*>(p.ve_z) + row * p.ve_z_stride + h))) : 0.f;
  float* s = p.S + bh * int64_t(K) * V;
  float ss = 0.f;
  for (int j = threadIdx.x; j < V; j += blockDim.x) {
    float vj = load_f32(vr + j);
    if (ver) vj = round_to<T>(vj + veg * load_f32(ver + j));
    float pred = 0.f;
    for (int i = 0; i < K; ++i) pred += ks[i] * (decay * s[int64_t(i) * V + j]);
    const float u = b * (vj - pred);
    float acc = 0.f;
    for (int i = 0; i < K; ++i) {
      const float sn = decay * s[int64_t(i) * V + j] + ks[i] * u;
      s[int64_t(i) * V + j] = sn;
      acc += qs[i] * sn;
    }
    const float o = round_to<T>(acc);
    os[j] = o;
    ss += o * o;
  }
  // the gated RMSNorm over the head's V outputs (the row norm's arithmetic)
  const float r = rsqrtf(block_sum(ss, red) / float(V) + p.norm_eps);
  const T* gr = static_cast<const T*>(p.gate) + row * p.gate_stride + h * V;
  T* out = static_cast<T*>(p.o) + bh * V;
  for (int j = threadIdx.x; j < V; j += blockDim.x) {
    const float g = load_f32(gr + j), sg = 1.f / (1.f + __expf(-g));
    out[j] = from_f32<T>(os[j] * r * load_f32(static_cast<const T*>(p.norm_w) + j) * (g * sg));
  }
}

template <class T>
void gdn_launch(const GdnStep& p, cudaStream_t stream) {
  if (p.B * p.H == 0) return;
  const int threads = int(std::min<int64_t>(256, ((std::max(p.K, p.V) + 31) / 32) * 32));
  cuda_launch::launch_dependent("gdn step", gdn_step_kernel<T>, unsigned(p.B * p.H), threads,
                                size_t(2 * p.K + p.V + 32) * sizeof(float), stream, p);
}

template <class T>
void conv_launch(const void* x, int64_t x_stride, void* tail, const void* w, void* y, int64_t B, int64_t C, int W, cudaStream_t stream) {
  const int64_t n = B * C;
  if (n == 0) return;
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((n + threads - 1) / threads, 65535);
  cuda_launch::launch_dependent("conv step", conv_step_kernel<T>, unsigned(blocks), threads, 0, stream,
                                static_cast<const T*>(x), x_stride, static_cast<T*>(tail), static_cast<const T*>(w),
                                static_cast<T*>(y), B, C, W);
}

template <class T>
void delta_launch(const void* q, const void* k, const void* v, const float* beta, const float* g, Decay decay, float scale,
                  float* S, void* o, int64_t B, int64_t H, int64_t K, int64_t V, cudaStream_t stream,
                  const RawGates& raw = {}) {
  if (B * H == 0) return;
  const int threads = int(std::min<int64_t>(256, ((V + 31) / 32) * 32));
  cuda_launch::launch_dependent("delta step", delta_step_kernel<T>, unsigned(B * H), threads,
                                size_t(3 * K) * sizeof(float), stream, static_cast<const T*>(q), static_cast<const T*>(k),
                                static_cast<const T*>(v), beta, g, decay, scale, S, static_cast<T*>(o), int(K), int(V),
                                raw, int(H));
}

void check(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

}  // namespace

void conv_step(Dtype dt, const void* x, int64_t x_stride, void* tail, const void* w, void* y, int64_t B, int64_t C, int W,
               cudaStream_t stream) {
  if (W < 1 || W > 8) throw std::invalid_argument("conv_step: the width must be 1..8");
  if (x_stride < C) throw std::invalid_argument("conv_step: x's rows overlap (stride below C)");
  switch (dt) {
    case Dtype::F32: conv_launch<float>(x, x_stride, tail, w, y, B, C, W, stream); break;
    case Dtype::BF16: conv_launch<__nv_bfloat16>(x, x_stride, tail, w, y, B, C, W, stream); break;
    case Dtype::F16: conv_launch<__half>(x, x_stride, tail, w, y, B, C, W, stream); break;
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

void gdn_step(Dtype dt, const GdnStep& p, cudaStream_t stream) {
  if (p.K < 1 || p.K > 256 || p.V < 1 || p.V > 256) throw std::invalid_argument("gdn_step kernel: K and V must be 1..256");
  if (!p.qk || !p.v || !p.norm_w || !p.gate || !p.S || !p.o || !p.gates.b_raw || !p.gates.a_raw || !p.gates.neg_a ||
      !p.gates.dt_bias || (p.ve && !p.ve_z))
    throw std::invalid_argument("gdn_step kernel: an input is missing");
  switch (dt) {
    case Dtype::F32: gdn_launch<float>(p, stream); break;
    case Dtype::BF16: gdn_launch<__nv_bfloat16>(p, stream); break;
    case Dtype::F16: gdn_launch<__half>(p, stream); break;
  }
  check("gdn_step kernel");
}

}  // namespace mixbench::linear::decode_cuda
