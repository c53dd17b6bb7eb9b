// Split-KV decode attention (flash-decoding). Phase 1: grid (splits, B·Hkv, head groups), each block
// walks its share of the valid cache slots with 4 warps, a warp taking every 4th key, 4 keys per
// iteration with their loads issued together; scores, an online softmax and the weighted sum of V
// in fp32 registers (each lane holds D/32 dimensions of every query head of its group). The 4 warps
// merge in shared memory and write (max, sum, unnormalised output) per split. Phase 2, in the same
// launch, merges the splits and rounds once to the cache's dtype: the last block of each (row, head
// group) to finish does it, found by an atomic count of arrivals (threadfence-reduction style).
#include "mixers/attention/decode_attention_kernel.h"

#include "harness/cuda_dtype.cuh"
#include "harness/pdl.cuh"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace mixbench::attn_decode_cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kUnroll = 4;
constexpr int kGroupCap = 8;  // query heads per block; larger GQA groups take several head groups
constexpr int kMaxSplits = 1024;  // choose_splits' bound (the merge keeps a weight per split in shared memory)
constexpr int kMergeUnroll = 8;   // partials of this many splits loaded together in the merge

using layers::load_row;
using layers::Vec;

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

// The block's max / sum of one value per thread, returned to every thread (kWarps warps; `red`
// holds kWarps floats; ends with a barrier so that `red` may be reused).
__device__ __forceinline__ float block_max(float x, float* red) {
  x = warp_max(x);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = x;
  __syncthreads();
  float r = red[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) r = fmaxf(r, red[w]);
  __syncthreads();
  return r;
}
__device__ __forceinline__ float block_sum(float x, float* red) {
  x = warp_sum(x);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = x;
  __syncthreads();
  float r = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) r += red[w];
  __syncthreads();
  return r;
}

// ws layout per (split, b, h): [m, l, acc[D]].
// Indexed: the slots are keys[b, s, j] for j < nk (s = 0 when the selection is shared by the KV
// heads, hk when each has its own; a negative entry is no slot), not the first n of the cache.
template <class T, int D, int kMaxGroup, bool Indexed>
__global__ void __launch_bounds__(kWarps * 32) split_kernel(const T* __restrict__ q, const T* __restrict__ K,
                                                          const T* __restrict__ V, const int64_t* __restrict__ pos_dev,
                                                          int H, int Hkv, int cap, float scale, double logit_a,
                                                          float* __restrict__ ws, int splits, int min_slots, T* __restrict__ o,
                                                          unsigned* __restrict__ counters, const int64_t* __restrict__ keys,
                                                          int nk, int key_rows) {
  cuda_launch::pdl_wait();
  constexpr int EPL = D / 32;
  const int split = blockIdx.x, bk = blockIdx.y, b = bk / Hkv, hk = bk % Hkv;
  const int G = H / Hkv, g0 = blockIdx.z * kMaxGroup, ng = min(kMaxGroup, G - g0);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t pos = Indexed && !(logit_a > 0) ? 0 : *pos_dev;  // a key list without a logit scale needs no position
  const int n = Indexed ? nk : int(pos + 1 < int64_t(cap) ? pos + 1 : int64_t(cap));
  const int64_t* key_row = Indexed ? keys + (int64_t(b) * key_rows + (key_rows == 1 ? 0 : hk)) * nk : nullptr;
  // The splits this launch fills: as many as give the live context min_slots slots each, up to the
  // grid's (sized for the full cache). The blocks past them take no slot; they only count their arrival.
  const int live = max(1, min(splits, (n + min_slots - 1) / min_slots));
  const int chunk = (n + live - 1) / live;
  const int lo = split < live ? min(n, split * chunk) : n, hi = split < live ? min(n, lo + chunk) : n;
  float s_mul = scale;
  if (logit_a > 0) s_mul *= float(log(double(pos) + logit_a) / log(logit_a));

  float qr[kMaxGroup][EPL];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    if (g < ng) {
      load_row<T, EPL>(q + (int64_t(b) * H + hk * G + g0 + g) * D + lane * EPL, qr[g]);
#pragma unroll
      for (int e = 0; e < EPL; ++e) qr[g][e] *= s_mul;
    } else {
#pragma unroll
      for (int e = 0; e < EPL; ++e) qr[g][e] = 0.f;
    }
  }
  float m[kMaxGroup], l[kMaxGroup], acc[kMaxGroup][EPL];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.f;
#pragma unroll
    for (int e = 0; e < EPL; ++e) acc[g][e] = 0.f;
  }
  const int64_t row_stride = int64_t(Hkv) * D;
  const T* Kb = K + int64_t(b) * cap * row_stride + int64_t(hk) * D + lane * EPL;
  const T* Vb = V + int64_t(b) * cap * row_stride + int64_t(hk) * D + lane * EPL;
  for (int j0 = lo + warp * kUnroll; j0 < hi; j0 += kWarps * kUnroll) {
    float kr[kUnroll][EPL], vr[kUnroll][EPL];
    bool ok[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int j = j0 + u;
      int64_t slot = j;
      if (Indexed && j < hi) slot = key_row[j];
      ok[u] = j < hi && (!Indexed || (slot >= 0 && slot < cap));
      if (ok[u]) {
        load_row<T, EPL>(Kb + slot * row_stride, kr[u]);
        load_row<T, EPL>(Vb + slot * row_stride, vr[u]);
      }
    }
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      if (g >= ng) break;
      float s[kUnroll];
      float mx = m[g];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        float d = 0.f;
#pragma unroll
        for (int e = 0; e < EPL; ++e) d += qr[g][e] * kr[u][e];
        d = warp_sum(d);
        s[u] = ok[u] ? d : -INFINITY;
        mx = fmaxf(mx, s[u]);
      }
      // no slot so far (only with an index list, whose entries may all be empty): nothing to add,
      // and exp(−inf − (−inf)) would be NaN
      if (Indexed && mx == -INFINITY) continue;
      const float alpha = __expf(m[g] - mx);  // m = -inf the first time: alpha = 0
      l[g] *= alpha;
#pragma unroll
      for (int e = 0; e < EPL; ++e) acc[g][e] *= alpha;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const float p = __expf(s[u] - mx);  // exp(-inf) = 0 past the range
        l[g] += p;
#pragma unroll
        for (int e = 0; e < EPL; ++e) acc[g][e] += p * (ok[u] ? vr[u][e] : 0.f);
      }
      m[g] = mx;
    }
  }
  // merge the warps: shared [warp][g] (m, l) and [warp][g][D] acc
  __shared__ float sm_m[kWarps][kMaxGroup], sm_l[kWarps][kMaxGroup];
  __shared__ float sm_acc[kWarps][kMaxGroup][D];
  for (int g = 0; g < ng; ++g) {
    if (lane == 0) {
      sm_m[warp][g] = m[g];
      sm_l[warp][g] = l[g];
    }
#pragma unroll
    for (int e = 0; e < EPL; ++e) sm_acc[warp][g][lane * EPL + e] = acc[g][e];
  }
  __syncthreads();
  const int B = gridDim.y / Hkv;
  for (int i = threadIdx.x; i < ng * D; i += blockDim.x) {
    const int g = i / D, d = i % D;
    float M = -INFINITY;
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, sm_m[w][g]);
    float L = 0.f, A = 0.f;
    if (M != -INFINITY)
      for (int w = 0; w < kWarps; ++w) {
        const float f = __expf(sm_m[w][g] - M);
        L += f * sm_l[w][g];
        A += f * sm_acc[w][g][d];
      }
    const int h = hk * G + g0 + g;
    float* out = ws + ((int64_t(split) * B + b) * H + h) * (D + 2);
    if (d == 0) {
      out[0] = M;
      out[1] = L;
    }
    out[2 + d] = A;
  }
  // Phase 2 in the same launch: the last block of this (b, head group) to finish merges the splits
  // (its count of arrivals in `counters`, reset to zero by that block for the next launch).
  __shared__ int is_last;
  __threadfence();  // this block's partials are visible device-wide before it is counted
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned* c = counters + (int64_t(b) * Hkv + hk) * gridDim.z + blockIdx.z;
    is_last = atomicAdd(c, 1u) == unsigned(splits - 1);
    if (is_last) *c = 0u;
  }
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  // Each query head of the group in turn: the splits' maxima and weighted sums reduced by the whole
  // block (threads stride over the splits), each split's weight exp(m − M) kept in shared memory,
  // then every output dimension sums its column of partials with the loads of several splits in
  // flight. (A load chain per dimension over hundreds of splits left the merge latency-bound: it
  // grew with splits × group size.)
  __shared__ float sm_w[kMaxSplits];
  __shared__ float sm_red[kWarps];
  const int64_t BH = int64_t(B) * H;
  const int64_t sstride = BH * (D + 2);  // from one split's partials to the next
  for (int g = 0; g < ng; ++g) {
    const int64_t bh = int64_t(b) * H + hk * G + g0 + g;
    const float* p0 = ws + bh * (D + 2);
    float mx = -INFINITY;
    for (int sp = threadIdx.x; sp < live; sp += blockDim.x) mx = fmaxf(mx, __ldcg(p0 + sp * sstride));
    mx = block_max(mx, sm_red);
    float ls = 0.f;
    for (int sp = threadIdx.x; sp < live; sp += blockDim.x) {
      const float pm = __ldcg(p0 + sp * sstride);
      const float f = pm == -INFINITY ? 0.f : __expf(pm - mx);  // an empty split weighs nothing
      sm_w[sp] = f;
      ls += f * __ldcg(p0 + sp * sstride + 1);
    }
    ls = block_sum(ls, sm_red);  // ends with a barrier: sm_w is complete
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
      const float* col = p0 + 2 + d;
      float a[kMergeUnroll] = {};
      int sp = 0;
      for (; sp + kMergeUnroll <= live; sp += kMergeUnroll) {
#pragma unroll
        for (int u = 0; u < kMergeUnroll; ++u) a[u] += sm_w[sp + u] * __ldcg(col + (sp + u) * sstride);
      }
      for (; sp < live; ++sp) a[0] += sm_w[sp] * __ldcg(col + sp * sstride);
      float A = 0.f;
#pragma unroll
      for (int u = 0; u < kMergeUnroll; ++u) A += a[u];
      o[bh * D + d] = layers::from_f32<T>(A / ls);
    }
    __syncthreads();  // sm_w and sm_red are reused by the next head
  }
}

// The slots an index list names (IndexedKeys::keys null: the cache's first min(pos + 1, cap)).
struct IndexedKeys {
  const int64_t* keys = nullptr;
  int n = 0, rows = 1;
};

template <class T, int D, int GM>
void launch_split(const void* q, const void* K, const void* V, void* o, const int64_t* pos_dev, int B, int H, int Hkv,
                  int cap, float scale, double logit_a, float* ws, int splits, int min_slots, unsigned* counters,
                  IndexedKeys ik, cudaStream_t stream) {
  const int G = H / Hkv;
  dim3 grid(unsigned(splits), unsigned(B * Hkv), unsigned((G + GM - 1) / GM));
  if (ik.keys)
    cuda_launch::launch_dependent("split-KV attention over listed keys", split_kernel<T, D, GM, true>, grid, kWarps * 32, 0,
                                  stream, static_cast<const T*>(q), static_cast<const T*>(K), static_cast<const T*>(V),
                                  pos_dev, H, Hkv, cap, scale, logit_a, ws, splits, min_slots, static_cast<T*>(o), counters,
                                  ik.keys, ik.n, ik.rows);
  else
    cuda_launch::launch_dependent("split-KV attention", split_kernel<T, D, GM, false>, grid, kWarps * 32, 0, stream,
                                  static_cast<const T*>(q), static_cast<const T*>(K), static_cast<const T*>(V), pos_dev, H,
                                  Hkv, cap, scale, logit_a, ws, splits, min_slots, static_cast<T*>(o), counters,
                                  static_cast<const int64_t*>(nullptr), 0, 1);
}

template <class T, int D>
void launch(const void* q, const void* K, const void* V, void* o, const int64_t* pos_dev, int B, int H, int Hkv, int cap,
            float scale, double logit_a, float* ws, int splits, int min_slots, unsigned* counters, IndexedKeys ik, cudaStream_t stream) {
  // the query heads of one KV head in registers: as many as the group has, up to kGroupCap
  const int G = H / Hkv;
  if (G == 1) launch_split<T, D, 1>(q, K, V, o, pos_dev, B, H, Hkv, cap, scale, logit_a, ws, splits, min_slots, counters, ik, stream);
  else if (G == 2) launch_split<T, D, 2>(q, K, V, o, pos_dev, B, H, Hkv, cap, scale, logit_a, ws, splits, min_slots, counters, ik, stream);
  else if (G <= 4) launch_split<T, D, 4>(q, K, V, o, pos_dev, B, H, Hkv, cap, scale, logit_a, ws, splits, min_slots, counters, ik, stream);
  else launch_split<T, D, kGroupCap>(q, K, V, o, pos_dev, B, H, Hkv, cap, scale, logit_a, ws, splits, min_slots, counters, ik, stream);
}

template <class T>
void dispatch_d(int D, const void* q, const void* K, const void* V, void* o, const int64_t* pos_dev, int B, int H, int Hkv,
                int cap, float scale, double logit_a, float* ws, int splits, int min_slots, unsigned* counters,
                IndexedKeys ik, cudaStream_t stream) {
  switch (D) {
    case 64: return launch<T, 64>(q, K, V, o, pos_dev, B, H, Hkv, cap, scale, logit_a, ws, splits, min_slots, counters, ik, stream);
    case 128: return launch<T, 128>(q, K, V, o, pos_dev, B, H, Hkv, cap, scale, logit_a, ws, splits, min_slots, counters, ik, stream);
    case 256: return launch<T, 256>(q, K, V, o, pos_dev, B, H, Hkv, cap, scale, logit_a, ws, splits, min_slots, counters, ik, stream);
    default: throw std::invalid_argument("decode attention kernel: head_dim must be 64, 128 or 256");
  }
}

}  // namespace

bool supported_head_dim(int D) { return D == 64 || D == 128 || D == 256; }

int choose_splits(int B, int Hkv, int cap, int sms, int min_slots) {
  // about eight blocks (32 warps) per multiprocessor, enough loads in flight to stream the cache, and
  // no split shorter than min_slots slots at full capacity
  const int rows = std::max(1, B * Hkv);
  int s = (8 * sms + rows - 1) / rows;
  s = std::min(s, std::max(1, cap / std::max(1, min_slots)));
  return std::max(1, std::min(s, kMaxSplits));
}

int64_t workspace_floats(int B, int H, int D, int splits) { return int64_t(splits) * B * H * (D + 2); }

int64_t counter_slots(int B, int H) { return int64_t(B) * H; }

namespace {
void decode_any(Dtype dt, const void* q, const void* K, const void* V, void* o, const int64_t* pos_dev, int B, int H, int Hkv,
                int D, int cap, float scale, double logit_a, float* workspace, int splits, int min_slots,
                unsigned* counters, IndexedKeys ik, cudaStream_t stream) {
  if (B == 0 || H == 0) return;
  if (Hkv <= 0 || H % Hkv != 0) throw std::invalid_argument("decode attention kernel: H must be a multiple of Hkv");
  if (!counters || splits < 1) throw std::invalid_argument("decode attention kernel: it needs its counters and a split");
  if (splits > kMaxSplits) throw std::invalid_argument("decode attention kernel: at most 1024 splits");
  if (min_slots < 1) throw std::invalid_argument("decode attention kernel: a split takes at least one slot");
  switch (dt) {
    case Dtype::F32:
      return dispatch_d<float>(D, q, K, V, o, pos_dev, B, H, Hkv, cap, scale, logit_a, workspace, splits, min_slots, counters,
                               ik, stream);
    case Dtype::BF16:
      return dispatch_d<__nv_bfloat16>(D, q, K, V, o, pos_dev, B, H, Hkv, cap, scale, logit_a, workspace, splits, min_slots,
                                       counters, ik, stream);
    case Dtype::F16:
      return dispatch_d<__half>(D, q, K, V, o, pos_dev, B, H, Hkv, cap, scale, logit_a, workspace, splits, min_slots, counters,
                                ik, stream);
  }
}
}  // namespace

void decode(Dtype dt, const void* q, const void* K, const void* V, void* o, const int64_t* pos_dev, int B, int H, int Hkv,
            int D, int cap, float scale, double logit_a, float* workspace, int splits, int min_slots, unsigned* counters,
            cudaStream_t stream) {
  decode_any(dt, q, K, V, o, pos_dev, B, H, Hkv, D, cap, scale, logit_a, workspace, splits, min_slots, counters, IndexedKeys{},
             stream);
}

void decode_listed(Dtype dt, const void* q, const void* K, const void* V, void* o, const int64_t* pos_dev,
                   const int64_t* keys, int n_keys, int key_rows, int B, int H, int Hkv, int D, int cap, float scale,
                   double logit_a, float* workspace, int splits, int min_slots, unsigned* counters, cudaStream_t stream) {
  if (!keys || n_keys < 1) throw std::invalid_argument("decode attention kernel: a key list of at least one entry");
  if (key_rows != 1 && key_rows != Hkv)
    throw std::invalid_argument("decode attention kernel: one key list per row, or one per KV head");
  if (logit_a > 0 && !pos_dev) throw std::invalid_argument("decode attention kernel: the logit scale reads the position");
  decode_any(dt, q, K, V, o, pos_dev, B, H, Hkv, D, cap, scale, logit_a, workspace, splits, min_slots, counters,
             IndexedKeys{keys, n_keys, key_rows}, stream);
}

}  // namespace mixbench::attn_decode_cuda
