// Rotary embedding in one pass: fp32 math in registers, one rounding to the input dtype (the unfused
// path casts the whole tensor to fp32 and back, ~10 memory passes per call).
#include "mixers/common/rope_kernel.h"

#include "harness/cuda_dtype.cuh"

#include <stdexcept>

namespace mixbench::layers::rope_cuda {

namespace {

// x, y: [rows, D] with rows = B·T·H ordered (b, t, h); cos, sin: [T, D/2] fp32.
template <class T>
__global__ void rope_kernel(const T* __restrict__ x, T* __restrict__ y, const float* __restrict__ cos,
                            const float* __restrict__ sin, int64_t n, int T_len, int H, int half, float sign) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int j = int(i % half);
    const int64_t row = i / half;
    const int t = int((row / H) % T_len);
    const float c = cos[int64_t(t) * half + j], s = sign * sin[int64_t(t) * half + j];
    const int64_t base = row * 2 * half;
    const float x1 = load_f32(x + base + j), x2 = load_f32(x + base + half + j);
    y[base + j] = from_f32<T>(x1 * c + x2 * s);
    y[base + half + j] = from_f32<T>(x2 * c - x1 * s);
  }
}

template <class T>
void launch(const void* x, void* y, const float* cos, const float* sin, int64_t rows, int T_len, int H, int half, float sign,
            cudaStream_t stream) {
  const int64_t n = rows * half;
  if (n == 0) return;
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((n + threads - 1) / threads, 65535LL * 16);
  rope_kernel<T><<<unsigned(blocks), threads, 0, stream>>>(static_cast<const T*>(x), static_cast<T*>(y), cos, sin, n, T_len,
                                                          H, half, sign);
}
template <class T>
__global__ void rope_pos_kernel(const T* __restrict__ x, T* __restrict__ y, const double* __restrict__ inv,
                                const int64_t* __restrict__ pos, int64_t n, int half) {
  const double p = double(*pos);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int j = int(i % half);
    const int64_t base = (i / half) * 2 * half;
    const double a = p * inv[j];
    const float c = float(cos(a)), s = float(sin(a));
    const float x1 = load_f32(x + base + j), x2 = load_f32(x + base + half + j);
    y[base + j] = from_f32<T>(x1 * c + x2 * s);
    y[base + half + j] = from_f32<T>(x2 * c - x1 * s);
  }
}

template <class T>
void launch_pos(const void* x, void* y, const double* inv, const int64_t* pos, int64_t rows, int half, cudaStream_t stream) {
  const int64_t n = rows * half;
  if (n == 0) return;
  const int threads = 128;
  const int64_t blocks = std::min<int64_t>((n + threads - 1) / threads, 65535LL * 16);
  rope_pos_kernel<T><<<unsigned(blocks), threads, 0, stream>>>(static_cast<const T*>(x), static_cast<T*>(y), inv, pos, n, half);
}
}  // namespace

void apply_at_pos(Dtype dt, const void* x, void* y, const double* inv_freq, const int64_t* pos, int64_t rows, int half,
                  cudaStream_t stream) {
  switch (dt) {
    case Dtype::F32: launch_pos<float>(x, y, inv_freq, pos, rows, half, stream); break;
    case Dtype::BF16: launch_pos<__nv_bfloat16>(x, y, inv_freq, pos, rows, half, stream); break;
    case Dtype::F16: launch_pos<__half>(x, y, inv_freq, pos, rows, half, stream); break;
  }
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw std::runtime_error(std::string("rope kernel: ") + cudaGetErrorString(err));
}

void apply(Dtype dt, const void* x, void* y, const float* cos, const float* sin, int64_t rows, int T_len, int H, int half,
           bool inverse, cudaStream_t stream) {
  const float sign = inverse ? -1.f : 1.f;
  switch (dt) {
    case Dtype::F32: launch<float>(x, y, cos, sin, rows, T_len, H, half, sign, stream); break;
    case Dtype::BF16: launch<__nv_bfloat16>(x, y, cos, sin, rows, T_len, H, half, sign, stream); break;
    case Dtype::F16: launch<__half>(x, y, cos, sin, rows, T_len, H, half, sign, stream); break;
  }
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw std::runtime_error(std::string("rope kernel: ") + cudaGetErrorString(err));
}

}  // namespace mixbench::layers::rope_cuda
