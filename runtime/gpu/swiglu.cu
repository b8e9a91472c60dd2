// Fused SwiGLU (layer_kernels.h): one thread per element of h, reading gate and up side by side in
// the one product of gate_proj and up_proj, forward and backward. The formulas are the reference's
// (model/fused_ops.cpp), written with __f*_rn and expf so that nvcc does not fuse them into FMAs.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "runtime/gpu/kernel_dtypes.cuh"
#include "runtime/gpu/layer_kernels.h"

namespace tessera::gpu {

namespace {

constexpr int kThreads = 256;

__device__ inline float silu_of(float g) { return __fdiv_rn(g, __fadd_rn(1.0f, expf(-g))); }
__device__ inline float sigmoid_of(float g) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-g))); }

template <typename T>
__global__ void forward_kernel(const T* __restrict__ gu, int64_t rows, int64_t inter, T* __restrict__ h) {
  const int64_t total = rows * inter;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / inter, j = i - r * inter;
    const float g = to_f32<T>(gu[r * 2 * inter + j]), u = to_f32<T>(gu[r * 2 * inter + inter + j]);
    h[i] = from_f32<T>(__fmul_rn(rounded<T>(silu_of(g)), u));
  }
}

template <typename T>
__global__ void backward_kernel(const T* __restrict__ gh, const T* __restrict__ gu, int64_t rows, int64_t inter,
                                T* __restrict__ ggu) {
  const int64_t total = rows * inter;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / inter, j = i - r * inter, a = r * 2 * inter + j, b = a + inter;
    const float d = to_f32<T>(gh[i]), g = to_f32<T>(gu[a]), u = to_f32<T>(gu[b]);
    const float sg = sigmoid_of(g), gs = rounded<T>(__fmul_rn(d, u));
    ggu[b] = from_f32<T>(__fmul_rn(d, rounded<T>(silu_of(g))));
    ggu[a] = from_f32<T>(__fmul_rn(__fmul_rn(gs, sg), __fadd_rn(1.0f, __fmul_rn(g, __fsub_rn(1.0f, sg)))));
  }
}

unsigned blocks_for(int64_t total) {
  const int64_t b = (total + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 65535 * 8 ? (b > 0 ? b : 1) : 65535 * 8);
}

template <typename T>
int forward(const void* gu, int64_t rows, int64_t inter, void* h, cudaStream_t s) {
  if (rows * inter == 0) return 0;
  forward_kernel<T><<<blocks_for(rows * inter), kThreads, 0, s>>>(static_cast<const T*>(gu), rows, inter, static_cast<T*>(h));
  return static_cast<int>(cudaGetLastError());
}

template <typename T>
int backward(const void* gh, const void* gu, int64_t rows, int64_t inter, void* ggu, cudaStream_t s) {
  if (rows * inter == 0) return 0;
  backward_kernel<T><<<blocks_for(rows * inter), kThreads, 0, s>>>(static_cast<const T*>(gh), static_cast<const T*>(gu), rows,
                                                                    inter, static_cast<T*>(ggu));
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int swiglu_forward_launch(const void* gu, int64_t rows, int64_t inter, KernelDtype t, void* h, void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  return for_element_type(t, [&](auto e) { return forward<decltype(e)>(gu, rows, inter, h, s); });
}

int swiglu_backward_launch(const void* gh, const void* gu, int64_t rows, int64_t inter, KernelDtype t, void* ggu, void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  return for_element_type(t, [&](auto e) { return backward<decltype(e)>(gh, gu, rows, inter, ggu, s); });
}

}  // namespace tessera::gpu
