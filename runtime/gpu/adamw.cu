// Tessera's AdamW kernel (adamw_kernel.h): one thread block per chunk of a shard (an 8-bit block,
// or 2048 elements), each thread every 256th element of it, so that loads are coalesced. The
// update of an element is adamw_element (adamw_math.h), the CPU loop's own code. A non-zero skip
// flag returns before anything is read or written.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "runtime/gpu/adamw_kernel.h"
#include "runtime/gpu/kernel_dtypes.cuh"

namespace tessera::gpu {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxPerThread = static_cast<int>(kAdamWMaxBlock / kThreads);

// The shard that chunk `chunk` of the launch belongs to (a few dozen shards at most).
__device__ inline const AdamWShardArgs& shard_of(const AdamWLaunch& a, int64_t chunk) {
  int s = 0;
  while (s + 1 < a.n && a.shards[s + 1].first_chunk <= chunk) ++s;
  return a.shards[s];
}

__device__ inline bool decayed(const AdamWShardArgs& s, int64_t i) { return in_ranges(s.decay, s.decay_ranges, i); }

__device__ inline bool skipped(const AdamWLaunch& a) { return a.found_inf != nullptr && *a.found_inf != 0.0f; }
__device__ inline float scale_of(const AdamWLaunch& a) { return a.grad_scale ? *a.grad_scale : a.c.grad_scale; }

template <typename S>
__global__ void __launch_bounds__(kThreads) plain_kernel(const __grid_constant__ AdamWLaunch a) {
  if (skipped(a)) return;
  const float gs = scale_of(a);
  const AdamWShardArgs& s = shard_of(a, blockIdx.x);
  const int64_t begin = (blockIdx.x - s.first_chunk) * kAdamWPlainChunk;
  const int64_t end = begin + kAdamWPlainChunk < s.numel ? begin + kAdamWPlainChunk : s.numel;
  S* m = static_cast<S*>(s.exp_avg);
  S* v = static_cast<S*>(s.exp_avg_sq);
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
    float mi = to_f32<S>(m[i]), vi = to_f32<S>(v[i]);
    s.param[i] = adamw_element(s.param[i], s.grad[i], mi, vi, decayed(s, i), a.c, gs);
    m[i] = from_f32<S>(mi);
    v[i] = from_f32<S>(vi);
  }
}

__device__ inline float max_of(float x, float y) { return fmaxf(x, y); }

// One 8-bit block per thread block: dequantize with the old absmax, update, the new absmax (the
// block's max |m| and max v), re-quantize. The fp32 moments stay in registers in between.
__global__ void __launch_bounds__(kThreads) q8_kernel(const __grid_constant__ AdamWLaunch a) {
  __shared__ float value_m[256], value_v[256], mid_m[255], mid_v[255];
  if (skipped(a)) return;  // the same for every thread of the block: no barrier is left waiting
  for (int k = threadIdx.x; k < 256; k += kThreads) {
    value_m[k] = a.value_m[k], value_v[k] = a.value_v[k];
    if (k < 255) mid_m[k] = a.mid_m[k], mid_v[k] = a.mid_v[k];
  }
  __syncthreads();
  const float gs = scale_of(a);
  const AdamWShardArgs& s = shard_of(a, blockIdx.x);
  const int64_t b = blockIdx.x - s.first_chunk, b0 = b * a.block;
  const int64_t b1 = b0 + a.block < s.numel ? b0 + a.block : s.numel;
  const uint8_t* qm = static_cast<const uint8_t*>(s.exp_avg);
  const uint8_t* qv = static_cast<const uint8_t*>(s.exp_avg_sq);
  const float sm = s.absmax_avg[b], sv = s.absmax_avg_sq[b];
  float m[kMaxPerThread], v[kMaxPerThread], max_m = 0.0f, max_v = 0.0f;
#pragma unroll
  for (int k = 0; k < kMaxPerThread; ++k) {
    const int64_t i = b0 + int64_t(k) * kThreads + threadIdx.x;
    if (i >= b1) continue;
    m[k] = adamw_ops::mul(value_m[qm[i]], sm);
    v[k] = adamw_ops::mul(value_v[qv[i]], sv);
    s.param[i] = adamw_element(s.param[i], s.grad[i], m[k], v[k], decayed(s, i), a.c, gs);
    max_m = fmaxf(max_m, fabsf(m[k]));
    max_v = fmaxf(max_v, v[k]);
  }
  max_m = block_reduce<kThreads>(max_m, max_of);  // after every thread read the old absmax
  max_v = block_reduce<kThreads>(max_v, max_of);
  if (threadIdx.x == 0) s.absmax_avg[b] = max_m, s.absmax_avg_sq[b] = max_v;
  const float inv_m = max_m > 0 ? adamw_ops::div(1.0f, max_m) : 0.0f;
  const float inv_v = max_v > 0 ? adamw_ops::div(1.0f, max_v) : 0.0f;
  uint8_t* wm = static_cast<uint8_t*>(s.exp_avg);
  uint8_t* wv = static_cast<uint8_t*>(s.exp_avg_sq);
#pragma unroll
  for (int k = 0; k < kMaxPerThread; ++k) {
    const int64_t i = b0 + int64_t(k) * kThreads + threadIdx.x;
    if (i >= b1) continue;
    wm[i] = q8_encode(mid_m, a.zero_m, adamw_ops::mul(m[k], inv_m));
    wv[i] = q8_encode(mid_v, a.zero_v, adamw_ops::mul(v[k], inv_v));
  }
}

}  // namespace

int adamw_launch(const AdamWLaunch& a, int64_t chunks, void* stream) {
  if (chunks <= 0) return 0;
  if (a.n < 1 || a.n > kAdamWMaxShards || chunks > 0x7fffffff) return static_cast<int>(cudaErrorInvalidValue);
  if (a.moments == MomentType::Q8 && (a.block < 1 || a.block > kAdamWMaxBlock))
    return static_cast<int>(cudaErrorInvalidValue);
  const auto st = static_cast<cudaStream_t>(stream);
  const dim3 grid(static_cast<unsigned>(chunks));
  switch (a.moments) {
    case MomentType::F32: plain_kernel<float><<<grid, kThreads, 0, st>>>(a); break;
    case MomentType::BF16: plain_kernel<__nv_bfloat16><<<grid, kThreads, 0, st>>>(a); break;
    case MomentType::Q8: q8_kernel<<<grid, kThreads, 0, st>>>(a); break;
  }
  return static_cast<int>(cudaGetLastError());
}

int kernel_image_version(int* binary_version) {
  cudaFuncAttributes attr{};
  const cudaError_t rc = cudaFuncGetAttributes(&attr, plain_kernel<float>);
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: a later launch elsewhere must not report it
    return static_cast<int>(rc);
  }
  *binary_version = attr.binaryVersion;
  return 0;
}

}  // namespace tessera::gpu
