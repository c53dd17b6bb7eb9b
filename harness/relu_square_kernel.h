// The MLP's ReLU² in one element-wise CUDA pass each way (harness/relu_square_kernel.cu); the
// autograd wrapper is relu_square (harness/relu_square.h).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace mixbench::relu_square_cuda {

enum class Dtype { F32, BF16, F16 };
// y = relu(h)²
void forward(Dtype dt, const void* h, void* y, int64_t n, cudaStream_t stream);
// dh = 2·relu(h)·dy
void backward(Dtype dt, const void* h, const void* dy, void* dh, int64_t n, cudaStream_t stream);

}  // namespace mixbench::relu_square_cuda
