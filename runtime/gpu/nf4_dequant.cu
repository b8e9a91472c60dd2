// NF4 dequantize kernel (nf4_kernel.h): one thread per packed byte (two values), the code tables in
// shared memory. The CPU decode in nf4.cpp is the reference (tests/unit/test_nf4.cpp); the formula
// is written with __fmul_rn / __fadd_rn so that nvcc cannot fuse it into an FMA the CPU does not do.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "runtime/gpu/kernel_dtypes.cuh"
#include "runtime/gpu/nf4_kernel.h"

namespace tessera::gpu {

namespace {

__device__ inline float load_f32(const uint8_t* p) { return *reinterpret_cast<const float*>(p); }  // 4-aligned (nf4.h)

template <typename T>
__global__ void nf4_dequant(const uint8_t* __restrict__ bytes, int64_t segments, Nf4KernelLayout l, bool double_quant,
                            Nf4Tables tables, T* __restrict__ out) {
  __shared__ float code[16], dyn[256];
  for (int i = threadIdx.x; i < 256; i += blockDim.x) dyn[i] = tables.dyn[i];
  if (threadIdx.x < 16) code[threadIdx.x] = tables.code[threadIdx.x];
  __syncthreads();
  const int64_t pairs = l.count / 2, total = segments * pairs;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total; t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t seg = t / pairs, i = t - seg * pairs, j = i / 32;  // 32 bytes per block of 64 values
    const uint8_t* s = bytes + seg * l.bytes;
    float a;
    if (double_quant) {
      a = __fadd_rn(__fmul_rn(dyn[s[l.qabsmax + j]], load_f32(s + l.group_scale + 4 * (j / 256))), load_f32(s + l.offset));
    } else {
      a = load_f32(s + l.absmax + 4 * j);
    }
    const uint8_t b = s[i];
    T* o = out + seg * l.count + 2 * i;
    o[0] = from_f32<T>(__fmul_rn(code[b >> 4], a));
    o[1] = from_f32<T>(__fmul_rn(code[b & 15], a));
  }
}

template <typename T>
int launch(const uint8_t* bytes, int64_t segments, const Nf4KernelLayout& l, bool dq, const Nf4Tables& tables, void* out,
           cudaStream_t stream) {
  const int64_t total = segments * (l.count / 2);
  if (total == 0) return 0;
  const int threads = 256;
  const int64_t want = (total + threads - 1) / threads;
  const int grid = static_cast<int>(want < 65535 * 8 ? want : 65535 * 8);  // grid-stride beyond
  nf4_dequant<T><<<grid, threads, 0, stream>>>(bytes, segments, l, dq, tables, static_cast<T*>(out));
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int nf4_dequant_launch(const uint8_t* bytes, int64_t segments, const Nf4KernelLayout& l, bool double_quant,
                       const Nf4Tables& tables, Nf4OutType type, void* out, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  return for_element_type(type, [&](auto e) { return launch<decltype(e)>(bytes, segments, l, double_quant, tables, out, s); });
}

}  // namespace tessera::gpu
