// The head's row-wise cross entropy (layer_kernels.h): one block per row of a chunk of fp32 logits:
// the row's max, the sum of exp(z - max), the row's loss, and with `grad` the softmax's gradient
// in place -- three reads and one write of the row instead of the composite's nine passes. The
// formulas are the reference's (model/fused_ops.cpp), written with __f*_rn so that nvcc does not
// fuse them into FMAs; expf and logf as the CPU's exp and log, a few ulps apart.
#include <cuda_runtime.h>

#include "runtime/gpu/kernel_dtypes.cuh"
#include "runtime/gpu/layer_kernels.h"

namespace tessera::gpu {

namespace {

constexpr int kThreads = 512;

__device__ inline float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ inline float max_of(float a, float b) { return fmaxf(a, b); }

__global__ void cross_entropy_kernel(float* __restrict__ z, const int64_t* __restrict__ labels,
                                     const float* __restrict__ weights, int64_t V, float scale, bool grad,
                                     float* __restrict__ loss_rows) {
  const int64_t row = blockIdx.x, label = labels[row];
  float* zr = z + row * V;
  float m = -__int_as_float(0x7f800000);  // -inf
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) m = fmaxf(m, zr[j]);
  m = block_reduce<kThreads>(m, max_of);
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) s = __fadd_rn(s, expf(__fsub_rn(zr[j], m)));
  s = block_reduce<kThreads>(s, add_rn);
  if (threadIdx.x == 0) loss_rows[row] = __fsub_rn(__fadd_rn(m, logf(s)), zr[label]);
  if (!grad) return;
  __syncthreads();  // thread 0 read zr[label] before anyone overwrites it
  const float w = weights != nullptr ? weights[row] : 1.0f;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
    const float p = __fdiv_rn(expf(__fsub_rn(zr[j], m)), s);
    zr[j] = __fmul_rn(__fmul_rn(__fsub_rn(p, j == label ? 1.0f : 0.0f), w), scale);
  }
}

}  // namespace

int cross_entropy_rows_launch(float* z, const int64_t* labels, const float* weights, int64_t rows, int64_t V, float scale,
                              bool grad, float* loss_rows, void* stream) {
  if (rows == 0) return 0;
  cross_entropy_kernel<<<static_cast<unsigned>(rows), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      z, labels, weights, V, scale, grad, loss_rows);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace tessera::gpu
