// The state walks of the tensor-core chunk kernels (interface in chunk_kernels.h), sequential over
// the chunks of every (b, h):
//   walk_fwd     one CTA per (b, h, V tile of BV columns) walks the chunks in order; its state tile
//                S [K × BV] lives in accumulator fragments for the whole walk (fp32), is written
//                per chunk to hs (input dtype) and updated with one K×64×BV product per chunk.
//                The next chunk's k, v (and w) tiles are fetched with cp.async while the current
//                one is processed (double buffer). The delta rule adds v_new = u − w·S first
//                (S rounded to the input dtype, as the chunk output uses it).
//   walk_bwd     the same walk in reverse for the state gradient of simple_gla.
//   walk_bwd_delta  the reverse walk of the delta rule's state gradient (du per chunk on the way).

#include "mixers/linear/chunk_launch.cuh"
#include "mixers/linear/chunk_state.cuh"
#include "mixers/linear/chunk_tiles.cuh"

#include <stdexcept>

namespace mixbench::linear::tc {
namespace {

struct WalkArgs {
  const void* key;  // k (forward) or q (backward)
  const void* val;  // v / u (forward) or do (backward)
  const void* w;    // delta rule only
  const float* b;
  const float* s0;  // h0 or dht, may be null
  void* hs;
  void* vnew;
  float* sT;
  float scale;
  int B, T, H, K, V, NT, Tp;
};

template <typename T, int K, int BV, bool DELTA, int NS>
constexpr size_t walk_smem() {
  return sizeof(T) * (NS * (kC * (K + 8) + kC * (BV + 8) + (DELTA ? kC * (K + 8) : 0)) + K * (BV + 8)) +
         sizeof(float) * NS * kC;
}

// The rounded state tile sb [K][ldv] (BV columns) to global memory (ld ldg) in 16-byte pieces.
template <typename T, int K, int BV, int NTH>
__device__ __forceinline__ void copy_state(T* dst, int ldg, const T* sb, int ldv) {
  constexpr int SEG = BV / 8;
  for_pieces<K * SEG, NTH>([&](int idx) {
    const int r = idx / SEG, s = idx % SEG;
    *reinterpret_cast<uint4*>(dst + size_t(r) * ldg + s * 8) = *reinterpret_cast<const uint4*>(sb + r * ldv + s * 8);
  });
}

// K/16 warps; warp w owns rows w·16 … +15 of the state tile S [K × BV] (BV/16 fragments). NS chunks
// of k, v (and w) in flight: chunk n + NS − 1 is requested while chunk n is processed, into the buffer
// of chunk n − 1, which every thread has finished with once it passes step n's first barrier.
// The per-chunk states leave through shared memory (sb) in 16-byte pieces, and so does v_new (delta
// rule), staged over the chunk's w tile after one more barrier: stores straight from the fragments
// write 16 bytes per row and instruction (measured 15–25 % slower walks on an H200).
template <typename T, int K, int BV, bool DELTA, bool REV, int NS>
__global__ void __launch_bounds__(K * 2) walk_kernel(WalkArgs a) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int LDK = K + 8, LDV = BV + 8, CT = BV / 16, NW = K / 16, NTH = K * 2;
  static_assert(NW * 32 == K * 2 && NS >= 2, "one warp per 16 state rows");
  T* kbuf = reinterpret_cast<T*>(smem);
  T* vbuf = kbuf + NS * kC * LDK;
  T* wbuf = vbuf + NS * kC * LDV;
  T* sb = wbuf + (DELTA ? NS * kC * LDK : 0);
  float* bbuf = reinterpret_cast<float*>(sb + K * LDV);  // NS × 64 cumulative gates

  const int H = a.H, T_ = a.T, V = a.V, NT = a.NT;
  const int bh = blockIdx.y, bi = bh / H, h = bh % H, v0 = blockIdx.x * BV;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const T* key = static_cast<const T*>(a.key);
  const T* val = static_cast<const T*>(a.val);
  const T* wg = static_cast<const T*>(a.w);
  T* hs = static_cast<T*>(a.hs);
  T* vnew = static_cast<T*>(a.vnew);

  Acc S[CT];
  const size_t sbase = size_t(bh) * K * V + v0;
  init_state<CT>(S, a.s0, sbase, V, warp);

  // Step n's chunk into buffer n mod NS; one commit group per step, empty past the last chunk.
  auto issue = [&](int n) {
    if (n < NT) {
      const int c = REV ? NT - 1 - n : n, buf = n % NS;
      load_rows<T, K, NTH>(kbuf + buf * kC * LDK, key, bi, h, c, T_, H, K, 0);
      load_rows<T, BV, NTH>(vbuf + buf * kC * LDV, val, bi, h, c, T_, H, V, v0);
      if (DELTA) load_rows<T, K, NTH>(wbuf + buf * kC * LDK, wg, bi, h, c, T_, H, K, 0);
      if (threadIdx.x < kC)
        cp_async4(bbuf + buf * kC + threadIdx.x, a.b + (size_t(bi) * a.Tp + size_t(c) * kC + threadIdx.x) * H + h);
    }
    cp_async_commit();
  };
#pragma unroll
  for (int n = 0; n < NS - 1; ++n) issue(n);
  for (int n = 0; n < NT; ++n) {
    const int c = REV ? NT - 1 - n : n, buf = n % NS;
    cp_async_wait<NS - 2>();
    __syncthreads();
    issue(n + NS - 1);
    const float* bc = bbuf + buf * kC;
    const float bL = bc[kC - 1];
    T* ks = kbuf + buf * kC * LDK;
    T* vs = vbuf + buf * kC * LDV;

    // 1. the state entering this step goes to hs[c] (and to sb for the delta rule), from registers
    T* hsc = hs + (size_t(bh) * NT + c) * K * V + v0;
    store_state<T, CT>(S, nullptr, 0, sb, LDV, warp, lane);
    if constexpr (!DELTA) {
      // 2. row factors on the values: e^{b_L − b_j} (forward) or scale·e^{b_j} (backward)
      for_pieces<kC * BV / 2, NTH>([&](int idx) {
        const int r = idx / (BV / 2), col = (idx % (BV / 2)) * 2;
        const float f = REV ? a.scale * __expf(bc[r]) : __expf(bL - bc[r]);
        T* e = vs + r * LDV + col;
        store2<T>(e, Ty<T>::f(e[0]) * f, Ty<T>::f(e[1]) * f);
      });
    } else {
      __syncthreads();
      copy_state<T, K, BV, NTH>(hsc, V, sb, LDV);
      // 3. v_new = u − w·S for this V tile (stored unscaled), then e^{b_L − b_j} on its rows: warp
      //    (r, g) owns rows r·16 … +15 and column group g of NG
      constexpr int NG = NW / 4, GCT = CT / NG;
      static_assert(GCT >= 1 && CT % NG == 0, "every warp owns whole column tiles");
      const int r = warp % 4, g = warp / 4;
      T* ws = wbuf + buf * kC * LDK;
      Acc P[GCT];
      rows_times_state<T, K, GCT>(P, ws, LDK, sb + g * GCT * 16, LDV, r);
      __syncthreads();  // every warp is done with w: v_new is staged there
#pragma unroll
      for (int ct = 0; ct < GCT; ++ct)
#pragma unroll
        for (int i = 0; i < 8; i += 2) {
          const int row = r * 16 + acc_row(i, lane), col = (g * GCT + ct) * 16 + acc_col(i, lane);
          const float f = __expf(bL - bc[row]);
          T* e = vs + row * LDV + col;
          const float y0 = Ty<T>::f(Ty<T>::from(Ty<T>::f(e[0]) - P[ct].x[i]));
          const float y1 = Ty<T>::f(Ty<T>::from(Ty<T>::f(e[1]) - P[ct].x[i + 1]));
          store2<T>(ws + row * LDK + col, y0, y1);
          store2<T>(e, y0 * f, y1 * f);
        }
    }
    __syncthreads();
    if constexpr (!DELTA) copy_state<T, K, BV, NTH>(hsc, V, sb, LDV);
    else store_rows<T, BV, NTH>(vnew, wbuf + buf * kC * LDK, LDK, bi, h, c, T_, H, V, v0);
    // 4. S ← e^{b_L} S + keysᵀ · (scaled values)
    state_update<T, CT>(S, __expf(bL), ks + warp * 16, LDK, vs, LDV);
  }
#pragma unroll
  for (int ct = 0; ct < CT; ++ct)
    wmma::store_matrix_sync(a.sT + sbase + size_t(warp) * 16 * V + ct * 16, S[ct], V, wmma::mem_row_major);
}

struct DeltaBwdArgs {
  const void *q, *d_o, *k, *w, *dvl;
  const float* b;
  const float* dht;
  void* dhs;
  void* du;
  float* dh0;
  float scale;
  int B, T, H, K, V, NT, Tp;
};

template <typename T, int K, int BV>
constexpr size_t delta_bwd_smem() {
  return sizeof(T) * (2 * (3 * kC * (K + 8) + 2 * kC * (BV + 8)) + K * (BV + 8) + kC * (BV + 8)) +
         sizeof(float) * 3 * kC;
}

// Reverse walk of the delta rule's state gradient: one CTA per (b, h, V tile of BV columns), K/16
// warps, warp w owning rows w·16 … +15 of dS [K × BV] (fp32 fragments for the whole walk). Per chunk,
// last to first (the next chunk's q, k, w, do, dv_local, b arriving meanwhile):
//   1. dS (the gradient of the state at the chunk's end), rounded, to shared memory; do ← scale·e^{b} ⊙ do;
//   2. dS ← e^{b_L} dS + qᵀ do; du = dv_local + e^{b_L − b} ⊙ (k dS_end), rounded to the input dtype,
//      negated into shared memory (warp (r, g): rows r·16 … +15, column group g); dS_end → dhs[c];
//   3. du → global memory; dS ← dS − wᵀ du.
// dhs and du leave in 16-byte pieces from shared memory (du with its sign bits flipped back).
template <typename T, int K, int BV>
__global__ void __launch_bounds__(K * 2) delta_walk_bwd_kernel(DeltaBwdArgs a) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int LDK = K + 8, LDV = BV + 8, CT = BV / 16, NW = K / 16, NTH = K * 2;
  constexpr int NG = NW / 4, GCT = CT / NG;
  static_assert(GCT >= 1 && CT % NG == 0, "every warp owns whole column tiles of du");
  T* qbuf = reinterpret_cast<T*>(smem);
  T* kbuf = qbuf + 2 * kC * LDK;
  T* wbuf = kbuf + 2 * kC * LDK;
  T* dobuf = wbuf + 2 * kC * LDK;
  T* dvbuf = dobuf + 2 * kC * LDV;
  T* sb = dvbuf + 2 * kC * LDV;
  T* dub = sb + K * LDV;
  float* rowr = reinterpret_cast<float*>(dub + kC * LDV);  // e^{b_L − b_j}
  float* bbuf = rowr + kC;                                 // 2 × 64 cumulative gates

  const int H = a.H, T_ = a.T, V = a.V, NT = a.NT;
  const int bh = blockIdx.y, bi = bh / H, h = bh % H, v0 = blockIdx.x * BV;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, r = warp % 4, g = warp / 4;
  T* dhs = static_cast<T*>(a.dhs);

  Acc S[CT];
  const size_t sbase = size_t(bh) * K * V + v0;
  init_state<CT>(S, a.dht, sbase, V, warp);
  auto issue = [&](int c, int buf) {
    load_rows<T, K, NTH>(qbuf + buf * kC * LDK, static_cast<const T*>(a.q), bi, h, c, T_, H, K, 0);
    load_rows<T, K, NTH>(kbuf + buf * kC * LDK, static_cast<const T*>(a.k), bi, h, c, T_, H, K, 0);
    load_rows<T, K, NTH>(wbuf + buf * kC * LDK, static_cast<const T*>(a.w), bi, h, c, T_, H, K, 0);
    load_rows<T, BV, NTH>(dobuf + buf * kC * LDV, static_cast<const T*>(a.d_o), bi, h, c, T_, H, V, v0);
    load_rows<T, BV, NTH>(dvbuf + buf * kC * LDV, static_cast<const T*>(a.dvl), bi, h, c, T_, H, V, v0);
    if (threadIdx.x < kC)
      cp_async4(bbuf + buf * kC + threadIdx.x, a.b + (size_t(bi) * a.Tp + size_t(c) * kC + threadIdx.x) * H + h);
    cp_async_commit();
  };
  issue(NT - 1, 0);
  for (int n = 0; n < NT; ++n) {
    const int c = NT - 1 - n, buf = n & 1;
    if (n + 1 < NT) {
      issue(c - 1, buf ^ 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const float* bc = bbuf + buf * kC;
    const float bL = bc[kC - 1];
    if (threadIdx.x < kC) rowr[threadIdx.x] = __expf(bL - bc[threadIdx.x]);
    const T* qs = qbuf + buf * kC * LDK;
    const T* ks = kbuf + buf * kC * LDK;
    const T* ws = wbuf + buf * kC * LDK;
    T* dos = dobuf + buf * kC * LDV;
    const T* dvs = dvbuf + buf * kC * LDV;
    // 1. dS → sb; do ← scale·e^{b} ⊙ do
    store_state<T, CT>(S, nullptr, 0, sb, LDV, warp, lane);
    for_pieces<kC * BV / 2, NTH>([&](int idx) {
      const int row = idx / (BV / 2), col = (idx % (BV / 2)) * 2;
      const float f = a.scale * __expf(bc[row]);
      T* e = dos + row * LDV + col;
      store2<T>(e, Ty<T>::f(e[0]) * f, Ty<T>::f(e[1]) * f);
    });
    __syncthreads();
    // 2. dS ← e^{b_L} dS + qᵀ (scale·e^{b} ⊙ do); du = dv_local + e^{b_L − b} ⊙ (k dS_end) → dub = −du
    state_update<T, CT>(S, __expf(bL), qs + warp * 16, LDK, dos, LDV);
    {
      Acc P[GCT];
      rows_times_state<T, K, GCT>(P, ks, LDK, sb + g * GCT * 16, LDV, r);
#pragma unroll
      for (int ct = 0; ct < GCT; ++ct)
#pragma unroll
        for (int i = 0; i < 8; i += 2) {
          const int row = r * 16 + acc_row(i, lane), col = (g * GCT + ct) * 16 + acc_col(i, lane);
          const float f = rowr[row];
          const T* e = dvs + row * LDV + col;
          const float y0 = Ty<T>::f(Ty<T>::from(Ty<T>::f(e[0]) + f * P[ct].x[i]));
          const float y1 = Ty<T>::f(Ty<T>::from(Ty<T>::f(e[1]) + f * P[ct].x[i + 1]));
          store2<T>(dub + row * LDV + col, -y0, -y1);
        }
    }
    copy_state<T, K, BV, NTH>(dhs + (size_t(bh) * NT + c) * K * V + v0, V, sb, LDV);
    __syncthreads();
    // 3. du (the negation of dub, exact: the sign bits) → global; dS ← dS − wᵀ du
    {
      constexpr int SEG = BV / 8;
      T* row0 = chunk_row0(static_cast<T*>(a.du), bi, h, c, T_, H, V, v0);
      const int rows_left = T_ - c * kC;
      for_pieces<kC * SEG, NTH>([&](int idx) {
        const int row = idx / SEG, sg = idx % SEG;
        if (row < rows_left) {
          uint4 x = *reinterpret_cast<const uint4*>(dub + row * LDV + sg * 8);
          x.x ^= 0x80008000u;
          x.y ^= 0x80008000u;
          x.z ^= 0x80008000u;
          x.w ^= 0x80008000u;
          *reinterpret_cast<uint4*>(row0 + size_t(row) * H * V + sg * 8) = x;
        }
      });
    }
    mma_span<ACol<T>, BRow<T>>(S, ws + warp * 16, 16 * LDK, LDK, dub, 16 * LDV, 16, LDV, 0, kC / 16);
    __syncthreads();
  }
#pragma unroll
  for (int ct = 0; ct < CT; ++ct)
    wmma::store_matrix_sync(a.dh0 + sbase + size_t(warp) * 16 * V + ct * 16, S[ct], V, wmma::mem_row_major);
}

template <typename T, int K, int BV, bool DELTA, bool REV>
void launch_walk(const WalkArgs& a, cudaStream_t s) {
  constexpr size_t sm = walk_smem<T, K, BV, DELTA, kWalkStages>();
  auto kern = walk_kernel<T, K, BV, DELTA, REV, kWalkStages>;
  set_smem(kern, sm);
  kern<<<dim3(a.V / BV, a.B * a.H), K * 2, sm, s>>>(a);
}
template <typename T, int K, bool DELTA, bool REV>
void walk_bv(const WalkArgs& a, cudaStream_t s) {
  if (walk_tile(Dims{a.B, a.T, a.H, a.K, a.V}) == 32) launch_walk<T, K, 32, DELTA, REV>(a, s);
  else launch_walk<T, K, 64, DELTA, REV>(a, s);
}
template <typename T, bool DELTA, bool REV>
void walk_dispatch(const WalkArgs& a, cudaStream_t s) {
  if (a.K == 64) walk_bv<T, 64, DELTA, REV>(a, s);
  else walk_bv<T, 128, DELTA, REV>(a, s);
}

}  // namespace

void walk_fwd(Dtype dt, const void* k, const void* v, const void* w, const float* b, const float* h0, void* hs,
              void* vnew, float* ht, Dims d, void* stream) {
  check_grid(d);
  const int NT = num_chunks(d.T);
  WalkArgs a{k, v, w, b, h0, hs, vnew, ht, 1.f, d.B, d.T, d.H, d.K, d.V, NT, NT * kC};
  auto s = static_cast<cudaStream_t>(stream);
  by_dtype(dt, [&](auto t) {
    using T = decltype(t);
    if (w) walk_dispatch<T, true, false>(a, s);
    else walk_dispatch<T, false, false>(a, s);
  });
  check_launch("walk_fwd");
}

void walk_bwd(Dtype dt, const void* q, const void* d_o, const float* b, const float* dht, void* dhs, float* dh0,
              float scale, Dims d, void* stream) {
  check_grid(d);
  const int NT = num_chunks(d.T);
  WalkArgs a{q, d_o, nullptr, b, dht, dhs, nullptr, dh0, scale, d.B, d.T, d.H, d.K, d.V, NT, NT * kC};
  auto s = static_cast<cudaStream_t>(stream);
  by_dtype(dt, [&](auto t) { walk_dispatch<decltype(t), false, true>(a, s); });
  check_launch("walk_bwd");
}

void walk_bwd_delta(Dtype dt, const void* q, const void* d_o, const void* k, const void* w, const void* dvl,
                    const float* b, const float* dht, void* dhs, void* du, float* dh0, float scale, Dims d,
                    void* stream) {
  check_grid(d);
  const int NT = num_chunks(d.T);
  DeltaBwdArgs a{q, d_o, k, w, dvl, b, dht, dhs, du, dh0, scale, d.B, d.T, d.H, d.K, d.V, NT, NT * kC};
  auto s = static_cast<cudaStream_t>(stream);
  by_dtype(dt, [&](auto t) {
    using T = decltype(t);
    auto go = [&](auto kc, auto bvc) {
      constexpr int K = decltype(kc)::value, BV = decltype(bvc)::value;
      constexpr size_t sm = delta_bwd_smem<T, K, BV>();
      auto kern = delta_walk_bwd_kernel<T, K, BV>;
      set_smem(kern, sm);
      kern<<<dim3(d.V / BV, d.B * d.H), K * 2, sm, s>>>(a);
    };
    const bool narrow = delta_bwd_tile(d) == 32;
    auto pk = [&](auto kc) {
      if (narrow) go(kc, std::integral_constant<int, 32>{});
      else go(kc, std::integral_constant<int, 64>{});
    };
    if (d.K == 64) pk(std::integral_constant<int, 64>{});
    else pk(std::integral_constant<int, 128>{});
  });
  check_launch("walk_bwd_delta");
}

}  // namespace mixbench::linear::tc
