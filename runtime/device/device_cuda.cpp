// The parts of runtime/device that need a CUDA-enabled LibTorch (c10/cuda). Built into the
// tessera_nccl library (cmake/cuda_nccl.cmake); empty unless TESSERA_WITH_CUDA.
#include "runtime/device/device.h"

#ifdef TESSERA_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>

namespace tessera::device::detail {

int64_t cuda_peak_allocated_bytes(int device) {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device);
  // Index 0 is StatType::AGGREGATE (all pools); the enum moved namespaces across PyTorch 2.x releases.
  return stats.allocated_bytes[0].peak;
}

void cuda_reset_peak(int device) { c10::cuda::CUDACachingAllocator::resetPeakStats(device); }

}  // namespace tessera::device::detail
#endif
