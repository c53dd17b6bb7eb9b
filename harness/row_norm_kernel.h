// The CUDA kernels behind harness/fused_ops.h's row norms (harness/row_norm_kernel.cu): over rows of
// D contiguous elements,
//   y = x · rsqrt(Σx² · inv_div + eps) · (w if given) · act(g) (if a gate is given)
// with inv_div = 1/D for RMSNorm and 1 for L2 normalization; act = SiLU or sigmoid.
// x, g, y, dy, dx, dg: [rows, D] contiguous, one dtype; w: [D] in the same dtype.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>

#include "harness/fused_ops_kernel.h"

namespace mixbench::fused_cuda {

enum class GateAct { None, Silu, Sigmoid };

struct RowNorm {
  int64_t rows = 0;
  int D = 0;
  float inv_div = 1.f;  // 1/D: RMSNorm; 1: L2 normalization
  float eps = 0.f;
  GateAct act = GateAct::None;  // with a gate g (not None) or without
};

// Whether the kernels take rows of p.D elements at these buffers (up to 256 elements, or up to 1024
// when D is a multiple of 4 and every buffer is 16-byte aligned; null buffers pass); other rows
// stay on LibTorch's ops.
bool row_norm_fits(const RowNorm& p, std::initializer_list<const void*> ptrs);
// w and g may be null (no gain, no gate: then p.act must be None).
void row_norm_forward(Dtype dt, const RowNorm& p, const void* x, const void* w, const void* g, void* y,
                      cudaStream_t stream);
// The number of row blocks the backward splits the rows into: dw_part is [parts, D] fp32, one
// partial gain gradient per block (summed by the caller: deterministic, no atomics).
int64_t row_norm_backward_parts(const RowNorm& p);
// dx always; dg with a gate; dw_part with a gain (w non-null).
void row_norm_backward(Dtype dt, const RowNorm& p, const void* x, const void* w, const void* g, const void* dy, void* dx,
                       void* dg, float* dw_part, cudaStream_t stream);

// One gate per row: y = v + s·sigmoid(z)·e over rows of D elements (v, e, y, dy, de: [rows, D];
// z, dz: [rows]; one dtype). Backward: de = dy·s·σ(z), dz = s·σ′(z)·Σ_j dy·e (dv = dy, no kernel).
void gated_add_forward(Dtype dt, int64_t rows, int D, float s, const void* v, const void* z, const void* e, void* y,
                       cudaStream_t stream);
void gated_add_backward(Dtype dt, int64_t rows, int D, float s, const void* z, const void* e, const void* dy, void* de,
                        void* dz, cudaStream_t stream);
// Whether the kernels take rows of D elements at these buffers (as row_norm_fits).
bool gated_add_fits(int D, std::initializer_list<const void*> ptrs);

}  // namespace mixbench::fused_cuda
