#include "runtime/device/device.h"

#include <ATen/ATen.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/cuda.h>

#include "runtime/gpu/gpu.h"
#include "runtime/profile/op_count.h"

namespace tessera::device {

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

at::Tensor to_device(const at::Tensor& host, const c10::Device& d) {
  if (!d.is_cuda() || !host.defined() || !host.is_cpu()) return host.defined() ? host.to(d) : host;
  return host.pin_memory().to(d, /*non_blocking=*/true);
}

at::Tensor to_host(const at::Tensor& t, const char* site) {
  profile::ops::note_sync(site);
  if (!t.defined() || t.is_cpu()) return t;
  at::Tensor out = host_buffer(t.sizes(), t.scalar_type(), t.device());
  out.copy_(t, /*non_blocking=*/false);  // waits for the stream: the synchronisation counted above
  return out;
}

at::Tensor host_buffer(at::IntArrayRef sizes, at::ScalarType dtype, const c10::Device& d) {
  return at::empty(sizes, at::TensorOptions().dtype(dtype).pinned_memory(d.is_cuda()));
}

int64_t peak_memory_bytes(const c10::Device& d) {
  return d.is_cuda() ? gpu::peak_allocated_bytes(d.has_index() ? d.index() : -1) : 0;
}

void reset_peak_memory(const c10::Device& d) {
  if (d.is_cuda()) gpu::reset_peak(d.has_index() ? d.index() : -1);
}

std::shared_ptr<profile::DeviceClock> clock_for(const c10::Device& d) {
  return d.is_cuda() ? gpu::make_clock(d.has_index() ? d.index() : -1) : nullptr;
}

}  // namespace tessera::device
