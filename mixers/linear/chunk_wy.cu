// The delta rule's per-chunk kernels (WY / UT form; interface in chunk_kernels.h):
//   delta_prep   one CTA per (chunk, b·h): A = β k kᵀ ⊙ decay (strictly lower), X = (I + A)⁻¹ by
//                blocks of 16: the diagonal blocks by forward substitution in registers (one warp
//                each, right after its tile of A), the blocks below them as halves of 32 in four
//                rounds on tensor cores (tf32, split into high and low parts); then w and u as
//                products with X (rounded to the input dtype).
//   delta_dv_local  Pᵀ do per chunk (the state-free part of du).
//   delta_wy_bwd    one CTA per (chunk, b·h): the backward through w = X B_k, u = X B_v and the
//                inverse (dk, dv, dβ, the gates' direct gradient), bf16 / fp16 operands.

#include "mixers/linear/chunk_launch.cuh"
#include "mixers/linear/chunk_grad_rows.cuh"
#include "mixers/linear/chunk_scores.cuh"
#include "mixers/linear/chunk_tiles.cuh"

#include <stdexcept>

namespace mixbench::linear::tc {
namespace {

struct PrepArgs {
  const void *k, *v;
  const float *beta, *b;
  void *w, *u;
  float* x;  // X per chunk, fp32 [B,H,NT,64,64], or null
  int B, T, H, K, V, NT, Tp;
};

template <typename T, int K, int V>
constexpr size_t prep_smem() {
  static_assert(sizeof(T) * (kC + 8) <= sizeof(float) * (kC + 4), "X in the input dtype must fit over A");
  return sizeof(T) * (kC * (K + 8) + kC * (V + 8)) + sizeof(float) * (2 * kC * (kC + 4) + 3 * kC);
}

// Row tiles RA and RB (RA + RB = 3, so every warp has RA + RB + 2 = 5 k-steps), column tiles
// ct0 … ct0 + D/64 − 1, of X·src (X lower triangular: k-steps kk ≤ r), into P[0] (RA) and P[1] (RB).
template <typename T, int D, int RA, int RB>
__device__ __forceinline__ void lower_product(Acc (&P)[2][D / 64], const T* xb, int ldx, const T* src, int ld,
                                              int ct0) {
  constexpr int N = D / 64;
#pragma unroll
  for (int n = 0; n < N; ++n) {
    wmma::fill_fragment(P[0][n], 0.f);
    wmma::fill_fragment(P[1][n], 0.f);
  }
  mma_span<ARow<T>, BRow<T>>(P[0], xb + RA * 16 * ldx, 16, ldx, src + ct0 * 16, 16 * ld, 16, ld, 0, RA + 1);
  mma_span<ARow<T>, BRow<T>>(P[1], xb + RB * 16 * ldx, 16, ldx, src + ct0 * 16, 16 * ld, 16, ld, 0, RB + 1);
}

// hi + lo += a·b for 16×16 fp32 blocks a, b (row-major, ld ld) on tensor cores, two k-steps of 8:
// each operand split into tf32 high and low parts, hi += a_hi·b_hi, lo += a_lo·b_hi + a_hi·b_lo (the
// a_lo·b_lo term is below fp32 rounding; two accumulators keep the dependent chains short).
using TAcc = wmma::fragment<wmma::accumulator, 16, 16, 8, float>;
using TA = wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major>;
using TB = wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::row_major>;
template <typename Frag>
__device__ __forceinline__ void split_tf32(Frag& hi, Frag& lo) {
#pragma unroll
  for (int i = 0; i < hi.num_elements; ++i) {
    const float x = hi.x[i], h = wmma::__float_to_tf32(x);
    hi.x[i] = h;
    lo.x[i] = wmma::__float_to_tf32(x - h);
  }
}
__device__ __forceinline__ void mma_tf32x3(TAcc& hi, TAcc& lo, const float* a, const float* b, int ld) {
#pragma unroll
  for (int kk = 0; kk < 2; ++kk) {
    TA ah, al;
    TB bh, bl;
    wmma::load_matrix_sync(ah, a + kk * 8, ld);
    wmma::load_matrix_sync(bh, b + kk * 8 * ld, ld);
    split_tf32(ah, al);
    split_tf32(bh, bl);
    wmma::mma_sync(lo, al, bh, lo);
    wmma::mma_sync(hi, ah, bh, hi);
    wmma::mma_sync(lo, ah, bl, lo);
  }
}

// m = f·(hi + lo), a 16×16 fp32 block (row-major, ld ld).
__device__ __forceinline__ void store_sum(float* m, TAcc& hi, const TAcc& lo, float f, int ld) {
#pragma unroll
  for (int i = 0; i < hi.num_elements; ++i) hi.x[i] = f * (hi.x[i] + lo.x[i]);
  wmma::store_matrix_sync(m, hi, ld, wmma::mem_row_major);
}

// Tile (r, ct) of A = β k kᵀ ⊙ e^{b_i − b_j} into af, zero on and above the diagonal.
template <typename T>
__device__ __forceinline__ void prep_tile(float* af, int lda, const T* ks, int ldk, int K, const float* rowb,
                                          const float* rowbeta, int r, int ct, int lane) {
  Acc acc;
  tile_xyT(acc, ks, ks, ldk, K, r, ct);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int row = r * 16 + acc_row(i, lane), col = ct * 16 + acc_col(i, lane);
    af[row * lda + col] = col < row ? acc.x[i] * rowbeta[row] * __expf(rowb[row] - rowb[col]) : 0.f;
  }
}

// D = (I + N)⁻¹ for a strictly lower 16×16 block N at a (row-major, ld lda, rows 16-byte aligned) into
// d, by forward substitution D_ij = −Σ_{m<i} N_im D_mj (D_jj = 1): lane j mod 16 holds column j in
// registers, rows of N are read as broadcasts; lanes 16…31 repeat lanes 0…15 and store nothing.
__device__ __forceinline__ void invert_unit_lower16(const float* a, float* d, int lda, int lane) {
  const int j = lane & 15;
  float x[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) x[i] = i == j ? 1.f : 0.f;
#pragma unroll
  for (int i = 1; i < 16; ++i) {
    float s[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int m4 = 0; m4 < i; m4 += 4) {
      const float4 n = *reinterpret_cast<const float4*>(a + i * lda + m4);
      const float nv[4] = {n.x, n.y, n.z, n.w};
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (m4 + e < i) s[e] += nv[e] * x[m4 + e];
    }
    if (i > j) x[i] = -((s[0] + s[1]) + (s[2] + s[3]));
  }
  if (lane < 16)
#pragma unroll
    for (int i = 0; i < 16; ++i) d[i * lda + j] = x[i];
}

// Row i of the 64 × D block m (ld ld) times f[i], in place, 8 elements per step; threads t of n.
template <typename T, int D>
__device__ __forceinline__ void scale_in_place(T* m, int ld, const float* f, int t, int n) {
  for (int idx = t; idx < kC * D / 8; idx += n) {
    const int i = idx / (D / 8), col = (idx % (D / 8)) * 8;
    uint4* p = reinterpret_cast<uint4*>(m + i * ld + col);
    uint4 raw = *p;
    T* e = reinterpret_cast<T*>(&raw);
    const float s = f[i];
#pragma unroll
    for (int q = 0; q < 8; q += 2) store2<T>(e + q, Ty<T>::f(e[q]) * s, Ty<T>::f(e[q + 1]) * s);
    *p = raw;
  }
}

// One CTA per (chunk, b·h), 8 warps.
template <typename T, int K, int V>
__global__ void __launch_bounds__(256) prep_kernel(PrepArgs a) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int LDK = K + 8, LDV = V + 8, LDA = kC + 4, LDB = kC + 8;
  T* ks = reinterpret_cast<T*>(smem);
  T* vs = ks + kC * LDK;
  float* af = reinterpret_cast<float*>(vs + kC * LDV);
  T* xb = reinterpret_cast<T*>(af);  // X in the input dtype, over A once X is formed
  float* xf = af + kC * LDA;
  float* rowb = xf + kC * LDA;
  float* rowbeta = rowb + kC;
  float* rowk = rowbeta + kC;

  const int H = a.H, T_ = a.T;
  const int c = blockIdx.x, bh = blockIdx.y, bi = bh / H, h = bh % H;
  const int wi = threadIdx.x / 32, lane = threadIdx.x % 32;
  load_rows<T, K>(ks, static_cast<const T*>(a.k), bi, h, c, T_, H, K, 0);
  load_rows<T, V>(vs, static_cast<const T*>(a.v), bi, h, c, T_, H, V, 0);
  cp_async_commit();
  if (threadIdx.x < kC) {
    const int t = c * kC + threadIdx.x;
    const float bt = a.b[(size_t(bi) * a.Tp + t) * H + h];
    const float be = t < T_ ? a.beta[(size_t(bi) * T_ + t) * H + h] : 0.f;
    rowb[threadIdx.x] = bt;
    rowbeta[threadIdx.x] = be;
    rowk[threadIdx.x] = be * __expf(bt);
  }
  cp_async_wait<0>();
  __syncthreads();
  // A = β k kᵀ ⊙ e^{b_i − b_j}, strictly lower, written from registers (the tiles above the diagonal
  // are never formed: step 2 keeps its intermediate blocks there).
  // X = (I + A)⁻¹, unit lower triangular, by blocks of 16.
  // 1. Warps 0…3 each form one diagonal tile A_RR and invert it at once (D_R = X_RR, in registers,
  //    no barrier in between); warps 4…7 meanwhile form the six tiles below the diagonal.
  if (wi < 4) {
    prep_tile(af, LDA, ks, LDK, K, rowb, rowbeta, wi, wi, lane);
    __syncwarp();
    invert_unit_lower16(af + wi * 16 * LDA + wi * 16, xf + wi * 16 * LDA + wi * 16, LDA, lane);
  } else {
    // tiles t = 0…5: (1,0) (2,0) (2,1) (3,0) (3,1) (3,2)
    for (int t = wi - 4; t < 6; t += 4) {
      const int tr = t < 1 ? 1 : t < 3 ? 2 : 3;
      prep_tile(af, LDA, ks, LDK, K, rowb, rowbeta, tr, t - tr * (tr - 1) / 2, lane);
    }
  }
  __syncthreads();
  // 2. Off-diagonal blocks on tensor cores, as halves of 32: with X_top = [D_0 0; X_10 D_1] and
  //    X_bot = [D_2 0; X_32 D_3], X_10 = −D_1 A_10 D_0, X_32 = −D_3 A_32 D_2 and the lower left
  //    half −X_bot (A_BL X_top), A_BL X_top = [A_20 D_0 + A_21 X_10, A_21 D_1; A_30 D_0 + A_31 X_10,
  //    A_31 D_1]. Four rounds of at most two block products per warp; the intermediate blocks live in
  //    the upper blocks of `af`, which are never read otherwise. Operands split into tf32 high and low
  //    parts (three products) keep X within a few fp32 roundings.
  {
    auto blk = [&](float* m, int r, int cc) { return m + r * 16 * LDA + cc * 16; };
    // scratch S(s), s = 0…5: Q_10 = A_10 D_0, Q_32 = A_32 D_2, U_20 = A_20 D_0, U_21 = A_21 D_1,
    // U_30 = A_30 D_0, U_31 = A_31 D_1, at upper blocks (0,1) (0,2) (0,3) (1,2) (1,3) (2,3)
    auto S = [&](int s) { return blk(af, (0x211000 >> (4 * s)) & 15, (0x332321 >> (4 * s)) & 15); };
    TAcc hi, lo;
    if (wi < 6) {
      const int ar = (0x332231 >> (4 * wi)) & 15, ac = (0x101020 >> (4 * wi)) & 15;
      wmma::fill_fragment(hi, 0.f);
      wmma::fill_fragment(lo, 0.f);
      mma_tf32x3(hi, lo, blk(af, ar, ac), blk(xf, ac, ac), LDA);
      store_sum(S(wi), hi, lo, 1.f, LDA);
    }
    __syncthreads();
    if (wi < 2) {  // X_10 = −D_1 Q_10, X_32 = −D_3 Q_32
      const int R = 1 + 2 * wi;
      wmma::fill_fragment(hi, 0.f);
      wmma::fill_fragment(lo, 0.f);
      mma_tf32x3(hi, lo, blk(xf, R, R), S(wi), LDA);
      store_sum(blk(xf, R, R - 1), hi, lo, -1.f, LDA);
    } else {  // meanwhile: β e^{b} k (k is no longer read once the tiles of A are formed)
      scale_in_place<T, K>(ks, LDK, rowk, threadIdx.x - 64, 192);
    }
    __syncthreads();
    if (wi < 2) {  // U_20 += A_21 X_10, U_30 += A_31 X_10
      float* u = S(2 + 2 * wi);
      wmma::load_matrix_sync(hi, u, LDA, wmma::mem_row_major);
      wmma::fill_fragment(lo, 0.f);
      mma_tf32x3(hi, lo, blk(af, 2 + wi, 1), blk(xf, 1, 0), LDA);
      store_sum(u, hi, lo, 1.f, LDA);
    } else {  // β v
      scale_in_place<T, V>(vs, LDV, rowbeta, threadIdx.x - 64, 192);
    }
    __syncthreads();
    if (wi < 4) {  // X_2C = −D_2 M_2C, X_3C = −(X_32 M_2C + D_3 M_3C)
      const int R = 2 + (wi >> 1), C = wi & 1;
      wmma::fill_fragment(hi, 0.f);
      wmma::fill_fragment(lo, 0.f);
      if (R == 3) mma_tf32x3(hi, lo, blk(xf, 3, 2), S(2 + C), LDA);
      mma_tf32x3(hi, lo, blk(xf, R, R), S(2 * R - 2 + C), LDA);
      store_sum(blk(xf, R, C), hi, lo, -1.f, LDA);
    }
    __syncthreads();
  }
  {
    float* xo = a.x ? a.x + (size_t(bh) * a.NT + c) * kC * kC : nullptr;
    for (int idx = threadIdx.x; idx < kC * kC / 4; idx += blockDim.x) {
      const int i = idx / (kC / 4), j = (idx % (kC / 4)) * 4;
      // blocks above the diagonal are never written in xf
      const float4 x4 = (j >> 4) > (i >> 4) ? make_float4(0.f, 0.f, 0.f, 0.f)
                                            : *reinterpret_cast<const float4*>(xf + i * LDA + j);
      store2<T>(xb + i * LDB + j, x4.x, x4.y);
      store2<T>(xb + i * LDB + j + 2, x4.z, x4.w);
      if (xo) *reinterpret_cast<float4*>(xo + i * kC + j) = x4;
    }
  }
  __syncthreads();
  // w = X (β e^{b} k), u = X (β v)
  // (warp pairs of row tiles {0, 3} or {1, 2}, a quarter of the columns each: equal work); each staged
  // over its source once every warp has its products, then stored in 16-byte pieces
  const int ra = wi & 1, rb = 3 - ra;
  {
    constexpr int N = K / 64;
    Acc P[2][N];
    if (ra) lower_product<T, K, 1, 2>(P, xb, LDB, ks, LDK, (wi >> 1) * N);
    else lower_product<T, K, 0, 3>(P, xb, LDB, ks, LDK, (wi >> 1) * N);
    __syncthreads();
    stage_chunk_rows<T, N>(P[0], ks, LDK, ra, (wi >> 1) * N, lane);
    stage_chunk_rows<T, N>(P[1], ks, LDK, rb, (wi >> 1) * N, lane);
  }
  {
    constexpr int N = V / 64;
    Acc P[2][N];
    if (ra) lower_product<T, V, 1, 2>(P, xb, LDB, vs, LDV, (wi >> 1) * N);
    else lower_product<T, V, 0, 3>(P, xb, LDB, vs, LDV, (wi >> 1) * N);
    __syncthreads();
    store_rows<T, K>(static_cast<T*>(a.w), ks, LDK, bi, h, c, T_, H, K, 0);
    stage_chunk_rows<T, N>(P[0], vs, LDV, ra, (wi >> 1) * N, lane);
    stage_chunk_rows<T, N>(P[1], vs, LDV, rb, (wi >> 1) * N, lane);
  }
  __syncthreads();
  store_rows<T, V>(static_cast<T*>(a.u), vs, LDV, bi, h, c, T_, H, V, 0);
}

struct DvlArgs {
  const void *q, *k, *d_o;
  const float* b;
  void* dvl;
  float scale;
  int B, T, H, K, V, NT, Tp;
};

template <typename T, int K, int V>
constexpr size_t dvl_smem() {
  return sizeof(T) * (2 * kC * (K + 8) + kC * (V + 8) + kC * (kC + 8)) + sizeof(float) * kC;
}

// dv_local = Pᵀ do for every chunk in parallel (P = scale·(q kᵀ) ⊙ e^{b_i − b_j} ⊙ [j ≤ i]): the part
// of the delta rule's v_new gradient that does not depend on the state. One CTA per (chunk, b·h),
// warp (r, hf) owns rows r·16 … +15 and half of the columns.
template <typename T, int K, int V>
__global__ void __launch_bounds__(256) dvl_kernel(DvlArgs a) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int LDK = K + 8, LDV = V + 8, LDB = kC + 8, NV = V / 32;
  T* qs = reinterpret_cast<T*>(smem);
  T* ks = qs + kC * LDK;
  T* dos = ks + kC * LDK;
  T* ab = dos + kC * LDV;
  float* rowb = reinterpret_cast<float*>(ab + kC * LDB);
  const int H = a.H, T_ = a.T;
  const int c = blockIdx.x, bh = blockIdx.y, bi = bh / H, h = bh % H;
  const int wi = threadIdx.x / 32, lane = threadIdx.x % 32, r = wi & 3, hf = wi >> 2;
  load_rows<T, K>(qs, static_cast<const T*>(a.q), bi, h, c, T_, H, K, 0);
  load_rows<T, K>(ks, static_cast<const T*>(a.k), bi, h, c, T_, H, K, 0);
  cp_async_commit();
  load_rows<T, V>(dos, static_cast<const T*>(a.d_o), bi, h, c, T_, H, V, 0);
  cp_async_commit();
  if (threadIdx.x < kC) rowb[threadIdx.x] = a.b[(size_t(bi) * a.Tp + size_t(c) * kC + threadIdx.x) * H + h];
  cp_async_wait<1>();
  __syncthreads();
  decayed_scores<T, K>(qs, ks, LDK, rowb, a.scale, ab, LDB, r, hf, lane);
  cp_async_wait<0>();
  __syncthreads();
  const int ct0 = hf * NV;
  Acc P[NV];
#pragma unroll
  for (int n = 0; n < NV; ++n) wmma::fill_fragment(P[n], 0.f);
  mma_span<ACol<T>, BRow<T>>(P, ab + r * 16, 16 * LDB, LDB, dos + ct0 * 16, 16 * LDV, 16, LDV, r, kC / 16);
  // staged over q and k (no longer read: the scores are in ab) and stored in 16-byte pieces
  static_assert(kC * LDV <= 2 * kC * LDK, "the staging tile fits over q and k");
  stage_chunk_rows<T, NV>(P, qs, LDV, r, ct0, lane);
  __syncwarp();
  warp_store_rows<T, NV * 16>(static_cast<T*>(a.dvl), qs + ct0 * 16, LDV, bi, h, c, T_, H, V, ct0 * 16, r, lane);
}

struct WyBwdArgs {
  const void *k, *v, *du, *hs;
  const float *x, *beta, *b, *dk_in;
  void *dk, *dv;
  float *dbeta, *x2;
  int B, T, H, K, V, NT, Tp;
};

// ks, dws, vs, dus, then one region that holds the state tile S0 for step 1 and X, dX, Y, E after it
// (the dv staging tile in Y and E), then the per-row sums: two CTAs per SM at K = V = 128.
template <typename T, int K, int V>
constexpr size_t wy_bwd_region() {
  constexpr size_t s0 = size_t(K) * (V + 8), x = 4 * size_t(kC) * (kC + 8);
  return sizeof(T) * (s0 > x ? s0 : x);
}
template <typename T, int K, int V>
constexpr size_t wy_bwd_smem() {
  return sizeof(T) * (2 * kC * (K + 8) + 2 * kC * (V + 8)) + wy_bwd_region<T, K, V>() + sizeof(float) * 7 * kC;
}

// Backward through the delta rule's WY preparation (w = X B_k, u = X B_v with B_k = β e^{b} ⊙ k,
// B_v = β ⊙ v, X = (I + A)⁻¹, A = tril(diag(β)(k kᵀ ⊙ Γ), −1)), one CTA per (chunk, b·h), 8 warps,
// warp (r, hf) owning rows r·16 … +15 and half of the columns. Given du (the v_new gradient) and the
// state S0 entering the chunk (hs), with dw = −du S0ᵀ:
//   dB_k = Xᵀ dw, dB_v = Xᵀ du, dX = dw B_kᵀ + du B_vᵀ, dA = −Xᵀ dX Xᵀ (strictly lower),
//   dv = β ⊙ dB_v,  dk = dk_in + β e^{b} ⊙ dB_k + (E + Eᵀ) k  with E = dA ⊙ Γ ⊙ β_row,
//   dβ = Σ v ⊙ dB_v + e^{b} Σ k ⊙ dB_k + Σ_j dA ⊙ (k kᵀ ⊙ Γ),
//   x2 = β e^{b} Σ k ⊙ dB_k + rows(M) − columns(M), M = dA ⊙ (k kᵀ ⊙ Γ) ⊙ β_row  (the direct gradient
//   of the chunk's cumulative gates b; the caller turns it into dg).
// X (fp32 in global memory) is read into registers first and written to shared memory over S0 once
// step 1 is done.
template <typename T, int K, int V>
__global__ void __launch_bounds__(256, 2) wy_bwd_kernel(WyBwdArgs a) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int LDK = K + 8, LDV = V + 8, LDB = kC + 8, NK = K / 32, NV = V / 32;
  T* ks = reinterpret_cast<T*>(smem);
  T* dws = ks + kC * LDK;
  T* vs = dws + kC * LDK;
  T* dus = vs + kC * LDV;
  T* hsm = dus + kC * LDV;  // step 1 only; then xs, dxs, ys, es
  T* xs = hsm;
  T* dxs = xs + kC * LDB;
  T* ys = dxs + kC * LDB;
  T* es = ys + kC * LDB;
  T* dvst = ys;  // dv staging [64][LDV] over ys and es (free until step 4)
  static_assert(kC * (V + 8) <= 2 * kC * (kC + 8), "the dv staging tile fits in Y and E");
  float* rowb = reinterpret_cast<float*>(reinterpret_cast<unsigned char*>(hsm) + wy_bwd_region<T, K, V>());
  float* rowbeta = rowb + kC;
  float* roweg = rowbeta + kC;  // e^{b}
  float* kdbk = roweg + kC;     // Σ k ⊙ dB_k per row
  float* vdbv = kdbk + kC;      // Σ v ⊙ dB_v per row
  float* rsum = vdbv + kC;      // Σ_j (dA ⊙ (k kᵀ ⊙ Γ))_ij
  float* csum = rsum + kC;      // Σ_i β_i (dA ⊙ (k kᵀ ⊙ Γ))_ij

  const int H = a.H, T_ = a.T, NT = a.NT;
  const int c = blockIdx.x, bh = blockIdx.y, bi = bh / H, h = bh % H;
  const int wi = threadIdx.x / 32, lane = threadIdx.x % 32, r = wi & 3, hf = wi >> 2;
  load_rows<T, K>(ks, static_cast<const T*>(a.k), bi, h, c, T_, H, K, 0);
  load_rows<T, V>(dus, static_cast<const T*>(a.du), bi, h, c, T_, H, V, 0);
  load_mat<T, K, V>(hsm, static_cast<const T*>(a.hs) + (size_t(bh) * NT + c) * K * V, V);
  cp_async_commit();
  load_rows<T, V>(vs, static_cast<const T*>(a.v), bi, h, c, T_, H, V, 0);
  cp_async_commit();
  constexpr int XN = kC * kC / 4 / 256;  // float4 pieces of X per thread
  float4 xr[XN];
  {
    const float4* xg = reinterpret_cast<const float4*>(a.x + (size_t(bh) * NT + c) * kC * kC);
#pragma unroll
    for (int j = 0; j < XN; ++j) xr[j] = xg[threadIdx.x + j * 256];
  }
  if (threadIdx.x < kC) {
    const int t = c * kC + threadIdx.x;
    const float bt = a.b[(size_t(bi) * a.Tp + t) * H + h];
    rowb[threadIdx.x] = bt;
    rowbeta[threadIdx.x] = t < T_ ? a.beta[(size_t(bi) * T_ + t) * H + h] : 0.f;
    roweg[threadIdx.x] = __expf(bt);
    kdbk[threadIdx.x] = 0.f;
    vdbv[threadIdx.x] = 0.f;
    rsum[threadIdx.x] = 0.f;
    csum[threadIdx.x] = 0.f;
  }
  cp_async_wait<1>();
  __syncthreads();
  // 1. dw = −du S0ᵀ, rounded into dws
  {
    const int ct0 = hf * NK;
    Acc P[NK];
#pragma unroll
    for (int n = 0; n < NK; ++n) wmma::fill_fragment(P[n], 0.f);
    mma_span<ARow<T>, BCol<T>>(P, dus + r * 16 * LDV, 16, LDV, hsm + ct0 * 16 * LDV, 16, 16 * LDV, LDV, 0, V / 16);
#pragma unroll
    for (int n = 0; n < NK; ++n)
#pragma unroll
      for (int i = 0; i < 8; i += 2) {
        const int row = r * 16 + acc_row(i, lane), col = (ct0 + n) * 16 + acc_col(i, lane);
        store2<T>(dws + row * LDK + col, -P[n].x[i], -P[n].x[i + 1]);
      }
  }
  cp_async_wait<0>();
  __syncthreads();  // S0 is no longer read: X goes over it
#pragma unroll
  for (int j = 0; j < XN; ++j) {
    const int idx = threadIdx.x + j * 256, i = idx / (kC / 4), col = (idx % (kC / 4)) * 4;
    store2<T>(xs + i * LDB + col, xr[j].x, xr[j].y);
    store2<T>(xs + i * LDB + col + 2, xr[j].z, xr[j].w);
  }
  __syncthreads();
  // 2. dB_k = Xᵀ dw (→ the dk accumulators, scaled by β e^{b}), dB_v = Xᵀ du (→ dv = β ⊙ dB_v)
  const int kc0 = hf * NK;
  Acc D[NK];
#pragma unroll
  for (int n = 0; n < NK; ++n) wmma::fill_fragment(D[n], 0.f);
  mma_span<ACol<T>, BRow<T>>(D, xs + r * 16, 16 * LDB, LDB, dws + kc0 * 16, 16 * LDK, 16, LDK, r, kC / 16);
  row_dots<T, NK>(D, ks, LDK, kc0 * 16, r, lane, kdbk);
  {
    const int r0 = r * 16 + (lane >> 2);
    const float f0 = rowbeta[r0] * roweg[r0], f1 = rowbeta[r0 + 8] * roweg[r0 + 8];
#pragma unroll
    for (int n = 0; n < NK; ++n)
#pragma unroll
      for (int i = 0; i < 8; ++i) D[n].x[i] *= (i & 2) ? f1 : f0;
  }
  {
    const int ct0 = hf * NV;
    Acc P[NV];
#pragma unroll
    for (int n = 0; n < NV; ++n) wmma::fill_fragment(P[n], 0.f);
    mma_span<ACol<T>, BRow<T>>(P, xs + r * 16, 16 * LDB, LDB, dus + ct0 * 16, 16 * LDV, 16, LDV, r, kC / 16);
    row_dots<T, NV>(P, vs, LDV, ct0 * 16, r, lane, vdbv);
    scale_rows<NV>(P, rowbeta, r, lane);
    stage_chunk_rows<T, NV>(P, dvst, LDV, r, ct0, lane);
    __syncwarp();
    warp_store_rows<T, NV * 16>(static_cast<T*>(a.dv), dvst + ct0 * 16, LDV, bi, h, c, T_, H, V, ct0 * 16, r, lane);
  }
  // 3. dX = dw B_kᵀ + du B_vᵀ, i.e. dX_ij = β_j (e^{b_j} (dw kᵀ)_ij + (du vᵀ)_ij), all 16 tiles
  for (int ct = hf; ct < 4; ct += 2) {
    Acc p1, p2;
    tile_xyT(p1, dws, ks, LDK, K, r, ct);
    tile_xyT(p2, dus, vs, LDV, V, r, ct);
#pragma unroll
    for (int i = 0; i < 8; i += 2) {
      const int row = r * 16 + acc_row(i, lane), col = ct * 16 + acc_col(i, lane);
      store2<T>(dxs + row * LDB + col, rowbeta[col] * (roweg[col] * p1.x[i] + p2.x[i]),
                rowbeta[col + 1] * (roweg[col + 1] * p1.x[i + 1] + p2.x[i + 1]));
    }
  }
  __syncthreads();
  // 4. Y = dX Xᵀ on the lower tiles (the only ones step 5 reads)
  for (int ct = hf; ct <= r; ct += 2) {
    Acc y;
    tile_xyT(y, dxs, xs, LDB, kC, r, ct);
#pragma unroll
    for (int i = 0; i < 8; i += 2) {
      const int row = r * 16 + acc_row(i, lane), col = ct * 16 + acc_col(i, lane);
      store2<T>(ys + row * LDB + col, y.x[i], y.x[i + 1]);
    }
  }
  __syncthreads();
  // 5. dA = −Xᵀ Y on the lower tiles, with k kᵀ ⊙ Γ: E = dA ⊙ Γ ⊙ β_row → es; the row sums of
  //    dA ⊙ (k kᵀ ⊙ Γ) → rsum, its column sums weighted by β_row → csum
  for (int ct = hf; ct <= r; ct += 2) {
    Acc P[1], kk;
    wmma::fill_fragment(P[0], 0.f);
    mma_span<ACol<T>, BRow<T>>(P, xs + r * 16, 16 * LDB, LDB, ys + ct * 16, 16 * LDB, 0, LDB, r, kC / 16);
    tile_xyT(kk, ks, ks, LDK, K, r, ct);
    float rs[2] = {0.f, 0.f}, cs[4] = {0.f, 0.f, 0.f, 0.f};  // rows lane/4 (+8); columns (i&1) + 2·(i>>2)
#pragma unroll
    for (int i = 0; i < 8; i += 2) {
      const int row = r * 16 + acc_row(i, lane), col = ct * 16 + acc_col(i, lane);
      float e[2];
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const bool in = col + u < row;
        const float g = in ? __expf(rowb[row] - rowb[col + u]) : 0.f;
        const float dA = -P[0].x[i + u];
        e[u] = dA * g * rowbeta[row];
        const float m = in ? dA * kk.x[i + u] * g : 0.f;
        rs[(i >> 1) & 1] += m;
        cs[u + 2 * (i >> 2)] += rowbeta[row] * m;
      }
      store2<T>(es + row * LDB + col, e[0], e[1]);
    }
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      rs[u] += __shfl_xor_sync(0xffffffffu, rs[u], 1);
      rs[u] += __shfl_xor_sync(0xffffffffu, rs[u], 2);
    }
#pragma unroll
    for (int u = 0; u < 4; ++u)
      for (int o = 4; o < 32; o <<= 1) cs[u] += __shfl_xor_sync(0xffffffffu, cs[u], o);
    if ((lane & 3) == 0) {
      atomicAdd(rsum + r * 16 + (lane >> 2), rs[0]);
      atomicAdd(rsum + r * 16 + (lane >> 2) + 8, rs[1]);
    }
    if (lane < 4)
#pragma unroll
      for (int u = 0; u < 4; ++u) atomicAdd(csum + ct * 16 + 2 * lane + (u & 1) + 8 * (u >> 1), cs[u]);
  }
  __syncthreads();
  // 6. dk += E k + Eᵀ k; dk = dk_in + accumulators
  mma_span<ARow<T>, BRow<T>>(D, es + r * 16 * LDB, 16, LDB, ks + kc0 * 16, 16 * LDK, 16, LDK, 0, r + 1);
  mma_span<ACol<T>, BRow<T>>(D, es + r * 16, 16 * LDB, LDB, ks + kc0 * 16, 16 * LDK, 16, LDK, r, kC / 16);
  {
    T* dk = static_cast<T*>(a.dk);
#pragma unroll
    for (int n = 0; n < NK; ++n)
#pragma unroll
      for (int i = 0; i < 8; i += 2) {
        const int row = r * 16 + acc_row(i, lane), col = (kc0 + n) * 16 + acc_col(i, lane), t = c * kC + row;
        if (t < T_) {
          const size_t g = ((size_t(bi) * T_ + t) * H + h) * K + col;
          const float2 d0 = *reinterpret_cast<const float2*>(a.dk_in + g);
          store2<T>(dk + g, D[n].x[i] + d0.x, D[n].x[i + 1] + d0.y);
        }
      }
  }
  if (threadIdx.x < kC) {
    const int i = threadIdx.x, t = c * kC + i;
    if (t < T_) {
      const size_t g = (size_t(bi) * T_ + t) * H + h;
      const float kb = roweg[i] * kdbk[i];
      a.dbeta[g] = vdbv[i] + kb + rsum[i];
      a.x2[g] = rowbeta[i] * (kb + rsum[i]) - csum[i];
    }
  }
}

MIXBENCH_PER_CHUNK_KERNEL(DvlKernel, dvl_kernel, dvl_smem)
MIXBENCH_PER_CHUNK_KERNEL(WyBwdKernel, wy_bwd_kernel, wy_bwd_smem)
MIXBENCH_PER_CHUNK_KERNEL(PrepKernel, prep_kernel, prep_smem)

}  // namespace

void delta_prep(Dtype dt, const void* k, const void* v, const float* beta, const float* b, void* w, void* u, float* x,
                Dims d, void* stream) {
  check_grid(d);
  const int NT = num_chunks(d.T);
  PrepArgs a{k, v, beta, b, w, u, x, d.B, d.T, d.H, d.K, d.V, NT, NT * kC};
  launch_per_chunk<PrepKernel>(dt, a, d, NT, stream, "delta_prep");
}

void delta_dv_local(Dtype dt, const void* q, const void* k, const void* d_o, const float* b, void* dvl, float scale,
                    Dims d, void* stream) {
  check_grid(d);
  const int NT = num_chunks(d.T);
  DvlArgs a{q, k, d_o, b, dvl, scale, d.B, d.T, d.H, d.K, d.V, NT, NT * kC};
  launch_per_chunk<DvlKernel>(dt, a, d, NT, stream, "delta_dv_local");
}

void delta_wy_bwd(Dtype dt, const void* k, const void* v, const void* du, const void* hs, const float* x,
                  const float* beta, const float* b, const float* dk_in, void* dk, void* dv, float* dbeta, float* x2,
                  Dims d, void* stream) {
  check_grid(d);
  const int NT = num_chunks(d.T);
  WyBwdArgs a{k, v, du, hs, x, beta, b, dk_in, dk, dv, dbeta, x2, d.B, d.T, d.H, d.K, d.V, NT, NT * kC};
  launch_per_chunk<WyBwdKernel>(dt, a, d, NT, stream, "delta_wy_bwd");
}

}  // namespace mixbench::linear::tc
