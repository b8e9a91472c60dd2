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
#include <vector>

#include "runtime/comm/emulation.h"
#include "runtime/gpu/adamw_math.h"
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

// Tessera's AdamW kernel (adamw.cu) over shards on one CUDA device, on its current stream: each
// shard's fp32 param and grad, its moments (fp32 or bf16; 8-bit: the codes, with absmax_avg and
// absmax_avg_sq, `q8` given) and its decay ranges as a [2 n] int64 tensor of (begin, length) pairs
// on the device (undefined: none). `grad_scale` (fp32 0-dim on the device; undefined: c.grad_scale)
// multiplies every gradient; a non-zero `found_inf` (likewise; undefined: never) skips the update.
// No host synchronisation. The caller (runtime/optim/adamw.cpp, whose CPU loop is the reference)
// checked dtypes, sizes and devices. Error(Input) without the GPU path.
struct AdamWShard {
  at::Tensor param, grad, exp_avg, exp_avg_sq, absmax_avg, absmax_avg_sq, decay;
};
struct Q8Codebooks {  // by stored byte (256 fp32) and midpoints (255 fp32), on the device
  at::Tensor value_m, mid_m, value_v, mid_v;
  int zero_m = 0, zero_v = 0;
  int64_t block = 0;
};
void adamw_update(const std::vector<AdamWShard>& shards, const AdamWCoefficients& c, const at::Tensor& grad_scale,
                  const at::Tensor& found_inf, const Q8Codebooks* q8);

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

// Why Tessera's kernels (runtime/gpu/*.cu) cannot run on `device` ("" when they can): a device this
// build has no image for (the architectures it was built for, CMAKE_CUDA_ARCHITECTURES, named).
// The launcher refuses such a run at start, naming the key that needs them. Without the GPU path:
// "built without CUDA".
std::string kernels_unavailable(int device);

}  // namespace tessera::gpu
