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

// N elements of type T in one aligned vector load (p aligned to sizeof(T)·N).
template <class T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

// EPL consecutive elements at p (aligned to sizeof(T)·EPL) into fp32 registers, one vector load.
template <class T, int EPL>
__device__ __forceinline__ void load_row(const T* p, float (&out)[EPL]) {
  const Vec<T, EPL> r = *reinterpret_cast<const Vec<T, EPL>*>(p);
#pragma unroll
  for (int e = 0; e < EPL; ++e) out[e] = load_f32(&r.v[e]);
}

}  // namespace mixbench::layers
