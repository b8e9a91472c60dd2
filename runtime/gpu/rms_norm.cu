// Fused RMSNorm (layer_kernels.h): forward one block per row (sum of squares, then the output);
// backward one block per row for the input gradient, and a column kernel for the weight gradient's
// partial sums. Products and sums are written with __fmul_rn / __fadd_rn so that nvcc does not fuse
// them into FMAs the reference (model/fused_ops.cpp) does not do.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "runtime/gpu/kernel_dtypes.cuh"
#include "runtime/gpu/layer_kernels.h"

namespace tessera::gpu {

namespace {

constexpr int kThreads = 256;

__device__ inline float add_rn(float a, float b) { return __fadd_rn(a, b); }

// The block's sum of v (every thread gets it).
__device__ float block_sum(float v) { return block_reduce<kThreads>(v, add_rn); }

template <typename T>
__global__ void forward_kernel(const T* __restrict__ x, const T* __restrict__ w, int64_t n, float eps, T* __restrict__ y,
                               float* __restrict__ rstd) {
  const int64_t row = blockIdx.x;
  const T* xr = x + row * n;
  float acc = 0.0f;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const float v = to_f32<T>(xr[j]);
    acc = __fadd_rn(acc, __fmul_rn(v, v));
  }
  const float s = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(block_sum(acc), static_cast<float>(n)), eps)));
  if (threadIdx.x == 0) rstd[row] = s;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
    y[row * n + j] = from_f32<T>(__fmul_rn(to_f32<T>(w[j]), rounded<T>(__fmul_rn(to_f32<T>(xr[j]), s))));
}

template <typename T>
__global__ void backward_kernel(const T* __restrict__ gy, const T* __restrict__ x, const T* __restrict__ w,
                                const float* __restrict__ rstd, int64_t n, T* __restrict__ gx) {
  const int64_t row = blockIdx.x;
  const T *gr = gy + row * n, *xr = x + row * n;
  float dot = 0.0f;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
    dot = __fadd_rn(dot, __fmul_rn(rounded<T>(__fmul_rn(to_f32<T>(gr[j]), to_f32<T>(w[j]))), to_f32<T>(xr[j])));
  dot = block_sum(dot);
  const float s = rstd[row];
  const float coef = __fdiv_rn(__fmul_rn(__fmul_rn(__fmul_rn(s, s), s), dot), static_cast<float>(n));
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const float g = rounded<T>(__fmul_rn(to_f32<T>(gr[j]), to_f32<T>(w[j])));
    gx[row * n + j] = from_f32<T>(__fsub_rn(__fmul_rn(s, g), __fmul_rn(coef, to_f32<T>(xr[j]))));
  }
}

// Column j of chunk c: sum over the chunk's rows of gy round(x rstd).
template <typename T>
__global__ void weight_grad_kernel(const T* __restrict__ gy, const T* __restrict__ x, const float* __restrict__ rstd,
                                   int64_t rows, int64_t n, int64_t rows_per_chunk, float* __restrict__ partial) {
  const int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x, c = blockIdx.y;
  if (j >= n) return;
  const int64_t r0 = c * rows_per_chunk, r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
  float acc = 0.0f;
  for (int64_t r = r0; r < r1; ++r)
    acc = __fadd_rn(acc, __fmul_rn(to_f32<T>(gy[r * n + j]), rounded<T>(__fmul_rn(to_f32<T>(x[r * n + j]), rstd[r]))));
  partial[c * n + j] = acc;
}

template <typename T>
int forward(const void* x, const void* w, int64_t rows, int64_t n, float eps, void* y, float* rstd, cudaStream_t s) {
  if (rows == 0) return 0;
  forward_kernel<T><<<static_cast<unsigned>(rows), kThreads, 0, s>>>(static_cast<const T*>(x), static_cast<const T*>(w), n, eps,
                                                                      static_cast<T*>(y), rstd);
  return static_cast<int>(cudaGetLastError());
}

template <typename T>
int backward(const void* gy, const void* x, const void* w, const float* rstd, int64_t rows, int64_t n, void* gx,
             float* partial, int64_t chunks, cudaStream_t s) {
  if (rows == 0) return 0;
  backward_kernel<T><<<static_cast<unsigned>(rows), kThreads, 0, s>>>(static_cast<const T*>(gy), static_cast<const T*>(x),
                                                                       static_cast<const T*>(w), rstd, n, static_cast<T*>(gx));
  const int64_t per_chunk = (rows + chunks - 1) / chunks;
  const dim3 grid(static_cast<unsigned>((n + kThreads - 1) / kThreads), static_cast<unsigned>(chunks));
  weight_grad_kernel<T><<<grid, kThreads, 0, s>>>(static_cast<const T*>(gy), static_cast<const T*>(x), rstd, rows, n, per_chunk,
                                                  partial);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int rms_norm_forward_launch(const void* x, const void* w, int64_t rows, int64_t n, float eps, KernelDtype t, void* y,
                            float* rstd, void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  return for_element_type(t, [&](auto e) { return forward<decltype(e)>(x, w, rows, n, eps, y, rstd, s); });
}

int rms_norm_backward_launch(const void* gy, const void* x, const void* w, const float* rstd, int64_t rows, int64_t n,
                             KernelDtype t, void* gx, float* gw_partial, int64_t chunks, void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  return for_element_type(t, [&](auto e) { return backward<decltype(e)>(gy, x, w, rstd, rows, n, gx, gw_partial, chunks, s); });
}

}  // namespace tessera::gpu
