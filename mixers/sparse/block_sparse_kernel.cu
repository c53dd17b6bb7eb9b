// Block-sparse causal attention kernels (CUDA cores, fp32 arithmetic).
//
// Forward and dq: one warp per (batch, query t, KV head) holding the up-to-GM query heads of its
// group in registers (each lane D/32 dimensions), walking the selected blocks of its query row,
// kUnroll keys per step with their loads issued together; scores reduced across the warp, an online
// softmax in fp32 (base 2). The kUnroll (scores) or 2·kUnroll (scores and dO·v) partial sums of a
// step are reduced together across the warp (warp_sum_n). The 4 warps of a block take 4 consecutive queries of one KV head, so
// blocks that neighbouring queries share are read from L1.
//
// dk / dv: key-block-stationary. The selection is transposed on the device (count per (b, KV head,
// block), scan, fill) into the list of query rows that selected each block; a work item is one
// block and up to rows_per_item() of its rows. Each warp keeps kUnroll keys' k, v and their dk, dv
// in registers and walks the item's queries (every query of each row and every head of the group);
// the block's warps split its keys (bs ≥ 16: 4 key groups) and, for small blocks, the queries. A
// warp adds its dk, dv to the fp32 outputs once per work item.
#include "mixers/sparse/block_sparse_kernel.h"

#include "harness/cuda_dtype.cuh"

#include <stdexcept>

namespace mixbench::bsa_cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kUnroll = 4;
constexpr int kGroupCap = 8;  // query heads per warp; larger GQA groups take several head groups
constexpr float kLog2e = 1.4426950408889634f;

using layers::load_row;
using layers::Vec;

template <class T, int EPL>
__device__ __forceinline__ void store_row(T* p, const float (&in)[EPL]) {
  Vec<T, EPL> r;
#pragma unroll
  for (int e = 0; e < EPL; ++e) r.v[e] = layers::from_f32<T>(in[e]);
  *reinterpret_cast<Vec<T, EPL>*>(p) = r;
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// x[j] ← Σ over the warp's lanes of x[j], in every lane, for N = 2^k ≤ 32 values: halving steps
// (at offset 16, 8, …: a lane keeps the half of its values picked by its lane bit and receives its
// partner's copy of that half), the last value summed by butterflies, then value j broadcast from
// lane j·32/N (whose lane bits spelled j's halves): N − 1 + log2(32/N) + N shuffles instead of 5N.
template <int N>
__device__ __forceinline__ void warp_sum_n(float (&x)[N], int lane) {
  constexpr int kSteps = N == 1 ? 0 : N == 2 ? 1 : N == 4 ? 2 : N == 8 ? 3 : N == 16 ? 4 : 5;
  static_assert((1 << kSteps) == N, "N must be a power of two up to 32");
  float a[N];
#pragma unroll
  for (int j = 0; j < N; ++j) a[j] = x[j];
#pragma unroll
  for (int st = 0; st < kSteps; ++st) {
    const int o = 16 >> st, h = N >> (st + 1);
    const bool up = (lane & o) != 0;
#pragma unroll
    for (int j = 0; j < h; ++j) {  // writes a[j], reads a[j'] and a[j' + h] for j' ≥ j only
      const float keep = up ? a[j + h] : a[j], send = up ? a[j] : a[j + h];
      a[j] = keep + __shfl_xor_sync(0xffffffffu, send, o);
    }
  }
#pragma unroll
  for (int st = kSteps; st < 5; ++st) a[0] += __shfl_xor_sync(0xffffffffu, a[0], 16 >> st);
#pragma unroll
  for (int j = 0; j < N; ++j) x[j] = __shfl_sync(0xffffffffu, a[0], j * (32 / N));
}

template <int EPL>
__device__ __forceinline__ float dot(const float (&a)[EPL], const float (&b)[EPL]) {
  float d = 0.f;
#pragma unroll
  for (int e = 0; e < EPL; ++e) d += a[e] * b[e];
  return d;
}

// The keys of query t in slot j of its row: [s0, s1), empty when the slot is −1 (or out of range).
__device__ __forceinline__ void slot_keys(const int64_t* row, int j, int t, const Shape& s, int NB, int& s0, int& s1) {
  const int64_t i = row[j];
  if (i < 0 || i >= NB) {
    s0 = s1 = 0;
    return;
  }
  s0 = int(i) * s.bs;
  s1 = min(min(s0 + s.bs, s.T), t + 1);
}

// ------------------------------------------------------------------------------------ forward
template <class T, int D, int GM>
__global__ void __launch_bounds__(kWarps * 32) fwd_kernel(const T* __restrict__ q, const T* __restrict__ k,
                                                        const T* __restrict__ v, const int64_t* __restrict__ idx,
                                                        T* __restrict__ o, float* __restrict__ lse, Shape s) {
  constexpr int EPL = D / 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int t = blockIdx.x * kWarps + warp;
  if (t >= s.T) return;
  const int b = blockIdx.y / s.Hkv, hk = blockIdx.y % s.Hkv;
  const int G = s.H / s.Hkv, g0 = blockIdx.z * GM, ng = min(GM, G - g0);
  const int NB = s.NB();
  const float qmul = s.scale * kLog2e;

  float qr[GM][EPL], m[GM], l[GM], acc[GM][EPL];
#pragma unroll
  for (int g = 0; g < GM; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.f;
#pragma unroll
    for (int e = 0; e < EPL; ++e) acc[g][e] = qr[g][e] = 0.f;
    if (g < ng) {
      load_row<T, EPL>(q + ((int64_t(b) * s.T + t) * s.H + hk * G + g0 + g) * D + lane * EPL, qr[g]);
#pragma unroll
      for (int e = 0; e < EPL; ++e) qr[g][e] *= qmul;
    }
  }
  const int64_t* row = idx + ((int64_t(b) * s.Hkv + hk) * s.NQ + t / s.qb) * s.topk;
  const int64_t rs = int64_t(s.Hkv) * D;  // key row stride
  const T* Kb = k + int64_t(b) * s.T * rs + hk * D + lane * EPL;
  const T* Vb = v + int64_t(b) * s.T * rs + hk * D + lane * EPL;
  for (int j = 0; j < s.topk; ++j) {
    int s0, s1;
    slot_keys(row, j, t, s, NB, s0, s1);
    for (int j0 = s0; j0 < s1; j0 += kUnroll) {
      float kr[kUnroll][EPL], vr[kUnroll][EPL];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (j0 + u < s1) {
          load_row<T, EPL>(Kb + int64_t(j0 + u) * rs, kr[u]);
          load_row<T, EPL>(Vb + int64_t(j0 + u) * rs, vr[u]);
        } else {
#pragma unroll
          for (int e = 0; e < EPL; ++e) kr[u][e] = vr[u][e] = 0.f;
        }
      }
#pragma unroll
      for (int g = 0; g < GM; ++g) {
        if (g >= ng) break;
        float sc[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) sc[u] = dot<EPL>(qr[g], kr[u]);
        warp_sum_n<kUnroll>(sc, lane);
        float mx = m[g];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          sc[u] = (j0 + u < s1) ? sc[u] : -INFINITY;
          mx = fmaxf(mx, sc[u]);
        }
        const float alpha = exp2f(m[g] - mx);  // key j0 is valid: mx finite; m = −inf the first time: 0
        l[g] *= alpha;
#pragma unroll
        for (int e = 0; e < EPL; ++e) acc[g][e] *= alpha;
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const float p = exp2f(sc[u] - mx);  // 0 past the range
          l[g] += p;
#pragma unroll
          for (int e = 0; e < EPL; ++e) acc[g][e] += p * vr[u][e];
        }
        m[g] = mx;
      }
    }
  }
#pragma unroll
  for (int g = 0; g < GM; ++g) {
    if (g >= ng) break;
    const int64_t th = (int64_t(b) * s.T + t) * s.H + hk * G + g0 + g;
    const float inv = l[g] > 0.f ? 1.f / l[g] : 0.f;
    float out[EPL];
#pragma unroll
    for (int e = 0; e < EPL; ++e) out[e] = acc[g][e] * inv;
    store_row<T, EPL>(o + th * D + lane * EPL, out);
    if (lane == 0) lse[th] = l[g] > 0.f ? m[g] + log2f(l[g]) : INFINITY;
  }
}

// ------------------------------------------------------------------------------------ dq
template <class T, int D, int GM>
__global__ void __launch_bounds__(kWarps * 32) dq_kernel(const T* __restrict__ q, const T* __restrict__ k,
                                                       const T* __restrict__ v, const T* __restrict__ o,
                                                       const T* __restrict__ dout, const int64_t* __restrict__ idx,
                                                       const float* __restrict__ lse, T* __restrict__ dq,
                                                       float* __restrict__ delta, Shape s) {
  constexpr int EPL = D / 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int t = blockIdx.x * kWarps + warp;
  if (t >= s.T) return;
  const int b = blockIdx.y / s.Hkv, hk = blockIdx.y % s.Hkv;
  const int G = s.H / s.Hkv, g0 = blockIdx.z * GM, ng = min(GM, G - g0);
  const int NB = s.NB();
  const float qmul = s.scale * kLog2e;

  float qr[GM][EPL], dor[GM][EPL], acc[GM][EPL], L[GM], Dl[GM];
#pragma unroll
  for (int g = 0; g < GM; ++g) {
    L[g] = INFINITY;
    Dl[g] = 0.f;
#pragma unroll
    for (int e = 0; e < EPL; ++e) acc[g][e] = qr[g][e] = dor[g][e] = 0.f;
    if (g < ng) {
      const int64_t th = (int64_t(b) * s.T + t) * s.H + hk * G + g0 + g;
      float orow[EPL];
      load_row<T, EPL>(q + th * D + lane * EPL, qr[g]);
      load_row<T, EPL>(dout + th * D + lane * EPL, dor[g]);
      load_row<T, EPL>(o + th * D + lane * EPL, orow);
#pragma unroll
      for (int e = 0; e < EPL; ++e) qr[g][e] *= qmul;
      L[g] = lse[th];
      Dl[g] = warp_sum(dot<EPL>(dor[g], orow));
      if (lane == 0) delta[th] = Dl[g];
    }
  }
  const int64_t* row = idx + ((int64_t(b) * s.Hkv + hk) * s.NQ + t / s.qb) * s.topk;
  const int64_t rs = int64_t(s.Hkv) * D;
  const T* Kb = k + int64_t(b) * s.T * rs + hk * D + lane * EPL;
  const T* Vb = v + int64_t(b) * s.T * rs + hk * D + lane * EPL;
  for (int j = 0; j < s.topk; ++j) {
    int s0, s1;
    slot_keys(row, j, t, s, NB, s0, s1);
    for (int j0 = s0; j0 < s1; j0 += kUnroll) {
      float kr[kUnroll][EPL], vr[kUnroll][EPL];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (j0 + u < s1) {
          load_row<T, EPL>(Kb + int64_t(j0 + u) * rs, kr[u]);
          load_row<T, EPL>(Vb + int64_t(j0 + u) * rs, vr[u]);
        } else {
#pragma unroll
          for (int e = 0; e < EPL; ++e) kr[u][e] = vr[u][e] = 0.f;
        }
      }
#pragma unroll
      for (int g = 0; g < GM; ++g) {
        if (g >= ng) break;
        float r[2 * kUnroll];  // scores, then dO·v
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          r[u] = dot<EPL>(qr[g], kr[u]);
          r[kUnroll + u] = dot<EPL>(dor[g], vr[u]);
        }
        warp_sum_n<2 * kUnroll>(r, lane);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const float sc = r[u], dp = r[kUnroll + u];
          const float p = (j0 + u < s1) ? exp2f(sc - L[g]) : 0.f;
          const float ds = p * (dp - Dl[g]);
#pragma unroll
          for (int e = 0; e < EPL; ++e) acc[g][e] += ds * kr[u][e];
        }
      }
    }
  }
#pragma unroll
  for (int g = 0; g < GM; ++g) {
    if (g >= ng) break;
    const int64_t th = (int64_t(b) * s.T + t) * s.H + hk * G + g0 + g;
    float out[EPL];
#pragma unroll
    for (int e = 0; e < EPL; ++e) out[e] = acc[g][e] * s.scale;
    store_row<T, EPL>(dq + th * D + lane * EPL, out);
  }
}

// ------------------------------------------------------------------------------------ transpose
__global__ void count_kernel(const int64_t* __restrict__ idx, int* __restrict__ count, Shape s) {
  const int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= s.entries()) return;
  const int64_t i = idx[n];
  const int NB = s.NB();
  if (i < 0 || i >= NB) return;
  const int64_t bh = n / (int64_t(s.NQ) * s.topk);  // b·Hkv + hk
  atomicAdd(count + bh * NB + i, 1);
}

__global__ void fill_kernel(const int64_t* __restrict__ idx, const int* __restrict__ row_off, int* __restrict__ cursor,
                            int* __restrict__ rows, Shape s) {
  const int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= s.entries()) return;
  const int64_t i = idx[n];
  const int NB = s.NB();
  if (i < 0 || i >= NB) return;
  const int64_t bh = n / (int64_t(s.NQ) * s.topk);
  const int r = int((n / s.topk) % s.NQ);
  const int64_t seg = bh * NB + i;
  rows[row_off[seg] + atomicAdd(cursor + seg, 1)] = r;
}

// ------------------------------------------------------------------------------------ dk, dv
// NKW: warps splitting the block's keys (kUnroll keys each per pass); the kWarps / NKW warps sharing
// keys split the work item's queries.
template <class T, int D, int NKW>
__global__ void __launch_bounds__(kWarps * 32) dkdv_kernel(const T* __restrict__ q, const T* __restrict__ k,
                                                         const T* __restrict__ v, const T* __restrict__ dout,
                                                         const float* __restrict__ lse, const float* __restrict__ delta,
                                                         const int* __restrict__ row_off, const int* __restrict__ item_off,
                                                         const int* __restrict__ rows, float* __restrict__ dk,
                                                         float* __restrict__ dv, Shape s) {
  constexpr int EPL = D / 32;
  constexpr int NQG = kWarps / NKW;
  const int NB = s.NB();
  const int nseg = int(s.segments());
  const int w = blockIdx.x;
  if (w >= item_off[nseg]) return;
  // the segment whose items hold w: item_off[lo] ≤ w < item_off[lo + 1]
  int lo = 0, hi = nseg;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (item_off[mid] <= w) lo = mid;
    else hi = mid;
  }
  const int seg = lo, R = s.rows_per_item();
  const int l0 = row_off[seg] + (w - item_off[seg]) * R, l1 = min(l0 + R, row_off[seg + 1]);
  const int bh = seg / NB, blk = seg % NB, b = bh / s.Hkv, hk = bh % s.Hkv;
  const int G = s.H / s.Hkv;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, kg = warp % NKW, qg = warp / NKW;
  const int kb0 = blk * s.bs, kb1 = min(kb0 + s.bs, s.T);
  const int64_t rs = int64_t(s.Hkv) * D;
  const int64_t kbase = int64_t(b) * s.T * rs + hk * D + lane * EPL;
  const int nitems = (l1 - l0) * s.qb * G;
  const float qmul = s.scale * kLog2e;

  for (int j0 = kb0 + kg * kUnroll; j0 < kb1; j0 += NKW * kUnroll) {
    float kr[kUnroll][EPL], vr[kUnroll][EPL], dkr[kUnroll][EPL], dvr[kUnroll][EPL];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int e = 0; e < EPL; ++e) kr[u][e] = vr[u][e] = dkr[u][e] = dvr[u][e] = 0.f;
      if (j0 + u < kb1) {
        load_row<T, EPL>(k + kbase + int64_t(j0 + u) * rs, kr[u]);
        load_row<T, EPL>(v + kbase + int64_t(j0 + u) * rs, vr[u]);
      }
    }
    for (int it = qg; it < nitems; it += NQG) {
      const int g = it % G, rest = it / G, tq = rest % s.qb;
      const int t = rows[l0 + rest / s.qb] * s.qb + tq;
      if (t >= s.T || t < j0) continue;  // beyond the sequence, or before every key of this pass
      const int64_t th = (int64_t(b) * s.T + t) * s.H + hk * G + g;
      float qr[EPL], dor[EPL];
      load_row<T, EPL>(q + th * D + lane * EPL, qr);
      load_row<T, EPL>(dout + th * D + lane * EPL, dor);
      const float L = lse[th], Dl = delta[th];
      float r[2 * kUnroll];  // scores, then dO·v
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        r[u] = dot<EPL>(qr, kr[u]);
        r[kUnroll + u] = dot<EPL>(dor, vr[u]);
      }
      warp_sum_n<2 * kUnroll>(r, lane);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const float sc = r[u] * qmul, dp = r[kUnroll + u];
        const bool valid = j0 + u < kb1 && j0 + u <= t;
        const float p = valid ? exp2f(sc - L) : 0.f;
        const float ds = p * (dp - Dl);
#pragma unroll
        for (int e = 0; e < EPL; ++e) {
          dvr[u][e] += p * dor[e];
          dkr[u][e] += ds * qr[e];
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (j0 + u >= kb1) break;
      float* dkp = dk + kbase + int64_t(j0 + u) * rs;
      float* dvp = dv + kbase + int64_t(j0 + u) * rs;
#pragma unroll
      for (int e = 0; e < EPL; ++e) {
        atomicAdd(dkp + e, dkr[u][e] * s.scale);
        atomicAdd(dvp + e, dvr[u][e]);
      }
    }
  }
}

// ------------------------------------------------------------------------------------ launch
template <class T, int D, int GM>
void launch_fwd(const Shape& s, const void* q, const void* k, const void* v, const int64_t* idx, void* o, float* lse,
                cudaStream_t st) {
  const int G = s.H / s.Hkv;
  dim3 grid(unsigned((s.T + kWarps - 1) / kWarps), unsigned(s.B * s.Hkv), unsigned((G + GM - 1) / GM));
  fwd_kernel<T, D, GM><<<grid, kWarps * 32, 0, st>>>(static_cast<const T*>(q), static_cast<const T*>(k),
                                                     static_cast<const T*>(v), idx, static_cast<T*>(o), lse, s);
}

template <class T, int D, int GM>
void launch_dq(const Shape& s, const void* q, const void* k, const void* v, const void* o, const void* dout,
               const int64_t* idx, const float* lse, void* dq, float* delta, cudaStream_t st) {
  const int G = s.H / s.Hkv;
  dim3 grid(unsigned((s.T + kWarps - 1) / kWarps), unsigned(s.B * s.Hkv), unsigned((G + GM - 1) / GM));
  dq_kernel<T, D, GM><<<grid, kWarps * 32, 0, st>>>(static_cast<const T*>(q), static_cast<const T*>(k),
                                                    static_cast<const T*>(v), static_cast<const T*>(o),
                                                    static_cast<const T*>(dout), idx, lse, static_cast<T*>(dq), delta, s);
}

template <class T, int D>
void fwd_d(const Shape& s, const void* q, const void* k, const void* v, const int64_t* idx, void* o, float* lse,
           cudaStream_t st) {
  const int G = s.H / s.Hkv;
  if (G == 1) launch_fwd<T, D, 1>(s, q, k, v, idx, o, lse, st);
  else if (G == 2) launch_fwd<T, D, 2>(s, q, k, v, idx, o, lse, st);
  else if (G <= 4) launch_fwd<T, D, 4>(s, q, k, v, idx, o, lse, st);
  else launch_fwd<T, D, kGroupCap>(s, q, k, v, idx, o, lse, st);
}

template <class T, int D>
void dq_d(const Shape& s, const void* q, const void* k, const void* v, const void* o, const void* dout,
          const int64_t* idx, const float* lse, void* dq, float* delta, cudaStream_t st) {
  const int G = s.H / s.Hkv;
  if (G == 1) launch_dq<T, D, 1>(s, q, k, v, o, dout, idx, lse, dq, delta, st);
  else if (G == 2) launch_dq<T, D, 2>(s, q, k, v, o, dout, idx, lse, dq, delta, st);
  else if (G <= 4) launch_dq<T, D, 4>(s, q, k, v, o, dout, idx, lse, dq, delta, st);
  else launch_dq<T, D, kGroupCap>(s, q, k, v, o, dout, idx, lse, dq, delta, st);
}

template <class T, int D>
void dkdv_d(const Shape& s, const void* q, const void* k, const void* v, const void* dout, const float* lse,
            const float* delta, const int* row_off, const int* item_off, const int* rows, float* dk, float* dv,
            cudaStream_t st) {
  const dim3 grid(unsigned(s.max_items()));
  auto go = [&](auto kern) {
    kern<<<grid, kWarps * 32, 0, st>>>(static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
                                       static_cast<const T*>(dout), lse, delta, row_off, item_off, rows, dk, dv, s);
  };
  // enough keys for every warp to hold kUnroll of them, else the warps split the queries too
  if (s.bs >= kWarps * kUnroll) go(dkdv_kernel<T, D, 4>);
  else if (s.bs >= 2 * kUnroll) go(dkdv_kernel<T, D, 2>);
  else go(dkdv_kernel<T, D, 1>);
}

// Op<T, D>::run(args…) for the element type dt and head dim D.
template <template <class, int> class Op, class... A>
void by_type(Dtype dt, int D, A&&... a) {
  if (D != 64 && D != 128) throw std::invalid_argument("block-sparse attention kernel: head_dim must be 64 or 128");
  switch (dt) {
    case Dtype::F32: return D == 64 ? Op<float, 64>::run(a...) : Op<float, 128>::run(a...);
    case Dtype::BF16: return D == 64 ? Op<__nv_bfloat16, 64>::run(a...) : Op<__nv_bfloat16, 128>::run(a...);
    case Dtype::F16: return D == 64 ? Op<__half, 64>::run(a...) : Op<__half, 128>::run(a...);
  }
}
template <class T, int D>
struct FwdOp {
  template <class... A>
  static void run(A... a) { fwd_d<T, D>(a...); }
};
template <class T, int D>
struct DqOp {
  template <class... A>
  static void run(A... a) { dq_d<T, D>(a...); }
};
template <class T, int D>
struct DkdvOp {
  template <class... A>
  static void run(A... a) { dkdv_d<T, D>(a...); }
};

void check(const Shape& s) {
  if (s.Hkv <= 0 || s.H % s.Hkv != 0) throw std::invalid_argument("block-sparse attention kernel: H must be a multiple of Hkv");
  if (s.bs <= 0 || s.qb <= 0) throw std::invalid_argument("block-sparse attention kernel: block_size and q_block must be positive");
}

unsigned entry_blocks(const Shape& s) { return unsigned((s.entries() + 255) / 256); }

}  // namespace

bool supported_head_dim(int D) { return D == 64 || D == 128; }

void forward(Dtype dt, const Shape& s, const void* q, const void* k, const void* v, const int64_t* idx, void* o,
             float* lse, cudaStream_t stream) {
  check(s);
  if (s.B == 0 || s.T == 0 || s.H == 0) return;
  by_type<FwdOp>(dt, s.D, s, q, k, v, idx, o, lse, stream);
}

void count_selections(const Shape& s, const int64_t* idx, int* count, cudaStream_t stream) {
  check(s);
  if (s.entries() == 0) return;
  count_kernel<<<entry_blocks(s), 256, 0, stream>>>(idx, count, s);
}

void fill_selections(const Shape& s, const int64_t* idx, const int* row_off, int* cursor, int* rows, cudaStream_t stream) {
  check(s);
  if (s.entries() == 0) return;
  fill_kernel<<<entry_blocks(s), 256, 0, stream>>>(idx, row_off, cursor, rows, s);
}

void backward_dq(Dtype dt, const Shape& s, const void* q, const void* k, const void* v, const void* o, const void* dout,
                 const int64_t* idx, const float* lse, void* dq, float* delta, cudaStream_t stream) {
  check(s);
  if (s.B == 0 || s.T == 0 || s.H == 0) return;
  by_type<DqOp>(dt, s.D, s, q, k, v, o, dout, idx, lse, dq, delta, stream);
}

void backward_dkdv(Dtype dt, const Shape& s, const void* q, const void* k, const void* v, const void* dout,
                   const float* lse, const float* delta, const int* row_off, const int* item_off, const int* rows,
                   float* dk, float* dv, cudaStream_t stream) {
  check(s);
  if (s.entries() == 0 || s.segments() == 0) return;
  by_type<DkdvOp>(dt, s.D, s, q, k, v, dout, lse, delta, row_off, item_off, rows, dk, dv, stream);
}

}  // namespace mixbench::bsa_cuda
