// The delay kernel of comm_delay.h: every thread of `blocks` blocks spins on %globaltimer (the GPU's
// nanosecond clock) until `ns` have passed since the block started.
#include <cuda_runtime.h>

#include "runtime/gpu/comm_delay.h"

namespace tessera::gpu {

namespace {

__device__ inline uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void delay_kernel(int64_t ns) {
  __shared__ uint64_t start;
  if (threadIdx.x == 0) start = global_timer_ns();
  __syncthreads();
  while (global_timer_ns() - start < static_cast<uint64_t>(ns)) {
  }
}

}  // namespace

int comm_delay_launch(int64_t ns, int blocks, void* stream) {
  if (ns <= 0) return 0;
  delay_kernel<<<blocks > 0 ? blocks : 1, 512, 0, static_cast<cudaStream_t>(stream)>>>(ns);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace tessera::gpu
