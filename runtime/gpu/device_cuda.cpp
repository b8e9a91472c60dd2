// The device queries of the GPU seam (gpu.h): the caching allocator's statistics and the device's
// name. Every *_cuda.cpp compiles where the CUDA runtime and NCCL are found, with a CPU LibTorch
// too (CI's compile and link check, cmake/cuda_nccl.cmake); what needs a CUDA LibTorch (c10/cuda) is
// under TESSERA_WITH_CUDA.
#include "runtime/gpu/gpu.h"

#include <cuda_runtime_api.h>

#ifdef TESSERA_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace tessera::gpu {

std::string device_name(int device) {
  if (device < 0 && cudaGetDevice(&device) != cudaSuccess) return "";
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return "";
  }
  return prop.name;
}

#ifdef TESSERA_WITH_CUDA
bool built() { return true; }

namespace {
int current_or(int device) { return device >= 0 ? device : static_cast<int>(c10::cuda::current_device()); }
}  // namespace

int64_t peak_allocated_bytes(int device) {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(current_or(device));
  // Index 0 is StatType::AGGREGATE (all pools); the enum moved namespaces across PyTorch 2.x releases.
  return stats.allocated_bytes[0].peak;
}

void reset_peak(int device) { c10::cuda::CUDACachingAllocator::resetPeakStats(current_or(device)); }
#endif

}  // namespace tessera::gpu
