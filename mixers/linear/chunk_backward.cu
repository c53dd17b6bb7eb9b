// The per-chunk gradient kernels of simple_gla (interface in chunk_kernels.h), also used by the
// delta rule's backward:
//   chunk_dqkv   one CTA per (chunk, b·h), 8 warps: A and dA = do vᵀ, then dq, dk, dv as sums of an
//                inter-chunk product (with h or dh) and an intra-chunk one (with A or dA); on request
//                also the decay gradient's row dots, with dq / dk in the input dtype, and without
//                dv (then without A).
//   decay_grad   one CTA per (chunk, b·h): the row dots (or chunk_dqkv's), then the chunk's scans.

#include "mixers/linear/chunk_launch.cuh"
#include "mixers/linear/chunk_grad_rows.cuh"
#include "mixers/linear/chunk_tiles.cuh"

#include <stdexcept>

namespace mixbench::linear::tc {
namespace {

struct DqkvArgs {
  const void *q, *k, *v, *d_o;
  const float* b;
  const void *hs, *dhs;
  float *dqf, *dkf;
  void* dv;
  float *y, *z;
  float scale;
  int B, T, H, K, V, NT, Tp;
  void *dq, *dk;  // with xdot: dq (and dk where not null) in the input dtype instead of dqf (dkf)
  float* xdot;    // null, or the row dots q_i·dq_i − k_i·dk_i, fp32 [B,T,H]
};

template <typename T, int K, int V>
constexpr size_t dqkv_smem() {
  constexpr int M = K > V ? K : V;
  return sizeof(T) * (2 * kC * (K + 8) + 2 * kC * (V + 8) + 2 * K * (V + 8) + 2 * kC * (kC + 8)) +
         sizeof(float) * (kC * (M + 4) + kC);
}

// DOTS: the row dots into a.xdot, dq (and dk where a.dk is set) in the input dtype (see chunk_dqkv).
template <typename T, int K, int V, bool DOTS = false>
__global__ void __launch_bounds__(256) dqkv_kernel(DqkvArgs a) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int M = K > V ? K : V;
  constexpr int LDK = K + 8, LDV = V + 8, LDB = kC + 8, LDG = M + 4;
  constexpr int NK = K / 32, NV = V / 32;  // column tiles per warp (two warps per row tile)
  T* qs = reinterpret_cast<T*>(smem);
  T* ks = qs + kC * LDK;
  T* vs = ks + kC * LDK;
  T* dos = vs + kC * LDV;
  T* hsm = dos + kC * LDV;
  T* dhsm = hsm + K * LDV;
  T* ab = dhsm + K * LDV;
  T* dab = ab + kC * LDB;
  float* stg = reinterpret_cast<float*>(dab + kC * LDB);  // output staging: fp32 [64][LDG] or T [64][2·LDG]
  T* stg_t = reinterpret_cast<T*>(stg);
  float* rowb = stg + kC * LDG;
  __shared__ float f_in[kC], f_out[kC], ysm[kC], xsm[kC], red[8];

  const int H = a.H, T_ = a.T, NT = a.NT;
  const int c = blockIdx.x, bh = blockIdx.y, bi = bh / H, h = bh % H;
  const int wi = threadIdx.x / 32, lane = threadIdx.x % 32, r = wi & 3, hf = wi >> 2;
  load_rows<T, K>(qs, static_cast<const T*>(a.q), bi, h, c, T_, H, K, 0);
  load_rows<T, K>(ks, static_cast<const T*>(a.k), bi, h, c, T_, H, K, 0);
  load_rows<T, V>(vs, static_cast<const T*>(a.v), bi, h, c, T_, H, V, 0);
  load_rows<T, V>(dos, static_cast<const T*>(a.d_o), bi, h, c, T_, H, V, 0);
  load_mat<T, K, V>(hsm, static_cast<const T*>(a.hs) + (size_t(bh) * NT + c) * K * V, V);
  cp_async_commit();
  load_mat<T, K, V>(dhsm, static_cast<const T*>(a.dhs) + (size_t(bh) * NT + c) * K * V, V);
  cp_async_commit();
  if (threadIdx.x < kC) {
    ysm[threadIdx.x] = 0.f;
    xsm[threadIdx.x] = 0.f;
    const float* bc = a.b + (size_t(bi) * a.Tp + size_t(c) * kC) * H + h;
    const float bj = bc[size_t(threadIdx.x) * H], bL = bc[size_t(kC - 1) * H];
    rowb[threadIdx.x] = bj;
    f_in[threadIdx.x] = __expf(bj) * a.scale;
    f_out[threadIdx.x] = __expf(bL - bj);
  }
  cp_async_wait<1>();
  __syncthreads();

  // A = q kᵀ (warps 0–3) and dA = do vᵀ (warps 4–7), lower tiles only (the only ones read below),
  // masked and decayed in fp32, rounded into ab / dab; A only serves dv
  const bool with_dv = a.dv != nullptr;
  if (hf || with_dv) {
    const T* x = hf ? dos : qs;
    const T* y = hf ? vs : ks;
    const int ld = hf ? LDV : LDK, nk = (hf ? V : K) / 16;
    T* dst = hf ? dab : ab;
    for (int ct = 0; ct <= r; ++ct) {
      Acc acc;
      tile_xyT(acc, x, y, ld, nk * 16, r, ct);
#pragma unroll
      for (int i = 0; i < 8; i += 2) {
        const int row = r * 16 + acc_row(i, lane), col = ct * 16 + acc_col(i, lane);
        float e[2];
#pragma unroll
        for (int u = 0; u < 2; ++u)
          e[u] = col + u <= row ? acc.x[i + u] * (__expf(rowb[row] - rowb[col + u]) * a.scale) : 0.f;
        store2<T>(dst + row * LDB + col, e[0], e[1]);
      }
    }
  }
  __syncthreads();

  // The warp's rows of P (N column tiles from ct0): the row dots with x (q or k rows, DOTS only) times
  // sign into xsm, then through the staging tile to dstf (fp32) or dstt (the input dtype) [B,T,H,D].
  auto finish = [&](auto& P, const T* x, float sign, float* dstf, T* dstt, int D, int ct0) {
    constexpr int N = std::extent_v<std::remove_reference_t<decltype(P)>>;
    if constexpr (DOTS)
      if (x) row_dots<T, N>(P, x, LDK, ct0 * 16, r, lane, xsm, sign);
    if (dstf) {
#pragma unroll
      for (int n = 0; n < N; ++n)
        wmma::store_matrix_sync(stg + r * 16 * LDG + (ct0 + n) * 16, P[n], LDG, wmma::mem_row_major);
      __syncwarp();
      warp_store_rows<float, N * 16>(dstf, stg + ct0 * 16, LDG, bi, h, c, T_, H, D, ct0 * 16, r, lane);
    } else {
      stage_chunk_rows<T, N>(P, stg_t, 2 * LDG, r, ct0, lane);
      __syncwarp();
      warp_store_rows<T, N * 16>(dstt, stg_t + ct0 * 16, 2 * LDG, bi, h, c, T_, H, D, ct0 * 16, r, lane);
    }
  };
  // dq = scale·e^{b} ⊙ (do hᵀ) + dA k
  {
    const int ct0 = hf * NK;
    Acc P[NK];
#pragma unroll
    for (int n = 0; n < NK; ++n) wmma::fill_fragment(P[n], 0.f);
    mma_span<ARow<T>, BCol<T>>(P, dos + r * 16 * LDV, 16, LDV, hsm + ct0 * 16 * LDV, 16, 16 * LDV, LDV, 0, V / 16);
    scale_rows<NK>(P, f_in, r, lane);
    mma_span<ARow<T>, BRow<T>>(P, dab + r * 16 * LDB, 16, LDB, ks + ct0 * 16, 16 * LDK, 16, LDK, 0, r + 1);
    finish(P, qs, 1.f, DOTS ? nullptr : a.dqf, DOTS ? static_cast<T*>(a.dq) : nullptr, K, ct0);
  }
  cp_async_wait<0>();
  __syncthreads();  // dh has arrived
  // z_c = e^{b_L} ⟨dh, h⟩: the decay gradient of the state entering the chunk
  {
    float acc = 0.f;
    for (int idx = threadIdx.x; idx < K * V / 8; idx += blockDim.x) {
      const int kk = idx / (V / 8), vv = (idx % (V / 8)) * 8;
      const uint4 hv = *reinterpret_cast<const uint4*>(hsm + kk * LDV + vv);
      const uint4 dv = *reinterpret_cast<const uint4*>(dhsm + kk * LDV + vv);
      const T* he = reinterpret_cast<const T*>(&hv);
      const T* de = reinterpret_cast<const T*>(&dv);
#pragma unroll
      for (int e = 0; e < 8; ++e) acc += Ty<T>::f(he[e]) * Ty<T>::f(de[e]);
    }
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) red[wi] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
      float z = 0.f;
      for (int i = 0; i < 8; ++i) z += red[i];
      a.z[(size_t(bi) * NT + c) * H + h] = z * __expf(rowb[kC - 1]);
    }
  }
  // dk = e^{b_L − b} ⊙ (v dhᵀ) + dAᵀ q
  {
    const int ct0 = hf * NK;
    Acc P[NK];
#pragma unroll
    for (int n = 0; n < NK; ++n) wmma::fill_fragment(P[n], 0.f);
    mma_span<ARow<T>, BCol<T>>(P, vs + r * 16 * LDV, 16, LDV, dhsm + ct0 * 16 * LDV, 16, 16 * LDV, LDV, 0, V / 16);
    scale_rows<NK>(P, f_out, r, lane);
    // y_j = k_j · (inter-chunk part of dk_j), summed over this warp's columns
    row_dots<T, NK>(P, ks, LDK, ct0 * 16, r, lane, ysm);
    mma_span<ACol<T>, BRow<T>>(P, dab + r * 16, 16 * LDB, LDB, qs + ct0 * 16, 16 * LDK, 16, LDK, r, kC / 16);
    T* const dk_t = DOTS ? static_cast<T*>(a.dk) : nullptr;
    finish(P, ks, -1.f, dk_t ? nullptr : a.dkf, dk_t, K, ct0);
  }
  __syncthreads();  // with K ≠ V the two warps of a row split the staging columns differently below
  // dv = e^{b_L − b} ⊙ (k dh) + Aᵀ do
  if (with_dv) {
    const int ct0 = hf * NV;
    Acc P[NV];
#pragma unroll
    for (int n = 0; n < NV; ++n) wmma::fill_fragment(P[n], 0.f);
    mma_span<ARow<T>, BRow<T>>(P, ks + r * 16 * LDK, 16, LDK, dhsm + ct0 * 16, 16 * LDV, 16, LDV, 0, K / 16);
    scale_rows<NV>(P, f_out, r, lane);
    mma_span<ACol<T>, BRow<T>>(P, ab + r * 16, 16 * LDB, LDB, dos + ct0 * 16, 16 * LDV, 16, LDV, r, kC / 16);
    finish(P, nullptr, 0.f, nullptr, static_cast<T*>(a.dv), V, ct0);
  }
  __syncthreads();
  if (threadIdx.x < kC && c * kC + int(threadIdx.x) < T_) {
    const size_t g = (size_t(bi) * T_ + c * kC + threadIdx.x) * H + h;
    a.y[g] = ysm[threadIdx.x];
    if constexpr (DOTS) a.xdot[g] = xsm[threadIdx.x];
  }
}

// The decay gradient of one (bi, chunk, head), 256 threads: x_i = q_i·dq_i − k_i·dk_i + y_i (+ x2_i)
// per row (K / 8 threads a row, 8 elements each, 16-byte loads), then one warp forms
// dg_t = Σ_{i ≥ t} x_i + Σ_{j < t} y_j + z_c with direct suffix / prefix scans over the chunk (no
// subtraction of partial sums). Rows past T count as 0. dq_out / dk_out (may be null): the fp32
// gradients rounded to the input dtype on the way. With xdot (chunk_dqkv's row dots) the dots are
// read from there and q, dqf, k, dkf, dq_out, dk_out are not used.
template <typename T>
__global__ void __launch_bounds__(256) decay_grad_kernel(const T* q, const float* dqf, const T* k, const float* dkf,
                                                         const float* y, const float* z, const float* x2,
                                                         const float* xdot, float* dg, T* dq_out, T* dk_out, int T_,
                                                         int H, int K, int NT) {
  __shared__ float xs[kC], ys[kC];
  const int h = blockIdx.x % H, c = (blockIdx.x / H) % NT, bi = blockIdx.x / (H * NT);
  const int tpr = K / 8, sub = threadIdx.x % tpr;
  for (int r = threadIdx.x / tpr; r < kC; r += blockDim.x / tpr) {  // the same trip count in every lane
    const int t = c * kC + r;
    float acc = 0.f;
    if (t < T_ && !xdot) {
      const size_t off = ((size_t(bi) * T_ + t) * H + h) * K + sub * 8;
      const uint4 qv = *reinterpret_cast<const uint4*>(q + off), kv = *reinterpret_cast<const uint4*>(k + off);
      const float4* dq4 = reinterpret_cast<const float4*>(dqf + off);
      const float4* dk4 = reinterpret_cast<const float4*>(dkf + off);
      const float4 dqa = dq4[0], dqb = dq4[1], dka = dk4[0], dkb = dk4[1];
      const float dqe[8] = {dqa.x, dqa.y, dqa.z, dqa.w, dqb.x, dqb.y, dqb.z, dqb.w};
      const float dke[8] = {dka.x, dka.y, dka.z, dka.w, dkb.x, dkb.y, dkb.z, dkb.w};
      const T* qe = reinterpret_cast<const T*>(&qv);
      const T* ke = reinterpret_cast<const T*>(&kv);
      uint4 dqo, dko;
      T* dqoe = reinterpret_cast<T*>(&dqo);
      T* dkoe = reinterpret_cast<T*>(&dko);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        acc += Ty<T>::f(qe[e]) * dqe[e] - Ty<T>::f(ke[e]) * dke[e];
        dqoe[e] = Ty<T>::from(dqe[e]);
        dkoe[e] = Ty<T>::from(dke[e]);
      }
      if (dq_out) *reinterpret_cast<uint4*>(dq_out + off) = dqo;
      if (dk_out) *reinterpret_cast<uint4*>(dk_out + off) = dko;
    }
    for (int o = tpr / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (sub == 0) {
      const size_t g = (size_t(bi) * T_ + t) * H + h;
      xs[r] = t < T_ ? (xdot ? xdot[g] : acc) + y[g] + (x2 ? x2[g] : 0.f) : 0.f;
      ys[r] = t < T_ ? y[g] : 0.f;
    }
  }
  __syncthreads();
  if (threadIdx.x >= 32) return;
  const int lane = threadIdx.x, i0 = 2 * lane, i1 = i0 + 1;
  // suffix sums of x over lanes ≥ lane (pairs), prefix sums of y over lanes ≤ lane
  float sx = xs[i0] + xs[i1], py = ys[i0] + ys[i1];
  for (int o = 1; o < 32; o <<= 1) {
    const float a = __shfl_down_sync(0xffffffffu, sx, o), b2 = __shfl_up_sync(0xffffffffu, py, o);
    if (lane + o < 32) sx += a;
    if (lane >= o) py += b2;
  }
  const float sx_next = __shfl_down_sync(0xffffffffu, sx, 1), py_prev = __shfl_up_sync(0xffffffffu, py, 1);
  const float suffix1 = xs[i1] + (lane < 31 ? sx_next : 0.f);  // Σ_{i ≥ i1} x_i
  const float prefix0 = lane > 0 ? py_prev : 0.f;               // Σ_{j < i0} y_j
  const float zc = z[(size_t(bi) * NT + c) * H + h];
  const int t0 = c * kC + i0;
  if (t0 < T_) dg[(size_t(bi) * T_ + t0) * H + h] = sx + prefix0 + zc;
  if (t0 + 1 < T_) dg[(size_t(bi) * T_ + t0 + 1) * H + h] = suffix1 + prefix0 + ys[i0] + zc;
}

MIXBENCH_PER_CHUNK_KERNEL(DqkvKernel, dqkv_kernel, dqkv_smem)
struct DqkvDotsKernel {
  template <typename T, int K, int V>
  static constexpr size_t smem() { return dqkv_smem<T, K, V>(); }
  template <typename T, int K, int V>
  static auto kernel() { return dqkv_kernel<T, K, V, true>; }
};

}  // namespace

void decay_grad(Dtype dt, const void* q, const float* dqf, const void* k, const float* dkf, const float* y,
                const float* z, const float* x2, float* dg, void* dq, void* dk, Dims d, void* stream,
                const float* xdot) {
  check_grid(d);
  const int NT = num_chunks(d.T);
  const long long n = (long long)d.B * NT * d.H;
  if (n == 0) return;
  if (n > 0x7fffffffLL) throw std::invalid_argument("decay_grad: B·T/64·H too large");
  by_dtype(dt, [&](auto t) {
    using T = decltype(t);
    decay_grad_kernel<T><<<unsigned(n), 256, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const T*>(q), dqf, static_cast<const T*>(k), dkf, y, z, x2, xdot, dg, static_cast<T*>(dq),
        static_cast<T*>(dk), d.T, d.H, d.K, NT);
  });
  check_launch("decay_grad");
}

void chunk_dqkv(Dtype dt, const void* q, const void* k, const void* v, const void* d_o, const float* b,
                const void* hs, const void* dhs, float* dqf, float* dkf, void* dv, float* y, float* z, float scale,
                Dims d, void* stream, void* dq, void* dk, float* xdot) {
  check_grid(d);
  if (xdot && !dq) throw std::invalid_argument("chunk_dqkv: the row dots need dq in the input dtype");
  const int NT = num_chunks(d.T);
  DqkvArgs a{q, k, v, d_o, b, hs, dhs, dqf, dkf, dv, y, z, scale, d.B, d.T, d.H, d.K, d.V, NT, NT * kC, dq, dk, xdot};
  if (xdot) launch_per_chunk<DqkvDotsKernel>(dt, a, d, NT, stream, "chunk_dqkv");
  else launch_per_chunk<DqkvKernel>(dt, a, d, NT, stream, "chunk_dqkv");
}

}  // namespace mixbench::linear::tc
