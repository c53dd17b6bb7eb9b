// Device primitives of the tensor-core chunk kernels (chunk_kernels.h): the input-dtype traits,
// WMMA 16×16×16 fragments (mma.sync, fp32 accumulation; bf16 operand fragments are loaded from shared
// memory with ldmatrix, load_frag), cp.async copies of chunk rows into shared memory and their 16-byte
// stores back, and the fragment products every kernel family is made of. Chunks are kC = 64 tokens.
//
// The per-chunk states of the walks, the outputs of chunk_output and delta_prep, and the gradients
// of chunk_dqkv, delta_dv_local, walk_bwd_delta (du) and delta_wy_bwd (dv) leave through shared
// memory in 16-byte pieces per thread (stores straight from accumulator fragments write 16 bytes per
// row and instruction); delta_wy_bwd's dk, which adds chunk_dqkv's fp32 part, still stores from the
// fragments. Masking is a select before exp (exponents are ≤ 0 wherever they
// are used). Rows past T are read as zero (cp.async with source size 0) and never stored.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

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
// l / 8. layout_probe (chunk_launch.cu) checks them against wmma::load_matrix_sync once on the device (bf16 only).
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

}  // namespace
}  // namespace mixbench::linear::tc
