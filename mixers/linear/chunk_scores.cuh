// Device primitives of the decayed intra-chunk scores, shared by the forward kernels
// (chunk_forward.cu) and delta_dv_local (chunk_wy.cu).
#pragma once

#include "mixers/linear/chunk_tiles.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

namespace mixbench::linear::tc {
namespace {

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

}  // namespace
}  // namespace mixbench::linear::tc
