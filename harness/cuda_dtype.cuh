// Loads and stores that convert between a tensor's element type (float, bf16, fp16) and fp32
// registers: the element-wise CUDA kernels compute in fp32 and round once.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace mixbench::layers {

template <class T>
__device__ __forceinline__ float load_f32(const T* p) { return float(*p); }
template <>
__device__ __forceinline__ float load_f32<__nv_bfloat16>(const __nv_bfloat16* p) { return __bfloat162float(*p); }
template <>
__device__ __forceinline__ float load_f32<__half>(const __half* p) { return __half2float(*p); }
template <class T>
__device__ __forceinline__ T from_f32(float v) { return T(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) { return __float2bfloat16(v); }
template <>
__device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half(v); }

}  // namespace mixbench::layers
