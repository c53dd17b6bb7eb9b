// The rotary-embedding CUDA kernel's C entry point (mixers/common/rope_kernel.cu); the autograd
// wrapper is layers::rope (mixers/common/layers.cpp).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace mixbench::layers::rope_cuda {

enum class Dtype { F32, BF16, F16 };
// y = rope(x) for x, y [rows, 2·half] contiguous, rows ordered (b, t, h) with T_len positions and H
// heads; cos/sin [T_len, half] fp32. inverse: the rotation by −θ (rope's backward).
void apply(Dtype dt, const void* x, void* y, const float* cos, const float* sin, int64_t rows, int T_len, int H, int half,
           bool inverse, cudaStream_t stream);
// y = rope(x) for decoded tokens at the position *pos on the device: x, y [rows, 2·half]; the angle
// pos·inv_freq[j] in fp64 (inv_freq [half] fp64), its cos and sin rounded to fp32 as rope's tables.
void apply_at_pos(Dtype dt, const void* x, void* y, const double* inv_freq, const int64_t* pos, int64_t rows, int half,
                  cudaStream_t stream);

}  // namespace mixbench::layers::rope_cuda
