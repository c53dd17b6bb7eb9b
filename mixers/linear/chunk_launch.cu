// Launch choices and device checks of the tensor-core chunk kernels (chunk_kernels.h, chunk_launch.cuh):
// the built-in rules for tile widths and splits (measured on an H200) with their Tuning overrides, the
// accumulator-fragment layout probe, and the error checks every launcher shares.
#include "mixers/linear/chunk_launch.cuh"
#include "mixers/linear/chunk_tiles.cuh"

#include <stdexcept>
#include <string>

namespace mixbench::linear::tc {
namespace {

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

Tuning g_tuning;

}  // namespace

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
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

void check_grid(const Dims& d) {
  if (d.B * d.H > 65535 || num_chunks(d.T) > 65535)
    throw std::invalid_argument("chunk kernels: B·H and T/64 must each be at most 65535");
}

int walk_tile(const Dims& d) {
  // V tiles of 64 (k read half as often) while they still give a CTA per SM, else 32 (long T, small
  // batch: more walks in parallel).
  return g_tuning.walk_bv ? g_tuning.walk_bv : d.B * d.H * (d.V / 64) >= sm_count() ? 64 : 32;
}

int delta_bwd_tile(const Dims& d) {
  // One CTA per SM walks either tile width (shared memory); a 64-column step costs about 1.35 of a
  // 32-column one (H200, K = 128). Narrow tiles when their waves of walks (twice the CTAs) cost
  // less than the wide tiles' waves: B·H = 32 at V = 128 (one wave either way) → 32; 128 (four
  // waves against two) → 64.
  const int wide = d.B * d.H * (d.V / 64), waves64 = (wide + sm_count() - 1) / sm_count();
  const int waves32 = (2 * wide + sm_count() - 1) / sm_count();
  const bool narrow = g_tuning.walk_bv ? g_tuning.walk_bv == 32 : 100 * waves32 < 135 * waves64;
  return narrow ? 32 : 64;
}

bool fused_split(const Dims& d) {
  // Whole V per CTA when the heads fill the machine, else two V tiles (more CTAs, A formed twice).
  return d.V == 128 && d.B * d.H < sm_count();
}

bool output_split(const Dims& d) {
  // Optionally two V tiles of 64 per chunk for V = 128: 3 CTAs per SM instead of 2, A formed twice
  // (measured slower on an H200: 0.85 against 0.70 ms at B·T = 64K, H = 16).
  return d.V == 128 && g_tuning.out_split == 2;
}

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

}  // namespace mixbench::linear::tc
