// The launch interface of Tessera's AdamW kernel (adamw.cu), plain C++ so that nvcc compiles the
// kernel without LibTorch: kernels_cuda.cpp passes raw device pointers. One launch updates up to
// kAdamWMaxShards flat fp32 shards whose moments are fp32, bf16 or 8-bit block-quantized
// (runtime/optim/quant8.h), with the clipping coefficient and the skip flag read on the device,
// so nothing waits on the host before it. Per element it is adamw_element (adamw_math.h), the CPU
// loop's own function; the 8-bit blocks are dequantized, updated and re-quantized as the CPU loop
// does (update_blocks_q8): the block's new absmax, then each code as the count of midpoints below
// x / absmax, never 0 for x != 0.
#pragma once
#include <cstdint>

#include "runtime/gpu/adamw_math.h"

namespace tessera::gpu {

enum class MomentType { F32 = 0, BF16 = 1, Q8 = 2 };

struct AdamWShardArgs {
  float* param;
  const float* grad;
  void* exp_avg;               // fp32, bf16, or the 8-bit codes (uint8)
  void* exp_avg_sq;
  float* absmax_avg = nullptr;  // 8-bit: one per block
  float* absmax_avg_sq = nullptr;
  const int64_t* decay = nullptr;  // (begin, length) pairs, sorted and disjoint, on the device
  int64_t numel = 0;
  int64_t first_chunk = 0;  // the launch's chunks before this shard's (adamw_chunks)
  int32_t decay_ranges = 0;
};

constexpr int kAdamWMaxShards = 24;  // the launch's arguments stay under CUDA's 4 KB

struct AdamWLaunch {
  AdamWShardArgs shards[kAdamWMaxShards];
  int n = 0;
  AdamWCoefficients c{};
  const float* grad_scale = nullptr;  // device: multiplies every gradient (null: c.grad_scale)
  const float* found_inf = nullptr;   // device: non-zero skips the whole launch (null: never)
  MomentType moments = MomentType::F32;
  int64_t block = 2048;  // 8-bit: elements per absmax block (1 to kAdamWMaxBlock)
  const float* value_m = nullptr;  // 8-bit: codebooks by stored byte (256) and midpoints (255)
  const float* mid_m = nullptr;
  const float* value_v = nullptr;
  const float* mid_v = nullptr;
  int zero_m = 0, zero_v = 0;  // index of the code 0 in each codebook
};

constexpr int64_t kAdamWMaxBlock = 8192;
constexpr int64_t kAdamWPlainChunk = 2048;  // fp32 / bf16 moments: elements per thread block

// Elements one thread block updates: a whole 8-bit block, else kAdamWPlainChunk.
inline int64_t adamw_chunk(const AdamWLaunch& a) { return a.moments == MomentType::Q8 ? a.block : kAdamWPlainChunk; }
// Sets every shard's first_chunk; returns the launch's chunks (its grid).
inline int64_t adamw_chunks(AdamWLaunch& a) {
  int64_t total = 0;
  for (int i = 0; i < a.n; ++i) {
    a.shards[i].first_chunk = total;
    total += (a.shards[i].numel + adamw_chunk(a) - 1) / adamw_chunk(a);
  }
  return total;
}

// Asynchronously on `stream` (a cudaStream_t); adamw_chunks must have been called. Returns the
// launch's cudaError_t as an int (0: launched).
int adamw_launch(const AdamWLaunch& a, int64_t chunks, void* stream);

// Whether the current device has an image of Tessera's kernels: every runtime/gpu/*.cu file is
// compiled for the same architectures, so one kernel's attributes answer for all. Returns the
// cudaError_t as an int (0: it has one) and the image's binary version (major * 10 + minor).
int kernel_image_version(int* binary_version);

}  // namespace tessera::gpu
