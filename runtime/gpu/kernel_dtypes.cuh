// What the kernels share: loads and stores of their element types (fp32, bf16, fp16) through fp32,
// rounding to nearest even as LibTorch's casts do, and a block's reduction.
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

// The combination of every thread's v in a block of `Threads` threads (a multiple of 32), given
// to every thread: warp shuffles, then the warps' values in order. `combine` is associative
// (__fadd_rn, fmaxf). Every thread of the block must call it.
template <int Threads, typename F>
__device__ float block_reduce(float v, F combine) {
  __shared__ float warp_values[Threads / 32];
  __shared__ float total;
  for (int o = 16; o > 0; o /= 2) v = combine(v, __shfl_down_sync(0xffffffffu, v, o));
  if (threadIdx.x % 32 == 0) warp_values[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float r = warp_values[0];
    for (int i = 1; i < Threads / 32; ++i) r = combine(r, warp_values[i]);
    total = r;
  }
  __syncthreads();
  const float out = total;
  __syncthreads();  // total and warp_values may be written again by the next call
  return out;
}

}  // namespace tessera::gpu
