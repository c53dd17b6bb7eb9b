// Device primitives of the per-chunk gradient kernels (chunk_backward.cu, chunk_wy.cu): row dots and
// row scaling of accumulator fragments, and a warp's rows stored in 16-byte pieces.
#pragma once

#include "mixers/linear/chunk_tiles.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

namespace mixbench::linear::tc {
namespace {

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

}  // namespace
}  // namespace mixbench::linear::tc
