// Loads and stores of the kernels' element types (fp32, bf16, fp16) through fp32, rounding to
// nearest even as LibTorch's casts do: what rms_norm.cu and swiglu.cu share.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace tessera::gpu {

template <typename T>
__device__ inline float to_f32(T v);
template <>
__device__ inline float to_f32<float>(float v) { return v; }
template <>
__device__ inline float to_f32<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <>
__device__ inline float to_f32<__half>(__half v) { return __half2float(v); }

template <typename T>
__device__ inline T from_f32(float v);
template <>
__device__ inline float from_f32<float>(float v) { return v; }
template <>
__device__ inline __nv_bfloat16 from_f32<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ inline __half from_f32<__half>(float v) { return __float2half_rn(v); }

// v rounded to T and back: the composite's intermediate rounding.
template <typename T>
__device__ inline float rounded(float v) { return to_f32<T>(from_f32<T>(v)); }

}  // namespace tessera::gpu
