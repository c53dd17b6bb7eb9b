// Element-wise backbone steps in one pass each way. LibTorch's relu(h).square() takes two kernels
// forward and three backward, and a·x + b·x0 with one-element device tensors takes three
// broadcasting (unvectorized) kernels forward and four plus two reductions backward, each a full
// read and write of [B, T, d] or [B, T, 4d]. fp32 arithmetic, one rounding to the tensor's dtype.
#include "harness/fused_ops_kernel.h"

#include "harness/cuda_dtype.cuh"

#include <initializer_list>
#include <stdexcept>
#include <string>

namespace mixbench::fused_cuda {
namespace {

using layers::from_f32;
using layers::load_f32;

// Sixteen bytes of elements per thread and iteration (eight bf16/fp16, four fp32) when every
// buffer is aligned and n a multiple; one element otherwise.
template <class T, int E>
struct alignas(E * sizeof(T)) Pack {
  T v[E];
};

template <class T>
constexpr int kPack = int(16 / sizeof(T));

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return unsigned(b < 132 * 16 ? b : 132 * 16);  // grid-stride beyond a few waves
}

bool packable(int64_t n, int elems, std::initializer_list<const void*> ptrs) {
  if (n % elems != 0) return false;
  for (const void* p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

void check(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

#define MIXBENCH_GRID_STRIDE(i, n) \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)

// ------------------------------------------------------------------------------------ relu²

template <class T, int E>
__global__ void relu_square_fwd(const Pack<T, E>* __restrict__ h, Pack<T, E>* __restrict__ y, int64_t n) {
  MIXBENCH_GRID_STRIDE(i, n) {
    const Pack<T, E> a = h[i];
    Pack<T, E> o;
#pragma unroll
    for (int j = 0; j < E; ++j) {
      const float f = load_f32(&a.v[j]);
      o.v[j] = from_f32<T>(f > 0.f ? f * f : 0.f);
    }
    y[i] = o;
  }
}

template <class T, int E>
__global__ void relu_square_bwd(const Pack<T, E>* __restrict__ h, const Pack<T, E>* __restrict__ dy,
                                Pack<T, E>* __restrict__ dh, int64_t n) {
  MIXBENCH_GRID_STRIDE(i, n) {
    const Pack<T, E> a = h[i], g = dy[i];
    Pack<T, E> o;
#pragma unroll
    for (int j = 0; j < E; ++j) {
      const float f = load_f32(&a.v[j]);
      o.v[j] = from_f32<T>(f > 0.f ? 2.f * f * load_f32(&g.v[j]) : 0.f);
    }
    dh[i] = o;
  }
}

template <class T, int E>
void relu_square_fwd_e(const void* h, void* y, int64_t n, cudaStream_t s) {
  relu_square_fwd<T, E><<<blocks_for(n / E), kThreads, 0, s>>>(static_cast<const Pack<T, E>*>(h),
                                                                 static_cast<Pack<T, E>*>(y), n / E);
}

template <class T>
void relu_square_fwd_t(const void* h, void* y, int64_t n, cudaStream_t s) {
  if (packable(n, kPack<T>, {h, y})) relu_square_fwd_e<T, kPack<T>>(h, y, n, s);
  else relu_square_fwd_e<T, 1>(h, y, n, s);
  check("relu² forward");
}

template <class T, int E>
void relu_square_bwd_e(const void* h, const void* dy, void* dh, int64_t n, cudaStream_t s) {
  relu_square_bwd<T, E><<<blocks_for(n / E), kThreads, 0, s>>>(
      static_cast<const Pack<T, E>*>(h), static_cast<const Pack<T, E>*>(dy), static_cast<Pack<T, E>*>(dh), n / E);
}

template <class T>
void relu_square_bwd_t(const void* h, const void* dy, void* dh, int64_t n, cudaStream_t s) {
  if (packable(n, kPack<T>, {h, dy, dh})) relu_square_bwd_e<T, kPack<T>>(h, dy, dh, n, s);
  else relu_square_bwd_e<T, 1>(h, dy, dh, n, s);
  check("relu² backward");
}

// ------------------------------------------------------------------------------- a·x + b·x0

template <class T, int E>
__global__ void scaled_sum_fwd(const T* __restrict__ a, const Pack<T, E>* __restrict__ x, const T* __restrict__ b,
                               const Pack<T, E>* __restrict__ x0, Pack<T, E>* __restrict__ y, int64_t n) {
  const float fa = load_f32(a), fb = load_f32(b);
  MIXBENCH_GRID_STRIDE(i, n) {
    const Pack<T, E> u = x[i], v = x0[i];
    Pack<T, E> o;
#pragma unroll
    for (int j = 0; j < E; ++j) o.v[j] = from_f32<T>(fa * load_f32(&u.v[j]) + fb * load_f32(&v.v[j]));
    y[i] = o;
  }
}

template <class T, int E>
__global__ void scaled_sum_bwd(const T* __restrict__ a, const Pack<T, E>* __restrict__ x, const T* __restrict__ b,
                               const Pack<T, E>* __restrict__ x0, const Pack<T, E>* __restrict__ g,
                               Pack<T, E>* __restrict__ dx, Pack<T, E>* __restrict__ dx0, float* __restrict__ sums,
                               int64_t n) {
  const float fa = load_f32(a), fb = load_f32(b);
  float sa = 0.f, sb = 0.f;
  MIXBENCH_GRID_STRIDE(i, n) {
    const Pack<T, E> u = x[i], v = x0[i], w = g[i];
    Pack<T, E> ox, ox0;
#pragma unroll
    for (int j = 0; j < E; ++j) {
      const float gf = load_f32(&w.v[j]);
      ox.v[j] = from_f32<T>(fa * gf);
      ox0.v[j] = from_f32<T>(fb * gf);
      sa += gf * load_f32(&u.v[j]);
      sb += gf * load_f32(&v.v[j]);
    }
    dx[i] = ox;
    dx0[i] = ox0;
  }
  // block sums: warp shuffles, then one atomic per warp
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    sa += __shfl_down_sync(0xffffffffu, sa, off);
    sb += __shfl_down_sync(0xffffffffu, sb, off);
  }
  if ((threadIdx.x & 31) == 0) {
    atomicAdd(sums, sa);
    atomicAdd(sums + 1, sb);
  }
}

template <class T, int E>
void scaled_sum_fwd_e(const void* a, const void* x, const void* b, const void* x0, void* y, int64_t n, cudaStream_t s) {
  scaled_sum_fwd<T, E><<<blocks_for(n / E), kThreads, 0, s>>>(
      static_cast<const T*>(a), static_cast<const Pack<T, E>*>(x), static_cast<const T*>(b),
      static_cast<const Pack<T, E>*>(x0), static_cast<Pack<T, E>*>(y), n / E);
}

template <class T>
void scaled_sum_fwd_t(const void* a, const void* x, const void* b, const void* x0, void* y, int64_t n, cudaStream_t s) {
  if (packable(n, kPack<T>, {x, x0, y})) scaled_sum_fwd_e<T, kPack<T>>(a, x, b, x0, y, n, s);
  else scaled_sum_fwd_e<T, 1>(a, x, b, x0, y, n, s);
  check("scaled sum forward");
}

template <class T, int E>
void scaled_sum_bwd_e(const void* a, const void* x, const void* b, const void* x0, const void* g, void* dx, void* dx0,
                      float* sums, int64_t n, cudaStream_t s) {
  scaled_sum_bwd<T, E><<<blocks_for(n / E), kThreads, 0, s>>>(
      static_cast<const T*>(a), static_cast<const Pack<T, E>*>(x), static_cast<const T*>(b),
      static_cast<const Pack<T, E>*>(x0), static_cast<const Pack<T, E>*>(g), static_cast<Pack<T, E>*>(dx),
      static_cast<Pack<T, E>*>(dx0), sums, n / E);
}

template <class T>
void scaled_sum_bwd_t(const void* a, const void* x, const void* b, const void* x0, const void* g, void* dx, void* dx0,
                      float* sums, int64_t n, cudaStream_t s) {
  if (packable(n, kPack<T>, {x, x0, g, dx, dx0})) scaled_sum_bwd_e<T, kPack<T>>(a, x, b, x0, g, dx, dx0, sums, n, s);
  else scaled_sum_bwd_e<T, 1>(a, x, b, x0, g, dx, dx0, sums, n, s);
  check("scaled sum backward");
}
#undef MIXBENCH_GRID_STRIDE
}  // namespace

#define MIXBENCH_FUSED_DISPATCH(dt, F, ...)                      \
  switch (dt) {                                                  \
    case Dtype::F32: F<float>(__VA_ARGS__); break;               \
    case Dtype::BF16: F<__nv_bfloat16>(__VA_ARGS__); break;      \
    case Dtype::F16: F<__half>(__VA_ARGS__); break;              \
  }

void relu_square_forward(Dtype dt, const void* h, void* y, int64_t n, cudaStream_t s) {
  if (n > 0) MIXBENCH_FUSED_DISPATCH(dt, relu_square_fwd_t, h, y, n, s)
}

void relu_square_backward(Dtype dt, const void* h, const void* dy, void* dh, int64_t n, cudaStream_t s) {
  if (n > 0) MIXBENCH_FUSED_DISPATCH(dt, relu_square_bwd_t, h, dy, dh, n, s)
}

void scaled_sum_forward(Dtype dt, const void* a, const void* x, const void* b, const void* x0, void* y, int64_t n,
                        cudaStream_t s) {
  if (n > 0) MIXBENCH_FUSED_DISPATCH(dt, scaled_sum_fwd_t, a, x, b, x0, y, n, s)
}

void scaled_sum_backward(Dtype dt, const void* a, const void* x, const void* b, const void* x0, const void* g, void* dx,
                         void* dx0, float* sums, int64_t n, cudaStream_t s) {
  if (n > 0) MIXBENCH_FUSED_DISPATCH(dt, scaled_sum_bwd_t, a, x, b, x0, g, dx, dx0, sums, n, s)
}
#undef MIXBENCH_FUSED_DISPATCH

}  // namespace mixbench::fused_cuda
