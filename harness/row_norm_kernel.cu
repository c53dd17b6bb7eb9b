// Row norms in one pass each way (harness/row_norm_kernel.h). The delta-rule layers normalize rows
// of one head (D = 128 at gpu-d12): LibTorch's rms_norm, the scalar multiply of the L2 norm, the
// gate's SiLU and the product take four kernels forward and about eight backward, each a full read
// and write of the [B, T, H, D] activations.
//
// One warp per row: each lane holds NIT packs of V consecutive elements in fp32 registers
// (D ≤ 32·V·NIT), the sum of squares is a warp reduction, and the row is written once. The
// backward recomputes the row's scale from x (nothing saved but the inputs), forms
//   n = x·r, dn = dy·w·act(g), dx = r·(dn − n·inv_div·Σ dn·n), dg = dy·n·w·act′(g),
// and accumulates dw = Σ_rows dy·n·act(g) in registers over a grid-stride loop of rows; each block
// writes its partial sum to its own row of dw_part (the caller sums them: deterministic).
#include "harness/row_norm_kernel.h"

#include "harness/cuda_dtype.cuh"

#include <initializer_list>
#include <stdexcept>
#include <string>

namespace mixbench::fused_cuda {
namespace {

using layers::from_f32;
using layers::load_f32;

constexpr int kWarps = 8;          // rows in flight per block (one warp each)
constexpr int kMaxIt = 8;          // packs per lane
constexpr int64_t kMaxParts = 1024;  // backward blocks (partial gain gradients)

template <class T, int V>
struct alignas(V * sizeof(T)) Vec {
  T v[V];
};

template <class T, int V>
__device__ __forceinline__ void load_vec(const T* p, float (&o)[V]) {
  const Vec<T, V> a = *reinterpret_cast<const Vec<T, V>*>(p);
#pragma unroll
  for (int e = 0; e < V; ++e) o[e] = load_f32(&a.v[e]);
}

template <class T, int V>
__device__ __forceinline__ void store_vec(T* p, const float (&o)[V]) {
  Vec<T, V> a;
#pragma unroll
  for (int e = 0; e < V; ++e) a.v[e] = from_f32<T>(o[e]);
  *reinterpret_cast<Vec<T, V>*>(p) = a;
}

__device__ __forceinline__ float warp_sum(float s) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
  return s;
}

__device__ __forceinline__ float sigmoid_f(float a) { return 1.f / (1.f + __expf(-a)); }

// act(g) and act′(g)
__device__ __forceinline__ void gate_act(GateAct act, float g, float& a, float& da) {
  if (act == GateAct::Silu) {
    const float s = sigmoid_f(g);
    a = g * s;
    da = s * (1.f + g * (1.f - s));
  } else if (act == GateAct::Sigmoid) {
    const float s = sigmoid_f(g);
    a = s;
    da = s * (1.f - s);
  } else {
    a = 1.f;
    da = 0.f;
  }
}

template <class T, int V, int NIT>
__global__ void __launch_bounds__(kWarps * 32)
    fwd_kernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ g, T* __restrict__ y, RowNorm p) {
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (row >= p.rows) return;  // whole warps: one row per warp
  const int64_t base = row * p.D;
  float xv[NIT][V], gv[NIT][V];
  float ss = 0.f;
#pragma unroll
  for (int it = 0; it < NIT; ++it) {
    const int j = (it * 32 + lane) * V;
    if (j < p.D) {
      load_vec<T, V>(x + base + j, xv[it]);
      if (g) load_vec<T, V>(g + base + j, gv[it]);
#pragma unroll
      for (int e = 0; e < V; ++e) ss += xv[it][e] * xv[it][e];
    } else {
#pragma unroll
      for (int e = 0; e < V; ++e) xv[it][e] = gv[it][e] = 0.f;
    }
  }
  const float r = rsqrtf(warp_sum(ss) * p.inv_div + p.eps);
#pragma unroll
  for (int it = 0; it < NIT; ++it) {
    const int j = (it * 32 + lane) * V;
    if (j < p.D) {
      float wv[V], o[V];
      if (w) {
        load_vec<T, V>(w + j, wv);
      } else {
#pragma unroll
        for (int e = 0; e < V; ++e) wv[e] = 1.f;
      }
#pragma unroll
      for (int e = 0; e < V; ++e) {
        float u = xv[it][e] * r * wv[e];
        if (g) {
          float a, da;
          gate_act(p.act, gv[it][e], a, da);
          u *= a;
        }
        o[e] = u;
      }
      store_vec<T, V>(y + base + j, o);
    }
  }
}

template <class T, int V, int NIT>
__global__ void __launch_bounds__(kWarps * 32)
    bwd_kernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ g, const T* __restrict__ dy,
               T* __restrict__ dx, T* __restrict__ dg, float* __restrict__ dw_part, RowNorm p) {
  extern __shared__ float red[];  // [kWarps][D] with a gain
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float dwacc[NIT][V];
#pragma unroll
  for (int it = 0; it < NIT; ++it)
#pragma unroll
    for (int e = 0; e < V; ++e) dwacc[it][e] = 0.f;
  for (int64_t row = int64_t(blockIdx.x) * kWarps + warp; row < p.rows; row += int64_t(gridDim.x) * kWarps) {
    const int64_t base = row * p.D;
    float xv[NIT][V], dyv[NIT][V], gv[NIT][V];
    float ss = 0.f;
#pragma unroll
    for (int it = 0; it < NIT; ++it) {
      const int j = (it * 32 + lane) * V;
      if (j < p.D) {
        load_vec<T, V>(x + base + j, xv[it]);
        load_vec<T, V>(dy + base + j, dyv[it]);
        if (g) load_vec<T, V>(g + base + j, gv[it]);
#pragma unroll
        for (int e = 0; e < V; ++e) ss += xv[it][e] * xv[it][e];
      }
    }
    const float r = rsqrtf(warp_sum(ss) * p.inv_div + p.eps);
    float dot = 0.f;
#pragma unroll
    for (int it = 0; it < NIT; ++it) {
      const int j = (it * 32 + lane) * V;
      if (j < p.D) {
        float wv[V], dgo[V];
        if (w) load_vec<T, V>(w + j, wv);
#pragma unroll
        for (int e = 0; e < V; ++e) {
          const float n = xv[it][e] * r, wj = w ? wv[e] : 1.f;
          float a = 1.f, da = 0.f;
          if (g) gate_act(p.act, gv[it][e], a, da);
          const float dn = dyv[it][e] * wj * a;
          dot += dn * n;
          dgo[e] = dyv[it][e] * n * wj * da;
          dwacc[it][e] += dyv[it][e] * n * a;
          dyv[it][e] = dn;  // dy is not needed past here: keep dn in its place
        }
        if (g) store_vec<T, V>(dg + base + j, dgo);
      }
    }
    dot = warp_sum(dot) * p.inv_div;
#pragma unroll
    for (int it = 0; it < NIT; ++it) {
      const int j = (it * 32 + lane) * V;
      if (j < p.D) {
        float o[V];
#pragma unroll
        for (int e = 0; e < V; ++e) o[e] = r * (dyv[it][e] - xv[it][e] * r * dot);
        store_vec<T, V>(dx + base + j, o);
      }
    }
  }
  if (w) {  // uniform over the block
#pragma unroll
    for (int it = 0; it < NIT; ++it) {
      const int j = (it * 32 + lane) * V;
      if (j < p.D) {
#pragma unroll
        for (int e = 0; e < V; ++e) red[warp * p.D + j + e] = dwacc[it][e];
      }
    }
    __syncthreads();
    for (int j = threadIdx.x; j < p.D; j += blockDim.x) {
      float s = 0.f;
#pragma unroll
      for (int k = 0; k < kWarps; ++k) s += red[k * p.D + j];
      dw_part[int64_t(blockIdx.x) * p.D + j] = s;
    }
  }
}

// y = v + s·σ(z)·e, one warp per row (rows of D = 32·V·NIT at most).
template <class T, int V, int NIT>
__global__ void __launch_bounds__(kWarps * 32)
    gated_add_fwd_kernel(const T* __restrict__ v, const T* __restrict__ z, const T* __restrict__ e, T* __restrict__ y,
                         int64_t rows, int D, float s) {
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int64_t base = row * D;
  const float gate = s * sigmoid_f(load_f32(z + row));
#pragma unroll
  for (int it = 0; it < NIT; ++it) {
    const int j = (it * 32 + lane) * V;
    if (j < D) {
      float a[V], b[V];
      load_vec<T, V>(v + base + j, a);
      load_vec<T, V>(e + base + j, b);
#pragma unroll
      for (int k = 0; k < V; ++k) a[k] += gate * b[k];
      store_vec<T, V>(y + base + j, a);
    }
  }
}

// de = dy·s·σ(z), dz = s·σ′(z)·Σ_j dy·e
template <class T, int V, int NIT>
__global__ void __launch_bounds__(kWarps * 32)
    gated_add_bwd_kernel(const T* __restrict__ z, const T* __restrict__ e, const T* __restrict__ dy, T* __restrict__ de,
                         T* __restrict__ dz, int64_t rows, int D, float s) {
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int64_t base = row * D;
  const float sg = sigmoid_f(load_f32(z + row)), gate = s * sg;
  float dot = 0.f;
#pragma unroll
  for (int it = 0; it < NIT; ++it) {
    const int j = (it * 32 + lane) * V;
    if (j < D) {
      float g[V], b[V];
      load_vec<T, V>(dy + base + j, g);
      load_vec<T, V>(e + base + j, b);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        dot += g[k] * b[k];
        g[k] *= gate;
      }
      store_vec<T, V>(de + base + j, g);
    }
  }
  dot = warp_sum(dot);
  if (lane == 0) dz[row] = from_f32<T>(s * sg * (1.f - sg) * dot);
}

void check(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

bool aligned16(std::initializer_list<const void*> ptrs) {
  for (const void* q : ptrs)
    if (reinterpret_cast<uintptr_t>(q) % 16 != 0) return false;  // null passes
  return true;
}

// Packs of 4 when every row and buffer allows; NIT the power of two that covers D.
struct Launch {
  int V, nit;
};
Launch launch_of(const RowNorm& p, const void* g, std::initializer_list<const void*> ptrs) {
  if (p.D <= 0) throw std::invalid_argument("row norm kernel: empty rows");
  if ((p.act != GateAct::None) != (g != nullptr))
    throw std::invalid_argument("row norm kernel: a gate needs an activation and an activation a gate");
  Launch l;
  l.V = p.D % 4 == 0 && aligned16(ptrs) ? 4 : 1;
  const int need = (p.D + 32 * l.V - 1) / (32 * l.V);
  l.nit = 1;
  while (l.nit < need) l.nit *= 2;
  if (l.nit > kMaxIt)
    throw std::invalid_argument("row norm kernel: rows of " + std::to_string(p.D) + " elements exceed the kernel's " +
                                std::to_string(32 * l.V * kMaxIt));
  return l;
}

#define MIXBENCH_ROW_NORM_NIT(K, V, nit, grid, smem, s, ...)                       \
  switch (nit) {                                                                   \
    case 1: K<T, V, 1><<<grid, kWarps * 32, smem, s>>>(__VA_ARGS__); break;       \
    case 2: K<T, V, 2><<<grid, kWarps * 32, smem, s>>>(__VA_ARGS__); break;       \
    case 4: K<T, V, 4><<<grid, kWarps * 32, smem, s>>>(__VA_ARGS__); break;       \
    default: K<T, V, 8><<<grid, kWarps * 32, smem, s>>>(__VA_ARGS__); break;      \
  }

// One warp per row, kWarps rows a block: the grid for `rows` rows (too many for a 1-D grid is an error).
unsigned warp_row_grid(int64_t rows, const char* kernel) {
  const int64_t blocks = (rows + kWarps - 1) / kWarps;
  if (blocks > 2147483647) throw std::invalid_argument(std::string(kernel) + " kernel: too many rows");
  return unsigned(blocks);
}

// The gated add's rows as the row kernels' launch arithmetic sees them (vector width from its buffers).
Launch gated_add_launch(int64_t rows, int D, std::initializer_list<const void*> ptrs) {
  RowNorm p;
  p.rows = rows;
  p.D = D;
  return launch_of(p, nullptr, ptrs);
}

template <class T>
void fwd_t(const RowNorm& p, const void* x, const void* w, const void* g, void* y, cudaStream_t s) {
  if (p.rows == 0) return;
  const Launch l = launch_of(p, g, {x, w, g, y});
  const unsigned grid = warp_row_grid(p.rows, "row norm");
  const T *xp = static_cast<const T*>(x), *wp = static_cast<const T*>(w), *gp = static_cast<const T*>(g);
  T* yp = static_cast<T*>(y);
  if (l.V == 4) MIXBENCH_ROW_NORM_NIT(fwd_kernel, 4, l.nit, grid, 0, s, xp, wp, gp, yp, p)
  else MIXBENCH_ROW_NORM_NIT(fwd_kernel, 1, l.nit, grid, 0, s, xp, wp, gp, yp, p)
  check("row norm forward");
}

template <class T>
void bwd_t(const RowNorm& p, const void* x, const void* w, const void* g, const void* dy, void* dx, void* dg,
           float* dw_part, cudaStream_t s) {
  const Launch l = launch_of(p, g, {x, w, g, dy, dx, dg});
  const unsigned grid = unsigned(row_norm_backward_parts(p));
  const size_t smem = w ? sizeof(float) * kWarps * size_t(p.D) : 0;
  const T *xp = static_cast<const T*>(x), *wp = static_cast<const T*>(w), *gp = static_cast<const T*>(g),
          *dyp = static_cast<const T*>(dy);
  T *dxp = static_cast<T*>(dx), *dgp = static_cast<T*>(dg);
  if (l.V == 4) MIXBENCH_ROW_NORM_NIT(bwd_kernel, 4, l.nit, grid, smem, s, xp, wp, gp, dyp, dxp, dgp, dw_part, p)
  else MIXBENCH_ROW_NORM_NIT(bwd_kernel, 1, l.nit, grid, smem, s, xp, wp, gp, dyp, dxp, dgp, dw_part, p)
  check("row norm backward");
}

template <class T>
void gated_add_fwd_t(int64_t rows, int D, float sc, const void* v, const void* z, const void* e, void* y,
                     cudaStream_t s) {
  if (rows == 0) return;
  const Launch l = gated_add_launch(rows, D, {v, e, y});
  const unsigned grid = warp_row_grid(rows, "gated add");
  const T *vp = static_cast<const T*>(v), *zp = static_cast<const T*>(z), *ep = static_cast<const T*>(e);
  T* yp = static_cast<T*>(y);
  if (l.V == 4) MIXBENCH_ROW_NORM_NIT(gated_add_fwd_kernel, 4, l.nit, grid, 0, s, vp, zp, ep, yp, rows, D, sc)
  else MIXBENCH_ROW_NORM_NIT(gated_add_fwd_kernel, 1, l.nit, grid, 0, s, vp, zp, ep, yp, rows, D, sc)
  check("gated add forward");
}

template <class T>
void gated_add_bwd_t(int64_t rows, int D, float sc, const void* z, const void* e, const void* dy, void* de, void* dz,
                     cudaStream_t s) {
  if (rows == 0) return;
  const Launch l = gated_add_launch(rows, D, {e, dy, de});
  const unsigned grid = warp_row_grid(rows, "gated add");
  const T *zp = static_cast<const T*>(z), *ep = static_cast<const T*>(e), *dyp = static_cast<const T*>(dy);
  T *dep = static_cast<T*>(de), *dzp = static_cast<T*>(dz);
  if (l.V == 4) MIXBENCH_ROW_NORM_NIT(gated_add_bwd_kernel, 4, l.nit, grid, 0, s, zp, ep, dyp, dep, dzp, rows, D, sc)
  else MIXBENCH_ROW_NORM_NIT(gated_add_bwd_kernel, 1, l.nit, grid, 0, s, zp, ep, dyp, dep, dzp, rows, D, sc)
  check("gated add backward");
}
#undef MIXBENCH_ROW_NORM_NIT
}  // namespace

bool row_norm_fits(const RowNorm& p, std::initializer_list<const void*> ptrs) {
  return p.D > 0 && (p.D <= 32 * kMaxIt || (p.D % 4 == 0 && p.D <= 32 * 4 * kMaxIt && aligned16(ptrs)));
}

int64_t row_norm_backward_parts(const RowNorm& p) {
  const int64_t b = (p.rows + kWarps - 1) / kWarps;
  return b < 1 ? 1 : b > kMaxParts ? kMaxParts : b;
}

#define MIXBENCH_ROW_NORM_DISPATCH(dt, F, ...)              \
  switch (dt) {                                             \
    case Dtype::F32: F<float>(__VA_ARGS__); break;          \
    case Dtype::BF16: F<__nv_bfloat16>(__VA_ARGS__); break; \
    case Dtype::F16: F<__half>(__VA_ARGS__); break;         \
  }

void row_norm_forward(Dtype dt, const RowNorm& p, const void* x, const void* w, const void* g, void* y,
                      cudaStream_t s) {
  MIXBENCH_ROW_NORM_DISPATCH(dt, fwd_t, p, x, w, g, y, s)
}

void row_norm_backward(Dtype dt, const RowNorm& p, const void* x, const void* w, const void* g, const void* dy, void* dx,
                       void* dg, float* dw_part, cudaStream_t s) {
  MIXBENCH_ROW_NORM_DISPATCH(dt, bwd_t, p, x, w, g, dy, dx, dg, dw_part, s)
}
void gated_add_forward(Dtype dt, int64_t rows, int D, float sc, const void* v, const void* z, const void* e, void* y,
                       cudaStream_t s) {
  MIXBENCH_ROW_NORM_DISPATCH(dt, gated_add_fwd_t, rows, D, sc, v, z, e, y, s)
}

void gated_add_backward(Dtype dt, int64_t rows, int D, float sc, const void* z, const void* e, const void* dy, void* de,
                        void* dz, cudaStream_t s) {
  MIXBENCH_ROW_NORM_DISPATCH(dt, gated_add_bwd_t, rows, D, sc, z, e, dy, de, dz, s)
}

bool gated_add_fits(int D, std::initializer_list<const void*> ptrs) {
  RowNorm p;
  p.D = D;
  return row_norm_fits(p, ptrs);
}
#undef MIXBENCH_ROW_NORM_DISPATCH

}  // namespace mixbench::fused_cuda
