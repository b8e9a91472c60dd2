#include "runtime/device/device.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/cuda.h>

namespace tessera::device {

bool cuda_built() {
#ifdef TESSERA_WITH_CUDA
  return true;
#else
  return false;
#endif
}

int cuda_device_count() { return static_cast<int>(torch::cuda::device_count()); }

std::string describe(const c10::Device& d) {
  if (d.is_cuda()) return "cuda:" + std::to_string(d.has_index() ? d.index() : 0);
  return d.str();
}

void set_current(const c10::Device& d) {
  if (!d.is_cuda()) return;
  c10::impl::getDeviceGuardImpl(d.type())->setDevice(d);
}

void synchronize(const c10::Device& d) {
  if (d.is_cuda()) torch::cuda::synchronize(d.has_index() ? d.index() : -1);
}

int64_t peak_memory_bytes(const c10::Device& d) {
#ifdef TESSERA_WITH_CUDA
  if (d.is_cuda()) return detail::cuda_peak_allocated_bytes(d.has_index() ? d.index() : 0);
#endif
  return 0;
}

void reset_peak_memory(const c10::Device& d) {
#ifdef TESSERA_WITH_CUDA
  if (d.is_cuda()) detail::cuda_reset_peak(d.has_index() ? d.index() : 0);
#endif
}

}  // namespace tessera::device
