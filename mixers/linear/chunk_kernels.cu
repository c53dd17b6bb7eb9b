// Tensor-core kernels of the chunked linear-attention algorithm (interface and conventions in
// chunk_kernels.h). bf16 / fp16 operands through WMMA 16×16×16 (mma.sync), fp32 accumulation; bf16
// operand fragments are loaded from shared memory with ldmatrix (load_frag).
//
// Structure (the chunked algorithm split by what is sequential):
//   walk_fwd     one CTA per (b, h, V tile of BV columns) walks the chunks in order; its state tile
//                S [K × BV] lives in accumulator fragments for the whole walk (fp32), is written
//                per chunk to hs (input dtype) and updated with one K×64×BV product per chunk.
//                The next chunk's k, v (and w) tiles are fetched with cp.async while the current
//                one is processed (double buffer). The delta rule adds v_new = u − w·S first
//                (S rounded to the input dtype, as the chunk output uses it).
//   walk_bwd     the same walk in reverse for the state gradient of simple_gla.
//   chunk_output one CTA per (chunk, V tile, b·h), all chunks in parallel: A = q kᵀ, masked and
//                decayed in fp32, rounded, then o = e^{b}·scale·(q h) + A v. Each warp owns 16 rows.
//   chunk_dqkv   one CTA per (chunk, b·h), 8 warps: A and dA = do vᵀ, then dq, dk, dv as sums of an
//                inter-chunk product (with h or dh) and an intra-chunk one (with A or dA); on request
//                also the decay gradient's row dots, with dq / dk in the input dtype, and without
//                dv (then without A).
//   decay_grad   one CTA per (chunk, b·h): the row dots (or chunk_dqkv's), then the chunk's scans.
//   walk_bwd_delta  the reverse walk of the delta rule's state gradient (du per chunk on the way).
//   delta_dv_local  Pᵀ do per chunk (the state-free part of du).
//   delta_wy_bwd    one CTA per (chunk, b·h): the backward through w = X B_k, u = X B_v and the
//                inverse (dk, dv, dβ, the gates' direct gradient), bf16 / fp16 operands.
//   delta_prep   one CTA per (chunk, b·h): A = β k kᵀ ⊙ decay (strictly lower), X = (I + A)⁻¹ by
//                blocks of 16: the diagonal blocks by forward substitution in registers (one warp
//                each, right after its tile of A), the blocks below them as halves of 32 in four
//                rounds on tensor cores (tf32, split into high and low parts); then w and u as
//                products with X (rounded to the input dtype).
// The per-chunk states of the walks, the outputs of chunk_output and delta_prep, and the gradients
// of chunk_dqkv, delta_dv_local, walk_bwd_delta (du) and delta_wy_bwd (dv) leave through shared
// memory in 16-byte pieces per thread (stores straight from accumulator fragments write 16 bytes per
// row and instruction); delta_wy_bwd's dk, which adds chunk_dqkv's fp32 part, still stores from the
// fragments. Masking is a select before exp (exponents are ≤ 0 wherever they
// are used). Rows past T are read as zero (cp.async with source size 0) and never stored.
#include "mixers/linear/chunk_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <stdexcept>
#include <string>
#include <type_traits>

namespace mixbench::linear::tc {
namespace {

using namespace nvcuda;
constexpr int kC = 64;

template <typename T>
struct Ty;
template <>
struct Ty<__nv_bfloat16> {
  static __device__ __forceinline__ float f(__nv_bfloat16 x) { return __bfloat162float(x); }
  static __device__ __forceinline__ __nv_bfloat16 from(float x) { return __float2bfloat16(x); }
};
template <>
struct Ty<__half> {
  static __device__ __forceinline__ float f(__half x) { return __half2float(x); }
  static __device__ __forceinline__ __half from(float x) { return __float2half(x); }
};

using Acc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;
template <typename T>
using ARow = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major>;
template <typename T>
using ACol = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::col_major>;
template <typename T>
using BRow = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major>;
template <typename T>
using BCol = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major>;

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// f(idx) for this thread's share of idx = 0 … N−1 when NTH threads split them (unrolled).
template <int N, int NTH, typename F>
__device__ __forceinline__ void for_pieces(F&& f) {
#pragma unroll
  for (int j = 0; j < (N + NTH - 1) / NTH; ++j) {
    const int idx = threadIdx.x + j * NTH;
    if (N % NTH != 0 && idx >= N) break;
    f(idx);
  }
}
// Row c·64 of head h of a [B,T,H,D] tensor, from column col0.
template <typename T>
__device__ __forceinline__ T* chunk_row0(T* base, int bi, int h, int c, int T_, int H, int D, int col0) {
  return base + ((size_t(bi) * T_ + size_t(c) * kC) * H + h) * size_t(D) + col0;
}

// Rows t = c·64 … c·64+63 of head h of a [B,T,H,D] tensor, columns col0 … col0+W−1, into smem
// [64][W+8]; rows past T are zero-filled.
template <typename T, int W, int NTH = 256>
__device__ __forceinline__ void load_rows(T* sm, const T* base, int bi, int h, int c, int T_, int H, int D, int col0) {
  constexpr int SEG = W / 8, LD = W + 8;
  const T* row0 = chunk_row0(base, bi, h, c, T_, H, D, col0);
  const int stride = H * D, rows = T_ - c * kC;
  for_pieces<kC * SEG, NTH>([&](int idx) {
    const int r = idx / SEG, s = idx % SEG;
    const bool ok = r < rows;
    cp_async16(sm + r * LD + s * 8, ok ? row0 + size_t(r) * stride + s * 8 : base, ok);
  });
}
// An R × W block of a row-major matrix with leading dimension ld into smem [R][W+8].
template <typename T, int R, int W, int NTH = 256>
__device__ __forceinline__ void load_mat(T* sm, const T* src, int ld) {
  constexpr int SEG = W / 8, LD = W + 8;
  for_pieces<R * SEG, NTH>([&](int idx) {
    const int r = idx / SEG, s = idx % SEG;
    cp_async16(sm + r * LD + s * 8, src + size_t(r) * ld + s * 8, true);
  });
}

// Element i (0…7) of a 16×16 fp32 accumulator fragment held by `lane` sits at (acc_row, acc_col):
// the layout of mma.sync m16n8k16 (two n8 halves), which WMMA uses on sm_80 and later. The host side
// verifies it once on the device (layout_ok) before any kernel that relies on it runs.
__device__ __forceinline__ int acc_row(int i, int lane) { return (lane >> 2) + 8 * ((i >> 1) & 1); }
__device__ __forceinline__ int acc_col(int i, int lane) { return ((lane & 3) << 1) + (i & 1) + 8 * (i >> 2); }

// 16×16 operand fragments from shared memory with ldmatrix (WMMA's own loads take generic pointers and
// compile to 32-bit generic loads plus register transposes). Matrix q of the four 8×8 pieces goes to
// register q of the fragment, in the order of mma.sync m16n8k16's operands: A (rows m, cols k) as
// (m 0–7, k 0–7), (m 8–15, k 0–7), (m 0–7, k 8–15), (m 8–15, k 8–15); B (rows k, cols n) as (k 0–7,
// n 0–7), (k 8–15, n 0–7), (k 0–7, n 8–15), (k 8–15, n 8–15). Lane l gives the row address of matrix
// l / 8. The probe below checks them against wmma::load_matrix_sync once on the device (bf16 only).
template <bool TRANS>
__device__ __forceinline__ void ldsm_x4(unsigned* r, const void* p) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  if constexpr (TRANS)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
template <typename F>
__device__ __forceinline__ unsigned* regs(F& f) {
  static_assert(sizeof(f.x) == 16, "a bf16 16×16 operand fragment is four registers");
  return reinterpret_cast<unsigned*>(&f.x[0]);
}
// (row, column) offset of lane l's row in the stored matrix: the matrix index walks the stored rows
// in steps of 8 first (MAJOR 1) or second (MAJOR 2).
template <int MAJOR>
__device__ __forceinline__ int ldsm_offset(int ld) {
  const int l = threadIdx.x & 31, q = l >> 3, rq = MAJOR == 1 ? (q & 1) : (q >> 1), cq = MAJOR == 1 ? (q >> 1) : (q & 1);
  return ((l & 7) + 8 * rq) * ld + 8 * cq;
}
using BF = __nv_bfloat16;
// fp16 fragments keep WMMA's loads (their eight-register layout is not mma.sync's)
template <typename F, typename T>
__device__ __forceinline__ void load_frag(F& f, const T* p, int ld) { wmma::load_matrix_sync(f, p, ld); }
__device__ __forceinline__ void load_frag(ARow<BF>& f, const BF* p, int ld) { ldsm_x4<false>(regs(f), p + ldsm_offset<1>(ld)); }
__device__ __forceinline__ void load_frag(ACol<BF>& f, const BF* p, int ld) { ldsm_x4<true>(regs(f), p + ldsm_offset<2>(ld)); }
__device__ __forceinline__ void load_frag(BRow<BF>& f, const BF* p, int ld) { ldsm_x4<true>(regs(f), p + ldsm_offset<1>(ld)); }
__device__ __forceinline__ void load_frag(BCol<BF>& f, const BF* p, int ld) { ldsm_x4<false>(regs(f), p + ldsm_offset<2>(ld)); }

template <typename F>
__device__ __forceinline__ int frag_differs(const BF* m) {
  F a, b;
  wmma::load_matrix_sync(a, m, 24);
  load_frag(b, m, 24);
  int bad = 0;
  for (int i = 0; i < 4; ++i) bad |= regs(a)[i] != regs(b)[i];
  return bad;
}

__global__ void layout_probe(int* out) {
  __shared__ float m[256];
  Acc f;
  for (int i = 0; i < f.num_elements; ++i) f.x[i] = float(threadIdx.x * 8 + i);
  wmma::store_matrix_sync(m, f, 16, wmma::mem_row_major);
  __syncwarp();
  int bad = 0;
  for (int i = 0; i < f.num_elements; ++i)
    bad |= m[acc_row(i, threadIdx.x) * 16 + acc_col(i, threadIdx.x)] != float(threadIdx.x * 8 + i);
  bad |= f.num_elements != 8;
  // the ldmatrix fragment loads against WMMA's, on a 16×16 tile with distinct entries (ld 24)
  __shared__ __align__(16) BF t[16 * 24];
  for (int i = threadIdx.x; i < 16 * 24; i += 32) t[i] = __float2bfloat16(float(i));
  __syncwarp();
  bad |= frag_differs<ARow<BF>>(t) | frag_differs<ACol<BF>>(t) | frag_differs<BRow<BF>>(t) |
         frag_differs<BCol<BF>>(t);
  if (bad) atomicOr(out, 1);
}

// Two adjacent values (columns col, col+1) in the input dtype.
template <typename T>
__device__ __forceinline__ void store2(T* p, float x, float y);
template <>
__device__ __forceinline__ void store2<__nv_bfloat16>(__nv_bfloat16* p, float x, float y) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(x, y);
}
template <>
__device__ __forceinline__ void store2<__half>(__half* p, float x, float y) {
  *reinterpret_cast<__half2*>(p) = __floats2half2_rn(x, y);
}

// The warp's rows of P into the shared tile st [64][ld] (tile columns from ct0).
template <typename T, int N>
__device__ __forceinline__ void stage_chunk_rows(const Acc (&P)[N], T* st, int ld, int r, int ct0, int lane) {
#pragma unroll
  for (int n = 0; n < N; ++n)
#pragma unroll
    for (int i = 0; i < 8; i += 2)
      store2<T>(st + (r * 16 + acc_row(i, lane)) * ld + (ct0 + n) * 16 + acc_col(i, lane), P[n].x[i], P[n].x[i + 1]);
}
// The inverse of load_rows: W columns of st [64][ld] to rows c·64 … of head h of a [B,T,H,D] tensor,
// columns col0 …, in 16-byte pieces; rows past T are not stored.
template <typename T, int W, int NTH = 256>
__device__ __forceinline__ void store_rows(T* base, const T* st, int LD, int bi, int h, int c, int T_, int H, int D,
                                           int col0) {
  constexpr int SEG = W / 8;
  T* row0 = chunk_row0(base, bi, h, c, T_, H, D, col0);
  const int stride = H * D, rows = T_ - c * kC;
  for_pieces<kC * SEG, NTH>([&](int idx) {
    const int r = idx / SEG, s = idx % SEG;
    if (r < rows)
      *reinterpret_cast<uint4*>(row0 + size_t(r) * stride + s * 8) = *reinterpret_cast<const uint4*>(st + r * LD + s * 8);
  });
}

// P[n] += Σ_{kk0 ≤ kk < kk1} A_kk · B_{kk,n}: fragment kk of A at a + kk·a_step (ld lda), fragment
// (kk, n) of B at b + kk·b_kk + n·b_n (ld ldb); FA / FB say how each operand is laid out.
template <typename FA, typename FB, typename T, int N>
__device__ __forceinline__ void mma_span(Acc (&P)[N], const T* a, int a_step, int lda, const T* b, int b_kk, int b_n,
                                         int ldb, int kk0, int kk1) {
  for (int kk = kk0; kk < kk1; ++kk) {
    FA fa;
    load_frag(fa, a + kk * a_step, lda);
#pragma unroll
    for (int n = 0; n < N; ++n) {
      FB fb;
      load_frag(fb, b + kk * b_kk + n * b_n, ldb);
      wmma::mma_sync(P[n], fa, fb, P[n]);
    }
  }
}

// acc = x_r · y_ctᵀ: row tile r of x [64][ld] against row tile ct of y, over D/16 k-steps.
template <typename T>
__device__ __forceinline__ void tile_xyT(Acc& acc, const T* x, const T* y, int ld, int D, int r, int ct) {
  wmma::fill_fragment(acc, 0.f);
  for (int kk = 0; kk < D / 16; ++kk) {
    ARow<T> fa;
    BCol<T> fb;
    load_frag(fa, x + r * 16 * ld + kk * 16, ld);
    load_frag(fb, y + ct * 16 * ld + kk * 16, ld);
    wmma::mma_sync(acc, fa, fb, acc);
  }
}

// S ← decay·S + kᵀ·v for the warp's state fragments: rows of the 16-row key tile at `keys`
// (ld ldk, one chunk of 64 rows), columns of N 16-column tiles of v at `vals` (ld ldv).
template <typename T, int N>
__device__ __forceinline__ void state_update(Acc (&S)[N], float decay, const T* keys, int ldk, const T* vals, int ldv) {
#pragma unroll
  for (int n = 0; n < N; ++n)
#pragma unroll
    for (int i = 0; i < 8; ++i) S[n].x[i] *= decay;
  mma_span<ACol<T>, BRow<T>>(S, keys, 16 * ldk, ldk, vals, 16 * ldv, 16, ldv, 0, kC / 16);
}

// The warp's state rows (warp·16 … +15, N fragments of 16 columns) from s0 + base (fp32, ld ld), or
// zero when s0 is null.
template <int N>
__device__ __forceinline__ void init_state(Acc (&S)[N], const float* s0, size_t base, int ld, int warp) {
#pragma unroll
  for (int n = 0; n < N; ++n) {
    if (s0)
      wmma::load_matrix_sync(S[n], s0 + base + size_t(warp) * 16 * ld + n * 16, ld, wmma::mem_row_major);
    else
      wmma::fill_fragment(S[n], 0.f);
  }
}

// P = rows r·16 … +15 of x [64][ldx] (K columns) times the rounded state tile sb [K][ldv].
template <typename T, int K, int N>
__device__ __forceinline__ void rows_times_state(Acc (&P)[N], const T* x, int ldx, const T* sb, int ldv, int r) {
#pragma unroll
  for (int n = 0; n < N; ++n) wmma::fill_fragment(P[n], 0.f);
  mma_span<ARow<T>, BRow<T>>(P, x + r * 16 * ldx, 16, ldx, sb, 16 * ldv, 16, ldv, 0, K / 16);
}

// The warp's state rows (fp32 fragments) rounded to the input dtype into dst (global, ld ldg) and
// sb (shared, ld lds), each when not null.
template <typename T, int N>
__device__ __forceinline__ void store_state(const Acc (&S)[N], T* dst, int ldg, T* sb, int lds, int warp, int lane) {
#pragma unroll
  for (int n = 0; n < N; ++n)
#pragma unroll
    for (int i = 0; i < 8; i += 2) {
      const int row = warp * 16 + acc_row(i, lane), col = n * 16 + acc_col(i, lane);
      if (dst) store2<T>(dst + size_t(row) * ldg + col, S[n].x[i], S[n].x[i + 1]);
      if (sb) store2<T>(sb + row * lds + col, S[n].x[i], S[n].x[i + 1]);
    }
}

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

// Shared pieces of the two forward kernels (output_kernel and fused_fwd_kernel): 8 warps, warp
// (r, hf) owns output rows r·16 … +15 and column half hf.
//
// A's lower tiles of row r (the two warps of the row take alternate tiles): q kᵀ, masked (j ≤ i),
// decayed by e^{b_i − b_j} and scaled, rounded into ab [64][ldb]. b: the chunk's 64 cumulative gates.
template <typename T, int K>
__device__ __forceinline__ void decayed_scores(const T* qs, const T* ks, int ld, const float* b, float scale, T* ab,
                                               int ldb, int r, int hf, int lane) {
  for (int ct = hf; ct <= r; ct += 2) {
    Acc acc;
    tile_xyT(acc, qs, ks, ld, K, r, ct);
#pragma unroll
    for (int i = 0; i < 8; i += 2) {
      const int row = r * 16 + acc_row(i, lane), col = ct * 16 + acc_col(i, lane);
      const float bi = b[row];
      const float x0 = col <= row ? acc.x[i] * __expf(bi - b[col]) * scale : 0.f;
      const float x1 = col + 1 <= row ? acc.x[i + 1] * __expf(bi - b[col + 1]) * scale : 0.f;
      store2<T>(ab + row * ldb + col, x0, x1);
    }
  }
}

// P (N column tiles from ct0) = f_row ⊙ (q S) + A v for the warp's rows; f0 / f1 are the row factors
// e^{b}·scale of the lane's two rows (r·16 + lane/4 and + 8). S [K][lds], v [64][ldv], A in ab.
template <typename T, int K, int N>
__device__ __forceinline__ void chunk_rows(Acc (&P)[N], const T* qs, int ldq, const T* S, int lds, const T* ab,
                                           int ldb, const T* vs, int ldv, float f0, float f1, int r, int ct0) {
#pragma unroll
  for (int n = 0; n < N; ++n) wmma::fill_fragment(P[n], 0.f);
  mma_span<ARow<T>, BRow<T>>(P, qs + r * 16 * ldq, 16, ldq, S + ct0 * 16, 16 * lds, 16, lds, 0, K / 16);
#pragma unroll
  for (int n = 0; n < N; ++n)
#pragma unroll
    for (int i = 0; i < 8; ++i) P[n].x[i] *= ((i >> 1) & 1) ? f1 : f0;
  mma_span<ARow<T>, BRow<T>>(P, ab + r * 16 * ldb, 16, ldb, vs + ct0 * 16, 16 * ldv, 16, ldv, 0, r + 1);
}

// The warp's rows of P into o [B,T,H,V] at column col0 + tile columns, rows past T skipped.
template <typename T, int N>
__device__ __forceinline__ void store_chunk_rows(const Acc (&P)[N], T* o, int bi, int h, int c, int T_, int H, int V,
                                                 int col0, int r, int ct0, int lane) {
#pragma unroll
  for (int n = 0; n < N; ++n)
#pragma unroll
    for (int i = 0; i < 8; i += 2) {
      const int row = r * 16 + acc_row(i, lane), col = col0 + (ct0 + n) * 16 + acc_col(i, lane), t = c * kC + row;
      if (t < T_) store2<T>(o + ((size_t(bi) * T_ + t) * H + h) * V + col, P[n].x[i], P[n].x[i + 1]);
    }
}

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

// Row sums of the lane's two rows (r·16 + lane/4 and + 8) of Σ_n P[n] ⊙ Y, Y read from smem [.][ld] at
// columns col0 + fragment columns; sign times them added to out[row] (the two warps of a row both add).
template <typename T, int N>
__device__ __forceinline__ void row_dots(const Acc (&P)[N], const T* y, int ld, int col0, int r, int lane,
                                         float* out, float sign = 1.f) {
  float s0 = 0.f, s1 = 0.f;
#pragma unroll
  for (int n = 0; n < N; ++n)
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int row = r * 16 + acc_row(i, lane), col = col0 + n * 16 + acc_col(i, lane);
      const float x = Ty<T>::f(y[row * ld + col]) * P[n].x[i];
      if (i & 2) s1 += x;
      else s0 += x;
    }
  s0 += __shfl_xor_sync(0xffffffffu, s0, 1);
  s0 += __shfl_xor_sync(0xffffffffu, s0, 2);
  s1 += __shfl_xor_sync(0xffffffffu, s1, 1);
  s1 += __shfl_xor_sync(0xffffffffu, s1, 2);
  if ((lane & 3) == 0) {
    atomicAdd(out + r * 16 + (lane >> 2), sign * s0);
    atomicAdd(out + r * 16 + (lane >> 2) + 8, sign * s1);
  }
}
// Rows of the warp's accumulators times f[row].
template <int N>
__device__ __forceinline__ void scale_rows(Acc (&P)[N], const float* f, int r, int lane) {
  const float f0 = f[r * 16 + (lane >> 2)], f1 = f[r * 16 + (lane >> 2) + 8];
#pragma unroll
  for (int n = 0; n < N; ++n)
#pragma unroll
    for (int i = 0; i < 8; ++i) P[n].x[i] *= (i & 2) ? f1 : f0;
}
// The warp's rows (r·16 … +15) of a staged tile st [64][ld] (W columns of E, fp32 or the input dtype)
// to rows c·64 … of head h of a [B,T,H,D] tensor, columns col0 …, in 16-byte pieces; rows past T are
// not stored.
template <typename E, int W>
__device__ __forceinline__ void warp_store_rows(E* base, const E* st, int ld, int bi, int h, int c, int T_, int H,
                                                int D, int col0, int r, int lane) {
  constexpr int PER = 16 / sizeof(E), SEG = W / PER;
  E* row0 = chunk_row0(base, bi, h, c, T_, H, D, col0);
  const int stride = H * D, rows = T_ - c * kC;
#pragma unroll
  for (int idx = lane; idx < 16 * SEG; idx += 32) {
    const int row = r * 16 + idx / SEG, s = idx % SEG;
    if (row < rows)
      *reinterpret_cast<uint4*>(row0 + size_t(row) * stride + s * PER) =
          *reinterpret_cast<const uint4*>(st + row * ld + s * PER);
  }
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

// ------------------------------------------------------------------ launch
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
template <typename Kern>
void set_smem(Kern kernel, size_t bytes) {
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)),
        "cudaFuncSetAttribute");
}
int sm_count() {
  static int n = [] {
    int dev = 0, v = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev);
    return v > 0 ? v : 1;
  }();
  return n;
}

Tuning g_tuning;

// One chunk of prefetch: 3 and 4 measured no faster on an H200 at any length (the walk is bound by
// its instructions per step, not by the load latency), and cost CTAs per SM at 8K.
constexpr int kWalkStages = 2;

template <typename T, int K, int BV, bool DELTA, bool REV>
void launch_walk(const WalkArgs& a, cudaStream_t s) {
  constexpr size_t sm = walk_smem<T, K, BV, DELTA, kWalkStages>();
  auto kern = walk_kernel<T, K, BV, DELTA, REV, kWalkStages>;
  set_smem(kern, sm);
  kern<<<dim3(a.V / BV, a.B * a.H), K * 2, sm, s>>>(a);
}
template <typename T, int K, bool DELTA, bool REV>
void walk_bv(const WalkArgs& a, cudaStream_t s) {
  // V tiles of 64 (k read half as often) while they still give a CTA per SM, else 32 (long T, small
  // batch: more walks in parallel).
  const int bv = g_tuning.walk_bv ? g_tuning.walk_bv : a.B * a.H * (a.V / 64) >= sm_count() ? 64 : 32;
  if (bv == 32) launch_walk<T, K, 32, DELTA, REV>(a, s);
  else launch_walk<T, K, 64, DELTA, REV>(a, s);
}
template <typename T, bool DELTA, bool REV>
void walk_dispatch(const WalkArgs& a, cudaStream_t s) {
  if (a.K == 64) walk_bv<T, 64, DELTA, REV>(a, s);
  else walk_bv<T, 128, DELTA, REV>(a, s);
}

template <typename F>
void by_dtype(Dtype dt, F&& f) {
  if (dt == Dtype::BF16) f(__nv_bfloat16{});
  else f(__half{});
}
template <typename F>
void by_kv(int K, int V, F&& f) {
  if (K == 64 && V == 64) f(std::integral_constant<int, 64>{}, std::integral_constant<int, 64>{});
  else if (K == 64) f(std::integral_constant<int, 64>{}, std::integral_constant<int, 128>{});
  else if (V == 64) f(std::integral_constant<int, 128>{}, std::integral_constant<int, 64>{});
  else f(std::integral_constant<int, 128>{}, std::integral_constant<int, 128>{});
}

// The per-chunk kernels (one CTA of 256 threads per chunk and b·h), instantiated for the dtype and
// head dims at hand.
#define MIXBENCH_PER_CHUNK_KERNEL(NAME, KERNEL, SMEM)               \
  struct NAME {                                                      \
    template <typename T, int K, int V>                              \
    static constexpr size_t smem() { return SMEM<T, K, V>(); }       \
    template <typename T, int K, int V>                              \
    static auto kernel() { return KERNEL<T, K, V>; }                 \
  };
MIXBENCH_PER_CHUNK_KERNEL(DqkvKernel, dqkv_kernel, dqkv_smem)
struct DqkvDotsKernel {
  template <typename T, int K, int V>
  static constexpr size_t smem() { return dqkv_smem<T, K, V>(); }
  template <typename T, int K, int V>
  static auto kernel() { return dqkv_kernel<T, K, V, true>; }
};
MIXBENCH_PER_CHUNK_KERNEL(DvlKernel, dvl_kernel, dvl_smem)
MIXBENCH_PER_CHUNK_KERNEL(WyBwdKernel, wy_bwd_kernel, wy_bwd_smem)
MIXBENCH_PER_CHUNK_KERNEL(PrepKernel, prep_kernel, prep_smem)
#undef MIXBENCH_PER_CHUNK_KERNEL
template <typename Kern, typename Args>
void launch_per_chunk(Dtype dt, const Args& a, const Dims& d, int NT, void* stream, const char* what) {
  auto s = static_cast<cudaStream_t>(stream);
  by_dtype(dt, [&](auto t) {
    using T = decltype(t);
    by_kv(d.K, d.V, [&](auto kc, auto vc) {
      constexpr int K = decltype(kc)::value, V = decltype(vc)::value;
      constexpr size_t sm = Kern::template smem<T, K, V>();
      auto kern = Kern::template kernel<T, K, V>();
      set_smem(kern, sm);
      kern<<<dim3(NT, d.B * d.H), 256, sm, s>>>(a);
    });
  });
  check_launch(what);
}

}  // namespace

void set_tuning(const Tuning& t) { g_tuning = t; }

bool supported(int K, int V) { return (K == 64 || K == 128) && (V == 64 || V == 128); }

bool prefer_fused(Dims d) { return d.B * d.H >= 3 * sm_count(); }

bool layout_ok() {
  static const bool ok = [] {
    int* d = nullptr;
    int hv = 1;
    if (cudaMalloc(&d, sizeof(int)) != cudaSuccess) return false;
    cudaMemset(d, 0, sizeof(int));
    layout_probe<<<1, 32>>>(d);
    const bool good = cudaMemcpy(&hv, d, sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess && hv == 0;
    cudaFree(d);
    return good;
  }();
  return ok;
}

void check_launch(const char* what) { check(cudaGetLastError(), what); }

static void check_grid(const Dims& d) {
  if (d.B * d.H > 65535 || num_chunks(d.T) > 65535)
    throw std::invalid_argument("chunk kernels: B·H and T/64 must each be at most 65535");
}

void chunk_cumsum(const float* g, float* b, int B, int T, int H, void* stream) {
  const int NT = num_chunks(T), n = B * NT * H;
  if (n == 0) return;
  cumsum_kernel<<<(n + 255) / 256, 256, 0, static_cast<cudaStream_t>(stream)>>>(g, b, B, T, H, NT);
  check_launch("chunk_cumsum");
}

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
    // Whole V per CTA when the heads fill the machine, else two V tiles (more CTAs, A formed twice).
    const bool split = d.V == 128 && d.B * d.H < sm_count();
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
    // One CTA per SM walks either tile width (shared memory); a 64-column step costs about 1.35 of a
    // 32-column one (H200, K = 128). Narrow tiles when their waves of walks (twice the CTAs) cost
    // less than the wide tiles' waves: B·H = 32 at V = 128 (one wave either way) → 32; 128 (four
    // waves against two) → 64.
    const int wide = d.B * d.H * (d.V / 64), waves64 = (wide + sm_count() - 1) / sm_count();
    const int waves32 = (2 * wide + sm_count() - 1) / sm_count();
    const bool narrow = g_tuning.walk_bv ? g_tuning.walk_bv == 32 : 100 * waves32 < 135 * waves64;
    auto pk = [&](auto kc) {
      if (narrow) go(kc, std::integral_constant<int, 32>{});
      else go(kc, std::integral_constant<int, 64>{});
    };
    if (d.K == 64) pk(std::integral_constant<int, 64>{});
    else pk(std::integral_constant<int, 128>{});
  });
  check_launch("walk_bwd_delta");
}

void chunk_output(Dtype dt, const void* q, const void* k, const void* v, const float* b, const void* hs, void* o,
                  float scale, Dims d, void* stream) {
  check_grid(d);
  const int NT = num_chunks(d.T);
  OutArgs a{q, k, v, b, hs, o, scale, d.B, d.T, d.H, d.K, d.V, NT, NT * kC};
  auto s = static_cast<cudaStream_t>(stream);
  // Optionally two V tiles of 64 per chunk for V = 128: 3 CTAs per SM instead of 2, A formed twice
  // (measured slower on an H200: 0.85 against 0.70 ms at B·T = 64K, H = 16).
  const bool split = d.V == 128 && g_tuning.out_split == 2;
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
