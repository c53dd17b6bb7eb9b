// Token-sparse attention, forward and backward. One block of 4 warps per query (b, t) handles all H
// query heads, since they share the row's key set. The row's K slots are walked in tiles of KT keys
// (KT ≤ 32, as many as fit the shared-memory budget): the tile's selected K and V rows — every KV
// head of a token is one contiguous row of Hkv·D elements — are gathered by index into shared
// memory in fp32 (vector loads, −1 slots zero), then
//   forward: scores (one thread per (head, key)), an online softmax in fp32 (one warp per head,
//     a lane per key), and o += P·V (one thread per (head, dim)); o and the row log-sum-exp are
//     written at the end;
//   backward: P = exp(scale·q·k − lse), dP = dO·v, dS = P (dP − Δ) with Δ = rowsum(dO ∘ O);
//     dq += scale · dS·K in shared memory (written once per query), and the tile's dK = scale · dSᵀQ,
//     dV = PᵀdO, the heads of a KV group summed first, added to fp32 [B,T,Hkv,D] buffers with
//     atomics (each (query, selected key, KV head) adds 2·D values).
// Shared-memory rows of the key tile are Hkv·D + 1 floats long, so that the threads of a warp,
// reading one dim of consecutive keys, hit distinct banks.
//
// Cost notes. The products run on the CUDA cores in fp32 from shared memory (no tensor cores), and
// the tile is stored in fp32, so d12's shape (H = Hkv = 6, D = 128) gets 16-key tiles and two
// blocks per multiprocessor. The backward's atomics: 2·K·Hkv·D per query — at K = 256, Hkv = 6,
// D = 128 that is 393K fp32 reductions per query, 12.9·10⁹ (51 GB of read-modify-write) per batch
// row at T = 32K, into 2·T·Hkv·D·4 B = 201 MB of buffers (more than the L2): the backward's largest
// cost there. A key-major pass over the transposed selection would replace them.
#include "mixers/sparse/token_sparse_kernel.h"

#include "harness/cuda_dtype.cuh"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace mixbench::token_sparse_cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
// Shared memory a block may take: two blocks per multiprocessor (of 227 KB) stay resident.
constexpr int64_t kSmemBudget = 110 * 1024;

template <class T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

// floats of shared memory (the index tile counted as floats)
int64_t forward_floats(int H, int Hkv, int D, int KT) {
  return 2LL * H * D + 2LL * KT * (int64_t(Hkv) * D + 1) + int64_t(H) * KT + 3LL * H + KT;
}
int64_t backward_floats(int H, int Hkv, int D, int KT) {
  return 3LL * H * D + 2LL * KT * (int64_t(Hkv) * D + 1) + 2LL * H * KT + 2LL * H + KT;
}

// Keys per tile: the largest of 32, 16, 8, 4 whose forward and backward both fit the budget (0: none).
int tile_keys(int H, int Hkv, int D) {
  for (int kt = 32; kt >= 4; kt /= 2)
    if (4 * std::max(forward_floats(H, Hkv, D, kt), backward_floats(H, Hkv, D, kt)) <= kSmemBudget) return kt;
  return 0;
}

// Gather the tile's selected rows of `src` ([B·T rows of HD elements], this batch's base) into
// dst [KT][HD + 1] fp32; an empty slot (idx < 0) gives zeros.
template <class T>
__device__ __forceinline__ void gather_rows(const T* __restrict__ src, const int* idx_s, float* dst, int KT, int HD) {
  constexpr int V = 16 / sizeof(T);
  const int per_row = HD / V;
  for (int e = threadIdx.x; e < KT * per_row; e += kThreads) {
    const int j = e / per_row, c = (e % per_row) * V;
    const int s = idx_s[j];
    float* out = dst + j * (HD + 1) + c;
    if (s >= 0) {
      const Vec<T, V> r = *reinterpret_cast<const Vec<T, V>*>(src + int64_t(s) * HD + c);
#pragma unroll
      for (int i = 0; i < V; ++i) out[i] = layers::load_f32(&r.v[i]);
    } else {
#pragma unroll
      for (int i = 0; i < V; ++i) out[i] = 0.f;
    }
  }
}

template <class T, int D>
__global__ void __launch_bounds__(kThreads) forward_kernel(const T* __restrict__ q, const T* __restrict__ k,
                                                           const T* __restrict__ v, const int64_t* __restrict__ indices,
                                                           T* __restrict__ o, float* __restrict__ lse, int T_len, int H,
                                                           int Hkv, int K, int KT, float scale) {
  extern __shared__ float sm[];
  const int t = blockIdx.x, b = blockIdx.y, G = H / Hkv, HD = Hkv * D, RS = HD + 1;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  float* q_s = sm;                  // [H][D], scaled
  float* acc_s = q_s + H * D;       // [H][D] unnormalised output
  float* k_s = acc_s + H * D;       // [KT][RS]
  float* v_s = k_s + KT * RS;       // [KT][RS]
  float* p_s = v_s + KT * RS;       // [H][KT] scores, then probabilities
  float* m_s = p_s + H * KT;        // [H] running max
  float* l_s = m_s + H;             // [H] running sum
  float* a_s = l_s + H;             // [H] this tile's rescale factor
  int* idx_s = reinterpret_cast<int*>(a_s + H);  // [KT]

  const int64_t row = int64_t(b) * T_len + t;
  for (int e = tid; e < H * D; e += kThreads) {
    q_s[e] = layers::load_f32(q + row * H * D + e) * scale;
    acc_s[e] = 0.f;
  }
  for (int h = tid; h < H; h += kThreads) {
    m_s[h] = -INFINITY;
    l_s[h] = 0.f;
  }
  const int64_t* irow = indices + row * K;
  const T* kb = k + int64_t(b) * T_len * HD;
  const T* vb = v + int64_t(b) * T_len * HD;
  for (int j0 = 0; j0 < K; j0 += KT) {
    __syncthreads();  // the previous tile is consumed (and the initialisation visible)
    if (tid < KT) idx_s[tid] = j0 + tid < K ? int(irow[j0 + tid]) : -1;
    __syncthreads();
    gather_rows<T>(kb, idx_s, k_s, KT, HD);
    gather_rows<T>(vb, idx_s, v_s, KT, HD);
    __syncthreads();
    for (int pr = tid; pr < H * KT; pr += kThreads) {
      const int h = pr / KT, j = pr % KT;
      float s = -INFINITY;
      if (idx_s[j] >= 0) {
        const float* qh = q_s + h * D;
        const float* kj = k_s + j * RS + (h / G) * D;
        float d0 = 0.f, d1 = 0.f;
#pragma unroll 8
        for (int d = 0; d < D; d += 2) {
          d0 += qh[d] * kj[d];
          d1 += qh[d + 1] * kj[d + 1];
        }
        s = d0 + d1;
      }
      p_s[pr] = s;
    }
    __syncthreads();
    for (int h = warp; h < H; h += kWarps) {
      const float s = lane < KT ? p_s[h * KT + lane] : -INFINITY;
      const float m_old = m_s[h], m_new = fmaxf(m_old, warp_max(s));
      float alpha = 1.f, p = 0.f;
      if (m_new != -INFINITY) {
        alpha = expf(m_old - m_new);  // 0 while nothing was seen (m_old = −inf)
        p = expf(s - m_new);          // 0 for an empty slot
      }
      const float psum = warp_sum(p);
      const float l_old = l_s[h];
      __syncwarp();  // every lane has read this head's state before lane 0 rewrites it
      if (lane < KT) p_s[h * KT + lane] = p;
      if (lane == 0) {
        m_s[h] = m_new;
        l_s[h] = l_old * alpha + psum;
        a_s[h] = alpha;
      }
    }
    __syncthreads();
    for (int e = tid; e < H * D; e += kThreads) {
      const int h = e / D, d = e % D;
      const float* vd = v_s + (h / G) * D + d;
      const float* ph = p_s + h * KT;
      float a = acc_s[e] * a_s[h];
      for (int j = 0; j < KT; ++j) a += ph[j] * vd[j * RS];
      acc_s[e] = a;
    }
  }
  __syncthreads();
  for (int e = tid; e < H * D; e += kThreads) {
    const float l = l_s[e / D];
    o[row * H * D + e] = layers::from_f32<T>(l > 0.f ? acc_s[e] / l : 0.f);
  }
  for (int h = tid; h < H; h += kThreads) lse[row * H + h] = l_s[h] > 0.f ? m_s[h] + logf(l_s[h]) : -INFINITY;
}

template <class T, int D>
__global__ void __launch_bounds__(kThreads)
    backward_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                    const int64_t* __restrict__ indices, const T* __restrict__ o, const float* __restrict__ lse,
                    const T* __restrict__ dout, T* __restrict__ dq, float* __restrict__ dk, float* __restrict__ dv,
                    int T_len, int H, int Hkv, int K, int KT, float scale) {
  extern __shared__ float sm[];
  const int t = blockIdx.x, b = blockIdx.y, G = H / Hkv, HD = Hkv * D, RS = HD + 1;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  float* q_s = sm;                  // [H][D] (unscaled)
  float* do_s = q_s + H * D;        // [H][D]
  float* dq_s = do_s + H * D;       // [H][D] dq / scale
  float* k_s = dq_s + H * D;        // [KT][RS]
  float* v_s = k_s + KT * RS;       // [KT][RS]
  float* p_s = v_s + KT * RS;       // [H][KT] P
  float* ds_s = p_s + H * KT;       // [H][KT] dS
  float* lse_s = ds_s + H * KT;     // [H]
  float* delta_s = lse_s + H;       // [H] Δ = rowsum(dO ∘ O)
  int* idx_s = reinterpret_cast<int*>(delta_s + H);  // [KT]

  const int64_t row = int64_t(b) * T_len + t;
  for (int e = tid; e < H * D; e += kThreads) {
    q_s[e] = layers::load_f32(q + row * H * D + e);
    do_s[e] = layers::load_f32(dout + row * H * D + e);
    dq_s[e] = 0.f;
  }
  for (int h = warp; h < H; h += kWarps) {
    float x = 0.f;
    for (int d = lane; d < D; d += 32)
      x += layers::load_f32(dout + (row * H + h) * D + d) * layers::load_f32(o + (row * H + h) * D + d);
    x = warp_sum(x);
    if (lane == 0) {
      delta_s[h] = x;
      lse_s[h] = lse[row * H + h];
    }
  }
  const int64_t* irow = indices + row * K;
  const T* kb = k + int64_t(b) * T_len * HD;
  const T* vb = v + int64_t(b) * T_len * HD;
  float* dkb = dk + int64_t(b) * T_len * HD;
  float* dvb = dv + int64_t(b) * T_len * HD;
  for (int j0 = 0; j0 < K; j0 += KT) {
    __syncthreads();
    if (tid < KT) idx_s[tid] = j0 + tid < K ? int(irow[j0 + tid]) : -1;
    __syncthreads();
    gather_rows<T>(kb, idx_s, k_s, KT, HD);
    gather_rows<T>(vb, idx_s, v_s, KT, HD);
    __syncthreads();
    for (int pr = tid; pr < H * KT; pr += kThreads) {
      const int h = pr / KT, j = pr % KT;
      float p = 0.f, ds = 0.f;
      if (idx_s[j] >= 0 && lse_s[h] != -INFINITY) {
        const float* qh = q_s + h * D;
        const float* oh = do_s + h * D;
        const float* kj = k_s + j * RS + (h / G) * D;
        const float* vj = v_s + j * RS + (h / G) * D;
        float s = 0.f, dp = 0.f;
#pragma unroll 8
        for (int d = 0; d < D; ++d) {
          s += qh[d] * kj[d];
          dp += oh[d] * vj[d];
        }
        p = expf(s * scale - lse_s[h]);
        ds = p * (dp - delta_s[h]);
      }
      p_s[pr] = p;
      ds_s[pr] = ds;
    }
    __syncthreads();
    // dq (in units of 1/scale) += dS·K
    for (int e = tid; e < H * D; e += kThreads) {
      const int h = e / D, d = e % D;
      const float* kd = k_s + (h / G) * D + d;
      const float* dsh = ds_s + h * KT;
      float a = dq_s[e];
      for (int j = 0; j < KT; ++j) a += dsh[j] * kd[j * RS];
      dq_s[e] = a;
    }
    // dK = scale · dSᵀQ, dV = PᵀdO of the tile's keys, the heads of each KV group summed
    for (int e = tid; e < KT * HD; e += kThreads) {
      const int j = e / HD, r = e % HD, hk = r / D, d = r % D;
      const int s = idx_s[j];
      if (s < 0) continue;
      float gk = 0.f, gv = 0.f;
      for (int g = 0; g < G; ++g) {
        const int h = hk * G + g;
        gk += ds_s[h * KT + j] * q_s[h * D + d];
        gv += p_s[h * KT + j] * do_s[h * D + d];
      }
      atomicAdd(dkb + int64_t(s) * HD + r, gk * scale);
      atomicAdd(dvb + int64_t(s) * HD + r, gv);
    }
  }
  __syncthreads();
  for (int e = tid; e < H * D; e += kThreads) dq[row * H * D + e] = layers::from_f32<T>(dq_s[e] * scale);
}

void set_smem(const void* fn, int64_t bytes) {
  if (bytes > 48 * 1024) {
    const cudaError_t err = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
    if (err != cudaSuccess) throw std::runtime_error(std::string("token-sparse kernel: ") + cudaGetErrorString(err));
  }
}

template <class T, int D>
void launch_forward(const void* q, const void* k, const void* v, const int64_t* indices, void* o, float* lse, int B,
                    int T_len, int H, int Hkv, int K, float scale, cudaStream_t stream) {
  const int KT = tile_keys(H, Hkv, D);
  const int64_t bytes = 4 * forward_floats(H, Hkv, D, KT);
  set_smem(reinterpret_cast<const void*>(&forward_kernel<T, D>), bytes);
  forward_kernel<T, D><<<dim3(unsigned(T_len), unsigned(B)), kThreads, size_t(bytes), stream>>>(
      static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), indices, static_cast<T*>(o), lse,
      T_len, H, Hkv, K, KT, scale);
}

template <class T, int D>
void launch_backward(const void* q, const void* k, const void* v, const int64_t* indices, const void* o,
                     const float* lse, const void* dout, void* dq, float* dk, float* dv, int B, int T_len, int H,
                     int Hkv, int K, float scale, cudaStream_t stream) {
  const int KT = tile_keys(H, Hkv, D);
  const int64_t bytes = 4 * backward_floats(H, Hkv, D, KT);
  set_smem(reinterpret_cast<const void*>(&backward_kernel<T, D>), bytes);
  backward_kernel<T, D><<<dim3(unsigned(T_len), unsigned(B)), kThreads, size_t(bytes), stream>>>(
      static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), indices, static_cast<const T*>(o),
      lse, static_cast<const T*>(dout), static_cast<T*>(dq), dk, dv, T_len, H, Hkv, K, KT, scale);
}

template <class T>
void forward_d(int D, const void* q, const void* k, const void* v, const int64_t* indices, void* o, float* lse, int B,
               int T_len, int H, int Hkv, int K, float scale, cudaStream_t stream) {
  if (D == 64) return launch_forward<T, 64>(q, k, v, indices, o, lse, B, T_len, H, Hkv, K, scale, stream);
  if (D == 128) return launch_forward<T, 128>(q, k, v, indices, o, lse, B, T_len, H, Hkv, K, scale, stream);
  throw std::invalid_argument("token-sparse kernel: head_dim must be 64 or 128");
}

template <class T>
void backward_d(int D, const void* q, const void* k, const void* v, const int64_t* indices, const void* o,
                const float* lse, const void* dout, void* dq, float* dk, float* dv, int B, int T_len, int H, int Hkv,
                int K, float scale, cudaStream_t stream) {
  if (D == 64)
    return launch_backward<T, 64>(q, k, v, indices, o, lse, dout, dq, dk, dv, B, T_len, H, Hkv, K, scale, stream);
  if (D == 128)
    return launch_backward<T, 128>(q, k, v, indices, o, lse, dout, dq, dk, dv, B, T_len, H, Hkv, K, scale, stream);
  throw std::invalid_argument("token-sparse kernel: head_dim must be 64 or 128");
}

void check_shape(int H, int Hkv, int D) {
  if (!supported(H, Hkv, D))
    throw std::invalid_argument("token-sparse kernel: unsupported shape (D must be 64 or 128, H a multiple of Hkv, "
                                "and a tile of 4 keys must fit in shared memory)");
}

}  // namespace

bool supported(int H, int Hkv, int D) {
  return (D == 64 || D == 128) && H > 0 && Hkv > 0 && H % Hkv == 0 && tile_keys(H, Hkv, D) > 0;
}

void forward(Dtype dt, const void* q, const void* k, const void* v, const int64_t* indices, void* o, float* lse, int B,
             int T, int H, int Hkv, int D, int K, float scale, cudaStream_t stream) {
  if (B == 0 || T == 0) return;
  check_shape(H, Hkv, D);
  switch (dt) {
    case Dtype::F32: return forward_d<float>(D, q, k, v, indices, o, lse, B, T, H, Hkv, K, scale, stream);
    case Dtype::BF16: return forward_d<__nv_bfloat16>(D, q, k, v, indices, o, lse, B, T, H, Hkv, K, scale, stream);
    case Dtype::F16: return forward_d<__half>(D, q, k, v, indices, o, lse, B, T, H, Hkv, K, scale, stream);
  }
}

void backward(Dtype dt, const void* q, const void* k, const void* v, const int64_t* indices, const void* o,
              const float* lse, const void* dout, void* dq, float* dk, float* dv, int B, int T, int H, int Hkv, int D,
              int K, float scale, cudaStream_t stream) {
  if (B == 0 || T == 0) return;
  check_shape(H, Hkv, D);
  switch (dt) {
    case Dtype::F32:
      return backward_d<float>(D, q, k, v, indices, o, lse, dout, dq, dk, dv, B, T, H, Hkv, K, scale, stream);
    case Dtype::BF16:
      return backward_d<__nv_bfloat16>(D, q, k, v, indices, o, lse, dout, dq, dk, dv, B, T, H, Hkv, K, scale, stream);
    case Dtype::F16:
      return backward_d<__half>(D, q, k, v, indices, o, lse, dout, dq, dk, dv, B, T, H, Hkv, K, scale, stream);
  }
}

}  // namespace mixbench::token_sparse_cuda
