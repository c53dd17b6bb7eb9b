// Device primitives of the state held in accumulator fragments, shared by the state walks
// (chunk_walk.cu) and the fused forward (chunk_forward.cu): its update per chunk, its start, products
// with it and its rounded stores.
#pragma once

#include "mixers/linear/chunk_tiles.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

namespace mixbench::linear::tc {
namespace {

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

}  // namespace
}  // namespace mixbench::linear::tc
