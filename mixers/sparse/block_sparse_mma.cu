// Block-sparse causal attention on tensor cores (bf16 / fp16, mma.sync m16n8k16 with fp32
// accumulation): key-block-stationary passes over the transposed selection (block_sparse_mma.h).
//
// Fragments follow PTX's m16n8k16 layouts: lane = 4·gid + tig; an A (row-major 16×16) fragment is
// rows gid, gid + 8 × columns 2·tig, 2·tig + 1 (+ 8); a B (16×8, k × n) fragment is column n = gid ×
// rows 2·tig, 2·tig + 1 (+ 8); a C fragment is rows gid, gid + 8 × columns 2·tig, 2·tig + 1. A C
// fragment pair (two n-tiles of 8) is the A fragment of one k-step of 16 (packed to 16 bits), so
// probabilities never leave registers. Operands whose k runs along a shared-memory row (Q·Kᵀ,
// K·Qᵀ, dS·K's dS) are read with 32-bit loads; those whose k runs down the rows (P·V, Pᵀ·dO, dSᵀ·Q,
// dS·K's K) through ldmatrix .trans. Shared rows are padded by 8 elements (16 bytes): the 8 rows of a
// fragment load or an ldmatrix phase fall into distinct banks.
//
// Forward CTA (4 warps): one work item = one segment and up to 64 items, warp w taking items
// 16w … 16w + 15; the block's keys in chunks of BN (64, 32 or 16). Backward CTA (BN/16 warps): one
// segment, one chunk of BN keys (warp w: keys 16w … 16w + 15, their dk and dv in registers) and up
// to kBwdUnit items in tiles of 32: Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ, then dv += Pᵀ·dO, dk += dSᵀ·Q, dS to
// shared memory, dq = dS·K added per tile.
#include "mixers/sparse/block_sparse_mma.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <stdexcept>
#include <type_traits>

namespace mixbench::bsa_mma {

namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kPad = 8;        // elements of padding per shared row
constexpr int kFwdWarps = 4;   // 16 items each: kFwdUnit = 64
constexpr int kBwdTile = 32;   // items per backward tile
static_assert(kFwdUnit == 16 * kFwdWarps, "one m16 tile of items per forward warp");
static_assert(kBwdUnit % kBwdTile == 0, "backward work items hold whole tiles");

template <class T>
struct Mma;
template <>
struct Mma<__nv_bfloat16> {
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
  static __device__ __forceinline__ __nv_bfloat16 to_elem(float x) { return __float2bfloat16(x); }
  static __device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};
template <>
struct Mma<__half> {
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
  static __device__ __forceinline__ __half to_elem(float x) { return __float2half(x); }
  static __device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

// Two consecutive 16-bit elements of shared memory as one register.
template <class T>
__device__ __forceinline__ uint32_t ld32(const T* p) { return *reinterpret_cast<const uint32_t*>(p); }

// A fragment (16×16) at p: rows 0 … 15 of stride ld, the thread's columns 2·tig, 2·tig + 1 and + 8.
template <class T>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const T* p, int ld, int gid, int tig) {
  const T* r = p + gid * ld + 2 * tig;
  a[0] = ld32(r);
  a[1] = ld32(r + 8 * ld);
  a[2] = ld32(r + 8);
  a[3] = ld32(r + 8 * ld + 8);
}

// Four 8×8 matrices transposed: at p a row-major [16 (k) × 16 (n)] tile of stride ld, B fragments of
// its two n-tiles: (r[0], r[1]) for columns 0 … 7, (r[2], r[3]) for 8 … 15.
template <class T>
__device__ __forceinline__ void load_b_trans(uint32_t (&r)[4], const T* p, int ld, int lane) {
  const unsigned a = unsigned(__cvta_generic_to_shared(p + (lane & 15) * ld + (lane >> 4) * 8));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a)
               : "memory");
}

// Probabilities (C fragments of n-tiles 2j, 2j + 1) as the A fragment of k-step j.
template <class T>
__device__ __forceinline__ void c_to_a(uint32_t (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
  a[0] = Mma<T>::pack(c0[0], c0[1]);
  a[1] = Mma<T>::pack(c0[2], c0[3]);
  a[2] = Mma<T>::pack(c1[0], c1[1]);
  a[3] = Mma<T>::pack(c1[2], c1[3]);
}

__device__ __forceinline__ void add2(float* p, float x, float y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(p), make_float2(x, y));
#else
  atomicAdd(p, x);
  atomicAdd(p + 1, y);
#endif
}

// 16-byte copy global -> shared (zeros when !ok).
template <class T>
__device__ __forceinline__ void copy16(T* dst, const T* src, bool ok) {
  *reinterpret_cast<uint4*>(dst) = ok ? *reinterpret_cast<const uint4*>(src) : make_uint4(0u, 0u, 0u, 0u);
}

// One work item of a segment: items [i0, i0 + n) of segment seg.
struct Work {
  int seg, i0, n;
};

// The work item w over item_off ([segments + 1], exclusive scan of each segment's work items):
// false past the last one.
__device__ __forceinline__ bool find_work(const int* item_off, const int* row_off, int nseg, int w, int unit, int G,
                                          Work& wk) {
  if (w >= item_off[nseg]) return false;
  int lo = 0, hi = nseg;  // item_off[lo] ≤ w < item_off[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (item_off[mid] <= w) lo = mid;
    else hi = mid;
  }
  wk.seg = lo;
  wk.i0 = (w - item_off[lo]) * unit;
  wk.n = min(unit, (row_off[lo + 1] - row_off[lo]) * G - wk.i0);
  return true;
}

// Key chunk of the kernels for block size bs.
int chunk_of(int bs) { return bs >= 64 ? 64 : bs >= 32 ? 32 : 16; }

// ------------------------------------------------------------------------------------ forward
template <int D, int BN, bool kOut>
constexpr size_t fwd_smem() {
  return size_t(kFwdUnit) * 4 * sizeof(int) + size_t(kFwdUnit + (kOut ? 2 : 1) * BN) * (D + kPad) * 2;
}

// kOut false: pass 1 (ml of every item); true: pass 2 (o_acc += exp2(s − lse)·V).
template <class T, int D, int BN, bool kOut>
__global__ void __launch_bounds__(kFwdWarps * 32) fwd_kernel(const T* __restrict__ q, const T* __restrict__ k,
                                                            const T* __restrict__ v, const int* __restrict__ row_off,
                                                            const int* __restrict__ item_off, const int* __restrict__ ents,
                                                            float2* __restrict__ ml, const float* __restrict__ lse,
                                                            float* __restrict__ o_acc, Shape s) {
  constexpr int BM = kFwdUnit, LD = D + kPad, NT = BN / 8, DV = D / 8;
  extern __shared__ __align__(16) unsigned char smem[];
  int* it_t = reinterpret_cast<int*>(smem);  // item's query t (−1: padding)
  int* it_q = it_t + BM;                     // its (b·T + t)·H + h
  int* it_m = it_q + BM;                     // its ml index (pass 1)
  float* it_l = reinterpret_cast<float*>(it_m + BM);  // its lse (pass 2)
  T* Qs = reinterpret_cast<T*>(it_l + BM);
  T* Ks = Qs + BM * LD;
  T* Vs = Ks + BN * LD;  // pass 2

  const int nseg = int(s.segments()), G = s.H / s.Hkv;
  Work wk;
  if (!find_work(item_off, row_off, nseg, blockIdx.x, BM, G, wk)) return;
  const int NB = s.NB(), bh = wk.seg / NB, blk = wk.seg % NB, b = bh / s.Hkv, hk = bh % s.Hkv;
  const int kb0 = blk * s.bs, kb1 = min(kb0 + s.bs, s.T);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, gid = lane / 4, tig = lane % 4;
  const float qmul = s.scale * kLog2e;

  if (tid < BM) {
    int t = -1, xq = 0, xm = 0;
    float l = INFINITY;
    if (tid < wk.n) {
      const int item = wk.i0 + tid, g = item % G, e = ents[row_off[wk.seg] + item / G];
      t = e / s.topk;  // q_block 1: row r is query t
      xq = (b * s.T + t) * s.H + hk * G + g;
      xm = (bh * s.NQ * s.topk + e) * G + g;
      if (kOut) l = lse[xq];
    }
    it_t[tid] = t;
    it_q[tid] = xq;
    it_m[tid] = xm;
    it_l[tid] = l;
  }
  __syncthreads();
  for (int c = tid; c < BM * DV; c += blockDim.x) {
    const int i = c / DV, d8 = (c % DV) * 8;
    copy16(Qs + i * LD + d8, q + int64_t(it_q[i]) * D + d8, it_t[i] >= 0);
  }
  const int r0 = 16 * warp + gid;  // the thread's items r0, r0 + 8
  const int t0 = it_t[r0], t1 = it_t[r0 + 8];
  const float L0 = it_l[r0], L1 = it_l[r0 + 8];

  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;  // pass 1: running max, partial sums
  float o[kOut ? D / 8 : 1][4];                              // pass 2: the items' outputs
#pragma unroll
  for (int n = 0; n < (kOut ? D / 8 : 1); ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;

  for (int c0 = kb0; c0 < kb1; c0 += BN) {
    __syncthreads();  // the previous chunk's readers are done
    for (int c = tid; c < BN * DV; c += blockDim.x) {
      const int j = c / DV, d8 = (c % DV) * 8, key = c0 + j;
      const int64_t off = (int64_t(b) * s.T + min(key, kb1 - 1)) * s.Hkv * D + int64_t(hk) * D + d8;
      copy16(Ks + j * LD + d8, k + off, key < kb1);
      if (kOut) copy16(Vs + j * LD + d8, v + off, key < kb1);
    }
    __syncthreads();
    // every key of the chunk after all of the warp's queries (or padding): skip (warp-uniform, as
    // mma.sync needs every lane)
    if (__all_sync(0xffffffffu, t0 < c0 && t1 < c0)) continue;

    float sc[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t a[4];
      load_a(a, Qs + 16 * warp * LD + kk * 16, LD, gid, tig);
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        const T* kp = Ks + (n * 8 + gid) * LD + kk * 16 + 2 * tig;
        Mma<T>::mma(sc[n], a, ld32(kp), ld32(kp + 8));
      }
    }
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = c0 + n * 8 + 2 * tig + (e & 1), t = e < 2 ? t0 : t1;
        sc[n][e] = (key < kb1 && key <= t) ? sc[n][e] * qmul : -INFINITY;
      }

    if constexpr (!kOut) {
      float x0 = -INFINITY, x1 = -INFINITY;
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        x0 = fmaxf(x0, fmaxf(sc[n][0], sc[n][1]));
        x1 = fmaxf(x1, fmaxf(sc[n][2], sc[n][3]));
      }
#pragma unroll
      for (int o2 = 1; o2 <= 2; o2 <<= 1) {  // the 4 lanes of a row
        x0 = fmaxf(x0, __shfl_xor_sync(0xffffffffu, x0, o2));
        x1 = fmaxf(x1, __shfl_xor_sync(0xffffffffu, x1, o2));
      }
      const float n0 = fmaxf(m0, x0), n1 = fmaxf(m1, x1);
      if (n0 != -INFINITY) {
        l0 *= exp2f(m0 - n0);
#pragma unroll
        for (int n = 0; n < NT; ++n) l0 += exp2f(sc[n][0] - n0) + exp2f(sc[n][1] - n0);
        m0 = n0;
      }
      if (n1 != -INFINITY) {
        l1 *= exp2f(m1 - n1);
#pragma unroll
        for (int n = 0; n < NT; ++n) l1 += exp2f(sc[n][2] - n1) + exp2f(sc[n][3] - n1);
        m1 = n1;
      }
    } else {
      // p = exp2(s − lse): 0 for masked keys (s = −inf) and for queries without keys (lse = +inf)
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        sc[n][0] = exp2f(sc[n][0] - L0);
        sc[n][1] = exp2f(sc[n][1] - L0);
        sc[n][2] = exp2f(sc[n][2] - L1);
        sc[n][3] = exp2f(sc[n][3] - L1);
      }
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        uint32_t a[4];
        c_to_a<T>(a, sc[2 * kk], sc[2 * kk + 1]);
#pragma unroll
        for (int dt = 0; dt < D / 16; ++dt) {
          uint32_t bv[4];
          load_b_trans(bv, Vs + kk * 16 * LD + dt * 16, LD, lane);
          Mma<T>::mma(o[2 * dt], a, bv[0], bv[1]);
          Mma<T>::mma(o[2 * dt + 1], a, bv[2], bv[3]);
        }
      }
    }
  }

  if constexpr (!kOut) {
#pragma unroll
    for (int o2 = 1; o2 <= 2; o2 <<= 1) {
      l0 += __shfl_xor_sync(0xffffffffu, l0, o2);
      l1 += __shfl_xor_sync(0xffffffffu, l1, o2);
    }
    if (tig == 0) {
      if (t0 >= 0) ml[it_m[r0]] = make_float2(m0, l0);
      if (t1 >= 0) ml[it_m[r0 + 8]] = make_float2(m1, l1);
    }
  } else {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int i = r0 + 8 * hf;
      if ((hf ? t1 : t0) < 0 || !((hf ? L1 : L0) < INFINITY)) continue;  // padding, or a query without keys
      float* op = o_acc + int64_t(it_q[i]) * D + 2 * tig;
#pragma unroll
      for (int n = 0; n < D / 8; ++n) add2(op + n * 8, o[n][2 * hf], o[n][2 * hf + 1]);
    }
  }
}

// lse of (b, t, h) from the ml of its slots (q_block 1): log2 Σ_j l_j·2^(m_j), +inf without any key.
__global__ void merge_kernel(const int64_t* __restrict__ idx, const float2* __restrict__ ml, float* __restrict__ lse,
                             Shape s) {
  const int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= int64_t(s.B) * s.T * s.H) return;
  const int G = s.H / s.Hkv, NB = s.NB();
  const int h = int(n % s.H), t = int((n / s.H) % s.T), b = int(n / (int64_t(s.H) * s.T));
  const int hk = h / G, g = h % G;
  const int64_t e0 = ((int64_t(b) * s.Hkv + hk) * s.NQ + t) * s.topk;
  float M = -INFINITY;
  for (int j = 0; j < s.topk; ++j) {
    const int64_t i = idx[e0 + j];
    if (i < 0 || i >= NB) continue;
    const float2 x = ml[(e0 + j) * G + g];
    if (x.y > 0.f) M = fmaxf(M, x.x);
  }
  float L = 0.f;
  for (int j = 0; j < s.topk; ++j) {
    const int64_t i = idx[e0 + j];
    if (i < 0 || i >= NB) continue;
    const float2 x = ml[(e0 + j) * G + g];
    if (x.y > 0.f) L += x.y * exp2f(x.x - M);
  }
  lse[n] = L > 0.f ? M + log2f(L) : INFINITY;
}

// ------------------------------------------------------------------------------------ transpose
__global__ void fill_entries_kernel(const int64_t* __restrict__ idx, const int* __restrict__ row_off,
                                    int* __restrict__ cursor, int* __restrict__ ents, Shape s) {
  const int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= s.entries()) return;
  const int64_t i = idx[n];
  const int NB = s.NB();
  if (i < 0 || i >= NB) return;
  const int64_t plane = int64_t(s.NQ) * s.topk, bh = n / plane;
  const int64_t seg = bh * NB + i;
  ents[row_off[seg] + atomicAdd(cursor + seg, 1)] = int(n % plane);
}

// ------------------------------------------------------------------------------------ backward
template <int D, int BN>
constexpr size_t bwd_smem() {
  return size_t(kBwdTile) * 4 * sizeof(int) + (size_t(2 * BN + 2 * kBwdTile) * (D + kPad) + size_t(kBwdTile) * (BN + kPad)) * 2;
}

template <class T, int D, int BN>
__global__ void __launch_bounds__(BN * 2) bwd_kernel(const T* __restrict__ q, const T* __restrict__ k,
                                                    const T* __restrict__ v, const T* __restrict__ dout,
                                                    const float* __restrict__ lse, const float* __restrict__ delta,
                                                    const int* __restrict__ row_off, const int* __restrict__ item_off,
                                                    const int* __restrict__ ents, float* __restrict__ dq_acc,
                                                    float* __restrict__ dk, float* __restrict__ dv, Shape s) {
  constexpr int NW = BN / 16, BM = kBwdTile, LD = D + kPad, LDS = BN + kPad, NT = BM / 8, DV = D / 8;
  extern __shared__ __align__(16) unsigned char smem[];
  int* it_t = reinterpret_cast<int*>(smem);
  int* it_q = it_t + BM;
  float* it_l = reinterpret_cast<float*>(it_q + BM);
  float* it_d = it_l + BM;
  T* Ks = reinterpret_cast<T*>(it_d + BM);
  T* Vs = Ks + BN * LD;
  T* Qs = Vs + BN * LD;
  T* Os = Qs + BM * LD;  // dO
  T* Ss = Os + BM * LD;  // dS [item][key]

  const int nseg = int(s.segments()), G = s.H / s.Hkv;
  Work wk;
  if (!find_work(item_off, row_off, nseg, blockIdx.x, kBwdUnit, G, wk)) return;
  const int NB = s.NB(), bh = wk.seg / NB, blk = wk.seg % NB, b = bh / s.Hkv, hk = bh % s.Hkv;
  const int kb1 = min(blk * s.bs + s.bs, s.T), c0 = blk * s.bs + int(blockIdx.y) * BN;
  if (c0 >= kb1) return;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, gid = lane / 4, tig = lane % 4;
  const float qmul = s.scale * kLog2e;
  const int64_t kv_base = int64_t(b) * s.T * s.Hkv * D + int64_t(hk) * D;

  for (int c = tid; c < BN * DV; c += blockDim.x) {
    const int j = c / DV, d8 = (c % DV) * 8, key = c0 + j;
    const int64_t off = kv_base + int64_t(min(key, kb1 - 1)) * s.Hkv * D + d8;
    copy16(Ks + j * LD + d8, k + off, key < kb1);
    copy16(Vs + j * LD + d8, v + off, key < kb1);
  }
  const int kr = 16 * warp + gid;  // the thread's keys kr, kr + 8 of the chunk
  const int key0 = c0 + kr, key1 = key0 + 8;

  float dka[D / 8][4], dva[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) dka[n][e] = dva[n][e] = 0.f;

  for (int i0 = 0; i0 < wk.n; i0 += BM) {
    __syncthreads();  // the previous tile's readers are done
    if (tid < BM) {
      int t = -1, xq = 0;
      float l = INFINITY, dl = 0.f;
      if (i0 + tid < wk.n) {
        const int item = wk.i0 + i0 + tid, g = item % G, e = ents[row_off[wk.seg] + item / G];
        t = e / s.topk;
        xq = (b * s.T + t) * s.H + hk * G + g;
        l = lse[xq];
        dl = delta[xq];
      }
      it_t[tid] = t;
      it_q[tid] = xq;
      it_l[tid] = l;
      it_d[tid] = dl;
    }
    __syncthreads();
    for (int c = tid; c < BM * DV; c += blockDim.x) {
      const int i = c / DV, d8 = (c % DV) * 8;
      const int64_t off = int64_t(it_q[i]) * D + d8;
      const bool ok = it_t[i] >= 0;
      copy16(Qs + i * LD + d8, q + off, ok);
      copy16(Os + i * LD + d8, dout + off, ok);
    }
    __syncthreads();

    // Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ: the warp's 16 keys × the tile's 32 items
    float st[NT][4], dpt[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) st[n][e] = dpt[n][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t ak[4], av[4];
      load_a(ak, Ks + 16 * warp * LD + kk * 16, LD, gid, tig);
      load_a(av, Vs + 16 * warp * LD + kk * 16, LD, gid, tig);
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        const T* qp = Qs + (n * 8 + gid) * LD + kk * 16 + 2 * tig;
        const T* op = Os + (n * 8 + gid) * LD + kk * 16 + 2 * tig;
        Mma<T>::mma(st[n], ak, ld32(qp), ld32(qp + 8));
        Mma<T>::mma(dpt[n], av, ld32(op), ld32(op + 8));
      }
    }
    // Pᵀ and dSᵀ = Pᵀ ∘ (dPᵀ − Δ); dS to shared memory as [item][key]
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = n * 8 + 2 * tig + (e & 1), key = e < 2 ? key0 : key1;
        const bool ok = key < kb1 && key <= it_t[i];
        const float p = ok ? exp2f(st[n][e] * qmul - it_l[i]) : 0.f;
        st[n][e] = p;
        dpt[n][e] = p * (dpt[n][e] - it_d[i]);
        Ss[i * LDS + kr + (e < 2 ? 0 : 8)] = Mma<T>::to_elem(dpt[n][e]);
      }
    // dv += Pᵀ·dO, dk += dSᵀ·Q (k = the tile's items)
#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk) {
      uint32_t ap[4], as[4];
      c_to_a<T>(ap, st[2 * kk], st[2 * kk + 1]);
      c_to_a<T>(as, dpt[2 * kk], dpt[2 * kk + 1]);
#pragma unroll
      for (int dt = 0; dt < D / 16; ++dt) {
        uint32_t bo[4], bq[4];
        load_b_trans(bo, Os + kk * 16 * LD + dt * 16, LD, lane);
        load_b_trans(bq, Qs + kk * 16 * LD + dt * 16, LD, lane);
        Mma<T>::mma(dva[2 * dt], ap, bo[0], bo[1]);
        Mma<T>::mma(dva[2 * dt + 1], ap, bo[2], bo[3]);
        Mma<T>::mma(dka[2 * dt], as, bq[0], bq[1]);
        Mma<T>::mma(dka[2 * dt + 1], as, bq[2], bq[3]);
      }
    }
    __syncthreads();  // dS complete
    // dq += scale · dS·K: jobs of (16 items, 64 dims) over the warps
    for (int job = warp; job < 2 * (D / 64); job += NW) {
      const int mt = job & 1, dc = job >> 1;
      if (it_t[mt * 16] < 0) continue;  // padding only (items fill the tile from the front)
      float acc[8][4];
#pragma unroll
      for (int n = 0; n < 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        uint32_t a[4];
        load_a(a, Ss + mt * 16 * LDS + kk * 16, LDS, gid, tig);
#pragma unroll
        for (int dt = 0; dt < 4; ++dt) {
          uint32_t bk[4];
          load_b_trans(bk, Ks + kk * 16 * LD + dc * 64 + dt * 16, LD, lane);
          Mma<T>::mma(acc[2 * dt], a, bk[0], bk[1]);
          Mma<T>::mma(acc[2 * dt + 1], a, bk[2], bk[3]);
        }
      }
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int i = mt * 16 + gid + 8 * hf;
        if (it_t[i] < 0 || !(it_l[i] < INFINITY)) continue;
        float* p = dq_acc + int64_t(it_q[i]) * D + dc * 64 + 2 * tig;
#pragma unroll
        for (int n = 0; n < 8; ++n) add2(p + n * 8, acc[n][2 * hf] * s.scale, acc[n][2 * hf + 1] * s.scale);
      }
    }
  }
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int key = hf ? key1 : key0;
    if (key >= kb1) continue;
    const int64_t off = kv_base + int64_t(key) * s.Hkv * D + 2 * tig;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      add2(dk + off + n * 8, dka[n][2 * hf] * s.scale, dka[n][2 * hf + 1] * s.scale);
      add2(dv + off + n * 8, dva[n][2 * hf], dva[n][2 * hf + 1]);
    }
  }
}

// ------------------------------------------------------------------------------------ launch
template <class Kern>
void allow_smem(Kern kern, size_t bytes) {
  if (bytes > 48 * 1024) cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
}

template <class T, int D, int BN>
void fwd_run(const Shape& s, const void* q, const void* k, const void* v, const int64_t* idx, const int* row_off,
             const int* item_off, const int* ents, float2* ml, float* lse, float* o_acc, cudaStream_t st) {
  const dim3 grid(unsigned(max_items(s, kFwdUnit)));
  const T *qt = static_cast<const T*>(q), *kt = static_cast<const T*>(k), *vt = static_cast<const T*>(v);
  auto k1 = fwd_kernel<T, D, BN, false>;
  auto k2 = fwd_kernel<T, D, BN, true>;
  allow_smem(k1, fwd_smem<D, BN, false>());
  allow_smem(k2, fwd_smem<D, BN, true>());
  k1<<<grid, kFwdWarps * 32, fwd_smem<D, BN, false>(), st>>>(qt, kt, vt, row_off, item_off, ents, ml, lse, o_acc, s);
  const int64_t n = int64_t(s.B) * s.T * s.H;
  merge_kernel<<<unsigned((n + 255) / 256), 256, 0, st>>>(idx, ml, lse, s);
  k2<<<grid, kFwdWarps * 32, fwd_smem<D, BN, true>(), st>>>(qt, kt, vt, row_off, item_off, ents, ml, lse, o_acc, s);
}

template <class T, int D, int BN>
void bwd_run(const Shape& s, const void* q, const void* k, const void* v, const void* dout, const float* lse,
             const float* delta, const int* row_off, const int* item_off, const int* ents, float* dq_acc, float* dk,
             float* dv, cudaStream_t st) {
  const dim3 grid(unsigned(max_items(s, kBwdUnit)), unsigned(bwd_chunks(s)));
  auto kern = bwd_kernel<T, D, BN>;
  allow_smem(kern, bwd_smem<D, BN>());
  kern<<<grid, BN * 2, bwd_smem<D, BN>(), st>>>(static_cast<const T*>(q), static_cast<const T*>(k),
                                                static_cast<const T*>(v), static_cast<const T*>(dout), lse, delta,
                                                row_off, item_off, ents, dq_acc, dk, dv, s);
}

// Op<T, D, BN>::run(args…) for the element type, head dim and key chunk of s.
template <template <class, int, int> class Op, class... A>
void dispatch(Dtype dt, const Shape& s, A&&... a) {
  auto by_bn = [&](auto tag, auto dtag) {
    using T = decltype(tag);
    constexpr int D = decltype(dtag)::value;
    switch (chunk_of(s.bs)) {
      case 64: return Op<T, D, 64>::run(s, a...);
      case 32: return Op<T, D, 32>::run(s, a...);
      default: return Op<T, D, 16>::run(s, a...);
    }
  };
  auto by_d = [&](auto tag) {
    if (s.D == 64) by_bn(tag, std::integral_constant<int, 64>{});
    else by_bn(tag, std::integral_constant<int, 128>{});
  };
  if (dt == Dtype::BF16) by_d(__nv_bfloat16{});
  else by_d(__half{});
}
template <class T, int D, int BN>
struct FwdOp {
  template <class... A>
  static void run(A... a) { fwd_run<T, D, BN>(a...); }
};
template <class T, int D, int BN>
struct BwdOp {
  template <class... A>
  static void run(A... a) { bwd_run<T, D, BN>(a...); }
};

void check(Dtype dt, const Shape& s) {
  if (!applies(dt, s))
    throw std::invalid_argument("block-sparse attention (tensor cores): needs bf16/fp16, head_dim 64 or 128, q_block 1, "
                                "block_size >= 16, H a multiple of Hkv");
}

}  // namespace

bool applies(Dtype dt, const Shape& s) {
  if (dt != Dtype::BF16 && dt != Dtype::F16) return false;
  if (s.D != 64 && s.D != 128) return false;
  if (s.qb != 1 || s.bs < 16 || s.Hkv <= 0 || s.H % s.Hkv != 0 || s.NQ != s.T) return false;
  const int64_t lim = int64_t(1) << 30;
  return s.entries() * (s.H / s.Hkv) < lim && int64_t(s.B) * s.T * s.H < lim && s.segments() < lim;
}

int64_t max_items(const Shape& s, int unit) {
  const int64_t E = s.entries(), S = s.segments(), G = s.H / std::max(s.Hkv, 1);
  return E * G / unit + 1 + std::min(E, S);
}

int bwd_chunks(const Shape& s) {
  const int bn = chunk_of(s.bs);
  return (s.bs + bn - 1) / bn;
}

void fill_entries(const Shape& s, const int64_t* idx, const int* row_off, int* cursor, int* ents, cudaStream_t stream) {
  if (s.entries() == 0) return;
  fill_entries_kernel<<<unsigned((s.entries() + 255) / 256), 256, 0, stream>>>(idx, row_off, cursor, ents, s);
}

void forward(Dtype dt, const Shape& s, const void* q, const void* k, const void* v, const int64_t* idx,
             const int* row_off, const int* item_off, const int* ents, float2* ml, float* lse, float* o_acc,
             cudaStream_t stream) {
  check(dt, s);
  if (s.B == 0 || s.T == 0 || s.H == 0) return;
  dispatch<FwdOp>(dt, s, q, k, v, idx, row_off, item_off, ents, ml, lse, o_acc, stream);
}

void backward(Dtype dt, const Shape& s, const void* q, const void* k, const void* v, const void* dout, const float* lse,
              const float* delta, const int* row_off, const int* item_off, const int* ents, float* dq_acc, float* dk,
              float* dv, cudaStream_t stream) {
  check(dt, s);
  if (s.entries() == 0 || s.segments() == 0) return;
  dispatch<BwdOp>(dt, s, q, k, v, dout, lse, delta, row_off, item_off, ents, dq_acc, dk, dv, stream);
}

}  // namespace mixbench::bsa_mma
