// ReLU² forward and backward in one pass each (LibTorch's relu(h).square() takes two kernels
// forward and three backward, each a full read and write of the MLP's hidden activations).
// fp32 arithmetic, one rounding to the tensor's dtype, as LibTorch's element-wise kernels do.
#include "harness/relu_square_kernel.h"

#include "harness/cuda_dtype.cuh"

#include <stdexcept>
#include <string>

namespace mixbench::relu_square_cuda {
namespace {

using layers::from_f32;
using layers::load_f32;

template <class T>
__global__ void fwd_kernel(const T* __restrict__ h, T* __restrict__ y, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float a = load_f32(h + i);
    y[i] = from_f32<T>(a > 0.f ? a * a : 0.f);
  }
}

template <class T>
__global__ void bwd_kernel(const T* __restrict__ h, const T* __restrict__ dy, T* __restrict__ dh, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float a = load_f32(h + i);
    dh[i] = from_f32<T>(a > 0.f ? 2.f * a * load_f32(dy + i) : 0.f);
  }
}

// Eight bf16/fp16 values (16 bytes) per load when the buffers allow it.
template <class T>
struct alignas(16) Pack {
  T v[16 / sizeof(T)];
};

template <class T>
__global__ void fwd_packed(const Pack<T>* __restrict__ h, Pack<T>* __restrict__ y, int64_t n_packs) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n_packs; i += int64_t(gridDim.x) * blockDim.x) {
    Pack<T> a = h[i], o;
#pragma unroll
    for (int j = 0; j < int(16 / sizeof(T)); ++j) {
      const float f = load_f32(&a.v[j]);
      o.v[j] = from_f32<T>(f > 0.f ? f * f : 0.f);
    }
    y[i] = o;
  }
}

template <class T>
__global__ void bwd_packed(const Pack<T>* __restrict__ h, const Pack<T>* __restrict__ dy, Pack<T>* __restrict__ dh,
                           int64_t n_packs) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n_packs; i += int64_t(gridDim.x) * blockDim.x) {
    Pack<T> a = h[i], g = dy[i], o;
#pragma unroll
    for (int j = 0; j < int(16 / sizeof(T)); ++j) {
      const float f = load_f32(&a.v[j]);
      o.v[j] = from_f32<T>(f > 0.f ? 2.f * f * load_f32(&g.v[j]) : 0.f);
    }
    dh[i] = o;
  }
}

constexpr int kThreads = 256;
unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return unsigned(b < 65536 * 8 ? b : 65536 * 8);  // grid-stride beyond
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

template <class T>
void fwd_t(const void* h, void* y, int64_t n, cudaStream_t s) {
  constexpr int E = int(16 / sizeof(T));
  if (packable(n, E, {h, y}))
    fwd_packed<T><<<blocks_for(n / E), kThreads, 0, s>>>(static_cast<const Pack<T>*>(h), static_cast<Pack<T>*>(y), n / E);
  else
    fwd_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(static_cast<const T*>(h), static_cast<T*>(y), n);
  check("relu² forward");
}

template <class T>
void bwd_t(const void* h, const void* dy, void* dh, int64_t n, cudaStream_t s) {
  constexpr int E = int(16 / sizeof(T));
  if (packable(n, E, {h, dy, dh}))
    bwd_packed<T><<<blocks_for(n / E), kThreads, 0, s>>>(static_cast<const Pack<T>*>(h), static_cast<const Pack<T>*>(dy),
                                                         static_cast<Pack<T>*>(dh), n / E);
  else
    bwd_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(static_cast<const T*>(h), static_cast<const T*>(dy), static_cast<T*>(dh), n);
  check("relu² backward");
}
}  // namespace

void forward(Dtype dt, const void* h, void* y, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  switch (dt) {
    case Dtype::F32: fwd_t<float>(h, y, n, s); break;
    case Dtype::BF16: fwd_t<__nv_bfloat16>(h, y, n, s); break;
    case Dtype::F16: fwd_t<__half>(h, y, n, s); break;
  }
}

void backward(Dtype dt, const void* h, const void* dy, void* dh, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  switch (dt) {
    case Dtype::F32: bwd_t<float>(h, dy, dh, n, s); break;
    case Dtype::BF16: bwd_t<__nv_bfloat16>(h, dy, dh, n, s); break;
    case Dtype::F16: bwd_t<__half>(h, dy, dh, n, s); break;
  }
}

}  // namespace mixbench::relu_square_cuda
