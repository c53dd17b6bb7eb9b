// Causal depthwise short convolution + SiLU in one pass forward and three passes backward (the
// unfused path takes a pad, W multiplies, W − 1 adds and the SiLU forward, about three times that
// backward). fp32 accumulation, one rounding to the input dtype.
#include "mixers/common/short_conv_kernel.h"

#include "mixers/common/cuda_dtype.cuh"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace mixbench::layers::short_conv_cuda {

namespace {

constexpr int kMaxW = 8;

// Every kernel: blockIdx.x a row (b, t), threads over the channels (coalesced), no 64-bit division.
// The pre-activation at (row, c): Σ_i w[c,i]·x[b, t−W+1+i, c], zero before the sequence's start.
template <class T>
__device__ __forceinline__ float conv_pre(const T* x, const T* w, int64_t row, int T_len, int C, int c, int W) {
  const int t = int(row % T_len);
  float acc = 0.f;
  for (int i = 0; i < W; ++i)
    if (t - (W - 1) + i >= 0) acc += load_f32(w + int64_t(c) * W + i) * load_f32(x + (row - (W - 1) + i) * C + c);
  return acc;
}

template <class T>
__global__ void fwd_kernel(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, int T_len, int C, int W) {
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int64_t row = blockIdx.x;
  const float a = conv_pre(x, w, row, T_len, C, c, W);
  y[row * C + c] = from_f32<T>(a / (1.f + __expf(-a)));
}

// pre ← dy·silu′(a) in fp32
template <class T>
__global__ void dpre_kernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ dy, float* __restrict__ pre,
                            int T_len, int C, int W) {
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int64_t row = blockIdx.x;
  const float a = conv_pre(x, w, row, T_len, C, c, W);
  const float sg = 1.f / (1.f + __expf(-a));
  pre[row * C + c] = load_f32(dy + row * C + c) * sg * (1.f + a * (1.f - sg));
}

// dx[b,s,c] = Σ_i w[c,i]·pre[b, s+W−1−i, c]
template <class T>
__global__ void dx_kernel(const float* __restrict__ pre, const T* __restrict__ w, T* __restrict__ dx, int T_len, int C, int W) {
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int64_t row = blockIdx.x;
  const int s = int(row % T_len);
  float acc = 0.f;
  for (int k = 0; k < W; ++k) {
    const int t = s + (W - 1) - k;
    if (t < T_len) acc += load_f32(w + int64_t(c) * W + k) * pre[(row + (W - 1) - k) * C + c];
  }
  dx[row * C + c] = from_f32<T>(acc);
}

// dw[c,i] = Σ_{b,t} pre[b,t,c]·x[b, t−W+1+i, c]: each thread a channel over a slice of the rows,
// partial sums added atomically.
template <class T>
__global__ void dw_kernel(const float* __restrict__ pre, const T* __restrict__ x, float* __restrict__ dw, int64_t rows,
                          int T_len, int C, int W, int rows_per_block) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int64_t r0 = int64_t(blockIdx.y) * rows_per_block;
  const int64_t r1 = r0 + rows_per_block < rows ? r0 + rows_per_block : rows;
  float acc[kMaxW] = {0.f};
  int t = int(r0 % T_len);
  for (int64_t r = r0; r < r1; ++r, t = t + 1 == T_len ? 0 : t + 1) {
    const float p = pre[r * C + c];
#pragma unroll
    for (int k = 0; k < kMaxW; ++k) {
      if (k >= W) break;
      if (t - (W - 1) + k >= 0) acc[k] += p * load_f32(x + (r - (W - 1) + k) * C + c);
    }
  }
  for (int k = 0; k < W; ++k) atomicAdd(dw + int64_t(c) * W + k, acc[k]);
}

void check(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

constexpr int kThreads = 128;
dim3 row_grid(int64_t rows, int64_t C) { return dim3(unsigned(rows), unsigned((C + kThreads - 1) / kThreads)); }

template <class T>
void fwd_t(const void* x, const void* w, void* y, int64_t B, int64_t T_len, int64_t C, int W, cudaStream_t s) {
  if (B * T_len * C == 0) return;
  fwd_kernel<T><<<row_grid(B * T_len, C), kThreads, 0, s>>>(static_cast<const T*>(x), static_cast<const T*>(w),
                                                           static_cast<T*>(y), int(T_len), int(C), W);
  check("short conv forward");
}

template <class T>
void bwd_t(const void* x, const void* w, const void* dy, void* dx, float* dw, float* pre, int64_t B, int64_t T_len, int64_t C,
           int W, cudaStream_t s) {
  cudaMemsetAsync(dw, 0, sizeof(float) * size_t(C) * size_t(W), s);
  const int64_t rows = B * T_len;
  if (rows * C == 0) return;
  const T* xt = static_cast<const T*>(x);
  const T* wt = static_cast<const T*>(w);
  dpre_kernel<T><<<row_grid(rows, C), kThreads, 0, s>>>(xt, wt, static_cast<const T*>(dy), pre, int(T_len), int(C), W);
  dx_kernel<T><<<row_grid(rows, C), kThreads, 0, s>>>(pre, wt, static_cast<T*>(dx), int(T_len), int(C), W);
  const int rows_per_block = int(std::max<int64_t>(256, (rows + 65534) / 65535));  // grid.y ≤ 65535
  dim3 grid(unsigned((C + kThreads - 1) / kThreads), unsigned((rows + rows_per_block - 1) / rows_per_block));
  dw_kernel<T><<<grid, kThreads, 0, s>>>(pre, xt, dw, rows, int(T_len), int(C), W, rows_per_block);
  check("short conv backward");
}
}  // namespace

void forward(Dtype dt, const void* x, const void* w, void* y, int64_t B, int64_t T, int64_t C, int W, cudaStream_t s) {
  if (W < 1 || W > kMaxW) throw std::invalid_argument("short conv kernel: width must be 1..8");
  switch (dt) {
    case Dtype::F32: fwd_t<float>(x, w, y, B, T, C, W, s); break;
    case Dtype::BF16: fwd_t<__nv_bfloat16>(x, w, y, B, T, C, W, s); break;
    case Dtype::F16: fwd_t<__half>(x, w, y, B, T, C, W, s); break;
  }
}

void backward(Dtype dt, const void* x, const void* w, const void* dy, void* dx, float* dw, float* pre, int64_t B, int64_t T,
              int64_t C, int W, cudaStream_t s) {
  if (W < 1 || W > kMaxW) throw std::invalid_argument("short conv kernel: width must be 1..8");
  switch (dt) {
    case Dtype::F32: bwd_t<float>(x, w, dy, dx, dw, pre, B, T, C, W, s); break;
    case Dtype::BF16: bwd_t<__nv_bfloat16>(x, w, dy, dx, dw, pre, B, T, C, W, s); break;
    case Dtype::F16: bwd_t<__half>(x, w, dy, dx, dw, pre, B, T, C, W, s); break;
  }
}

}  // namespace mixbench::layers::short_conv_cuda
