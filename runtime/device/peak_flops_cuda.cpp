// The GPU's name for the peak table (peak_flops.h). Built into tessera_nccl; empty unless
// TESSERA_WITH_CUDA.
#include "runtime/device/peak_flops.h"

#ifdef TESSERA_WITH_CUDA
#include <cuda_runtime_api.h>

namespace tessera::device::detail {

std::string cuda_device_name(int device) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) return "";
  return prop.name;
}

}  // namespace tessera::device::detail
#endif
