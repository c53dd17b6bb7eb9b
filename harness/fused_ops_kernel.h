// The CUDA kernels behind harness/fused_ops.h (harness/fused_ops_kernel.cu). Buffers are contiguous, of n elements.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace mixbench::fused_cuda {

enum class Dtype { F32, BF16, F16 };
// y = relu(h)²
void relu_square_forward(Dtype dt, const void* h, void* y, int64_t n, cudaStream_t stream);
// dh = 2·relu(h)·dy
void relu_square_backward(Dtype dt, const void* h, const void* dy, void* dh, int64_t n, cudaStream_t stream);
// y = a·x + b·x0 (a, b: one element each, on the device)
void scaled_sum_forward(Dtype dt, const void* a, const void* x, const void* b, const void* x0, void* y, int64_t n,
                        cudaStream_t stream);
// dx = a·g, dx0 = b·g, sums[0] += Σ g·x, sums[1] += Σ g·x0 (sums: fp32, zeroed by the caller)
void scaled_sum_backward(Dtype dt, const void* a, const void* x, const void* b, const void* x0, const void* g, void* dx,
                         void* dx0, float* sums, int64_t n, cudaStream_t stream);

}  // namespace mixbench::fused_cuda
