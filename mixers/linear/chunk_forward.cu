// The forward kernels of the tensor-core chunk kernels (interface in chunk_kernels.h):
//   chunk_output one CTA per (chunk, V tile, b·h), all chunks in parallel: A = q kᵀ, masked and
//                decayed in fp32, rounded, then o = e^{b}·scale·(q h) + A v. Each warp owns 16 rows.
//   fused_fwd    one CTA per (b, h, V tile) walks the chunks with the state in fragments and writes
//                the outputs on the way (no per-chunk states in global memory).
//   chunk_cumsum the cumulative gates inside each chunk, one thread per (b, chunk, h).

#include "mixers/linear/chunk_launch.cuh"
#include "mixers/linear/chunk_scores.cuh"
#include "mixers/linear/chunk_state.cuh"
#include "mixers/linear/chunk_tiles.cuh"

#include <stdexcept>

namespace mixbench::linear::tc {
namespace {

struct OutArgs {
  const void *q, *k, *v;
  const float* b;
  const void* hs;
  void* o;
  float scale;
  int B, T, H, K, V, NT, Tp;
};

template <typename T, int K, int VT>
constexpr size_t out_smem() {
  return sizeof(T) * (2 * kC * (K + 8) + kC * (VT + 8) + K * (VT + 8) + kC * (kC + 8)) + sizeof(float) * kC;
}

// One CTA per (chunk, V tile of VT columns, b·h), 8 warps: warp (r = w mod 4, hf = w / 4) owns rows
// r·16 … +15 and half of the tile's columns of o; A's lower tiles of row r are split between the two
// warps of the row (a CTA per V tile forms A again: less shared memory per CTA, more CTAs per SM).
// q and k arrive first (A is formed while v and h are still loading).
template <typename T, int K, int VT>
__global__ void __launch_bounds__(256) output_kernel(OutArgs a) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int LDK = K + 8, LDV = VT + 8, LDB = kC + 8, NCT = VT / 32;
  T* qs = reinterpret_cast<T*>(smem);
  T* ks = qs + kC * LDK;
  T* vs = ks + kC * LDK;
  T* hsm = vs + kC * LDV;
  T* ab = hsm + K * LDV;
  float* rowb = reinterpret_cast<float*>(ab + kC * LDB);

  const int H = a.H, T_ = a.T, NT = a.NT, V = a.V, nvt = V / VT;
  const int c = blockIdx.x / nvt, v0 = (blockIdx.x % nvt) * VT, bh = blockIdx.y, bi = bh / H, h = bh % H;
  const int wi = threadIdx.x / 32, lane = threadIdx.x % 32, r = wi & 3, hf = wi >> 2;
  load_rows<T, K>(qs, static_cast<const T*>(a.q), bi, h, c, T_, H, K, 0);
  load_rows<T, K>(ks, static_cast<const T*>(a.k), bi, h, c, T_, H, K, 0);
  cp_async_commit();
  load_rows<T, VT>(vs, static_cast<const T*>(a.v), bi, h, c, T_, H, V, v0);
  load_mat<T, K, VT>(hsm, static_cast<const T*>(a.hs) + (size_t(bh) * NT + c) * K * V + v0, V);
  cp_async_commit();
  if (threadIdx.x < kC) rowb[threadIdx.x] = a.b[(size_t(bi) * a.Tp + size_t(c) * kC + threadIdx.x) * H + h];
  cp_async_wait<1>();
  __syncthreads();

  decayed_scores<T, K>(qs, ks, LDK, rowb, a.scale, ab, LDB, r, hf, lane);
  cp_async_wait<0>();
  __syncthreads();

  const int ct0 = hf * NCT;
  Acc P[NCT];
  const float f0 = __expf(rowb[r * 16 + (lane >> 2)]) * a.scale, f1 = __expf(rowb[r * 16 + (lane >> 2) + 8]) * a.scale;
  chunk_rows<T, K, NCT>(P, qs, LDK, hsm, LDV, ab, LDB, vs, LDV, f0, f1, r, ct0);
  // o leaves through shared memory (over q and k, which every warp is done with after the barrier)
  // in 16-byte pieces: stores straight from the fragments write 16 bytes per row and instruction.
  static_assert(kC * LDV <= 2 * kC * LDK, "the output tile fits over q and k");
  __syncthreads();
  stage_chunk_rows<T, NCT>(P, qs, LDV, r, ct0, lane);
  __syncthreads();
  store_rows<T, VT>(static_cast<T*>(a.o), qs, LDV, bi, h, c, T_, H, V, v0);
}

struct FusedArgs {
  const void *q, *k, *v, *w;  // v: v (simple_gla) or u (delta rule, with w)
  const float* b;
  const float* h0;
  void* o;
  float* ht;
  float scale;
  int B, T, H, K, V, NT, Tp;
};

template <typename T, int K, int BV, bool DELTA>
constexpr size_t fused_smem() {
  return sizeof(T) * ((DELTA ? 6 : 4) * kC * (K + 8) + 3 * kC * (BV + 8) + K * (BV + 8) + kC * (kC + 8)) +
         sizeof(float) * 4 * kC;
}

// Forward in one pass: one CTA per (b, h, V tile), 8 warps, walking the chunks in order with the
// state tile S [K × BV] in accumulator fragments. Per chunk (the next chunk's q, k, v, w, b arriving
// meanwhile): S is rounded into shared memory, A = q kᵀ (masked, decayed, scaled), [delta rule:
// v ← u − w S], o = e^{b}·scale·(q S) + A v is stored, and S ← e^{b_L} S + kᵀ (e^{b_L − b} ⊙ v).
// No per-chunk state goes to global memory.
template <typename T, int K, int BV, bool DELTA>
__global__ void __launch_bounds__(256) fused_fwd_kernel(FusedArgs a) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int LDK = K + 8, LDV = BV + 8, LDB = kC + 8;
  constexpr int SR = K / 16, WPR = 8 / SR, SCT = (BV / 16) / WPR, NCT = BV / 32;
  T* qbuf = reinterpret_cast<T*>(smem);
  T* kbuf = qbuf + 2 * kC * LDK;
  T* wbuf = kbuf + 2 * kC * LDK;
  T* vbuf = wbuf + (DELTA ? 2 * kC * LDK : 0);
  T* vsc = vbuf + 2 * kC * LDV;
  T* sb = vsc + kC * LDV;
  T* ab = sb + K * LDV;
  float* rowf = reinterpret_cast<float*>(ab + kC * LDB);  // e^{b_L − b_j}
  float* rowe = rowf + kC;                                // e^{b_j}·scale
  float* bbuf = rowe + kC;                                // 2 × 64 cumulative gates

  const int H = a.H, T_ = a.T, V = a.V, NT = a.NT;
  const int bh = blockIdx.y, bi = bh / H, h = bh % H, v0 = blockIdx.x * BV;
  const int wi = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int srow = wi % SR, scol0 = (wi / SR) * SCT;  // state fragments of this warp
  const int r = wi & 3, hf = wi >> 2;                  // output rows / column half of this warp

  Acc S[SCT];
  const size_t sbase = size_t(bh) * K * V + v0;
#pragma unroll
  for (int n = 0; n < SCT; ++n) {
    if (a.h0)
      wmma::load_matrix_sync(S[n], a.h0 + sbase + size_t(srow) * 16 * V + (scol0 + n) * 16, V, wmma::mem_row_major);
    else
      wmma::fill_fragment(S[n], 0.f);
  }
  auto issue = [&](int c, int buf) {
    load_rows<T, K>(qbuf + buf * kC * LDK, static_cast<const T*>(a.q), bi, h, c, T_, H, K, 0);
    load_rows<T, K>(kbuf + buf * kC * LDK, static_cast<const T*>(a.k), bi, h, c, T_, H, K, 0);
    if (DELTA) load_rows<T, K>(wbuf + buf * kC * LDK, static_cast<const T*>(a.w), bi, h, c, T_, H, K, 0);
    load_rows<T, BV>(vbuf + buf * kC * LDV, static_cast<const T*>(a.v), bi, h, c, T_, H, V, v0);
    if (threadIdx.x < kC)
      cp_async4(bbuf + buf * kC + threadIdx.x, a.b + (size_t(bi) * a.Tp + size_t(c) * kC + threadIdx.x) * H + h);
    cp_async_commit();
  };
  T* o = static_cast<T*>(a.o);
  issue(0, 0);
  for (int c = 0; c < NT; ++c) {
    const int buf = c & 1;
    if (c + 1 < NT) {
      issue(c + 1, buf ^ 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const T* qs = qbuf + buf * kC * LDK;
    const T* ks = kbuf + buf * kC * LDK;
    const T* ws = wbuf + buf * kC * LDK;
    T* vs = vbuf + buf * kC * LDV;
    const float* bc = bbuf + buf * kC;
    const float bL = bc[kC - 1];
    if (threadIdx.x < kC) {
      rowf[threadIdx.x] = __expf(bL - bc[threadIdx.x]);
      rowe[threadIdx.x] = __expf(bc[threadIdx.x]) * a.scale;
    }
    // S → sb (input dtype), A → ab
#pragma unroll
    for (int n = 0; n < SCT; ++n)
#pragma unroll
      for (int i = 0; i < 8; i += 2) {
        const int row = srow * 16 + acc_row(i, lane), col = (scol0 + n) * 16 + acc_col(i, lane);
        store2<T>(sb + row * LDV + col, S[n].x[i], S[n].x[i + 1]);
      }
    decayed_scores<T, K>(qs, ks, LDK, bc, a.scale, ab, LDB, r, hf, lane);
    __syncthreads();
    if constexpr (DELTA) {
      // v ← u − w·S (rounded to the input dtype, as the unfused path stores it), vsc ← e^{b_L − b} ⊙ v
      Acc P[NCT];
#pragma unroll
      for (int n = 0; n < NCT; ++n) wmma::fill_fragment(P[n], 0.f);
#pragma unroll
      for (int kk = 0; kk < K / 16; ++kk) {
        ARow<T> fa;
        wmma::load_matrix_sync(fa, ws + r * 16 * LDK + kk * 16, LDK);
#pragma unroll
        for (int n = 0; n < NCT; ++n) {
          BRow<T> fb;
          wmma::load_matrix_sync(fb, sb + kk * 16 * LDV + (hf * NCT + n) * 16, LDV);
          wmma::mma_sync(P[n], fa, fb, P[n]);
        }
      }
#pragma unroll
      for (int n = 0; n < NCT; ++n)
#pragma unroll
        for (int i = 0; i < 8; i += 2) {
          const int row = r * 16 + acc_row(i, lane), col = (hf * NCT + n) * 16 + acc_col(i, lane);
          T* e = vs + row * LDV + col;
          const float y0 = Ty<T>::f(Ty<T>::from(Ty<T>::f(e[0]) - P[n].x[i]));
          const float y1 = Ty<T>::f(Ty<T>::from(Ty<T>::f(e[1]) - P[n].x[i + 1]));
          store2<T>(e, y0, y1);
          store2<T>(vsc + row * LDV + col, y0 * rowf[row], y1 * rowf[row]);
        }
    } else {
      for (int idx = threadIdx.x; idx < kC * BV / 2; idx += blockDim.x) {
        const int row = idx / (BV / 2), col = (idx % (BV / 2)) * 2;
        store2<T>(vsc + row * LDV + col, Ty<T>::f(vs[row * LDV + col]) * rowf[row],
                  Ty<T>::f(vs[row * LDV + col + 1]) * rowf[row]);
      }
    }
    __syncthreads();
    // o = e^{b}·scale·(q S) + A v for rows r·16 … +15, columns of half hf
    {
      Acc P[NCT];
      const float f0 = rowe[r * 16 + (lane >> 2)], f1 = rowe[r * 16 + (lane >> 2) + 8];
      chunk_rows<T, K, NCT>(P, qs, LDK, sb, LDV, ab, LDB, vs, LDV, f0, f1, r, hf * NCT);
      store_chunk_rows<T, NCT>(P, o, bi, h, c, T_, H, V, v0, r, hf * NCT, lane);
    }
    // S ← e^{b_L} S + kᵀ vsc
    state_update<T, SCT>(S, __expf(bL), ks + srow * 16, LDK, vsc + scol0 * 16, LDV);
    __syncthreads();
  }
#pragma unroll
  for (int n = 0; n < SCT; ++n)
    wmma::store_matrix_sync(a.ht + sbase + size_t(srow) * 16 * V + (scol0 + n) * 16, S[n], V, wmma::mem_row_major);
}

// b[bi, c·64 + j, h] = Σ_{i ≤ j} g[bi, c·64 + i, h], g read as 0 past T: one thread per (bi, c, h),
// neighbouring threads on neighbouring heads.
__global__ void cumsum_kernel(const float* g, float* b, int B, int T, int H, int NT) {
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= B * NT * H) return;
  const int h = idx % H, c = (idx / H) % NT, bi = idx / (H * NT);
  const float* src = g + size_t(bi) * T * H + h;
  float* dst = b + size_t(bi) * NT * kC * H + h;
  float acc = 0.f;
#pragma unroll 16
  for (int j = 0; j < kC; ++j) {
    const int t = c * kC + j;
    if (t < T) acc += src[size_t(t) * H];
    dst[size_t(t) * H] = acc;
  }
}

}  // namespace

void chunk_cumsum(const float* g, float* b, int B, int T, int H, void* stream) {
  const int NT = num_chunks(T), n = B * NT * H;
  if (n == 0) return;
  cumsum_kernel<<<(n + 255) / 256, 256, 0, static_cast<cudaStream_t>(stream)>>>(g, b, B, T, H, NT);
  check_launch("chunk_cumsum");
}

void fused_fwd(Dtype dt, const void* q, const void* k, const void* v, const void* w, const float* b, const float* h0,
               void* o, float* ht, float scale, Dims d, void* stream) {
  check_grid(d);
  const int NT = num_chunks(d.T);
  FusedArgs a{q, k, v, w, b, h0, o, ht, scale, d.B, d.T, d.H, d.K, d.V, NT, NT * kC};
  auto s = static_cast<cudaStream_t>(stream);
  by_dtype(dt, [&](auto t) {
    using T = decltype(t);
    auto go = [&](auto kern, size_t sm, int bv) {
      set_smem(kern, sm);
      kern<<<dim3(d.V / bv, d.B * d.H), 256, sm, s>>>(a);
    };
    const bool split = fused_split(d);
    auto pick = [&](auto kc, auto delta) {
      constexpr int K = decltype(kc)::value;
      constexpr bool D = decltype(delta)::value;
      if (d.V == 64 || split) go(fused_fwd_kernel<T, K, 64, D>, fused_smem<T, K, 64, D>(), 64);
      else go(fused_fwd_kernel<T, K, 128, D>, fused_smem<T, K, 128, D>(), 128);
    };
    auto pk = [&](auto delta) {
      if (d.K == 64) pick(std::integral_constant<int, 64>{}, delta);
      else pick(std::integral_constant<int, 128>{}, delta);
    };
    if (w) pk(std::true_type{});
    else pk(std::false_type{});
  });
  check_launch("fused_fwd");
}

void chunk_output(Dtype dt, const void* q, const void* k, const void* v, const float* b, const void* hs, void* o,
                  float scale, Dims d, void* stream) {
  check_grid(d);
  const int NT = num_chunks(d.T);
  OutArgs a{q, k, v, b, hs, o, scale, d.B, d.T, d.H, d.K, d.V, NT, NT * kC};
  auto s = static_cast<cudaStream_t>(stream);
  const bool split = output_split(d);
  by_dtype(dt, [&](auto t) {
    using T = decltype(t);
    by_kv(d.K, d.V, [&](auto kc, auto vc) {
      constexpr int K = decltype(kc)::value, V = decltype(vc)::value;
      auto go = [&](auto kern, size_t sm, int nvt) {
        set_smem(kern, sm);
        kern<<<dim3(NT * nvt, d.B * d.H), 256, sm, s>>>(a);
      };
      if (V == 128 && split) go(output_kernel<T, K, 64>, out_smem<T, K, 64>(), 2);
      else go(output_kernel<T, K, V>, out_smem<T, K, V>(), 1);
    });
  });
  check_launch("chunk_output");
}

}  // namespace mixbench::linear::tc
