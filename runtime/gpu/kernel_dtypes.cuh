// What the kernels share: loads and stores of their element types (fp32, bf16, fp16) through fp32,
// rounding to nearest even as LibTorch's casts do, and a block's reduction.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace tessera::gpu {

// Each element type's load into fp32 and store from it (round to nearest even), one line a type.
template <typename T>
struct Io;
template <> struct Io<float> { __device__ static float load(float v) { return v; } __device__ static float store(float v) { return v; } };
template <> struct Io<__nv_bfloat16> { __device__ static float load(__nv_bfloat16 v) { return __bfloat162float(v); } __device__ static __nv_bfloat16 store(float v) { return __float2bfloat16_rn(v); } };
template <> struct Io<__half> { __device__ static float load(__half v) { return __half2float(v); } __device__ static __half store(float v) { return __float2half_rn(v); } };

template <typename T>
__device__ inline float to_f32(T v) { return Io<T>::load(v); }
template <typename T>
__device__ inline T from_f32(float v) { return Io<T>::store(v); }

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

// The launch for element type t: f(T{}) with T = float, __nv_bfloat16 or __half for t's F32, BF16
// or F16 (any enum with those three members: KernelDtype, Nf4OutType); cudaErrorInvalidValue else.
template <typename Enum, typename F>
int for_element_type(Enum t, F&& f) {
  if (t == Enum::F32) return f(float{});
  if (t == Enum::BF16) return f(__nv_bfloat16{});
  if (t == Enum::F16) return f(__half{});
  return static_cast<int>(cudaErrorInvalidValue);
}

}  // namespace tessera::gpu
