// Device helpers for the runtime: everything the FSDP engine and the trainer need to know about
// "the device" beyond at::Device itself. Device-generic: compiles and runs against a CPU-only
// LibTorch (every CUDA query answers "none" there). What needs CUDA itself (the caching allocator's
// statistics) it asks of the GPU seam, runtime/gpu/gpu.h.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <string>

#include "runtime/profile/step_profile.h"

namespace tessera::device {

// CUDA devices visible to LibTorch (0 with a CPU-only LibTorch or no driver).
int cuda_device_count();

// "cpu" or "cuda:N" (the form metrics.jsonl and error messages use).
std::string describe(const c10::Device& d);

// Makes `d` the current device of the calling thread (no-op for CPU).
void set_current(const c10::Device& d);
// Blocks the host until the work queued on `d` is done (no-op for CPU). Not for the training step.
void synchronize(const c10::Device& d);
// A host tensor on `d` for the step, without synchronising the host: on a CPU the tensor itself; on a
// GPU a pinned copy of it and an asynchronous copy on the current stream (a pageable copy would
// block the host until the stream drained). The pinned staging buffer stays alive until the copy is
// done (LibTorch's host caching allocator records the stream).
at::Tensor to_device(const at::Tensor& host, const c10::Device& d);
// `t` on the host, readable at once: on a GPU through a pinned buffer with one synchronisation,
// counted as a host synchronisation point (profile::ops::note_sync(site)); on a CPU the tensor
// itself, and counted all the same, so a CPU run reports what a GPU run would wait for.
at::Tensor to_host(const at::Tensor& t, const char* site);
// An empty host tensor to stage copies to or from `d`: pinned when `d` is a GPU.
at::Tensor host_buffer(at::IntArrayRef sizes, at::ScalarType dtype, const c10::Device& d);

// Peak bytes held by LibTorch's caching allocator on `d` since the last reset (0 for CPU).
int64_t peak_memory_bytes(const c10::Device& d);
void reset_peak_memory(const c10::Device& d);

// The step profile's device clock for `d` (profile::set_device_clock): CUDA events on its current
// stream on a GPU, null (host clocks) on a CPU.
std::shared_ptr<profile::DeviceClock> clock_for(const c10::Device& d);

}  // namespace tessera::device
