// Length-aware decode products (decode_rows_kernel.h). row_scores: one block of 4 warps per
// (b, s) and 16 consecutive rows, a warp per row: the lanes stride over D, a shuffle reduction per
// query row g; rows past the position's reach are written 0 without reading the buffer. row_mix:
// one block per (b, s, g), a thread per dim, the reachable rows walked in order.
#include "mixers/sparse/decode_rows_kernel.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <stdexcept>
#include <string>

#include "harness/cuda_dtype.cuh"

namespace mixbench::decode_rows_cuda {

namespace {

using layers::from_f32;
using layers::load_f32;

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kRowsPerBlock = 16;

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

__device__ __forceinline__ int64_t reach(const int64_t* pos, int64_t per, int L) {
  const int64_t n = *pos / per + 1;
  return n < L ? n : int64_t(L);
}

template <class T>
__device__ __forceinline__ float round_to(float x) {
  const T t = from_f32<T>(x);
  return load_f32(&t);
}

template <class TQ, class TK>
__global__ void row_scores_kernel(const TQ* __restrict__ q, const TK* __restrict__ K, const TQ* __restrict__ w,
                                  TQ* __restrict__ out, const int64_t* __restrict__ pos, int64_t per, int S, int G,
                                  int D, int L) {
  const int64_t bsi = blockIdx.y;  // b·S + s
  const int64_t b = bsi / S, s = bsi % S;
  const int64_t n = reach(pos, per, L);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const TQ* qb = q + bsi * G * D;
  for (int r = warp; r < kRowsPerBlock; r += kWarps) {
    const int64_t j = int64_t(blockIdx.x) * kRowsPerBlock + r;
    if (j >= L) break;
    const bool live = j < n;  // warp-uniform
    const TK* kr = K + ((b * L + j) * S + s) * D;
    float mixed = 0.f;
    for (int g = 0; g < G; ++g) {
      float a = 0.f;
      if (live) {
        for (int d = lane; d < D; d += 32) a += load_f32(qb + int64_t(g) * D + d) * load_f32(kr + d);
        a = warp_sum(a);
      }
      if (w) {
        mixed += load_f32(w + bsi * G + g) * fmaxf(round_to<TQ>(a), 0.f);
      } else if (lane == 0) {
        out[(bsi * G + g) * L + j] = from_f32<TQ>(a);
      }
    }
    if (w && lane == 0) out[bsi * L + j] = from_f32<TQ>(live ? mixed : 0.f);
  }
}

template <class TP, class TV>
__global__ void row_mix_kernel(const TP* __restrict__ p, const TV* __restrict__ V, TV* __restrict__ out,
                               const int64_t* __restrict__ pos, int64_t per, int S, int G, int D, int L) {
  const int64_t row = blockIdx.x;  // (b·S + s)·G + g
  const int64_t bsi = row / G;
  const int64_t b = bsi / S, s = bsi % S;
  const int64_t n = reach(pos, per, L);
  const TP* pr = p + row * L;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.f;
    for (int64_t j = 0; j < n; ++j) acc += round_to<TV>(load_f32(pr + j)) * load_f32(V + ((b * L + j) * S + s) * D + d);
    out[row * D + d] = from_f32<TV>(acc);
  }
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

template <class TQ, class TK>
void launch_scores(const void* q, const void* K, const void* w, void* out, const int64_t* pos, int64_t per, int B,
                   int S, int G, int D, int L, cudaStream_t stream) {
  const dim3 grid((L + kRowsPerBlock - 1) / kRowsPerBlock, B * S);
  row_scores_kernel<TQ, TK><<<grid, kThreads, 0, stream>>>(static_cast<const TQ*>(q), static_cast<const TK*>(K),
                                                           static_cast<const TQ*>(w), static_cast<TQ*>(out), pos, per, S,
                                                           G, D, L);
  check(cudaGetLastError(), "decode row_scores");
}

template <class TP, class TV>
void launch_mix(const void* p, const void* V, void* out, const int64_t* pos, int64_t per, int B, int S, int G, int D,
                int L, cudaStream_t stream) {
  const int threads = D >= 128 ? 128 : (D + 31) / 32 * 32;
  row_mix_kernel<TP, TV><<<B * S * G, threads, 0, stream>>>(static_cast<const TP*>(p), static_cast<const TV*>(V),
                                                            static_cast<TV*>(out), pos, per, S, G, D, L);
  check(cudaGetLastError(), "decode row_mix");
}

}  // namespace

bool supported(Dtype q, Dtype buf) { return q == buf || q == Dtype::F32; }

void row_scores(Dtype tq, Dtype tk, const void* q, const void* K, const void* w, void* out, const int64_t* pos,
                int64_t per, int B, int S, int G, int D, int L, cudaStream_t stream) {
  if (B * S == 0 || L == 0) return;
  if (tq == Dtype::F32 && tk == Dtype::F32) return launch_scores<float, float>(q, K, w, out, pos, per, B, S, G, D, L, stream);
  if (tq == Dtype::F32 && tk == Dtype::BF16)
    return launch_scores<float, __nv_bfloat16>(q, K, w, out, pos, per, B, S, G, D, L, stream);
  if (tq == Dtype::F32 && tk == Dtype::F16) return launch_scores<float, __half>(q, K, w, out, pos, per, B, S, G, D, L, stream);
  if (tq == Dtype::BF16 && tk == Dtype::BF16)
    return launch_scores<__nv_bfloat16, __nv_bfloat16>(q, K, w, out, pos, per, B, S, G, D, L, stream);
  if (tq == Dtype::F16 && tk == Dtype::F16) return launch_scores<__half, __half>(q, K, w, out, pos, per, B, S, G, D, L, stream);
  throw std::invalid_argument("decode row_scores: unsupported element types");
}

void row_mix(Dtype tp, Dtype tv, const void* p, const void* V, void* out, const int64_t* pos, int64_t per, int B, int S,
             int G, int D, int L, cudaStream_t stream) {
  if (B * S * G == 0 || D == 0) return;
  if (tp == Dtype::F32 && tv == Dtype::F32) return launch_mix<float, float>(p, V, out, pos, per, B, S, G, D, L, stream);
  if (tp == Dtype::F32 && tv == Dtype::BF16) return launch_mix<float, __nv_bfloat16>(p, V, out, pos, per, B, S, G, D, L, stream);
  if (tp == Dtype::F32 && tv == Dtype::F16) return launch_mix<float, __half>(p, V, out, pos, per, B, S, G, D, L, stream);
  if (tp == Dtype::BF16 && tv == Dtype::BF16)
    return launch_mix<__nv_bfloat16, __nv_bfloat16>(p, V, out, pos, per, B, S, G, D, L, stream);
  if (tp == Dtype::F16 && tv == Dtype::F16) return launch_mix<__half, __half>(p, V, out, pos, per, B, S, G, D, L, stream);
  throw std::invalid_argument("decode row_mix: unsupported element types");
}

}  // namespace mixbench::decode_rows_cuda
