// The backbone's element-wise work of a static-cache decode step in one launch per step boundary
// (harness/decode_ops_kernel.h). At batch 1 a decode step is bound by its launches, not by these
// rows of a few thousand elements: one block per row keeps the row's fp32 values in shared memory
// between the sum of squares and the normalized write, and a block reduction forms the statistics.
#include "harness/decode_ops_kernel.h"

#include "harness/cuda_dtype.cuh"
#include "harness/pdl.cuh"

#include <cstdint>
#include <stdexcept>
#include <string>

namespace mixbench::decode_cuda_ops {
namespace {

using layers::from_f32;
using layers::load_f32;
using cuda_launch::launch_dependent;
using cuda_launch::pdl_wait;

constexpr int kThreads = 256;

// The value a tensor of type T holds after v is stored in it.
template <class T>
__device__ __forceinline__ float round_to(float v) {
  const T t = from_f32<T>(v);
  return load_f32(&t);
}

// Σ over the warp of every lane's v, in butterfly order; every lane gets the sum.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// Σ over the block of every thread's v; red holds kThreads/32 floats. Every thread gets the sum.
__device__ __forceinline__ float block_sum(float v, float* red) {
  v = warp_sum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float s = 0.f;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) s += red[w];
  return s;
}

// Element i of the rows: s = x + y (rounded as stored), r = mix(s); `store`: s to p.sum (when given)
// and r to p.residual. Returns r.
template <class T>
__device__ __forceinline__ float residual_of(const ResidualNormArgs& p, int64_t i, float fa, float fb, bool store) {
  float s = load_f32(static_cast<const T*>(p.x) + i);
  if (p.y) s = round_to<T>(s + load_f32(static_cast<const T*>(p.y) + i));  // x + y, materialized
  if (store && p.sum) static_cast<T*>(p.sum)[i] = from_f32<T>(s);
  float r = s;
  if (p.mix == Mix::Scaled)
    r = round_to<T>(fa * s + fb * load_f32(static_cast<const T*>(p.z) + i));  // one rounding (fused scaled_sum)
  else if (p.mix == Mix::Backout)
    r = round_to<T>(s - round_to<T>(fb * load_f32(static_cast<const T*>(p.z) + i)));  // b·z, then s − b·z
  if (store) static_cast<T*>(p.residual)[i] = from_f32<T>(r);
  return r;
}

// Row `row` of the rows into buf [D] (normalized, each value rounded as the normed tensor stores
// it) with kThreads threads; `store`: the residual (and sum, normed) rows written too.
template <class T>
__device__ __forceinline__ void residual_norm_row(const ResidualNormArgs& p, int64_t row, float* buf, float* red, bool store) {
  const float fa = p.a ? load_f32(static_cast<const T*>(p.a)) : 1.f;
  const float fb = p.b ? load_f32(static_cast<const T*>(p.b)) : 0.f;
  const int64_t base = row * p.D;
  float ss = 0.f;
  for (int j = threadIdx.x; j < p.D; j += kThreads) {
    const float r = residual_of<T>(p, base + j, fa, fb, store);
    buf[j] = r;
    ss += r * r;
  }
  const float inv = rsqrtf(block_sum(ss, red) / float(p.D) + p.eps);
  T* normed = p.normed ? static_cast<T*>(p.normed) + base : nullptr;
  for (int j = threadIdx.x; j < p.D; j += kThreads) {
    const float v = round_to<T>(buf[j] * inv);
    buf[j] = v;
    if (store && normed) normed[j] = from_f32<T>(v);
  }
  __syncthreads();  // buf complete for every thread; red free again
}

// Bytes of the fused kernel's rows [rows, D] of a type of `size` bytes, rounded up to 16.
__host__ __device__ constexpr size_t fused_rows_bytes(int rows, int D, size_t size) {
  return (size_t(rows) * size_t(D) * size + 15) / 16 * 16;
}

// residual_norm_row for every row (≤ kGemvRows) by the whole block, into rows [rows, D] of T (every
// value they hold is one a T stores: the residual is rounded as stored, the normed value too), with
// residual_norm_row's arithmetic: thread t sums its elements t, t + kThreads, … of each row, each warp
// reduces as block_sum does and the warps' sums are added in order, so the statistics, and hence the
// values, are residual_norm_row's bit for bit. Every row's loads are issued before any reduction.
// red holds kGemvRows·kThreads/32 floats. `store`: the residual (and sum, normed) rows written too,
// recomputed in the second pass (so the first pass reads only).
template <class T>
__device__ __forceinline__ void residual_norm_rows_block(const ResidualNormArgs& p, T* xs, float* red, bool store) {
  constexpr int kWarps = kThreads / 32;
  const int rows = int(p.rows), D = p.D, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float fa = p.a ? load_f32(static_cast<const T*>(p.a)) : 1.f;
  const float fb = p.b ? load_f32(static_cast<const T*>(p.b)) : 0.f;
  float ss[kGemvRows];
#pragma unroll
  for (int r = 0; r < kGemvRows; ++r) {
    ss[r] = 0.f;
    if (r < rows)
      for (int j = threadIdx.x; j < D; j += kThreads) {
        const float v = residual_of<T>(p, int64_t(r) * D + j, fa, fb, false);
        xs[int64_t(r) * D + j] = from_f32<T>(v);
        ss[r] += v * v;
      }
  }
#pragma unroll
  for (int r = 0; r < kGemvRows; ++r) {
    if (r < rows) {
      const float v = warp_sum(ss[r]);
      if (lane == 0) red[r * kWarps + warp] = v;
    }
  }
  __syncthreads();
  for (int r = 0; r < rows; ++r) {
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) s += red[r * kWarps + w];
    const float inv = rsqrtf(s / float(D) + p.eps);
    const int64_t base = int64_t(r) * D;
    T* normed = store && p.normed ? static_cast<T*>(p.normed) + base : nullptr;
    for (int j = threadIdx.x; j < D; j += kThreads) {
      const T v = from_f32<T>(load_f32(&xs[base + j]) * inv);
      xs[base + j] = v;
      if (normed) normed[j] = v;
      if (store) residual_of<T>(p, base + j, fa, fb, true);
    }
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads) residual_norm_kernel(ResidualNormArgs p) {
  pdl_wait();
  extern __shared__ float buf[];  // [D] the row's r, then kThreads/32 partial sums
  residual_norm_row<T>(p, blockIdx.x, buf, buf + p.D, true);
}

template <class T>
__global__ void __launch_bounds__(kThreads) embed_smear_kernel(EmbedSmearArgs p) {
  pdl_wait();
  extern __shared__ float buf[];  // [D] the normalized embedding, then kThreads/32 partial sums
  float* red = buf + p.D;
  const int64_t row = blockIdx.x, base = row * p.D;
  const int64_t id = p.idx[row];
  if (blockIdx.y > 0) {  // a gathered table's row
    const int t = int(blockIdx.y) - 1;
    if (id < 0 || id >= p.gather_vocab[t]) __trap();
    const int64_t w = p.gather_width[t];
    const T* src = static_cast<const T*>(p.gather_table[t]) + id * w;
    T* dst = static_cast<T*>(p.gather_out[t]) + row * w;
    for (int64_t j = threadIdx.x; j < w; j += kThreads) dst[j] = src[j];
    return;
  }
  if (id < 0 || id >= p.vocab) __trap();  // as the embedding's device-side index check
  const T* e = static_cast<const T*>(p.wte) + id * p.D;
  float ss = 0.f;
  for (int j = threadIdx.x; j < p.D; j += kThreads) {
    const float v = load_f32(e + j);
    buf[j] = v;
    ss += v * v;
  }
  const float inv = rsqrtf(block_sum(ss, red) / float(p.D) + p.eps);
  for (int j = threadIdx.x; j < p.D; j += kThreads) buf[j] = round_to<T>(buf[j] * inv);  // rms_norm's output
  __syncthreads();
  // the gate: a G-wide dot product (the GEMM's output in T), σ, then λ·σ, each rounded as stored
  float d = threadIdx.x < p.G ? buf[threadIdx.x] * load_f32(static_cast<const T*>(p.w) + threadIdx.x) : 0.f;
  if (threadIdx.x < 32) {
    d = warp_sum(d);
    if (threadIdx.x == 0) red[0] = d;
  }
  __syncthreads();
  const float sg = round_to<T>(1.f / (1.f + expf(-round_to<T>(red[0]))));
  const float gate = round_to<T>(load_f32(static_cast<const T*>(p.lambda)) * sg);
  T* prev = static_cast<T*>(p.prev) + base;
  T* x = static_cast<T*>(p.x) + base;
  for (int j = threadIdx.x; j < p.D; j += kThreads) {
    const float pv = load_f32(prev + j);  // read before this thread overwrites it
    x[j] = from_f32<T>(buf[j] + round_to<T>(gate * pv));
    prev[j] = from_f32<T>(buf[j]);
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads) softcap_kernel(const T* __restrict__ l, float* __restrict__ out, int64_t n,
                                                           float cap, int64_t* advance) {
  pdl_wait();
  const float inv = 1.f / cap;  // LibTorch divides by a host scalar as a product with its reciprocal
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads)
    out[i] = cap * tanhf(load_f32(l + i) * inv);
  if (advance && blockIdx.x == 0 && threadIdx.x == 0) *advance += 1;
}

// Greedy tokens: grid (blocks_per_row, rows). Each block takes a stride of its row, each thread keeps
// its best (value, index), the block reduces them and writes its partial; the last block of the row
// to arrive (its count in `counters`, reset by that block) reduces the row's partials and stores the
// token. The order is at::argmax's: NaN above every number, and the first index among equals.
__device__ __forceinline__ bool greedy_better(float v, int64_t i, float bv, int64_t bi) {
  const bool vn = v != v, bn = bv != bv;
  if (vn != bn) return vn;
  if (!vn && v != bv) return v > bv;
  return i < bi;
}

__device__ __forceinline__ void greedy_warp(float& v, int64_t& i) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, off);
    const int64_t oi = __shfl_xor_sync(0xffffffffu, i, off);
    if (greedy_better(ov, oi, v, i)) {
      v = ov;
      i = oi;
    }
  }
}

// The block's best (value, index) of every thread's; every thread gets it.
__device__ __forceinline__ void greedy_block(float& v, int64_t& i, float* sv, int64_t* si) {
  greedy_warp(v, i);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    sv[warp] = v;
    si[warp] = i;
  }
  __syncthreads();
  v = sv[0];
  i = si[0];
#pragma unroll
  for (int w = 1; w < kThreads / 32; ++w)
    if (greedy_better(sv[w], si[w], v, i)) {
      v = sv[w];
      i = si[w];
    }
  __syncthreads();  // sv, si are reused
}

template <class T>
__global__ void __launch_bounds__(kThreads) greedy_kernel(const T* __restrict__ logits, int64_t V, int64_t* __restrict__ out,
                                                          float* __restrict__ ws_v, int64_t* __restrict__ ws_i,
                                                          unsigned* __restrict__ counters) {
  pdl_wait();
  const int64_t row = blockIdx.y;
  const int nb = int(gridDim.x);
  const T* l = logits + row * V;
  float v = -INFINITY;
  int64_t i = V;  // no element: loses to every element (a row of -inf still picks index 0)
  for (int64_t j = int64_t(blockIdx.x) * kThreads + threadIdx.x; j < V; j += int64_t(nb) * kThreads) {
    const float x = load_f32(l + j);
    if (greedy_better(x, j, v, i)) {
      v = x;
      i = j;
    }
  }
  __shared__ float sv[kThreads / 32];
  __shared__ int64_t si[kThreads / 32];
  greedy_block(v, i, sv, si);
  __shared__ int is_last;
  if (threadIdx.x == 0) {
    ws_v[row * nb + blockIdx.x] = v;
    ws_i[row * nb + blockIdx.x] = i;
    __threadfence();  // the partial is visible device-wide before it is counted
    is_last = atomicAdd(counters + row, 1u) == unsigned(nb - 1);
    if (is_last) counters[row] = 0u;
  }
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  v = -INFINITY;
  i = V;
  for (int b = threadIdx.x; b < nb; b += kThreads) {
    const float pv = __ldcg(ws_v + row * nb + b);
    const int64_t pi = __ldcg(ws_i + row * nb + b);
    if (greedy_better(pv, pi, v, i)) {
      v = pv;
      i = pi;
    }
  }
  greedy_block(v, i, sv, si);
  if (threadIdx.x == 0) out[row] = i < V ? i : 0;
}

// 16-byte packs of E elements when K and the buffers allow, single elements otherwise.
template <class T, int E>
struct alignas(E * sizeof(T)) Pack {
  T v[E];
};

constexpr int kGemvWarps = 4;

// The rows a GEMV reads: E consecutive values of row r from column k, as fp32, from rows [rows, K]
// of T (in global or shared memory; 16-byte packs when E > 1, so that a warp's 32 lanes read 512
// consecutive bytes: coalesced in global memory, free of bank conflicts in shared memory).
template <class T, int E>
struct PackedRows {
  const T* x;
  int64_t K;
  __device__ __forceinline__ void load(int r, int64_t k, float (&v)[E]) const {
    const Pack<T, E> p = *reinterpret_cast<const Pack<T, E>*>(x + int64_t(r) * K + k);
#pragma unroll
    for (int e = 0; e < E; ++e) v[e] = load_f32(&p.v[e]);
  }
};

// W's packs lane l reads first: packs k = l·E + i·32·E for i < NP (the whole row for K ≤ NP·32·E).
// A GEMV kernel loads them before pdl_wait(): W is a weight no kernel of the step writes, so it
// streams in while the kernel before is finishing. linear_rows_kernel holds 12 (3072 values of a
// 16-bit type: the MLP's down projection), the fused kernel 6 (a model width of 1536), within their
// registers.
constexpr int kPrefetchRows = 12, kPrefetchFused = 6;

template <class T, int E, int NP>
struct WHead {
  Pack<T, E> p[NP];
};

template <class T, int E, int NP>
__device__ __forceinline__ void prefetch_w(const T* __restrict__ W, int64_t n, int64_t K, WHead<T, E, NP>& h) {
  const int lane = threadIdx.x & 31;
  const T* w = W + n * K;
#pragma unroll
  for (int i = 0; i < NP; ++i) {
    const int64_t k = int64_t(lane) * E + int64_t(i) * 32 * E;
    if (k < K) h.p[i] = *reinterpret_cast<const Pack<T, E>*>(w + k);
  }
}

// One warp's output column n of y[r, n] = act(Σ_k x[r,k]·W[n,k]) for the rows: W's row read once for
// every row of x (its head from h, the rest loaded here), fp32 accumulation over each lane's k in
// ascending order, the product rounded to T before the activation.
template <class T, int E, bool kReluSquare, class Rows, int NP>
__device__ __forceinline__ void gemv_column(const Rows& x, const WHead<T, E, NP>& h, const T* __restrict__ W, T* __restrict__ y,
                                            int rows, int64_t n, int64_t N, int64_t K) {
  const int lane = threadIdx.x & 31;
  float acc[kGemvRows];
#pragma unroll
  for (int r = 0; r < kGemvRows; ++r) acc[r] = 0.f;
  auto fma_pack = [&](const Pack<T, E>& wp, int64_t k) {
    float wf[E];
#pragma unroll
    for (int e = 0; e < E; ++e) wf[e] = load_f32(&wp.v[e]);
#pragma unroll
    for (int r = 0; r < kGemvRows; ++r) {
      if (r < rows) {
        float xv[E];
        x.load(r, k, xv);
#pragma unroll
        for (int e = 0; e < E; ++e) acc[r] += wf[e] * xv[e];
      }
    }
  };
#pragma unroll
  for (int i = 0; i < NP; ++i) {
    const int64_t k = int64_t(lane) * E + int64_t(i) * 32 * E;
    if (k < K) fma_pack(h.p[i], k);
  }
  const T* w = W + n * K;
#pragma unroll 4
  for (int64_t k = int64_t(lane) * E + int64_t(NP) * 32 * E; k < K; k += 32 * E)  // the rest of a long row
    fma_pack(*reinterpret_cast<const Pack<T, E>*>(w + k), k);
#pragma unroll
  for (int r = 0; r < kGemvRows; ++r) {
    if (r < rows) {
      const float a = warp_sum(acc[r]);
      if (lane == 0) {
        if constexpr (kReluSquare) {
          const float hv = round_to<T>(a);
          y[int64_t(r) * N + n] = from_f32<T>(hv > 0.f ? hv * hv : 0.f);
        } else {
          y[int64_t(r) * N + n] = from_f32<T>(a);
        }
      }
    }
  }
}

// y = act(x·Wᵀ) for a few rows of x in global memory, one warp per output column; W's head loaded
// before the wait for the kernel before.
template <class T, int E, bool kReluSquare>
__global__ void __launch_bounds__(kGemvWarps * 32)
    linear_rows_kernel(const T* __restrict__ x, const T* __restrict__ W, T* __restrict__ y, int rows, int64_t N, int64_t K) {
  const int64_t n = int64_t(blockIdx.x) * kGemvWarps + (threadIdx.x >> 5);
  WHead<T, E, kPrefetchRows> h;
  if (n < N) prefetch_w(W, n, K, h);
  pdl_wait();
  if (n >= N) return;  // whole warps
  gemv_column<T, E, kReluSquare>(PackedRows<T, E>{x, K}, h, W, y, rows, n, N, K);
}

template <class T, bool kReluSquare>
void linear_rows_t(const void* x, const void* W, void* y, int rows, int64_t N, int64_t K, cudaStream_t s) {
  constexpr int E = int(16 / sizeof(T));
  const bool packed = K % E == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(W) % 16 == 0;
  const unsigned blocks = unsigned((N + kGemvWarps - 1) / kGemvWarps);
  if (packed)
    launch_dependent("linear rows", linear_rows_kernel<T, E, kReluSquare>, blocks, kGemvWarps * 32, 0, s,
                     static_cast<const T*>(x), static_cast<const T*>(W), static_cast<T*>(y), rows, N, K);
  else
    launch_dependent("linear rows", linear_rows_kernel<T, 1, kReluSquare>, blocks, kGemvWarps * 32, 0, s,
                     static_cast<const T*>(x), static_cast<const T*>(W), static_cast<T*>(y), rows, N, K);
}
template <class T>
void linear_relu_square_t(const void* x, const void* W, void* y, int rows, int64_t N, int64_t K, cudaStream_t s) {
  linear_rows_t<T, true>(x, W, y, rows, N, K, s);
}
template <class T>
void linear_plain_t(const void* x, const void* W, void* y, int rows, int64_t N, int64_t K, cudaStream_t s) {
  linear_rows_t<T, false>(x, W, y, rows, N, K, s);
}

// residual_norm's rows (≤ kGemvRows) and then y[r, n] = act(Σ_k normed[r,k]·W[n,k]): each warp loads
// the head of its output column's W row, waits for the kernel before, then every block forms the
// normed rows in shared memory itself (a few thousand numbers, read from L2, by the whole block),
// block 0 also writes the residual (and sum, normed) rows, and each of the block's kThreads/32 warps
// takes its output column, as linear_rows_kernel does. The rows are held as T (the values the normed
// tensor stores), so the values are those of residual_norm_kernel and then linear_rows_kernel.
template <class T, int E, bool kReluSquare>
__global__ void __launch_bounds__(kThreads) residual_norm_linear_kernel(ResidualNormArgs p, const T* __restrict__ W,
                                                                       T* __restrict__ y, int64_t N) {
  const int64_t n = int64_t(blockIdx.x) * (kThreads / 32) + (threadIdx.x >> 5);
  WHead<T, E, kPrefetchFused> h;
  if (n < N) prefetch_w(W, n, p.D, h);
  pdl_wait();
  extern __shared__ __align__(16) unsigned char fused_rows[];  // [rows, D] of T: the normed rows; then red
  T* xs = reinterpret_cast<T*>(fused_rows);
  float* red = reinterpret_cast<float*>(fused_rows + fused_rows_bytes(int(p.rows), p.D, sizeof(T)));
  residual_norm_rows_block<T>(p, xs, red, blockIdx.x == 0);
  __syncthreads();
  if (n >= N) return;  // whole warps
  gemv_column<T, E, kReluSquare>(PackedRows<T, E>{xs, p.D}, h, W, y, int(p.rows), n, N, p.D);
}

template <class T>
void residual_norm_linear_t(const ResidualNormArgs& p, const void* W, void* y, int64_t N, bool relu_square, cudaStream_t s) {
  constexpr int E = int(16 / sizeof(T));
  const bool packed = p.D % E == 0 && reinterpret_cast<uintptr_t>(W) % 16 == 0;
  const unsigned blocks = unsigned((N + kThreads / 32 - 1) / (kThreads / 32));
  const size_t smem = fused_rows_bytes(int(p.rows), p.D, sizeof(T)) + sizeof(float) * kGemvRows * (kThreads / 32);
  const T* w = static_cast<const T*>(W);
  T* out = static_cast<T*>(y);
  auto* kernel = packed ? (relu_square ? residual_norm_linear_kernel<T, E, true> : residual_norm_linear_kernel<T, E, false>)
                        : (relu_square ? residual_norm_linear_kernel<T, 1, true> : residual_norm_linear_kernel<T, 1, false>);
  launch_dependent("residual norm linear", kernel, blocks, kThreads, smem, s, p, w, out, N);
}

void check(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

void check_row(int D, const char* what) {
  if (D < 1 || D > kMaxRow)
    throw std::invalid_argument(std::string(what) + " kernel: rows of " + std::to_string(D) + " elements (1.." +
                                std::to_string(kMaxRow) + " taken)");
}

size_t row_smem(int D) { return sizeof(float) * (size_t(D) + kThreads / 32); }

template <class T>
void residual_norm_t(const ResidualNormArgs& p, cudaStream_t s) {
  launch_dependent("residual norm", residual_norm_kernel<T>, unsigned(p.rows), kThreads, row_smem(p.D), s, p);
}
template <class T>
void embed_smear_t(const EmbedSmearArgs& p, cudaStream_t s) {
  launch_dependent("embed smear", embed_smear_kernel<T>, dim3(unsigned(p.rows), unsigned(1 + p.n_gather)), kThreads,
                   row_smem(p.D), s, p);
}
template <class T>
void softcap_t(const void* l, float* out, int64_t n, float cap, int64_t* advance, cudaStream_t s) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  launch_dependent("softcap", softcap_kernel<T>, unsigned(blocks < 1 ? 1 : blocks > 132 * 8 ? 132 * 8 : blocks), kThreads,
                   0, s, static_cast<const T*>(l), out, n, cap, advance);
}
template <class T>
void greedy_t(const void* l, int64_t rows, int64_t V, int64_t* out, float* ws_v, int64_t* ws_i, unsigned* counters,
              cudaStream_t s) {
  launch_dependent("greedy tokens", greedy_kernel<T>, dim3(unsigned(greedy_blocks_per_row(V)), unsigned(rows)), kThreads, 0,
                   s, static_cast<const T*>(l), V, out, ws_v, ws_i, counters);
}
}  // namespace

#define MIXBENCH_DECODE_OPS_DISPATCH(dt, F, ...)            \
  switch (dt) {                                             \
    case Dtype::F32: F<float>(__VA_ARGS__); break;          \
    case Dtype::BF16: F<__nv_bfloat16>(__VA_ARGS__); break; \
    case Dtype::F16: F<__half>(__VA_ARGS__); break;         \
  }

void residual_norm(Dtype dt, const ResidualNormArgs& p, cudaStream_t s) {
  check_row(p.D, "residual norm");
  if (!p.x || !p.residual || !p.normed) throw std::invalid_argument("residual norm kernel: x, residual and normed are required");
  if (p.mix != Mix::None && (!p.b || !p.z)) throw std::invalid_argument("residual norm kernel: a mix reads b and z");
  if (p.mix == Mix::Scaled && !p.a) throw std::invalid_argument("residual norm kernel: the scaled mix reads a");
  if (p.rows < 1) return;
  if (p.rows > 2147483647) throw std::invalid_argument("residual norm kernel: too many rows");
  MIXBENCH_DECODE_OPS_DISPATCH(dt, residual_norm_t, p, s)
  check("residual norm");
}

void residual_norm_linear(Dtype dt, const ResidualNormArgs& p, const void* W, void* y, int64_t N, bool relu_square,
                          cudaStream_t s) {
  check_row(p.D, "residual norm linear");
  if (!p.x || !p.residual || !W || !y) throw std::invalid_argument("residual norm linear kernel: x, residual, W and y are required");
  if (p.mix != Mix::None && (!p.b || !p.z)) throw std::invalid_argument("residual norm linear kernel: a mix reads b and z");
  if (p.mix == Mix::Scaled && !p.a) throw std::invalid_argument("residual norm linear kernel: the scaled mix reads a");
  if (p.rows < 1 || p.rows > kGemvRows || p.rows * p.D > kFusedRowElems)
    throw std::invalid_argument("residual norm linear kernel: 1.." + std::to_string(kGemvRows) + " rows of at most " +
                                std::to_string(kFusedRowElems) + " elements in all");
  if (N < 1 || (N + kThreads / 32 - 1) / (kThreads / 32) > 2147483647)
    throw std::invalid_argument("residual norm linear kernel: empty or too large a weight");
  MIXBENCH_DECODE_OPS_DISPATCH(dt, residual_norm_linear_t, p, W, y, N, relu_square, s)
  check("residual norm linear");
}

void embed_smear(Dtype dt, const EmbedSmearArgs& p, cudaStream_t s) {
  check_row(p.D, "embed smear");
  if (p.G < 1 || p.G > 32 || p.G > p.D) throw std::invalid_argument("embed smear kernel: the gate reads 1..32 channels of the row");
  if (p.n_gather < 0 || p.n_gather > kMaxGather)
    throw std::invalid_argument("embed smear kernel: at most " + std::to_string(kMaxGather) + " gathered tables");
  for (int t = 0; t < p.n_gather; ++t)
    if (!p.gather_table[t] || !p.gather_out[t] || p.gather_width[t] < 1)
      throw std::invalid_argument("embed smear kernel: a gathered table without rows or output");
  if (p.rows < 1) return;
  if (p.rows > 2147483647) throw std::invalid_argument("embed smear kernel: too many rows");
  MIXBENCH_DECODE_OPS_DISPATCH(dt, embed_smear_t, p, s)
  check("embed smear");
}

static void check_gemv(int rows, int64_t N, int64_t K, const std::string& what) {
  if (rows < 1 || rows > kGemvRows) throw std::invalid_argument(what + " kernel: 1.." + std::to_string(kGemvRows) + " rows");
  if (N < 1 || K < 1 || (N + kGemvWarps - 1) / kGemvWarps > 2147483647)
    throw std::invalid_argument(what + " kernel: empty or too large a weight");
}

void linear_relu_square(Dtype dt, const void* x, const void* W, void* y, int rows, int64_t N, int64_t K, cudaStream_t s) {
  check_gemv(rows, N, K, "linear relu²");
  MIXBENCH_DECODE_OPS_DISPATCH(dt, linear_relu_square_t, x, W, y, rows, N, K, s)
  check("linear relu²");
}

void linear_rows(Dtype dt, const void* x, const void* W, void* y, int rows, int64_t N, int64_t K, cudaStream_t s) {
  check_gemv(rows, N, K, "linear rows");
  MIXBENCH_DECODE_OPS_DISPATCH(dt, linear_plain_t, x, W, y, rows, N, K, s)
  check("linear rows");
}

void softcap(Dtype dt, const void* logits, float* out, int64_t n, float cap, int64_t* advance, cudaStream_t s) {
  if (n < 1 && !advance) return;
  MIXBENCH_DECODE_OPS_DISPATCH(dt, softcap_t, logits, out, n, cap, advance, s)
  check("softcap");
}
int greedy_blocks_per_row(int64_t V) {
  // about eight values per thread, at most kGreedyMaxBlocks blocks to a row
  const int64_t b = (V + 8 * kThreads - 1) / (8 * kThreads);
  return int(b < 1 ? 1 : b > kGreedyMaxBlocks ? kGreedyMaxBlocks : b);
}

void greedy_tokens(Dtype dt, const void* logits, int64_t rows, int64_t V, int64_t* out, float* ws_v, int64_t* ws_i,
                   unsigned* counters, cudaStream_t s) {
  if (rows < 1) return;
  if (V < 1 || rows > 65535) throw std::invalid_argument("greedy tokens kernel: 1..65535 rows of at least one logit");
  if (!logits || !out || !ws_v || !ws_i || !counters)
    throw std::invalid_argument("greedy tokens kernel: logits, out, its workspace and its counters are required");
  MIXBENCH_DECODE_OPS_DISPATCH(dt, greedy_t, logits, rows, V, out, ws_v, ws_i, counters, s)
  check("greedy tokens");
}
#undef MIXBENCH_DECODE_OPS_DISPATCH

}  // namespace mixbench::decode_cuda_ops
