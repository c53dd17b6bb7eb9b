// Causal depthwise short convolution + SiLU: one pass forward, one pass backward (the unfused path
// takes a pad, W multiplies, W − 1 adds and the SiLU forward, about three times that backward).
// fp32 accumulation, one rounding to the input dtype.
//
// Each thread owns one channel over a strip of kStrip consecutive positions of one sequence and
// first loads the whole strip (plus a W − 1 halo) into registers — all loads in flight at once: a
// warp reads 32 channels of one position, 64 bytes in bf16, so bandwidth needs many per thread —
// then computes, so every input is read once (plus the halo) and every output written once.
// Backward recomputes the pre-activation, forms dpre = dy·silu′, and from it both dx (a window of W
// dpre values ahead) and the strip's share of dw, reduced over the block's strips in shared memory
// before one atomic add per (channel, tap).
#include "mixers/common/short_conv_kernel.h"

#include "harness/cuda_dtype.cuh"

#include <stdexcept>
#include <string>

namespace mixbench::layers::short_conv_cuda {

namespace {

constexpr int kMaxW = 8;
constexpr int kLanes = 32;   // channels per block (one warp: coalesced along the channels)
constexpr int kStrips = 8;   // strips per block (blockDim.y)
constexpr int kStrip = 32;   // positions per strip

struct Shape {
  int T_len, C, strips_per_seq;
  int64_t n_strips;
  int c1, c2;  // the output side's split: [0, c1) | [c1, c2) | [c2, C)
};

// Channel c's column in the output-side buffer it belongs to: the buffer, its row width and c's
// column there.
template <class P>
__device__ __forceinline__ P* split_column(P* const (&y)[3], const Shape& s, int c, int& width) {
  if (c < s.c1) {
    width = s.c1;
    return y[0] + c;
  }
  if (c < s.c2) {
    width = s.c2 - s.c1;
    return y[1] + (c - s.c1);
  }
  width = s.C - s.c2;
  return y[2] + (c - s.c2);
}

template <class T>
struct Out3 {
  T* p[3];
};

// The strip of blockIdx.y·kStrips + threadIdx.y: its sequence b and first position t0; false
// past the last strip.
__device__ __forceinline__ bool strip_of(const Shape& s, int64_t& b, int& t0) {
  const int64_t strip = int64_t(blockIdx.y) * kStrips + threadIdx.y;
  if (strip >= s.n_strips) return false;
  b = strip / s.strips_per_seq;
  t0 = int(strip - b * s.strips_per_seq) * kStrip;
  return true;
}

__device__ __forceinline__ float silu(float a) { return a / (1.f + __expf(-a)); }

template <class T, int W>
__global__ void fwd_kernel(const T* __restrict__ x, const T* __restrict__ w, Out3<T> y, Shape s) {
  const int c = blockIdx.x * kLanes + threadIdx.x;
  int64_t b;
  int t0;
  if (c >= s.C || !strip_of(s, b, t0)) return;
  const T* xs = x + b * s.T_len * s.C + c;
  int yw;
  T* ys = split_column(y.p, s, c, yw);
  ys += b * s.T_len * yw;
  const int t1 = min(t0 + kStrip, s.T_len);
  // every load of the strip and its W − 1 halo issued before any arithmetic: xin[i] = x[t0 − W + 1 + i]
  float xin[kStrip + W - 1];
#pragma unroll
  for (int i = 0; i < kStrip + W - 1; ++i) {
    const int t = t0 - (W - 1) + i;
    xin[i] = t >= 0 && t < t1 ? load_f32(xs + int64_t(t) * s.C) : 0.f;
  }
  float wr[W];
#pragma unroll
  for (int i = 0; i < W; ++i) wr[i] = load_f32(w + int64_t(c) * W + i);
#pragma unroll
  for (int j = 0; j < kStrip; ++j) {
    if (t0 + j < t1) {
      float a = 0.f;
#pragma unroll
      for (int i = 0; i < W; ++i) a += wr[i] * xin[j + i];
      ys[int64_t(t0 + j) * yw] = from_f32<T>(silu(a));
    }
  }
}

// dpre[t] = dy[t]·silu′(a[t]); dx[u] = Σ_k w[k]·dpre[u+W−1−k]; dw[k] = Σ_t dpre[t]·x[t−W+1+k].
// The strip's dx needs dpre up to W − 1 positions past its end, and those a's x from W − 1 before
// its start: xin[i] = x[t0 − W + 1 + i] (kStrip + 2(W − 1)), dp[j] = dpre[t0 + j] (kStrip + W − 1),
// all loads issued first.
template <class T, int W>
__global__ void bwd_kernel(const T* __restrict__ x, const T* __restrict__ w, Out3<const T> dy, T* __restrict__ dx,
                           float* __restrict__ dw, Shape s) {
  __shared__ float red[kStrips][W][kLanes];
  const int c = blockIdx.x * kLanes + threadIdx.x;
  int64_t b;
  int t0;
  float acc[W];
#pragma unroll
  for (int k = 0; k < W; ++k) acc[k] = 0.f;
  if (c < s.C && strip_of(s, b, t0)) {
    const int64_t base = b * s.T_len * s.C + c;
    int yw;
    const T* dys = split_column(dy.p, s, c, yw);
    dys += b * s.T_len * yw;
    const int t_end = min(t0 + kStrip, s.T_len);  // this strip's dx and dw positions
    float xin[kStrip + 2 * (W - 1)], dp[kStrip + W - 1];
#pragma unroll
    for (int i = 0; i < kStrip + 2 * (W - 1); ++i) {
      const int t = t0 - (W - 1) + i;
      xin[i] = t >= 0 && t < s.T_len ? load_f32(x + base + int64_t(t) * s.C) : 0.f;
    }
#pragma unroll
    for (int j = 0; j < kStrip + W - 1; ++j) {
      const int t = t0 + j;
      dp[j] = t < s.T_len ? load_f32(dys + int64_t(t) * yw) : 0.f;
    }
    float wr[W];
#pragma unroll
    for (int i = 0; i < W; ++i) wr[i] = load_f32(w + int64_t(c) * W + i);
#pragma unroll
    for (int j = 0; j < kStrip + W - 1; ++j) {
      float a = 0.f;
#pragma unroll
      for (int i = 0; i < W; ++i) a += wr[i] * xin[j + i];
      const float sg = 1.f / (1.f + __expf(-a));
      dp[j] = dp[j] * sg * (1.f + a * (1.f - sg));  // 0 past the sequence (dy read as 0 there)
      if (j < kStrip && t0 + j < t_end) {
#pragma unroll
        for (int k = 0; k < W; ++k) acc[k] += dp[j] * xin[j + k];
      }
    }
#pragma unroll
    for (int j = 0; j < kStrip; ++j) {
      if (t0 + j < t_end) {
        float v = 0.f;
#pragma unroll
        for (int k = 0; k < W; ++k) v += wr[k] * dp[j + W - 1 - k];
        dx[base + int64_t(t0 + j) * s.C] = from_f32<T>(v);
      }
    }
  }
#pragma unroll
  for (int k = 0; k < W; ++k) red[threadIdx.y][k][threadIdx.x] = acc[k];
  __syncthreads();
  if (threadIdx.y == 0 && c < s.C) {
#pragma unroll
    for (int k = 0; k < W; ++k) {
      float v = 0.f;
#pragma unroll
      for (int j = 0; j < kStrips; ++j) v += red[j][k][threadIdx.x];
      atomicAdd(dw + int64_t(c) * W + k, v);
    }
  }
}

void check(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

Shape shape_of(int64_t B, int64_t T_len, int64_t C, int64_t c1, int64_t c2) {
  if (!(0 <= c1 && c1 <= c2 && c2 <= C)) throw std::invalid_argument("short conv kernel: bad channel split");
  Shape s;
  s.T_len = int(T_len);
  s.C = int(C);
  s.c1 = int(c1);
  s.c2 = int(c2);
  s.strips_per_seq = int((T_len + kStrip - 1) / kStrip);
  s.n_strips = B * s.strips_per_seq;
  return s;
}

dim3 grid_of(const Shape& s) {
  const int64_t gy = (s.n_strips + kStrips - 1) / kStrips;
  if (gy > 2147483647) throw std::invalid_argument("short conv kernel: too many rows");
  return dim3(unsigned((s.C + kLanes - 1) / kLanes), unsigned(gy));
}

template <class T, int W>
void fwd_w(const void* x, const void* w, const Split& y, const Shape& s, cudaStream_t st) {
  const Out3<T> out{{static_cast<T*>(y.p[0]), static_cast<T*>(y.p[1]), static_cast<T*>(y.p[2])}};
  fwd_kernel<T, W><<<grid_of(s), dim3(kLanes, kStrips), 0, st>>>(static_cast<const T*>(x), static_cast<const T*>(w), out,
                                                                   s);
}

template <class T, int W>
void bwd_w(const void* x, const void* w, const Split& dy, void* dx, float* dw, const Shape& s, cudaStream_t st) {
  const Out3<const T> in{{static_cast<const T*>(dy.p[0]), static_cast<const T*>(dy.p[1]), static_cast<const T*>(dy.p[2])}};
  bwd_kernel<T, W><<<grid_of(s), dim3(kLanes, kStrips), 0, st>>>(static_cast<const T*>(x), static_cast<const T*>(w), in,
                                                                   static_cast<T*>(dx), dw, s);
}

// Instantiates F<T, W> for the runtime width W (1..kMaxW).
#define MIXBENCH_SHORT_CONV_DISPATCH_W(F, ...) \
  switch (W) {                                 \
    case 1: F<T, 1>(__VA_ARGS__); break;       \
    case 2: F<T, 2>(__VA_ARGS__); break;       \
    case 3: F<T, 3>(__VA_ARGS__); break;       \
    case 4: F<T, 4>(__VA_ARGS__); break;       \
    case 5: F<T, 5>(__VA_ARGS__); break;       \
    case 6: F<T, 6>(__VA_ARGS__); break;       \
    case 7: F<T, 7>(__VA_ARGS__); break;       \
    default: F<T, 8>(__VA_ARGS__); break;      \
  }

template <class T>
void fwd_t(const void* x, const void* w, const Split& y, int64_t B, int64_t T_len, int64_t C, int W, cudaStream_t st) {
  if (B * T_len * C == 0) return;
  const Shape s = shape_of(B, T_len, C, y.c1, y.c2);
  MIXBENCH_SHORT_CONV_DISPATCH_W(fwd_w, x, w, y, s, st)
  check("short conv forward");
}

template <class T>
void bwd_t(const void* x, const void* w, const Split& dy, void* dx, float* dw, int64_t B, int64_t T_len, int64_t C, int W,
           cudaStream_t st) {
  cudaMemsetAsync(dw, 0, sizeof(float) * size_t(C) * size_t(W), st);
  if (B * T_len * C == 0) return;
  const Shape s = shape_of(B, T_len, C, dy.c1, dy.c2);
  MIXBENCH_SHORT_CONV_DISPATCH_W(bwd_w, x, w, dy, dx, dw, s, st)
  check("short conv backward");
}
#undef MIXBENCH_SHORT_CONV_DISPATCH_W
}  // namespace

void forward_split(Dtype dt, const void* x, const void* w, const Split& y, int64_t B, int64_t T, int64_t C, int W,
                   cudaStream_t s) {
  if (W < 1 || W > kMaxW) throw std::invalid_argument("short conv kernel: width must be 1..8");
  switch (dt) {
    case Dtype::F32: fwd_t<float>(x, w, y, B, T, C, W, s); break;
    case Dtype::BF16: fwd_t<__nv_bfloat16>(x, w, y, B, T, C, W, s); break;
    case Dtype::F16: fwd_t<__half>(x, w, y, B, T, C, W, s); break;
  }
}

void backward_split(Dtype dt, const void* x, const void* w, const Split& dy, void* dx, float* dw, int64_t B, int64_t T,
                    int64_t C, int W, cudaStream_t s) {
  if (W < 1 || W > kMaxW) throw std::invalid_argument("short conv kernel: width must be 1..8");
  switch (dt) {
    case Dtype::F32: bwd_t<float>(x, w, dy, dx, dw, B, T, C, W, s); break;
    case Dtype::BF16: bwd_t<__nv_bfloat16>(x, w, dy, dx, dw, B, T, C, W, s); break;
    case Dtype::F16: bwd_t<__half>(x, w, dy, dx, dw, B, T, C, W, s); break;
  }
}

void forward(Dtype dt, const void* x, const void* w, void* y, int64_t B, int64_t T, int64_t C, int W, cudaStream_t s) {
  forward_split(dt, x, w, Split{{y, y, y}, C, C}, B, T, C, W, s);
}

void backward(Dtype dt, const void* x, const void* w, const void* dy, void* dx, float* dw, int64_t B, int64_t T, int64_t C,
              int W, cudaStream_t s) {
  void* d = const_cast<void*>(dy);
  backward_split(dt, x, w, Split{{d, d, d}, C, C}, dx, dw, B, T, C, W, s);
}

}  // namespace mixbench::layers::short_conv_cuda
