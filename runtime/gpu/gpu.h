// The GPU seam: everything the rest of Tessera asks of CUDA, declared the same in every build.
//
// runtime/gpu/ is the one home of GPU code (docs/ARCHITECTURE.md#gpu): the NCCL backend (nccl.h),
// the caching allocator's statistics, the device's name, the CUDA-event clock of the step profile,
// and Tessera's own kernels (*.cu, each with a CPU reference elsewhere that the CPU build tests).
// One CMake switch, TESSERA_WITH_CUDA (cmake/cuda_nccl.cmake), picks this folder's sources: the
// *_cuda.cpp files and the kernels when it is on, absent.cpp when it is off. Only this folder
// tests the macro (tests/unit/architecture.sh checks that); callers ask built() at run time.
//
// Threads: any thread may call these; device -1 means the calling thread's current device.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>

#include "runtime/comm/emulation.h"
#include "runtime/gpu/nf4_kernel.h"
#include "runtime/profile/step_profile.h"

namespace tessera::gpu {

// True when this binary has the GPU path (a CUDA LibTorch and NCCL).
bool built();

// Peak bytes held by LibTorch's caching allocator on `device` since the last reset_peak (0 without
// the GPU path).
int64_t peak_allocated_bytes(int device);
void reset_peak(int device);

// The device's name as CUDA reports it ("NVIDIA H100 80GB HBM3"; "" when unknown or not built).
std::string device_name(int device);

// CUDA events on `device`'s current stream as the step profile's device clock (null without the
// GPU path).
std::shared_ptr<profile::DeviceClock> make_clock(int device);

// The NF4 dequantize kernel (nf4_dequant.cu) on `bytes`' device and current stream: `segments`
// segments of layout `l` into `out` (both checked by the caller, runtime/quant/nf4.cpp, whose CPU
// decode is the reference). Throws Error(Internal) without the GPU path or on a failed launch.
void nf4_decode(const at::Tensor& bytes, int64_t segments, const Nf4KernelLayout& l, bool double_quant,
                const Nf4Tables& tables, const at::Tensor& out);

// Communication-time emulation (runtime/comm/emulation.h) for every NCCL communicator of this
// process from now on: before each collective a delay kernel on its stream (comm_delay.cu). Error
// (Input) without the GPU path when `e` is on.
void set_comm_emulation(const comm::Emulation& e);

// Tessera's own kernels for model/ (the fused RMSNorm, SwiGLU, RoPE and the head's cross entropy:
// rms_norm.cu, swiglu.cu, rope.cu, cross_entropy.cu) into
// util::device_kernels(),
// where model/ finds them; the launcher calls it when it picks a CUDA device. Nothing without the
// GPU path (the model then runs LibTorch's composites).
void install_kernels();

}  // namespace tessera::gpu
