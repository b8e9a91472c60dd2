// Fused RoPE (layer_kernels.h): one thread per pair (j, j + D/2) of a (b, h, t) row, forward and
// backward, the reference's formulas (model/fused_ops.cpp) with each product rounded to the element
// type before the sum, as the composite's products are.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "runtime/gpu/kernel_dtypes.cuh"
#include "runtime/gpu/layer_kernels.h"

namespace tessera::gpu {

namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void rope_kernel(const T* __restrict__ x, const T* __restrict__ cs, const T* __restrict__ sn, RopeLayout l,
                            bool backward, T* __restrict__ o) {
  const int64_t half = l.D / 2, total = l.B * l.H * l.T * half;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = i % half, r = i / half, t = r % l.T, h = (r / l.T) % l.H, b = r / (l.T * l.H);
    const T* xr = x + b * l.sx[0] + h * l.sx[1] + t * l.sx[2];
    T* orow = o + b * l.so[0] + h * l.so[1] + t * l.so[2];
    const int64_t row = l.R == l.B * l.T ? b * l.T + t : t;
    const T *c = cs + row * l.D, *s = sn + row * l.D;
    const float x1 = to_f32<T>(xr[j]), x2 = to_f32<T>(xr[j + half]);
    const float c1 = to_f32<T>(c[j]), c2 = to_f32<T>(c[j + half]), s1 = to_f32<T>(s[j]), s2 = to_f32<T>(s[j + half]);
    if (!backward) {
      orow[j] = from_f32<T>(__fsub_rn(rounded<T>(__fmul_rn(x1, c1)), rounded<T>(__fmul_rn(x2, s1))));
      orow[j + half] = from_f32<T>(__fadd_rn(rounded<T>(__fmul_rn(x2, c2)), rounded<T>(__fmul_rn(x1, s2))));
    } else {
      orow[j] = from_f32<T>(__fadd_rn(rounded<T>(__fmul_rn(x1, c1)), rounded<T>(__fmul_rn(x2, s2))));
      orow[j + half] = from_f32<T>(__fsub_rn(rounded<T>(__fmul_rn(x2, c2)), rounded<T>(__fmul_rn(x1, s1))));
    }
  }
}

template <typename T>
int launch(const void* x, const void* cos, const void* sin, const RopeLayout& l, bool backward, void* o, cudaStream_t s) {
  const int64_t total = l.B * l.H * l.T * (l.D / 2);
  if (total == 0) return 0;
  const int64_t blocks = (total + kThreads - 1) / kThreads;
  rope_kernel<T><<<static_cast<unsigned>(blocks < 65535 * 8 ? blocks : 65535 * 8), kThreads, 0, s>>>(
      static_cast<const T*>(x), static_cast<const T*>(cos), static_cast<const T*>(sin), l, backward, static_cast<T*>(o));
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int rope_launch(const void* x, const void* cos, const void* sin, const RopeLayout& l, bool backward, KernelDtype t, void* o,
                void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  return for_element_type(t, [&](auto e) { return launch<decltype(e)>(x, cos, sin, l, backward, o, s); });
}

}  // namespace tessera::gpu
