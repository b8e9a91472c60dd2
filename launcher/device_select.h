// `train.device` -> this rank's device and the process groups on it.
//
//   auto     as cuda when this build has CUDA (gpu::built()) and a GPU is visible, else cpu
//   cpu      CPU tensors, the bootstrap's MPI groups
//   cuda     local rank r on GPU r (CUDA_VISIBLE_DEVICES renumbers), NCCL groups
//   cuda:N   local rank r on GPU N + r
//
// One GPU per rank with comm.device_backend = nccl (the default): NCCL refuses two ranks on one GPU,
// so more local ranks than visible GPUs is bad input, as are a GPU index that does not exist and
// `cuda` on a build or machine without CUDA. With comm.device_backend = staged (collectives through
// host memory over MPI, runtime/comm/staged.h) ranks share GPUs: local rank r uses GPU
// N + r mod (visible - N); staged on the CPU is refused (it stages GPU tensors).
#pragma once
#include <c10/core/Device.h>

#include <string>

#include "launcher/bootstrap.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/names.h"

namespace tessera::launcher {

// What choose_device() needs to know about this rank and its machine.
struct DeviceContext {
  bool cuda_built = false;  // gpu::built()
  int visible_gpus = 0;     // CUDA devices this process sees
  int local_rank = 0, local_size = 1;
  std::string host;
  std::string cuda_visible_devices;  // the environment variable, "" when unset (for messages)
};

// Pure (no MPI, no CUDA calls): the device for `spec`, or Error(Input) with a one-line message naming
// the key, the host and the device (the caller's agreement step adds the rank).
c10::Device choose_device(const std::string& spec, const DeviceContext& ctx,
                          comm::DeviceBackend backend = comm::DeviceBackend::Nccl);

// What a GPU run asks of kernels that its device or its LibTorch may lack, each refused at start in
// one line naming the key to set (never silently slower): Tessera's kernels where the build has no
// image for the device (`image_problem`: gpu::kernels_unavailable's), for model.fused_kernels and
// for the optimizer's kernel (optim.state_dtype whose update is Tessera's kernel); packed rows or a
// sliding window in 16-bit compute where FlashAttention's variable-length kernel cannot run
// (`varlen_problem`: model::varlen_kernel_unavailable's) unless model.varlen_attention is off.
struct KernelRequest {
  std::string device;                 // as device::describe
  bool fused_kernels = false;         // model.fused_kernels
  std::string own_optimizer_kernel;   // optim.state_dtype's name when AdamW runs Tessera's kernel there, else ""
  std::string varlen_for;             // "data.packing" or "the model's sliding_window" (with model.varlen_attention), else ""
  std::string image_problem, varlen_problem;
};
// Pure: the refusal, or "" when the run may go on.
std::string kernel_refusal(const KernelRequest& r);

// This process's context from the bootstrap and LibTorch.
DeviceContext device_context(const Bootstrap& b);

// Process groups on `device`: the bootstrap's MPI groups for CPU; for CUDA, NCCL communicators over
// the same ranks (world, intra, inter; unique ids broadcast over MPI) bound to the device, or with
// `backend` staged the bootstrap's groups staged for it. Collective over the world. NCCL
// initialisation failure throws Error naming rank, host and device.
comm::ProcessGroups device_groups(const Bootstrap& b, const c10::Device& device,
                                  comm::DeviceBackend backend = comm::DeviceBackend::Nccl);

}  // namespace tessera::launcher
