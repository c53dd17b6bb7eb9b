// CUDA forward of `simple_gla` (see simple_gla_op.cpp for the recurrence and the chunked algorithm
// this kernel implements; the autograd wrapper and the dispatch live there too).
//
// Design (one fused kernel, fp32 FMA, no tensor cores):
// - Grid: one CTA per (b, h, V-tile of BV = 32 columns; the kernel also takes BV = 64); V ∈ {64,
//   128} gives 2 or 4 tiles. 256 threads, viewed as a 16×16 grid (tx = tid % 16, ty = tid / 16).
//   Every V-tile CTA of a head recomputes the same A (q kᵀ) for its chunk; the smaller tile still
//   won on the H200 (more CTAs, two per SM): see ci/kernels/NOTES.md.
// - The CTA walks the chunks of C = 64 tokens in order. Its fp32 state tile S [K, BV] lives in
//   shared memory for the whole walk (starts from h0 or zero, written to ht at the end).
// - Per chunk, shared memory holds (all fp32): q·scale [C, K+1], k [C, K+1] (rows padded by one
//   float so that 16 lanes reading 16 different rows hit 16 different banks), the v tile [C, BV],
//   b = cumsum(g) within the chunk [C], kd_j = exp(b_L − b_j) [C], and A [C, C+1].
//   Steps, separated by barriers:
//     1. load q, k, v, g (rows t ≥ T read as 0, g as 0); warp 0 scans g into b and writes kd;
//     2. A_ij = (q_i·k_j)·exp(b_i − b_j) for j ≤ i, else 0  — each thread owns a 4×4 block
//        (i = ty + 16r, j = tx + 16c);
//     3. o_iv = Σ_j A_ij v_jv + exp(b_i)·Σ_k q_ik S_kv   — each thread owns 4 rows × BV/16
//        columns (i = ty + 16r, v = tx + 16c), reads the state as it was at the chunk start, and stores
//        rows with t < T in the input dtype;
//     4. S_kv ← exp(b_L)·S_kv + Σ_j k_jk kd_j v_jv — each thread owns K/16 × BV/16 entries
//        (k = ty + 16r, v = tx + 16c), in registers while it accumulates, written back in place.
//        Each entry is read and written only by its owner, so the barrier after step 3 (all
//        readers of the old S done) is the only one the update needs.
// - Masking: the causal mask is a select, applied before exp (exp(b_i − b_j) for j > i could
//   overflow to inf, and inf·0 is NaN). The tail chunk is padded exactly as the LibTorch path pads:
//   q = k = v = 0 and g = 0 for t ≥ T. Then b stays at its last valid value past the end, so
//   b_L = b at the last valid token and the state decays by exactly the valid tokens' gates; padded
//   rows have k = 0 and v = 0, so they add nothing to A's valid rows, to o, or to S; padded output
//   rows are never stored. Every o element with t < T is stored by exactly one CTA (its b, h,
//   V-tile, at its chunk) and every ht element by exactly one CTA, so no output is left unwritten.
// - Accumulation is fp32 throughout; inputs are converted to fp32 on load. Shared memory at
//   K = 128 is about 107 KB with BV = 32 (two CTAs per SM), 131 KB with BV = 64, set with
//   cudaFuncSetAttribute. ptxas (sm_90): 87–113 registers, no stack frame, no spills.
#if defined(MIXBENCH_WITH_CUDA)
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "harness/alloc.h"
#include "mixers/linear/gla_ops.h"

namespace mixbench::linear {
namespace {

constexpr int kC = 64;        // chunk length (== kGlaChunk)
constexpr int kThreads = 256;
constexpr int kVTile = 32;    // V columns per CTA (the kernel takes 32 or 64; 32 measured faster)
static_assert(kC == kGlaChunk, "the kernel's chunk length must match the LibTorch path's");

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
template <typename T>
__device__ __forceinline__ T from_f(float x);
template <>
__device__ __forceinline__ float from_f<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16(x); }
template <>
__device__ __forceinline__ __half from_f<__half>(float x) { return __float2half(x); }

template <int K, int kBV>
constexpr size_t smem_floats() {
  return size_t(kC) * (K + 1) * 2   // q, k
         + size_t(kC) * kBV         // v tile
         + size_t(K) * kBV          // state tile
         + size_t(kC) * (kC + 1)    // A
         + 2 * size_t(kC);          // b, kd
}

// q,k [B,T,H,K], v [B,T,H,V], g [B,T,H] fp32, h0 [B,H,K,V] fp32 or null; o [B,T,H,V], ht [B,H,K,V] fp32.
template <typename scalar_t, int K, int kBV>
__global__ void __launch_bounds__(kThreads, 1)
    simple_gla_fwd_kernel(const scalar_t* __restrict__ q, const scalar_t* __restrict__ k,
                          const scalar_t* __restrict__ v, const float* __restrict__ g,
                          const float* __restrict__ h0, scalar_t* __restrict__ o, float* __restrict__ ht,
                          int T, int H, int V, float scale) {
  constexpr int KP = K + 1, AP = kC + 1, KR = K / 16, VC = kBV / 16;
  static_assert(kBV == 32 || kBV == 64, "V tile of 32 or 64 columns");
  extern __shared__ float smem[];
  float* q_s = smem;                  // [C][KP]
  float* k_s = q_s + kC * KP;         // [C][KP]
  float* v_s = k_s + kC * KP;         // [C][BV]
  float* S_s = v_s + kC * kBV;        // [K][BV]
  float* A_s = S_s + K * kBV;         // [C][AP]
  float* b_s = A_s + kC * AP;         // [C]
  float* kd_s = b_s + kC;             // [C]

  const int NV = V / kBV;
  const int vt = blockIdx.x % NV;
  const int h = (blockIdx.x / NV) % H;
  const int b = blockIdx.x / (NV * H);
  const int v0 = vt * kBV;
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const int lane = tid % 32, warp = tid / 32;

  // state tile from h0 (or zero)
  const int64_t sbase = (int64_t(b) * H + h) * K * V;
  for (int idx = tid; idx < K * kBV; idx += kThreads) {
    const int kk = idx / kBV, vv = idx % kBV;
    S_s[idx] = h0 ? h0[sbase + int64_t(kk) * V + v0 + vv] : 0.f;
  }

  const int N = (T + kC - 1) / kC;
  for (int n = 0; n < N; ++n) {
    const int t0 = n * kC;
    __syncthreads();  // previous chunk's readers of q_s, k_s, v_s, A_s, b_s, kd_s are done; S_s init visible

    // ---- 1. loads (rows past T are zero) and the gate scan
    for (int idx = tid; idx < kC * K; idx += kThreads) {
      const int i = idx / K, kk = idx % K, t = t0 + i;
      float qv = 0.f, kv = 0.f;
      if (t < T) {
        const int64_t off = ((int64_t(b) * T + t) * H + h) * K + kk;
        qv = to_f(q[off]) * scale;
        kv = to_f(k[off]);
      }
      q_s[i * KP + kk] = qv;
      k_s[i * KP + kk] = kv;
    }
    for (int idx = tid; idx < kC * kBV; idx += kThreads) {
      const int i = idx / kBV, vv = idx % kBV, t = t0 + i;
      v_s[idx] = t < T ? to_f(v[((int64_t(b) * T + t) * H + h) * V + v0 + vv]) : 0.f;
    }
    if (warp == 0) {
      // lane l holds tokens 2l and 2l+1; inclusive scan of the pair sums across the warp
      const int ta = t0 + 2 * lane, tb = ta + 1;
      const float ga = ta < T ? g[(int64_t(b) * T + ta) * H + h] : 0.f;
      const float gb = tb < T ? g[(int64_t(b) * T + tb) * H + h] : 0.f;
      const float pair = ga + gb;
      float incl = pair;
#pragma unroll
      for (int d = 1; d < 32; d *= 2) {
        const float up = __shfl_up_sync(0xffffffffu, incl, d);
        if (lane >= d) incl += up;
      }
      const float excl = incl - pair;
      const float ba = excl + ga, bb = incl;
      const float bL = __shfl_sync(0xffffffffu, incl, 31);
      b_s[2 * lane] = ba;
      b_s[2 * lane + 1] = bb;
      kd_s[2 * lane] = expf(bL - ba);
      kd_s[2 * lane + 1] = expf(bL - bb);
    }
    __syncthreads();

    // ---- 2. A = (q kᵀ) ⊙ exp(b_i − b_j) [j ≤ i]
    {
      float acc[4][4];
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[r][c] = 0.f;
#pragma unroll 4
      for (int kk = 0; kk < K; ++kk) {
        float a[4], bk[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) a[r] = q_s[(ty + 16 * r) * KP + kk];
#pragma unroll
        for (int c = 0; c < 4; ++c) bk[c] = k_s[(tx + 16 * c) * KP + kk];
#pragma unroll
        for (int r = 0; r < 4; ++r)
#pragma unroll
          for (int c = 0; c < 4; ++c) acc[r][c] = fmaf(a[r], bk[c], acc[r][c]);
      }
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int i = ty + 16 * r;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int j = tx + 16 * c;
          A_s[i * AP + j] = j <= i ? acc[r][c] * expf(b_s[i] - b_s[j]) : 0.f;
        }
      }
    }
    __syncthreads();

    // ---- 3. o = A v + exp(b) ⊙ (q S_start)
    {
      float acc[4][VC], inter[4][VC];
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int c = 0; c < VC; ++c) acc[r][c] = inter[r][c] = 0.f;
#pragma unroll 4
      for (int j = 0; j < kC; ++j) {
        float a[4], w[VC];
#pragma unroll
        for (int r = 0; r < 4; ++r) a[r] = A_s[(ty + 16 * r) * AP + j];
#pragma unroll
        for (int c = 0; c < VC; ++c) w[c] = v_s[j * kBV + tx + 16 * c];
#pragma unroll
        for (int r = 0; r < 4; ++r)
#pragma unroll
          for (int c = 0; c < VC; ++c) acc[r][c] = fmaf(a[r], w[c], acc[r][c]);
      }
#pragma unroll 4
      for (int kk = 0; kk < K; ++kk) {
        float a[4], s[VC];
#pragma unroll
        for (int r = 0; r < 4; ++r) a[r] = q_s[(ty + 16 * r) * KP + kk];
#pragma unroll
        for (int c = 0; c < VC; ++c) s[c] = S_s[kk * kBV + tx + 16 * c];
#pragma unroll
        for (int r = 0; r < 4; ++r)
#pragma unroll
          for (int c = 0; c < VC; ++c) inter[r][c] = fmaf(a[r], s[c], inter[r][c]);
      }
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int i = ty + 16 * r, t = t0 + i;
        if (t >= T) continue;
        const float di = expf(b_s[i]);
        scalar_t* orow = o + ((int64_t(b) * T + t) * H + h) * V + v0;
#pragma unroll
        for (int c = 0; c < VC; ++c) orow[tx + 16 * c] = from_f<scalar_t>(fmaf(di, inter[r][c], acc[r][c]));
      }
    }
    __syncthreads();  // every reader of the chunk-start state is done

    // ---- 4. S ← exp(b_L) S + (k ⊙ kd)ᵀ v
    {
      float acc[KR][VC];
#pragma unroll
      for (int r = 0; r < KR; ++r)
#pragma unroll
        for (int c = 0; c < VC; ++c) acc[r][c] = 0.f;
#pragma unroll 2
      for (int j = 0; j < kC; ++j) {
        const float dj = kd_s[j];
        float a[KR], w[VC];
#pragma unroll
        for (int r = 0; r < KR; ++r) a[r] = k_s[j * KP + ty + 16 * r];
#pragma unroll
        for (int c = 0; c < VC; ++c) w[c] = dj * v_s[j * kBV + tx + 16 * c];
#pragma unroll
        for (int r = 0; r < KR; ++r)
#pragma unroll
          for (int c = 0; c < VC; ++c) acc[r][c] = fmaf(a[r], w[c], acc[r][c]);
      }
      const float dL = expf(b_s[kC - 1]);
#pragma unroll
      for (int r = 0; r < KR; ++r)
#pragma unroll
        for (int c = 0; c < VC; ++c) {
          float* s = &S_s[(ty + 16 * r) * kBV + tx + 16 * c];
          *s = fmaf(dL, *s, acc[r][c]);
        }
    }
  }
  __syncthreads();
  for (int idx = tid; idx < K * kBV; idx += kThreads) {
    const int kk = idx / kBV, vv = idx % kBV;
    ht[sbase + int64_t(kk) * V + v0 + vv] = S_s[idx];
  }
}

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("simple_gla_fwd_cuda: ") + what + ": " + cudaGetErrorString(e));
}

template <typename scalar_t, int K, int kBV>
void launch(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g, const at::Tensor& h0,
            at::Tensor& o, at::Tensor& ht, double scale) {
  const int B = int(q.size(0)), T = int(q.size(1)), H = int(q.size(2)), V = int(v.size(3));
  const size_t smem = smem_floats<K, kBV>() * sizeof(float);
  auto kernel = simple_gla_fwd_kernel<scalar_t, K, kBV>;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
             "cudaFuncSetAttribute");
  const int64_t blocks = int64_t(B) * H * (V / kBV);
  if (blocks > 0x7fffffff) throw std::runtime_error("simple_gla_fwd_cuda: grid too large");
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  kernel<<<unsigned(blocks), kThreads, smem, stream>>>(
      reinterpret_cast<const scalar_t*>(q.data_ptr()), reinterpret_cast<const scalar_t*>(k.data_ptr()),
      reinterpret_cast<const scalar_t*>(v.data_ptr()), g.data_ptr<float>(),
      h0.defined() ? h0.data_ptr<float>() : nullptr, reinterpret_cast<scalar_t*>(o.data_ptr()),
      ht.data_ptr<float>(), T, H, V, float(scale));
  check_cuda(cudaGetLastError(), "kernel launch");
}

template <typename scalar_t, int kBV>
void launch_k(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g, const at::Tensor& h0,
              at::Tensor& o, at::Tensor& ht, double scale) {
  if (q.size(3) == 64)
    launch<scalar_t, 64, kBV>(q, k, v, g, h0, o, ht, scale);
  else
    launch<scalar_t, 128, kBV>(q, k, v, g, h0, o, ht, scale);
}

}  // namespace

std::pair<at::Tensor, at::Tensor> simple_gla_fwd_cuda(const at::Tensor& q_in, const at::Tensor& k_in,
                                                      const at::Tensor& v_in, const at::Tensor& g_in, double scale,
                                                      const at::Tensor& h0_in) {
  if (!simple_gla_cuda_eligible(q_in, k_in, v_in, g_in, h0_in))
    throw std::invalid_argument("simple_gla_fwd_cuda: inputs not supported (CUDA, K and V in {64, 128}, "
                                "q/k/v of one dtype among fp32, bf16, fp16)");
  const int64_t T = q_in.size(1);
  if (T > int64_t(0x7fffffff) / 2) throw std::invalid_argument("simple_gla_fwd_cuda: T too large");
  c10::cuda::CUDAGuard guard(q_in.device());
  const at::Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
  const at::Tensor g = g_in.to(at::kFloat).contiguous();
  const at::Tensor h0 = h0_in.defined() ? h0_in.to(at::kFloat).contiguous() : at::Tensor();
  const int64_t B = q.size(0), H = q.size(2), K = q.size(3), V = v.size(3);
  at::Tensor o = alloc_output({B, T, H, V}, v.options());
  at::Tensor ht = alloc_output({B, H, K, V}, v.options().dtype(at::kFloat));
  if (B * H == 0) return {o, ht};
  if (T == 0) {
    ht.copy_(h0.defined() ? h0 : at::zeros_like(ht));
    return {o, ht};
  }
  switch (q.scalar_type()) {
    case at::kFloat: launch_k<float, kVTile>(q, k, v, g, h0, o, ht, scale); break;
    case at::kBFloat16: launch_k<__nv_bfloat16, kVTile>(q, k, v, g, h0, o, ht, scale); break;
    case at::kHalf: launch_k<__half, kVTile>(q, k, v, g, h0, o, ht, scale); break;
    default: throw std::invalid_argument("simple_gla_fwd_cuda: unsupported dtype");
  }
  return {o, ht};
}

}  // namespace mixbench::linear
#endif  // MIXBENCH_WITH_CUDA
